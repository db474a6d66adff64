"""lm-eval request machinery for an answer (or a passage) scored after a prompt, shared by every
benchmark's tasks (TOFU's, MUSE's, MovieLens's): the model's tokenizer from task metadata, the
exact split of a (prompt, answer) into the tokens lm-eval scores, and the one-token requests that
give each answer token's log-probability (Min-K%, MUSE's PrivLeak).

lm-eval scores a continuation by the SUM of its token log-probabilities, and moves any whitespace
that ends the context into the continuation: :func:`score_plan` says how many answer tokens a
request covers and whether the prompt's trailing whitespace needs a request of its own (its
log-likelihood is subtracted). :func:`token_plan` plans one request per answer token: not a
suffix trick (prompt + answer[:k], answer[k:]), whose requests share input tokens, for which
lm-eval's logits cache (HFLM ``logits_cache``) returns the longest continuation's first tokens'
log-probabilities (tasks/README.md, "Membership inference").
"""

from __future__ import annotations

import logging
import os
from functools import lru_cache
from typing import Any, Sequence

from lm_eval.api.instance import Instance
from lm_eval.api.task import ConfigurableTask

from ..errors import DataError

log = logging.getLogger(__name__)


@lru_cache(maxsize=4)
def _load_tokenizer(name: str, trust_remote_code: bool):
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(name, trust_remote_code=trust_remote_code)
    except OSError as exc:
        raise DataError(f"TOFU tasks: cannot load the tokenizer {name!r}: {exc}") from None


def resolve_tokenizer(tokenizer: Any = None, pretrained: Any = None, trust_remote_code: Any = False):
    """The model's tokenizer from task metadata (an object, a folder or a hub id)."""
    source = tokenizer if tokenizer not in (None, "") else pretrained
    if source in (None, ""):
        raise DataError(
            "TOFU tasks need the model's tokenizer to compute TOFU's per-token means: with lm_eval pass "
            '--model_args pretrained=MODEL (or --metadata \'{"tokenizer": "MODEL"}\'); in Python pass '
            "TaskManager(metadata={'tokenizer': ...})"
        )
    if hasattr(source, "encode") and hasattr(source, "decode") and hasattr(source, "eos_token"):
        return source  # already a tokenizer
    if not isinstance(source, (str, os.PathLike)):
        name = getattr(source, "name_or_path", None) or getattr(getattr(source, "config", None), "_name_or_path", None)
        if not name:
            raise DataError(
                f"TOFU tasks: cannot find a tokenizer for a {type(source).__name__}; pass metadata 'tokenizer'"
            )
        source = name
    return _load_tokenizer(str(source), bool(trust_remote_code in (True, "True", "true", "1", 1)))


def metadata_tokenizer(metadata: dict[str, Any]):
    """:func:`resolve_tokenizer` from a task's metadata (``tokenizer``, ``pretrained``,
    ``trust_remote_code``), which every benchmark's ``custom_dataset`` receives as keywords."""
    return resolve_tokenizer(
        metadata.get("tokenizer"), metadata.get("pretrained"), metadata.get("trust_remote_code", False)
    )


def encode_ids(tokenizer, text: str) -> list[int]:
    return tokenizer.encode(text, add_special_tokens=False)


def decode_ids(tokenizer, ids: Sequence[int]) -> str:
    return tokenizer.decode(list(ids), skip_special_tokens=False, clean_up_tokenization_spaces=False)


def score_plan(tokenizer, prompt: str, continuation: str, where: str) -> tuple[int, bool]:
    """(answer token count, subtract the whitespace request?) for one (prompt, answer).

    Exact TOFU scoring needs the prompt tokens to be a prefix of the joint tokens (true
    for chat templates). Otherwise (a plain "Answer: " prompt whose space merges into the
    answer) lm-eval's joint tokenisation is scored as is.
    """
    full = encode_ids(tokenizer, prompt + continuation)
    p = encode_ids(tokenizer, prompt)
    stripped = prompt.rstrip()
    ps = encode_ids(tokenizer, stripped) if stripped != prompt else p
    if full[: len(p)] == p and len(full) > len(p):
        if stripped == prompt:
            return len(full) - len(p), False
        if p[: len(ps)] == ps:  # lm-eval scores the whitespace tokens too: subtract them
            return len(full) - len(p), True
    if full[: len(ps)] != ps or len(full) <= len(ps):
        raise DataError(f"{where}: the prompt and the answer cannot be split into tokens for scoring")
    log.warning("%s: the prompt's trailing whitespace merges with the answer; scoring lm-eval's joint tokens", where)
    return len(full) - len(ps), False


def request_metadata(kwargs: dict) -> tuple:
    """lm-eval's (task, doc_id, repeats) for each Instance; lm-eval's own task tests call
    construct_requests without it (then Instance's default, no names)."""
    return kwargs.get("metadata") or (None, None, None)


