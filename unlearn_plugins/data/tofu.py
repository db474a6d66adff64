"""TOFU splits: loading with validation, chat formatting, label masks, padding, pairing.

A split is named ``tofu:NAME`` (TOFU's names: full, forget01/05/10, retain90/95/99,
*_perturbed, retain_perturbed, real_authors_perturbed, world_facts_perturbed, or
any NAME.json in the folder, such as a CUD-stratified split), optionally sliced
``tofu:full[0:40]``; or a path to a JSON-lines file in TOFU's format. The folder is
``--tofu-dir``, else UNLEARN_TOFU_DIR, else the hub dataset locuslab/TOFU.
"""

from __future__ import annotations

import hashlib
import os
import re
from pathlib import Path
from typing import Any, Iterable, Sequence

from ..errors import DataError
from ..interfaces import QASample
from .jsonl import iter_jsonl

HUB_ID = "locuslab/TOFU"
SPLITS = (
    "full", "forget01", "forget05", "forget10", "retain90", "retain95", "retain99",
    "forget01_perturbed", "forget05_perturbed", "forget10_perturbed",
    "retain_perturbed", "real_authors_perturbed", "world_facts_perturbed",
)
QA_PER_AUTHOR = 20
IGNORE_INDEX = -100
_SPEC_RE = re.compile(r"^(?P<name>[^\[\]]+?)(?:\[(?P<start>-?\d*):(?P<stop>-?\d*)\])?$")


def resolve_tofu_dir(tofu_dir: str | os.PathLike | None = None) -> Path:
    """The local TOFU folder: the argument, else UNLEARN_TOFU_DIR, else a hub snapshot."""
    chosen = tofu_dir or os.environ.get("UNLEARN_TOFU_DIR")
    if chosen:
        path = Path(chosen).expanduser()
        if not path.is_dir():
            origin = "--tofu-dir" if tofu_dir else "UNLEARN_TOFU_DIR"
            raise DataError(f"TOFU folder not found: {path} (from {origin})")
        return path
    try:
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(HUB_ID, repo_type="dataset", allow_patterns=["*.json"]))
    except Exception as exc:
        raise DataError(
            f"no TOFU folder given (--tofu-dir or UNLEARN_TOFU_DIR) and the hub dataset {HUB_ID} "
            f"could not be fetched ({type(exc).__name__}); point UNLEARN_TOFU_DIR at a local copy"
        ) from None


def read_jsonl(path: str | os.PathLike, *, require: Sequence[str] = ("question", "answer")) -> list[QASample]:
    """Read a TOFU JSON-lines file; every error names the file, the line and the field."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"{path}: file not found")
    samples: list[QASample] = []
    for lineno, record in iter_jsonl(path):
        if not isinstance(record, dict):
            raise DataError(f"{path}:{lineno}: expected a JSON object, got {type(record).__name__}")
        for key in require:
            if key not in record:
                raise DataError(f"{path}:{lineno}: field '{key}' is missing")
        for key in ("question", "answer"):
            value = record.get(key)
            if not isinstance(value, str) or not value.strip():
                raise DataError(f"{path}:{lineno}: field '{key}' must be a non-empty string")
        if "perturbed_answer" in require:
            pert = record["perturbed_answer"]
            if not isinstance(pert, list) or not pert or not all(isinstance(p, str) and p.strip() for p in pert):
                raise DataError(f"{path}:{lineno}: field 'perturbed_answer' must be a non-empty list of strings")
        extra = {k: v for k, v in record.items() if k not in ("question", "answer")}
        samples.append(QASample(record["question"], record["answer"], len(samples), str(path), lineno, extra))
    if not samples:
        raise DataError(f"{path}: split is empty")
    return samples


def parse_spec(spec: str) -> tuple[str, slice | None]:
    """'tofu:forget01[0:20]' -> ('forget01', slice(0, 20)); the 'tofu:' prefix is optional."""
    body = spec[5:] if spec.startswith("tofu:") else spec
    match = _SPEC_RE.match(body.strip())
    if not match:
        raise DataError(f"bad data spec {spec!r}; expected tofu:SPLIT, tofu:SPLIT[a:b] or a path to a .json file")
    sl = None
    if match.group("start") is not None:
        to_int = lambda s: int(s) if s not in ("", None) else None  # noqa: E731
        sl = slice(to_int(match.group("start")), to_int(match.group("stop")))
    return match.group("name"), sl


def load_split(
    spec: str,
    tofu_dir: str | os.PathLike | None = None,
    *,
    require: Sequence[str] = ("question", "answer"),
) -> list[QASample]:
    """Load a split by TOFU name (``tofu:forget01``), slice, or file path."""
    name, sl = parse_spec(spec)
    candidate = Path(name).expanduser()
    if name.endswith(".json") or name.endswith(".jsonl") or candidate.is_file():
        path = candidate
    else:
        folder = resolve_tofu_dir(tofu_dir)
        path = folder / f"{name}.json"
        if not path.is_file():
            available = sorted(p.stem for p in folder.glob("*.json"))
            raise DataError(f"split {name!r} not found in {folder}; available: {', '.join(available) or '(none)'}")
    samples = read_jsonl(path, require=require)
    if sl is not None:
        samples = samples[sl]
        if not samples:
            raise DataError(f"{path}: the slice in {spec!r} selects no samples (split has {len(read_jsonl(path))})")
    return samples


def author_slice(authors: Iterable[int]) -> list[int]:
    """Row indices of the given authors in TOFU's author-major `full` split."""
    return [a * QA_PER_AUTHOR + i for a in authors for i in range(QA_PER_AUTHOR)]


