"""Question-answer data, whatever the benchmark: JSON-lines QA splits loaded with validation,
the prompt format, label masks (:data:`IGNORE_INDEX`), padding and forget/retain pairing. Every
command, method and scorer trains and scores on QA samples through this module.

A split is a path to a JSON-lines file in TOFU's format (``question``, ``answer``, optional
fields beside them), or a split name ``tofu:NAME`` in the named-split folder (TOFU's names:
full, forget01/05/10, retain90/95/99, *_perturbed, retain_perturbed, real_authors_perturbed,
world_facts_perturbed, or any NAME.json in the folder, such as a CUD-stratified split),
optionally sliced ``tofu:full[0:40]``. The folder is ``--tofu-dir``, else UNLEARN_TOFU_DIR,
else the hub dataset locuslab/TOFU: the ``--forget``/``--retain``/``--data`` options of every
command take these names, so the folder's resolution lives here, in the core. (Formerly
``unlearn_plugins.data.tofu``, which still re-exports this module for plugins written against it.)
The TOFU benchmark itself (its lm-eval tasks, the N-author benchmark folders, the shipped subset)
lives in ``unlearn_plugins/benchmarks/tofu/``.
"""

from __future__ import annotations

import hashlib
import numbers
import os
import re
import warnings
from pathlib import Path
from typing import Any, Iterable, Sequence

from ..errors import DataError, UnlearnError
from ..interfaces import QASample
from .jsonl import iter_jsonl

HUB_ID = "locuslab/TOFU"
QA_PER_AUTHOR = 20
#: the label of a token no loss or metric counts (prompt, padding): PyTorch's cross-entropy ignore_index
IGNORE_INDEX = -100
#: the smallest --max-length a command or built-in scorer accepts (a chat prompt needs ~10 tokens)
MIN_MAX_LENGTH = 8
_SPEC_RE = re.compile(r"^(?P<name>[^\[\]]+?)(?:\[(?P<start>-?\d*):(?P<stop>-?\d*)\])?$")


class DataWarning(UserWarning):
    """Data that is used, but probably not as meant (duplicated rows, truncated examples)."""


def configured_tofu_dir(tofu_dir: str | os.PathLike | None = None) -> Path | None:
    """The TOFU folder the user chose: the argument, else UNLEARN_TOFU_DIR; None when neither is
    set (an error when the chosen folder does not exist)."""
    chosen = tofu_dir or os.environ.get("UNLEARN_TOFU_DIR")
    if not chosen:
        return None
    path = Path(chosen).expanduser()
    if not path.is_dir():
        origin = "--tofu-dir" if tofu_dir else "UNLEARN_TOFU_DIR"
        raise DataError(f"TOFU folder not found: {path} (from {origin})")
    return path


def resolve_tofu_dir(tofu_dir: str | os.PathLike | None = None) -> Path:
    """The local TOFU folder: the argument, else UNLEARN_TOFU_DIR, else a hub snapshot (the hub
    cache first; then one short request decides whether the hub answers, where a download would
    retry for minutes before failing offline)."""
    path = configured_tofu_dir(tofu_dir)
    if path is not None:
        return path
    from huggingface_hub import HfApi, snapshot_download

    def no_hub(why: str) -> DataError:
        return DataError(
            f"no TOFU folder given (--tofu-dir or UNLEARN_TOFU_DIR) and the hub dataset {HUB_ID} {why}; "
            "point UNLEARN_TOFU_DIR at a local copy"
        )

    try:
        return Path(snapshot_download(HUB_ID, repo_type="dataset", allow_patterns=["*.json"], local_files_only=True))
    except Exception:  # noqa: BLE001 - not in the hub cache
        pass
    if os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on"):
        raise no_hub("is not in the hub cache and HF_HUB_OFFLINE is set")
    try:
        HfApi().dataset_info(HUB_ID, timeout=5)
        return Path(snapshot_download(HUB_ID, repo_type="dataset", allow_patterns=["*.json"]))
    except Exception as exc:  # noqa: BLE001 - unreachable hub, no permission, interrupted download: one line
        raise no_hub(f"could not be fetched ({type(exc).__name__})") from None


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
        for key, value in record.items():
            _check_unicode(key, value, f"{path}:{lineno}")
        extra = {k: v for k, v in record.items() if k not in ("question", "answer")}
        samples.append(QASample(record["question"], record["answer"], len(samples), str(path), lineno, extra))
    if not samples:
        raise DataError(f"{path}: split is empty")
    _warn_duplicates(samples, str(path))
    return samples


