"""TOFU as lm-eval tasks: documents, requests and per-sample metrics.

lm-eval scores a continuation by the SUM of its token log-probabilities, and moves any
whitespace that ends the context into the continuation. TOFU needs the MEAN over exactly
the answer tokens (+ end token) after the model's chat prompt. So each document carries,
from the model's tokenizer:

* ``prompt``: the chat-formatted question (unlearn_plugins.data.qa.prompt_text, as in
  training), and for each scored answer its continuation text (answer + end token) and
  its token count;
* ``ws_sub``: whether the prompt ends in whitespace that lm-eval moves into the
  continuation; then one extra request scores that whitespace alone, and its
  log-likelihood is subtracted (exact, and shared across tasks by lm-eval's cache).
  The YAML's ``target_delimiter: ""`` (lm-eval's convention for chat prompts) does not make
  it unnecessary: lm-eval's loglikelihood still covers the chat template's final newline,
  whose probability is near 1 only for a model trained on that template.

The tokenizer comes from task metadata: ``tokenizer`` or ``pretrained`` (lm_eval's CLI
merges --model_args into the metadata, so ``--model_args pretrained=DIR`` is enough).
Tasks are lm-eval "class" tasks; their YAML files are beside this file. The request machinery they
share with the other benchmarks' tasks is :mod:`unlearn_plugins.evaluation.lm_eval_requests`.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Sequence

from lm_eval.api.instance import Instance
from lm_eval.api.metrics import mean

from unlearn_plugins.benchmarks.tofu import metrics as tm
from unlearn_plugins.data.qa import control_token_in, control_tokens, prompt_text, read_jsonl, split_path
from unlearn_plugins.errors import DataError
from unlearn_plugins.evaluation.lm_eval_requests import (  # noqa: F401 - the TOFU tasks' (and their users') names
    PromptTask,
    decode_ids,
    encode_ids,
    metadata_tokenizer,
    request_metadata,
    resolve_tokenizer,
    score_plan,
)
from unlearn_plugins.evaluation.reference import HINT, Reference, references_from, sample_key

log = logging.getLogger(__name__)

#: dataset_kwargs.tofu_split value that means "the split named by metadata forget_split"
FORGET_PLACEHOLDER = "@forget"
ROLES = ("qa", "es", "perturbed", "options")
ROUGE_MAX_NEW_TOKENS = 200
_REQUIRED = {
    "qa": ("question", "answer"),
    "es": ("question", "answer"),
    "perturbed": ("question", "answer", "paraphrased_answer", "perturbed_answer"),
    "options": ("question", "answer", "perturbed_answer"),
}


# ----------------------------------------------------------------------------- extraction strength


def _es_plan(tokenizer, prompt: str, continuation: str) -> tuple[list[str], list[str], list[int], str, int]:
    """Requests that give, through lm-eval's greedy flag, for each answer position s
    whether every teacher-forced greedy prediction from s on equals the label.

    ``continuation`` is the answer without the end token: open-unlearning's extraction strength
    drops the last label ("-1 to ignore eos prediction"). Returns contexts, continuations, the
    suffix start each request measures (negative: the request also covers the prompt's trailing
    whitespace), the text of the first answer token and the answer's token count n.
    """
    p = encode_ids(tokenizer, prompt)
    full = encode_ids(tokenizer, prompt + continuation)
    answer = full[len(p) :]
    if not answer:
        return [], [], [], "", 0
    contexts, conts, starts = [], [], []
    seen = set()
    for k in range(len(answer)):
        ctx = prompt + decode_ids(tokenizer, answer[:k])
        rest = decode_ids(tokenizer, answer[k:])
        if ctx + rest != prompt + continuation:
            continue  # the split falls inside a multi-byte character
        stripped = encode_ids(tokenizer, ctx.rstrip())
        if full[: len(stripped)] != stripped or len(stripped) >= len(full):
            continue  # lm-eval would not score the true token sequence
        start = len(stripped) - len(p)
        if start in seen:
            continue
        seen.add(start)
        contexts.append(ctx)
        conts.append(rest)
        starts.append(start)
    first = tokenizer.decode([answer[0]], skip_special_tokens=True)
    return contexts, conts, starts, first, len(answer)


# ----------------------------------------------------------------------------- dataset


def _refuse_control_tokens(fields: dict[str, Any], specials: Sequence[str], where: str) -> None:
    """lm-eval tokenises the request strings itself, with special tokens active, so data text that
    holds one (``<|im_end|>``...) would act as a control token here: refused (training, probs and
    the scorers keep it as text, see unlearn_plugins.data.qa.text_ids)."""
    for key, value in fields.items():
        for text in value if isinstance(value, list) else [value]:
            found = control_token_in(text, specials) if isinstance(text, str) else None
            if found:
                raise DataError(
                    f"{where}: field '{key}' contains the tokenizer's control token {found!r}, which "
                    f"lm-eval would read as a control token, not text; remove it from the data"
                )


def _perturbed_path(forget: str, folder: Path | None, tofu_dir: str | None = None) -> Path:
    """The truth-ratio file of a forget split: NAME_perturbed.json beside it, else the file itself."""
    base = split_path(forget, folder, tofu_dir)
    sibling = base.with_name(f"{base.stem}_perturbed{base.suffix}")
    return sibling if sibling.is_file() else base


def tofu_dataset(
    *,
    tofu_split: str | None = None,
    tofu_role: str = "qa",
    forget_split: str | None = None,
    tofu_dir: str | None = None,
    system_prompt: str | None = None,
    **metadata: Any,
):
    """lm-eval ``custom_dataset``: one TOFU split as a DatasetDict {"test": ...} of
    documents with the prompt and the token counts the tasks need (the tokenizer from
    ``metadata``, :func:`metadata_tokenizer`)."""
    import datasets

    if tofu_role not in ROLES:
        raise DataError(f"dataset_kwargs.tofu_role must be one of {', '.join(ROLES)}, got {tofu_role!r}")
    if tofu_split in (None, FORGET_PLACEHOLDER):
        if not forget_split:
            raise DataError(
                "the generic tofu_forget_* tasks read their split from metadata 'forget_split' "
                "(a TOFU split name such as forget05, or a JSON-lines file in TOFU's format): "
                'unlearn eval --forget-split X, or lm_eval --metadata \'{"forget_split": "X"}\''
            )
        path = (
            _perturbed_path(forget_split, None, tofu_dir)
            if tofu_role == "perturbed"
            else split_path(forget_split, None, tofu_dir)
        )
    else:
        path = split_path(tofu_split, None, tofu_dir)
    samples = read_jsonl(path, require=_REQUIRED[tofu_role])
    tok = metadata_tokenizer(metadata)
    eos = tok.eos_token
    if not eos:
        raise DataError(f"tokenizer {getattr(tok, 'name_or_path', '?')} has no eos token: TOFU scores the end token")
    if tofu_split not in (None, FORGET_PLACEHOLDER):
        label = tofu_split
    elif forget_split.endswith((".json", ".jsonl")) or Path(forget_split).expanduser().is_file():
        label = str(path)
    else:
        label = path.stem  # a split name in the TOFU folder

    docs = []
    specials = control_tokens(tok)
    for s in samples:
        where = s.where
        _refuse_control_tokens(
            {"question": s.question, "answer": s.answer, **{k: s.extra.get(k) for k in _REQUIRED[tofu_role][2:]}},
            specials,
            where,
        )
        prompt = prompt_text(tok, s.question, system_prompt)
        if tofu_role == "perturbed":
            answers = [s.extra["paraphrased_answer"], *s.extra["perturbed_answer"]]
            if not isinstance(answers[0], str) or not answers[0].strip():
                raise DataError(f"{where}: field 'paraphrased_answer' must be a non-empty string")
        elif tofu_role == "options":
            answers = [s.answer, *s.extra["perturbed_answer"]]
        else:
            answers = [s.answer]
        conts, counts, ws = [], [], []
        for a in answers:
            n, sub = score_plan(tok, prompt, a + eos, where)
            conts.append(a + eos)
            counts.append(n)
            ws.append(sub)
        doc = {
            "key": sample_key(s.question, s.answer),
            "split": label,
            "where": where,
            "question": s.question,
            "answer": s.answer,
            "prompt": prompt,
            "continuations": conts,
            "n_tokens": counts,
            "ws_sub": ws,
        }
        if tofu_role == "es":
            ctxs, rests, starts, first, n = _es_plan(tok, prompt, s.answer)
            doc.update(es_contexts=ctxs, es_continuations=rests, es_starts=starts, first_token=first, es_n_tokens=n)
        docs.append(doc)
    return datasets.DatasetDict({"test": datasets.Dataset.from_list(docs)})


# ----------------------------------------------------------------------------- tasks


class TofuTask(PromptTask):
    """Base of the TOFU tasks: documents from :func:`tofu_dataset`, prompt already formatted."""

    OUTPUT_TYPE = "loglikelihood"
    PROMPT_OWNER = "TOFU tasks"

    def _loglik_requests(self, doc, kwargs, start_idx: int = 0) -> list[Instance]:
        meta = request_metadata(kwargs)
        reqs = [
            Instance("loglikelihood", doc, (doc["prompt"], cont), start_idx + i, metadata=meta)
            for i, cont in enumerate(doc["continuations"])
        ]
        if any(doc["ws_sub"]):
            reqs.append(Instance("loglikelihood", doc, (doc["prompt"], ""), start_idx + len(reqs), metadata=meta))
        return reqs

    @staticmethod
    def _mean_nlls(doc, results) -> list[float]:
        """Per-answer mean NLLs from the loglikelihood results (whitespace subtracted)."""
        n = len(doc["continuations"])
        ws = results[n][0] if any(doc["ws_sub"]) else 0.0
        out = []
        for i in range(n):
            ll = results[i][0] - (ws if doc["ws_sub"][i] else 0.0)
            out.append(tm.mean_nll(ll, doc["n_tokens"][i]))
        return out

    def construct_requests(self, doc, ctx, **kwargs):
        self._check_context(doc, ctx)
        return self._loglik_requests(doc, kwargs)

    def aggregation(self):
        return {name: mean for name in self.METRICS}


class TofuProbTask(TofuTask):
    """Answer probability exp(-mean NLL) of the question's answer."""

    METRICS = {"prob": True}

    def process_results(self, doc, results):
        return {"prob": tm.probability(self._mean_nlls(doc, results)[0])}


