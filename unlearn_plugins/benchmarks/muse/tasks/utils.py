"""MUSE (Shi et al. 2024) as lm-eval tasks: VerbMem, KnowMem (forget, retain) and PrivLeak.

Data: a local copy of the hub dataset ``muse-bench/MUSE-News`` or ``muse-bench/MUSE-Books``
in the MUSE repository's layout (``constants.DEFAULT_DATA``), under ``UNLEARN_MUSE_DIR`` (or task
metadata ``muse_dir``): ``news/verbmem/forget.json``, ``news/knowmem/{forget,retain}_qa[_icl].json``,
``news/privleak/{forget,holdout}.json``, the same under ``books/``. docs/data.md says how to
write the folder from the hub.

Metrics follow the MUSE reference (swj0419/muse_bench at commit
fcd6651da8bcf34744fb9a1cc69bb856ab3eb277: ``eval.py``, ``constants.py``, ``metrics/verbmem.py``,
``metrics/knowmem.py``, ``metrics/privleak.py``, ``metrics/logger.py``): VerbMem is ROUGE-L F1
(rouge-score, unstemmed) of the greedy continuation of the stored prompt over 128 new tokens
against the true continuation cut to its first 128 tokens; KnowMem is ROUGE-L F1 of the greedy
answer (32 new tokens, cut before "\n\n", "\nQuestion", "Question:") after the in-context QA
pairs; PrivLeak is the Min-40% AUC of forget vs holdout passages relative to the retain model's
AUC, in percent. docs/methods.md, "MUSE metrics", names each line checked.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

import lm_eval.api.metrics  # noqa: F401 - lm-eval's own metrics first (its registry fills itself only while empty)
from lm_eval.api import registry as lm_eval_registry
from lm_eval.api.instance import Instance
from lm_eval.api.task import ConfigurableTask

from unlearn_plugins.errors import DataError
from unlearn_plugins.evaluation import mia
from unlearn_plugins.evaluation.lm_eval_requests import (
    decode_ids,
    encode_ids,
    metadata_tokenizer,
    mia_requests,
    request_metadata,
    token_logprobs,
    token_plan,
)
from unlearn_plugins.evaluation.metrics_reference import reference_value

log = logging.getLogger(__name__)


def _per_document(items):
    """The values process_results gave, as lm-eval's own passthrough metrics (``acc``) have it."""
    return items


# The YAMLs' metric names, registered: lm-eval looks an unknown one up in HF `evaluate`, whose load
# retries the hub with sleeps when offline (~1.5 s a metric and task, every time a task is built).
for _name in ("rougeL_f1", "rougeL_recall"):
    if _name not in lm_eval_registry.metric_registry:  # lm-eval may execute this file more than once
        lm_eval_registry.register_metric(metric=_name)(_per_document)

ENV = "UNLEARN_MUSE_DIR"
RETAIN_AUC_ENV = "UNLEARN_MUSE_RETAIN_AUC"
HUB = {"news": "muse-bench/MUSE-News", "books": "muse-bench/MUSE-Books"}
MIN_K = 0.4
#: the reference's ``verbmem_max_new_tokens`` (eval.py): new tokens, and the true continuation's cut
VERBMEM_TOKENS = 128
#: metrics/knowmem.py ``get_prefix_before_words_occur(output, [...])``: the answer is cut before each
KNOWMEM_STOP = ("\n\n", "\nQuestion", "Question:")
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


def verbmem_dataset(
    *,
    corpus: str,
    muse_dir: str | None = None,
    **metadata: Any,
):
    """The forget prompts and true continuations, each continuation with its token ids as the
    reference encodes it (``tokenizer(gt, add_special_tokens=True)``, metrics/verbmem.py): the
    task cuts them to its number of new tokens (:class:`MuseVerbMemTask`)."""
    path = corpus_dir(corpus, muse_dir) / "verbmem" / "forget.json"
    data = read_json_list(path)
    tok = metadata_tokenizer(metadata)
    rows = []
    for i, r in enumerate(data):
        prompt, gt = _field(path, i, r, "prompt"), _field(path, i, r, "gt")
        rows.append({"prompt": prompt, "gt": gt, "gt_ids": list(tok(gt, add_special_tokens=True).input_ids)})
    return _dataset(rows)