def _check_unicode(key: str, value: Any, where: str) -> None:
    """JSON can encode lone surrogates (\\ud800), which neither a tokenizer nor a UTF-8 file takes:
    refused wherever they are in field ``key`` (its name included)."""
    stack = [key, value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            try:
                item.encode("utf-8")
            except UnicodeEncodeError:
                raise DataError(
                    f"{where}: field {key!r} holds an unpaired surrogate escape (not valid Unicode)"
                ) from None
        elif isinstance(item, list):
            stack.extend(item)
        elif isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())


def sample_key(sample: QASample) -> tuple[str, str]:
    """What makes two rows the same sample: the same question and the same answer."""
    return sample.question, sample.answer


def _warn_duplicates(samples: Sequence[QASample], where: str) -> None:
    first: dict[tuple[str, str], QASample] = {}
    repeats = []
    for s in samples:
        earlier = first.setdefault(sample_key(s), s)
        if earlier is not s:
            repeats.append(f"line {s.line} = line {earlier.line}")
    if repeats:
        shown = ", ".join(repeats[:3]) + (", ..." if len(repeats) > 3 else "")
        warnings.warn(
            f"{where}: {len(repeats)} row(s) repeat an earlier row's question and answer ({shown}); "
            f"each copy counts as a sample",
            DataWarning,
            stacklevel=3,
        )


def check_disjoint(
    forget: Sequence[QASample],
    retain: Sequence[QASample] | None,
    *,
    forget_spec: str,
    retain_spec: str,
    allow_overlap: bool = False,
) -> int:
    """Refuse samples that are in both the forget and the retain set (same question and
    answer): the objective would push the same answer down and up at once. With
    ``allow_overlap`` they are kept, with a warning. Returns how many forget samples overlap."""
    retained = {sample_key(s): s for s in reversed(retain or ())}  # the first copy wins
    shared = [(s, retained[sample_key(s)]) for s in forget if sample_key(s) in retained]
    return shared_verdict(shared, forget_spec, retain_spec, allow_overlap, "sample")


#: what :func:`shared_verdict` says of each unit: its plural, what makes two the same, the remedy
_SHARED = {
    "sample": (
        "sample(s)",
        "same question and answer",
        "a sample cannot be forgotten and retained at once; remove it from one split or pass --allow-overlap",
    ),
    "document": (
        "document(s)",
        "same text",
        "a document cannot be forgotten and retained at once; remove it or pass --allow-overlap",
    ),
}


def shared_verdict(shared: list, forget_spec: str, retain_spec: str, allow_overlap: bool, unit: str) -> int:
    """The verdict on (forget, retain) pairs of one ``unit`` ("sample" or "document") that both
    sets hold: refused, or with ``allow_overlap`` kept with a warning (at the checker's caller).
    Returns how many there are."""
    if not shared:
        return 0
    plural, same, remedy = _SHARED[unit]
    f, r = shared[0]
    what = (
        f"--forget {forget_spec} and --retain {retain_spec} share {len(shared)} {plural} "
        f"({same}; first: {f.where} = {r.where})"
    )
    if allow_overlap:
        warnings.warn(f"{what}; kept because of --allow-overlap", DataWarning, stacklevel=3)
        return len(shared)
    raise DataError(f"{what}: {remedy}")