# ----------------------------------------------------------------------------- formatting

def _has_chat_template(tokenizer) -> bool:
    return bool(getattr(tokenizer, "chat_template", None))


def prompt_text(tokenizer, question: str, system_prompt: str | None = None) -> str:
    """The prompt up to where the answer starts: the model's chat template with the
    question as user turn and the generation prompt; a plain Q/A format without a template."""
    if _has_chat_template(tokenizer):
        messages = ([{"role": "system", "content": system_prompt}] if system_prompt else []) + [
            {"role": "user", "content": question}
        ]
        return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return f"Question: {question}\nAnswer: "


def end_token_id(tokenizer) -> int:
    """The token that ends the assistant turn (eos for chat models)."""
    if tokenizer.eos_token_id is None:
        raise DataError(f"tokenizer {type(tokenizer).__name__} has no eos token")
    return tokenizer.eos_token_id


def encode_qa(
    tokenizer,
    question: str,
    answer: str,
    *,
    max_length: int = 512,
    system_prompt: str | None = None,
    where: str = "<memory>",
) -> dict[str, list[int]]:
    """input_ids / attention_mask / labels for one QA pair.

    Prompt and answer are tokenised separately so the label boundary is exact;
    labels cover the answer tokens and the end token only. Over-long examples
    lose prompt tokens from the left, never answer tokens (unless the answer alone
    exceeds max_length, then its end is cut).
    """
    prompt_ids = tokenizer(prompt_text(tokenizer, question, system_prompt), add_special_tokens=False)["input_ids"]
    answer_ids = tokenizer(answer, add_special_tokens=False)["input_ids"]
    if not answer_ids:
        raise DataError(f"{where}: field 'answer' tokenises to nothing ({answer!r})")
    if tokenizer.bos_token_id is not None and not _has_chat_template(tokenizer) and getattr(tokenizer, "add_bos_token", False):
        prompt_ids = [tokenizer.bos_token_id] + prompt_ids
    answer_ids = answer_ids + [end_token_id(tokenizer)]
    if len(answer_ids) >= max_length:
        answer_ids = answer_ids[: max_length - 1]
    keep_prompt = max(1, max_length - len(answer_ids))
    prompt_ids = prompt_ids[-keep_prompt:]
    input_ids = prompt_ids + answer_ids
    labels = [IGNORE_INDEX] * len(prompt_ids) + answer_ids
    return {"input_ids": input_ids, "attention_mask": [1] * len(input_ids), "labels": labels}