class PromptTask(ConfigurableTask):
    """Base of the lm-eval "class" tasks whose documents carry their chat-formatted ``prompt`` and
    ``answer``: lm-eval's prompt options must not change what is scored. ``PROMPT_OWNER`` names
    the tasks in that error; ``METRICS`` maps each metric to higher-is-better."""

    PROMPT_OWNER = "these tasks"
    METRICS: dict[str, bool] = {}

    def __init__(self, config: dict | None = None, **kwargs):
        config = {k: v for k, v in (config or {}).items() if k != "class"}
        super().__init__(config=config, **kwargs)

    def doc_to_text(self, doc, doc_to_text=None):
        return doc["prompt"]

    def doc_to_target(self, doc, doc_to_target=None):
        return doc["answer"]

    def _check_context(self, doc, ctx) -> None:
        if ctx != doc["prompt"]:
            raise DataError(
                f"task {self.config.task}: the prompt was changed by lm-eval options; {self.PROMPT_OWNER} format the "
                "chat prompt themselves, so run them without --apply_chat_template, --system_instruction "
                "and --num_fewshot (set metadata 'system_prompt' for a system turn)"
            )

    def higher_is_better(self):
        return dict(self.METRICS)


# ----------------------------------------------------------------------------- per-token log-probabilities


def answer_tokens(tok, prompt: str, continuation: str, where: str) -> tuple[str, str, list[int], bool]:
    """(prompt, continuation, answer token ids, subtract the whitespace request?) with the
    prompt's token ids a prefix of the whole sequence's; when the prompt's trailing whitespace
    merges into the answer (a plain ``Answer: `` prompt), that whitespace joins the continuation."""
    n, ws_sub = score_plan(tok, prompt, continuation, where)
    p = encode_ids(tok, prompt)
    full = encode_ids(tok, prompt + continuation)
    if full[: len(p)] != p or len(full) - len(p) != n:
        cut = len(prompt.rstrip())
        prompt, continuation = prompt[:cut], prompt[cut:] + continuation
        p = encode_ids(tok, prompt)
    return prompt, continuation, full[len(p) :], ws_sub


def prefix_offsets(tok, prompt: str, continuation: str, answer: list[int]) -> list[int | None]:
    """For each k in 0..n, the length of the continuation's text that is answer[:k] when
    ``prompt + continuation[:offset]`` re-tokenises to exactly the prompt and answer[:k] (None
    where it does not, e.g. a cut inside a character or a merge the tokenizer makes)."""
    p = encode_ids(tok, prompt)
    out: list[int | None] = []
    for k in range(len(answer) + 1):
        text = decode_ids(tok, answer[:k])
        if not continuation.startswith(text):
            out.append(None)
            continue
        ok = k == 0 or encode_ids(tok, prompt + text) == p + answer[:k]
        out.append(len(text) if ok else None)
    return out


def token_plan(tok, prompt: str, continuation: str, where: str) -> dict[str, Any]:
    """The requests that give each answer token's log-probability (see the module docstring):
    for each answer position k but the last, the one-token request (prompt + answer[:k],
    answer[k]) and the first token it covers (lm-eval moves whitespace that ends the context into
    the continuation: those tokens are covered too, negative positions being the prompt's)."""
    prompt, continuation, answer, ws_sub = answer_tokens(tok, prompt, continuation, where)
    n = len(answer)
    p = encode_ids(tok, prompt)
    offsets = prefix_offsets(tok, prompt, continuation, answer)
    singles: list[list[int]] = []  # [position, first position covered, text start, text end]
    for k in range(n - 1):
        lo, hi = offsets[k], offsets[k + 1]
        if lo is None or hi is None or continuation[lo:hi] != decode_ids(tok, answer[k : k + 1]):
            continue
        context = (prompt + continuation[:lo]).rstrip()
        kept = encode_ids(tok, context)
        if kept != (p + answer)[: len(kept)]:
            continue  # lm-eval would not split the tokens here
        singles.append([k, len(kept) - len(p), lo, hi])
    return {
        "score_prompt": prompt,
        "score_continuation": continuation,
        "n_tokens": [n],
        "ws_sub": [ws_sub],
        "singles": singles,
    }


def mia_requests(doc: dict, metadata: tuple) -> list[Instance]:
    """The plan's loglikelihood requests: the whole answer, the prompt's trailing whitespace alone
    (when it has some), and one request per answer token but the last. No two of them share the
    same input tokens with continuations of different lengths: lm-eval's logits cache (HFLM,
    ``logits_cache``) would hand the shorter one the log-probabilities of the longer's first tokens."""
    prompt, cont = doc["score_prompt"], doc["score_continuation"]
    args = [(prompt, cont)]
    if doc["ws_sub"][0]:
        args.append((prompt, ""))
    args += [(prompt + cont[:lo], cont[lo:hi]) for _, _, lo, hi in doc["singles"]]
    return [Instance("loglikelihood", doc, a, i, metadata=metadata) for i, a in enumerate(args)]


def token_logprobs(doc: dict, results: Sequence) -> tuple[list[float], int]:
    """(log-probability of each answer token, the end token last; how many of them share what
    the measured ones leave, when more than the end token is not measured) from the results of
    :func:`mia_requests`."""
    n = doc["n_tokens"][0]
    lls = [float(r[0]) for r in results]
    ws = lls[1] if doc["ws_sub"][0] else 0.0
    total = lls[0] - ws
    known: dict[int, float] = {}
    for (k, first, _, _), ll in zip(doc["singles"], lls[2 if doc["ws_sub"][0] else 1 :]):
        covered = range(max(first, 0), k)
        if all(t in known for t in covered):
            known[k] = ll - sum(known[t] for t in covered) - (ws if first < 0 else 0.0)
    unknown = [t for t in range(n) if t not in known]
    rest = (total - sum(known.values())) / len(unknown)
    return [known.get(t, rest) for t in range(n)], (len(unknown) if len(unknown) > 1 else 0)