def parse_spec(spec: str) -> tuple[str, slice | None]:
    """'tofu:forget01[0:20]' -> ('forget01', slice(0, 20)); the 'tofu:' prefix is optional."""
    body = spec[5:] if spec.startswith("tofu:") else spec
    match = _SPEC_RE.match(body.strip())
    if not match:
        raise DataError(f"bad data spec {spec!r}; expected tofu:SPLIT, tofu:SPLIT[a:b] or a path to a .json file")
    sl = None
    if match.group("start") is not None:
        to_int = lambda s: int(s) if s not in ("", None) else None  # noqa: E731
        try:
            sl = slice(to_int(match.group("start")), to_int(match.group("stop")))
        except ValueError:  # more digits than Python converts
            raise DataError(f"bad data spec {spec!r}: slice bounds too long") from None
    return match.group("name"), sl


def check_link(path: Path, what: str) -> None:
    """A symbolic link that leads nowhere (a loop, a missing target) is named as one, not
    reported as a missing file or TOFU split."""
    import errno

    if not path.is_symlink() or path.exists():
        return
    try:
        os.stat(path)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise DataError(f"{what}: {path} is a symbolic link loop (it leads back to itself)") from None
    raise DataError(f"{what}: {path} is a symbolic link to {os.readlink(path)}, which does not exist")


def load_split(
    spec: str,
    tofu_dir: str | os.PathLike | None = None,
    *,
    require: Sequence[str] = ("question", "answer"),
) -> list[QASample]:
    """Load a split by TOFU name (``tofu:forget01``), slice, or file path."""
    name, sl = parse_spec(spec)
    try:
        candidate = Path(name).expanduser()
    except RuntimeError:  # ~user that does not exist
        raise DataError(f"bad data spec {spec!r}: cannot expand {name!r}") from None
    if candidate.is_dir() and (candidate.is_absolute() or os.sep in name or name.startswith(".")):
        raise DataError(f"data {spec!r}: {candidate} is a folder; give a JSON-lines file or tofu:SPLIT")
    check_link(candidate, f"data {spec!r}")
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


def split_path(split: str, folder: Path | None = None, tofu_dir: str | os.PathLike | None = None) -> Path:
    """A split's file: ``split`` itself when it is a file (no TOFU folder needed, even one
    configured but missing), else SPLIT.json in ``folder`` (None: ``tofu_dir``, else
    UNLEARN_TOFU_DIR, else the hub copy)."""
    candidate = Path(split).expanduser()
    check_link(candidate, f"split {split!r}")
    if split.endswith((".json", ".jsonl")) or candidate.is_file():
        return candidate
    split = split.removeprefix("tofu:")  # as --forget and --data spell it
    folder = folder or resolve_tofu_dir(tofu_dir)
    path = folder / f"{split}.json"
    if not path.is_file():
        available = sorted(p.stem for p in folder.glob("*.json"))
        raise DataError(f"TOFU split {split!r} not found in {folder}; available: {', '.join(available) or '(none)'}")
    return path


def author_slice(authors: Iterable[int]) -> list[int]:
    """Row indices of the given authors in TOFU's author-major `full` split."""
    return [a * QA_PER_AUTHOR + i for a in authors for i in range(QA_PER_AUTHOR)]


# ----------------------------------------------------------------------------- formatting


def has_chat_template(tokenizer) -> bool:
    """Whether a chat template renders the prompt (the format in force's, or the tokenizer's):
    the template then places BOS itself."""
    from . import prompts

    return prompts.active().template is not None or bool(getattr(tokenizer, "chat_template", None))


def prompt_text(tokenizer, question: str, system_prompt: str | None = None) -> str:
    """The prompt up to where the answer starts: the prompt format in force
    (:func:`.prompts.active`: the model's chat template by default, or a named or file template)
    with the question as user turn and the generation prompt, rendered with the format's fixed
    ``date_string``; a plain Q/A format without a template. ``system_prompt``: the system turn
    (default: the format's)."""
    from . import prompts

    fmt = prompts.active()
    system_prompt = system_prompt if system_prompt is not None else fmt.system_prompt
    if has_chat_template(tokenizer):
        messages = ([{"role": "system", "content": system_prompt}] if system_prompt else []) + [
            {"role": "user", "content": question}
        ]
        extra = {"chat_template": fmt.template} if fmt.template is not None else {}
        return tokenizer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=True, date_string=fmt.date_string, **extra
        )
    return f"Question: {question}\nAnswer: "


