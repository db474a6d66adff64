"""MUSE (Shi et al. 2024) as lm-eval tasks: VerbMem, KnowMem (forget, retain) and PrivLeak.

Data: a local copy of the hub dataset ``muse-bench/MUSE-News`` or ``muse-bench/MUSE-Books``
in the MUSE repository's layout (``constants.DEFAULT_DATA``), under ``UNLEARN_MUSE_DIR`` (or task
metadata ``muse_dir``): ``news/verbmem/forget.json``, ``news/knowmem/{forget,retain}_qa[_icl].json``,
``news/privleak/{forget,holdout}.json``, the same under ``books/``. docs/data.md says how to
write the folder from the hub.

Metrics follow the MUSE reference ``eval.py`` (swj0419/muse_bench): VerbMem is ROUGE-L F1 of the
greedy continuation of the stored prompt (the first 32 tokens of a forget passage) over 128 new
tokens against the true continuation; KnowMem is ROUGE-L F1 of the greedy answer (32 new tokens)
after the in-context QA pairs; PrivLeak is the Min-40% AUC of forget vs holdout passages relative
to the retain model's AUC, in percent.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

from lm_eval.api.task import ConfigurableTask

from unlearn_plugins.errors import DataError
from unlearn_plugins.evaluation import mia
from unlearn_plugins.evaluation.mia_tasks import mia_requests, token_logprobs, token_plan
from unlearn_plugins.evaluation.tofu_tasks import decode_ids, encode_ids, request_metadata, resolve_tokenizer

log = logging.getLogger(__name__)

ENV = "UNLEARN_MUSE_DIR"
RETAIN_AUC_ENV = "UNLEARN_MUSE_RETAIN_AUC"
HUB = {"news": "muse-bench/MUSE-News", "books": "muse-bench/MUSE-Books"}
MIN_K = 0.4
# The reference's AUC_RETRAIN["forget_holdout_Min-40%"] (constants.py; MUSE's retrained
# Llama-2-7B models), stated here as this project's AUC (forget 0, holdout 1) = 1 - MUSE's AUC.
PUBLISHED_RETAIN_AUC = {"news": 1.0 - 0.47719999999999996, "books": 1.0 - 0.5392999999999999}


# ----------------------------------------------------------------------------- data


def corpus_dir(corpus: str, muse_dir: str | os.PathLike | None = None) -> Path:
    """``<muse_dir>/<corpus>``; a one-line error naming what to download and where when absent."""
    chosen = muse_dir or os.environ.get(ENV)
    hint = f"download {HUB[corpus]} (see docs/data.md, MUSE) into a folder and set {ENV} (or metadata 'muse_dir') to it"
    if not chosen:
        raise DataError(f"MUSE {corpus}: no data folder; {hint}")
    path = Path(chosen).expanduser() / corpus
    if not path.is_dir():
        raise DataError(f"MUSE {corpus}: {path} not found; {hint}")
    return path


def read_json_list(path: Path) -> list:
    """A JSON file holding a list (the MUSE repository's data files)."""
    if not path.is_file():
        raise DataError(f"{path}: file not found (MUSE layout, see docs/data.md)")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise DataError(f"{path}:{exc.lineno}: not valid JSON ({exc.msg})") from None
    if not isinstance(data, list) or not data:
        raise DataError(f"{path}: expected a non-empty JSON list")
    return data


def _field(path: Path, i: int, rec: Any, key: str) -> str:
    if not isinstance(rec, dict) or not isinstance(rec.get(key), str):
        raise DataError(f"{path}: item {i}: field '{key}' missing or not a string")
    return rec[key]


def _text(path: Path, i: int, rec: Any) -> str:
    if isinstance(rec, str):
        return rec
    return _field(path, i, rec, "text")


def _dataset(rows: list[dict]):
    import datasets

    return datasets.DatasetDict({"test": datasets.Dataset.from_list(rows)})


def verbmem_dataset(*, corpus: str, muse_dir: str | None = None, **_other: Any):
    path = corpus_dir(corpus, muse_dir) / "verbmem" / "forget.json"
    data = read_json_list(path)
    return _dataset(
        [{"prompt": _field(path, i, r, "prompt"), "gt": _field(path, i, r, "gt")} for i, r in enumerate(data)]
    )


def knowmem_prompt(question: str, icl: list[tuple[str, str]]) -> str:
    """The few-shot prompt: each in-context pair, then the question."""
    shots = "".join(f"Question: {q}\nAnswer: {a}\n\n" for q, a in icl)
    return f"{shots}Question: {question}\nAnswer:"


def knowmem_dataset(*, corpus: str, part: str, muse_dir: str | None = None, **_other: Any):
    folder = corpus_dir(corpus, muse_dir) / "knowmem"
    qa_path, icl_path = folder / f"{part}_qa.json", folder / f"{part}_qa_icl.json"
    icl = [
        (_field(icl_path, i, r, "question"), _field(icl_path, i, r, "answer"))
        for i, r in enumerate(read_json_list(icl_path))
    ]
    rows = []
    for i, r in enumerate(read_json_list(qa_path)):
        q, a = _field(qa_path, i, r, "question"), _field(qa_path, i, r, "answer")
        rows.append({"question": q, "answer": a, "prompt": knowmem_prompt(q, icl)})
    return _dataset(rows)


def privleak_dataset(
    *,
    corpus: str,
    muse_dir: str | None = None,
    tokenizer: Any = None,
    pretrained: Any = None,
    trust_remote_code: Any = False,
    **_other: Any,
):
    """Forget and holdout passages, interleaved (so --limit keeps about as many of each), each with
    the requests that give every token's log-probability (:func:`mia_tasks.token_plan`)."""
    folder = corpus_dir(corpus, muse_dir) / "privleak"
    tok = resolve_tokenizer(tokenizer, pretrained, trust_remote_code)
    parts = {}
    for member in ("forget", "holdout"):
        path = folder / f"{member}.json"
        parts[member] = [(f"{path}: item {i}", _text(path, i, r)) for i, r in enumerate(read_json_list(path))]
    rows = []
    for i in range(max(len(parts["forget"]), len(parts["holdout"]))):
        for member in ("forget", "holdout"):
            if i < len(parts[member]):
                where, text = parts[member][i]
                rows.append(_privleak_doc(tok, member, where, text))
    return _dataset(rows)


def _privleak_doc(tok, member: str, where: str, text: str) -> dict:
    ids = encode_ids(tok, text)
    if len(ids) < 2:
        raise DataError(f"{where}: a privleak passage needs at least two tokens")
    # The first token is the context (lm-eval cannot score a token without one, and an empty
    # context gets a different prefix token); every later token is scored.
    first = decode_ids(tok, ids[:1])
    if not text.startswith(first):
        raise DataError(f"{where}: the passage's first token does not decode to its first characters")
    plan = token_plan(tok, first, text[len(first) :], where)
    return {"member": member, "where": where, "text": text, **plan}


# ----------------------------------------------------------------------------- metrics


def rouge_l(reference: str, generation: str) -> dict[str, float]:
    """ROUGE-L F1 and recall (rouge-score, stemmed as open-unlearning's MUSE ROUGE)."""
    from rouge_score import rouge_scorer

    s = rouge_scorer.RougeScorer(["rougeL"], use_stemmer=True).score(reference, generation)["rougeL"]
    return {"rougeL_f1": s.fmeasure, "rougeL_recall": s.recall}


def verbmem_results(doc, results):
    return rouge_l(doc["gt"], results[0])


def knowmem_results(doc, results):
    return rouge_l(doc["answer"], results[0])


def privleak_value(auc_model: float, auc_retain: float) -> float:
    """MUSE's PrivLeak in percent, (AUC - AUC_retain) / AUC_retain * 100 with MUSE's AUC (forget
    members scoring as training data give AUC near 0, so a model that still knows the forget set
    is near -100); this project's AUC is 1 - MUSE's, :func:`mia.privleak` converts."""
    return mia.privleak(auc_model, auc_retain)


def retain_auc(corpus: str, metadata: dict) -> tuple[float, str]:
    """(the retain model's AUC, where it came from): metadata ``retain_auc``, else the environment
    variable, else the reference's published value for MUSE's own retrained model."""
    for value, source in (
        (metadata.get("retain_auc"), "metadata retain_auc"),
        (os.environ.get(RETAIN_AUC_ENV), RETAIN_AUC_ENV),
    ):
        if value not in (None, ""):
            try:
                auc = float(value)
            except ValueError:
                raise DataError(f"{source}: not a number: {value!r}") from None
            if not 0 < auc < 1:
                raise DataError(f"{source}: the retain model's AUC must be in (0, 1), got {auc}")
            return auc, source
    return PUBLISHED_RETAIN_AUC[corpus], "the reference's AUC_RETRAIN (MUSE's retrained Llama-2-7B)"


class MusePrivLeakTask(ConfigurableTask):
    """Min-K% (k = 0.4) AUC of forget (0) vs holdout (1) passages and MUSE's PrivLeak."""

    METRICS = {"auc_min_k": False, "privleak": False}

    def __init__(self, config: dict | None = None, **kwargs):
        config = {k: v for k, v in (config or {}).items() if k != "class"}
        super().__init__(config=config, **kwargs)
        self.corpus = (self.config.dataset_kwargs or {}).get("corpus", "news")
        self.k = float((self.config.metadata or {}).get("mia_k", MIN_K))

    def doc_to_text(self, doc, doc_to_text=None):
        return doc["score_prompt"]

    def doc_to_target(self, doc, doc_to_target=None):
        return doc["score_continuation"]

    def construct_requests(self, doc, ctx, **kwargs):
        return mia_requests(doc, request_metadata(kwargs))

    def process_results(self, doc, results):
        logps, _ = token_logprobs(doc, results)
        score = mia.min_k_score(logps, self.k)
        return {name: [doc["member"], score] for name in self.METRICS}

    def _auc(self, items) -> float:
        return mia.auc([s for m, s in items if m == "forget"], [s for m, s in items if m == "holdout"])

    def _privleak(self, items) -> float:
        ref, source = retain_auc(self.corpus, self.config.metadata or {})
        log.info("%s: the retain model's AUC %.4f from %s", self.config.task, ref, source)
        return privleak_value(self._auc(items), ref)

    def aggregation(self):
        return {"auc_min_k": self._auc, "privleak": self._privleak}

    def higher_is_better(self):
        return dict(self.METRICS)