class TofuTruthRatioTask(TofuTask):
    """Truth ratio of paraphrased vs perturbed answers; ``true_better`` aggregate
    (retain split)."""

    METRICS = {"truth_ratio": True}

    def process_results(self, doc, results):
        nll = self._mean_nlls(doc, results)
        return {"truth_ratio": tm.truth_ratio(nll[0], nll[1:])}

    def aggregation(self):
        return {"truth_ratio": tm.true_better_truth_ratio}


class TofuForgetTruthRatioTask(TofuTruthRatioTask):
    """Forget split: truth ratio (``mean(min(tr, 1/tr))``) and Forget Quality, the KS test
    against a retain reference named by metadata ``retain_reference``."""

    METRICS = {"truth_ratio": True, "forget_quality": True}
    #: what the core's evaluation asks (unlearn_plugins.evaluation.reference.forget_quality_task)
    FORGET_QUALITY = True

    def __init__(self, config: dict | None = None, **kwargs):
        super().__init__(config=config, **kwargs)
        docs = self.dataset["test"]
        self.split_label = docs[0]["split"]
        self.reference = self._pick_reference(list(docs["key"]), (self.config.metadata or {}).get("retain_reference"))

    def _pick_reference(self, keys: list[str], value: Any) -> Reference | None:
        refs = references_from(value)
        if not refs:
            return None
        for ref in refs:
            if ref.matches_split(keys):
                return ref
        made_on = "; ".join(f"{r.path}: {r.describe()}" for r in refs)
        raise DataError(
            f"task {self.config.task} evaluates split {self.split_label!r} ({len(keys)} samples) but no retain "
            f"reference was made on it ({made_on}); {HINT.format(task=self.config.task)}"
        )

    def process_results(self, doc, results):
        tr = super().process_results(doc, results)["truth_ratio"]
        return {"truth_ratio": tr, "forget_quality": [doc["key"], tr]}

    def _forget_quality(self, items) -> float:
        if self.reference is None:
            log.warning(
                "%s: forget_quality unavailable: no retain reference; %s",
                self.config.task,
                HINT.format(task=self.config.task),
            )
            return float("nan")
        keys = [k for k, _ in items]
        self.reference.check_evaluated(keys, task=self.config.task, split=self.split_label)
        return tm.forget_quality([tr for _, tr in items], self.reference.truth_ratios)

    def aggregation(self):
        return {"truth_ratio": tm.forget_truth_ratio, "forget_quality": self._forget_quality}