def encode_samples(tokenizer, samples: Sequence[QASample], *, max_length: int = 512, answer_key: str = "answer",
                   system_prompt: str | None = None) -> list[dict[str, list[int]]]:
    """Tokenise QA samples (answer from ``answer_key``, e.g. 'paraphrased_answer')."""
    out = []
    for s in samples:
        answer = s.answer if answer_key == "answer" else s.extra.get(answer_key)
        if not isinstance(answer, str):
            raise DataError(f"{s.where}: field '{answer_key}' is missing")
        out.append(encode_qa(tokenizer, s.question, answer, max_length=max_length,
                             system_prompt=system_prompt, where=s.where))
    return out


def pad_batch(examples: Sequence[dict[str, list[int]]], pad_token_id: int, *, pad_to_multiple_of: int | None = None):
    """Right-pad a list of encoded examples into tensors (labels padded with -100)."""
    import torch

    length = max(len(e["input_ids"]) for e in examples)
    if pad_to_multiple_of:
        length = -(-length // pad_to_multiple_of) * pad_to_multiple_of
    ids = torch.full((len(examples), length), pad_token_id, dtype=torch.long)
    mask = torch.zeros((len(examples), length), dtype=torch.long)
    labels = torch.full((len(examples), length), IGNORE_INDEX, dtype=torch.long)
    for i, e in enumerate(examples):
        n = len(e["input_ids"])
        ids[i, :n] = torch.tensor(e["input_ids"])
        mask[i, :n] = torch.tensor(e["attention_mask"])
        labels[i, :n] = torch.tensor(e["labels"])
    return {"input_ids": ids, "attention_mask": mask, "labels": labels}


class PaddingCollator:
    """Right-padding collator for encoded examples (or forget/retain pairs)."""

    def __init__(self, pad_token_id: int, pad_to_multiple_of: int | None = None):
        self.pad_token_id = pad_token_id
        self.pad_to_multiple_of = pad_to_multiple_of

    def __call__(self, examples):
        if examples and "forget" in examples[0]:
            return {
                part: pad_batch([e[part] for e in examples], self.pad_token_id, pad_to_multiple_of=self.pad_to_multiple_of)
                for part in examples[0]
                if examples[0][part] is not None
            }
        return pad_batch(examples, self.pad_token_id, pad_to_multiple_of=self.pad_to_multiple_of)


def draw_index(n: int, *key: Any) -> int:
    """A uniform draw from range(n) that is a pure function of ``key`` (a hash, not an RNG
    state), so every process, rerun and resumed run draws the same index for the same key."""
    digest = hashlib.sha256(":".join(map(str, key)).encode()).digest()
    return int.from_bytes(digest[:8], "big") % n


class ForgetRetainPairs:
    """Forget-anchored pairs: item i is forget example i with a random retain example.

    One epoch = len(forget). As in the reference implementations, which draw a fresh
    partner on every access, the partner is redrawn every epoch; it is a pure function of
    (seed, epoch, i) (see ``partner_index``), so a resumed run, or another process, pairs
    exactly as an uninterrupted run does. The trainer calls ``set_epoch`` when an epoch starts.
    """

    def __init__(self, forget: Sequence[dict], retain: Sequence[dict] | None, seed: int = 0):
        if not forget:
            raise DataError("the forget split is empty: nothing to unlearn")
        self.forget = list(forget)
        self.retain = list(retain) if retain else []
        self.seed = seed
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = int(epoch)

    def partner_index(self, i: int, epoch: int | None = None) -> int | None:
        """The retain example paired with forget example ``i`` in ``epoch`` (default: the current one)."""
        if not self.retain:
            return None
        return draw_index(len(self.retain), "retain", self.seed, self.epoch if epoch is None else epoch, i)

    def __len__(self) -> int:
        return len(self.forget)

    def __getitem__(self, i: int) -> dict[str, Any]:
        return {"forget": self.forget[i], "retain": self.retain[self.partner_index(i)] if self.retain else None}