def verbmem_truth(tok, gt_ids: list[int], max_new_tokens: int) -> str:
    """The true continuation as the reference scores it (metrics/verbmem.py): its first
    ``max_new_tokens`` ids (special tokens included, as the reference counts them), decoded
    without special tokens. The reference also asks for ``clean_up_tokenization_spaces``, which
    only rewrites spaced forms (" n't", " ." ...) that ROUGE's tokenizer ignores or natural text
    lacks, and which transformers 5 ignores for BPE tokenizers: not asked here."""
    return tok.decode(list(gt_ids[:max_new_tokens]), skip_special_tokens=True, clean_up_tokenization_spaces=False)


def knowmem_prompt(question: str, icl: list[tuple[str, str]]) -> str:
    """The few-shot prompt of metrics/knowmem.py: each in-context pair as
    ``Question: q\nAnswer: a\n\n``, then ``Question: q\nAnswer: `` (with its trailing space)."""
    shots = "".join(f"Question: {q}\nAnswer: {a}\n\n" for q, a in icl)
    return f"{shots}Question: {question}\nAnswer: "


def knowmem_answer(output: str) -> str:
    """The generated answer as metrics/knowmem.py keeps it: cut before each of ``KNOWMEM_STOP``
    in turn (``get_prefix_before_words_occur``)."""
    for word in KNOWMEM_STOP:
        output = output.split(word)[0]
    return output


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
    **metadata: Any,
):
    """Forget and holdout passages, interleaved (so --limit keeps about as many of each), each with
    the requests that give every token's log-probability (:func:`unlearn_plugins.evaluation.lm_eval_requests.token_plan`)."""
    folder = corpus_dir(corpus, muse_dir) / "privleak"
    tok = metadata_tokenizer(metadata)
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


def scores_first_token(tok, text: str, ids: list[int]) -> bool:
    """Whether the reference scores the passage's first token: metrics/privleak.py scores
    ``tokenizer.encode(text)[1:]``, so the first text token only when the tokenizer puts a special
    token (Llama's BOS) before it."""
    added = list(tok.encode(text))
    return len(added) > len(ids) and added[len(added) - len(ids) :] == ids


def _privleak_doc(tok, member: str, where: str, text: str) -> dict:
    ids = encode_ids(tok, text)
    if len(ids) < 2:
        raise DataError(f"{where}: a privleak passage needs at least two tokens")
    # The first token is the context of the per-token requests (lm-eval cannot score a token
    # without one); when the tokenizer adds a BOS, the reference scores it too, given the BOS:
    # lm-eval's empty context is that BOS (its prefix token), so one more request ("", first).
    first = decode_ids(tok, ids[:1])
    if not text.startswith(first):
        raise DataError(f"{where}: the passage's first token does not decode to its first characters")
    plan = token_plan(tok, first, text[len(first) :], where)
    return {"member": member, "where": where, "text": text, "score_first": scores_first_token(tok, text, ids), **plan}


# ----------------------------------------------------------------------------- metrics


def rouge_l(reference: str, generation: str, *, stemmer: bool = False) -> dict[str, float]:
    """ROUGE-L F1 and recall (rouge-score; unstemmed as metrics/logger.py's
    ``RougeScorer(..., use_stemmer=False)``; ``stemmer``: task metadata ``rouge_stemmer``,
    open-unlearning's stemmed ROUGE)."""
    from rouge_score import rouge_scorer

    s = rouge_scorer.RougeScorer(["rougeL"], use_stemmer=bool(stemmer)).score(reference, generation)["rougeL"]
    return {"rougeL_f1": s.fmeasure, "rougeL_recall": s.recall}