class TofuOptionsTask(TofuTask):
    """Real authors / world facts: probability normalised over the options, and truth
    ratio of the answer vs the perturbed answers (``true_better``)."""

    METRICS = {"prob": True, "truth_ratio": True}

    def process_results(self, doc, results):
        nll = self._mean_nlls(doc, results)
        return {"prob": tm.probability_with_options(nll[0], nll[1:]), "truth_ratio": tm.truth_ratio(nll[0], nll[1:])}

    def aggregation(self):
        return {"prob": mean, "truth_ratio": tm.true_better_truth_ratio}


class TofuRougeTask(TofuTask):
    """ROUGE recall of a greedy generation (at most 200 new tokens, stops at the end token)."""

    OUTPUT_TYPE = "generate_until"
    METRICS = {"rougeL_recall": True, "rouge1_recall": True}

    def construct_requests(self, doc, ctx, **kwargs):
        self._check_context(doc, ctx)
        gen = dict(self.config.generation_kwargs or {}) or {
            "until": [],
            "max_gen_toks": ROUGE_MAX_NEW_TOKENS,
            "do_sample": False,
            "temperature": 0.0,
        }
        return [Instance("generate_until", doc, (doc["prompt"], gen), 0, metadata=request_metadata(kwargs))]

    def process_results(self, doc, results):
        return tm.rouge_recall(results[0].strip(), doc["answer"])