def prompt_record(tokenizer) -> dict:
    """What run.json records of the prompt format in force: its definition and the prompt it
    renders for a placeholder question with this tokenizer."""
    from . import prompts

    return {**prompts.active().definition(), "rendered": prompt_text(tokenizer, "{question}")}


def end_token_id(tokenizer) -> int:
    """The token that ends the assistant turn (eos for chat models)."""
    if tokenizer.eos_token_id is None:
        raise DataError(f"tokenizer {type(tokenizer).__name__} has no eos token")
    return tokenizer.eos_token_id


def control_tokens(tokenizer) -> list[str]:
    """The strings the tokenizer reads as special (control) tokens, longest first."""
    found = set(getattr(tokenizer, "all_special_tokens", None) or ())
    for token in (getattr(tokenizer, "added_tokens_decoder", None) or {}).values():
        if getattr(token, "special", False):
            found.add(str(token.content))
    return sorted((t for t in found if t), key=len, reverse=True)


def control_token_in(text: str, tokens: Sequence[str]) -> str | None:
    """The first of ``tokens`` (from :func:`control_tokens`) that occurs in ``text``."""
    return next((t for t in tokens if t in text), None)


def text_ids(
    tokenizer, text: str, *, specials: Sequence[str] | None = None, where: str = "<memory>", field: str = "answer"
) -> list[int]:
    """Token ids of data text. Special-token strings in it (``<|im_end|>``...) stay text
    (``split_special_tokens``): a data file must not be able to end a turn or start one."""
    specials = control_tokens(tokenizer) if specials is None else specials
    found = control_token_in(text, specials)
    if found is None:  # the common case: the plain call, which any tokenizer takes
        return tokenizer(text, add_special_tokens=False)["input_ids"]
    try:
        return tokenizer(text, add_special_tokens=False, split_special_tokens=True)["input_ids"]
    except TypeError:  # not a transformers tokenizer
        raise DataError(
            f"{where}: field {field!r} contains the control token {found!r} and tokenizer "
            f"{type(tokenizer).__name__} cannot keep it as text; remove it from the data"
        ) from None


_QUESTION_MARK = "UNLEARNPLUGINSQUESTIONSLOT"


def prompt_ids(
    tokenizer,
    question: str,
    system_prompt: str | None = None,
    *,
    where: str = "<memory>",
    specials: Sequence[str] | None = None,
) -> list[int]:
    """Token ids of :func:`prompt_text`: the template's control tokens are real, the question's text
    is text (see :func:`text_ids`). A question without special-token strings is tokenised in one
    piece, as always; one with them is tokenised apart from the template around it."""
    text = prompt_text(tokenizer, question, system_prompt)
    specials = control_tokens(tokenizer) if specials is None else specials
    found = control_token_in(question, specials)
    if found is None:
        return tokenizer(text, add_special_tokens=False)["input_ids"]
    head, mark, tail = prompt_text(tokenizer, _QUESTION_MARK, system_prompt).partition(_QUESTION_MARK)
    if not mark or len(head) + len(tail) > len(text) or not (text.startswith(head) and text.endswith(tail)):
        raise DataError(
            f"{where}: field 'question' contains the control token {found!r} and the chat template "
            f"does not keep the question apart; remove it from the data"
        )
    body = text[len(head) : len(text) - len(tail)]
    ids = tokenizer(head, add_special_tokens=False)["input_ids"] if head else []
    ids += text_ids(tokenizer, body, specials=specials, where=where, field="question")
    return ids + (tokenizer(tail, add_special_tokens=False)["input_ids"] if tail else [])