def _stemmer(metadata: dict | None) -> bool:
    value = (metadata or {}).get("rouge_stemmer", False)
    if isinstance(value, str):
        value = value.strip().lower() in ("1", "true", "yes")
    return bool(value)


class MuseVerbMemTask(ConfigurableTask):
    """VerbMem: ROUGE-L of the greedy continuation against the true continuation cut to the
    task's number of new tokens (``max_gen_toks``: the reference's 128, or ``--max-gen-toks``'s
    cap, the reference cutting both with one ``max_new_tokens``)."""

    def __init__(self, config: dict | None = None, **kwargs):
        config = {k: v for k, v in (config or {}).items() if k != "class"}
        super().__init__(config=config, **kwargs)
        self._tok = None

    def _tokenizer(self):
        if self._tok is None:
            self._tok = metadata_tokenizer(self.config.metadata or {})
        return self._tok

    def process_results(self, doc, results):
        n = int((self.config.generation_kwargs or {}).get("max_gen_toks") or VERBMEM_TOKENS)
        truth = verbmem_truth(self._tokenizer(), doc["gt_ids"], n)
        return rouge_l(truth, results[0], stemmer=_stemmer(self.config.metadata))


class MuseKnowMemTask(ConfigurableTask):
    """KnowMem: ROUGE-L of the answer, cut as the reference cuts it, against the true answer."""

    def __init__(self, config: dict | None = None, **kwargs):
        config = {k: v for k, v in (config or {}).items() if k != "class"}
        super().__init__(config=config, **kwargs)

    def process_results(self, doc, results):
        return rouge_l(doc["answer"], knowmem_answer(results[0]), stemmer=_stemmer(self.config.metadata))


def privleak_value(auc_model: float, auc_retain: float) -> float:
    """MUSE's PrivLeak in percent, (AUC - AUC_retain) / AUC_retain * 100 with MUSE's AUC (forget
    members scoring as training data give AUC near 0, so a model that still knows the forget set
    is near -100); this project's AUC is 1 - MUSE's, :func:`mia.privleak` converts."""
    return mia.privleak(auc_model, auc_retain)


def retain_auc(corpus: str, metadata: dict, task: str | None = None) -> tuple[float, str]:
    """(the retain model's AUC, where it came from): metadata ``retain_auc``, else the retain
    reference (``unlearn eval --save-reference`` on the retain model, metadata ``retain_reference``,
    which ``--retain-reference`` sets) holding ``task``'s ``auc_min_k``, else the environment
    variable, else the reference's published value for MUSE's own retrained model."""
    found = reference_value(metadata.get("retain_reference"), task, "auc_min_k") if task else None
    for value, source in (
        (metadata.get("retain_auc"), "metadata retain_auc"),
        *([(found[0], f"retain reference {found[1]}")] if found else []),
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
        meta = request_metadata(kwargs)
        requests = mia_requests(doc, meta)
        if doc.get("score_first"):  # log p(first token | BOS): lm-eval's empty context is its prefix token
            requests.append(Instance("loglikelihood", doc, ("", doc["score_prompt"]), len(requests), metadata=meta))
        return requests

    def process_results(self, doc, results):
        results = list(results)
        head = [float(results.pop()[0])] if doc.get("score_first") else []
        logps, _ = token_logprobs(doc, results)
        score = mia.min_k_score(head + logps, self.k)
        return {name: [doc["member"], score] for name in self.METRICS}

    def _auc(self, items) -> float:
        return mia.auc([s for m, s in items if m == "forget"], [s for m, s in items if m == "holdout"])

    def _privleak(self, items) -> float:
        ref, source = retain_auc(self.corpus, self.config.metadata or {}, self.config.task)
        log.info("%s: the retain model's AUC %.4f from %s", self.config.task, ref, source)
        return privleak_value(self._auc(items), ref)

    def aggregation(self):
        return {"auc_min_k": self._auc, "privleak": self._privleak}

    def higher_is_better(self):
        return dict(self.METRICS)