class TofuExtractionStrengthTask(TofuTask):
    """Extraction strength 1 - k/n over the answer's n tokens without the end token, as
    open-unlearning's ``extraction_strength``, from lm-eval's greedy flags on answer suffixes (one
    forward per sample thanks to lm-eval's shared-prefix cache) plus one greedy token for
    the first answer position.

    A suffix can only be scored from a position where re-tokenising the answer prefix
    gives the same tokens; elsewhere (about 0.3% of positions for SmolLM2 on TOFU) k is
    rounded up to the next such position.
    """

    METRICS = {"extraction_strength": True}

    def construct_requests(self, doc, ctx, **kwargs):
        self._check_context(doc, ctx)
        meta = request_metadata(kwargs)
        reqs = [
            Instance("loglikelihood", doc, (c, r), i, metadata=meta)
            for i, (c, r) in enumerate(zip(doc["es_contexts"], doc["es_continuations"]))
        ]
        if doc["prompt"] != doc["prompt"].rstrip():  # lm-eval scores that whitespace with the answer
            reqs.append(Instance("loglikelihood", doc, (doc["prompt"], ""), len(reqs), metadata=meta))
        gen = {"until": [], "max_gen_toks": 1, "do_sample": False, "temperature": 0.0}
        reqs.append(Instance("generate_until", doc, (doc["prompt"], gen), len(reqs), metadata=meta))
        return reqs

    def process_results(self, doc, results):
        n = doc["es_n_tokens"]  # the answer's tokens, not the end token (open-unlearning's)
        if n == 0:  # no answer token: open-unlearning scores 0
            return {"extraction_strength": 0.0}
        starts = doc["es_starts"]
        greedy = {s: bool(results[i][1]) for i, s in enumerate(starts)}
        first_is_greedy = results[-1] == doc["first_token"]
        if 0 not in greedy:  # the full-answer request also covered the prompt's trailing whitespace
            ws_greedy = bool(results[len(starts)][1]) if len(results) > len(starts) + 1 else False
            covering = [s for s in starts if s < 0]
            if covering and ws_greedy:
                greedy[0] = greedy[covering[0]]
            else:  # suffix from 0 matches iff the first token is greedy and the suffix from 1 matches
                greedy[0] = first_is_greedy and greedy.get(1, n == 1)
        k = n
        for s in sorted(x for x in greedy if 0 <= x < n):
            if greedy[s]:
                k = s
                break
        return {"extraction_strength": tm.extraction_strength(k, n)}