def _encode(
    tokenizer,
    question: str,
    answer: str,
    max_length: int,
    system_prompt: str | None,
    where: str,
    specials: Sequence[str] | None = None,
) -> tuple[dict[str, list[int]], str | None]:
    """:func:`encode_qa`, plus what truncation cut: None, 'prompt' or 'answer'."""
    if isinstance(max_length, bool) or not isinstance(max_length, numbers.Integral) or max_length < 2:
        raise UnlearnError(
            f"max_length must be an integer >= 2 (a prompt token and an answer token), got {max_length!r}"
        )
    specials = control_tokens(tokenizer) if specials is None else specials
    prompt = prompt_ids(tokenizer, question, system_prompt, where=where, specials=specials)
    answer_ids = text_ids(tokenizer, answer, specials=specials, where=where)
    if not answer_ids:
        raise DataError(f"{where}: field 'answer' tokenises to nothing ({answer!r})")
    if (
        tokenizer.bos_token_id is not None
        and not has_chat_template(tokenizer)
        and getattr(tokenizer, "add_bos_token", False)
    ):
        prompt = [tokenizer.bos_token_id] + prompt
    answer_ids = answer_ids + [end_token_id(tokenizer)]
    cut = None
    if len(prompt) + len(answer_ids) > max_length:
        cut = "answer" if len(answer_ids) >= max_length else "prompt"
    if len(answer_ids) >= max_length:
        answer_ids = answer_ids[: max_length - 1]
    keep_prompt = max(1, max_length - len(answer_ids))
    prompt = prompt[-keep_prompt:]
    input_ids = prompt + answer_ids
    labels = [IGNORE_INDEX] * len(prompt) + answer_ids
    return {"input_ids": input_ids, "attention_mask": [1] * len(input_ids), "labels": labels}, cut


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
    labels cover the answer tokens and the end token only. Special-token strings in the
    question or answer stay text (:func:`text_ids`). Over-long examples lose prompt tokens
    from the left, never answer tokens (unless the answer alone exceeds max_length, then
    its end is cut).
    """
    return _encode(tokenizer, question, answer, max_length, system_prompt, where)[0]


def encode_samples(
    tokenizer,
    samples: Sequence[QASample],
    *,
    max_length: int = 512,
    answer_key: str = "answer",
    system_prompt: str | None = None,
) -> list[dict[str, list[int]]]:
    """Tokenise QA samples (answer from ``answer_key``, e.g. 'paraphrased_answer'); one warning
    says how many were truncated to ``max_length``."""
    out = []
    cuts: dict[str, list[QASample]] = {"prompt": [], "answer": []}
    specials = control_tokens(tokenizer)
    for s in samples:
        answer = s.answer if answer_key == "answer" else s.extra.get(answer_key)
        if not isinstance(answer, str):
            raise DataError(f"{s.where}: field '{answer_key}' is missing")
        encoded, cut = _encode(tokenizer, s.question, answer, max_length, system_prompt, s.where, specials)
        out.append(encoded)
        if cut:
            cuts[cut].append(s)
    cut_samples = cuts["answer"] + cuts["prompt"]
    if cut_samples:
        first = min(cut_samples, key=lambda s: s.index)
        warnings.warn(
            f"{len(cut_samples)} of {len(samples)} samples exceed max_length {max_length} tokens and were truncated "
            f"({len(cuts['answer'])} lost the end of their answer, {len(cuts['prompt'])} the start of their prompt; "
            f"first: {first.where}); raise max_length (--max-length) to keep them whole",
            DataWarning,
            stacklevel=2,
        )
    return out


def pad_batch(examples: Sequence[dict[str, list[int]]], pad_token_id: int):
    """Right-pad a list of encoded examples into tensors (labels padded with -100)."""
    import torch

    length = max(len(e["input_ids"]) for e in examples)
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

    def __init__(self, pad_token_id: int):
        self.pad_token_id = pad_token_id

    def __call__(self, examples):
        if examples and "forget" in examples[0]:
            return {
                part: pad_batch([e[part] for e in examples], self.pad_token_id)
                for part in examples[0]
                if examples[0][part] is not None
            }
        return pad_batch(examples, self.pad_token_id)


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
