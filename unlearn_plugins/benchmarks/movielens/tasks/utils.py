"""MovieLens as lm-eval tasks: ``movielens_rec`` (test interactions of the retained users)
and ``movielens_rec_forget`` (the forgotten users' interactions).

Each document is one prompt, formatted with the model's chat template as in training (the
tokenizer comes from task metadata ``tokenizer`` or ``pretrained``, as for the TOFU tasks),
and asks lm-eval for two log-likelihoods: of "Yes" and of "No" after the prompt. P(Yes) /
(P(Yes) + P(No)) then gives AUC, LogLoss and accuracy (:mod:`unlearn_plugins.benchmarks.movielens.tasks.metrics`),
and on the forget task the JSD to a retrained model's predictions (metadata
``retrain_reference``: a prediction reference file).

Where the documents come from (task metadata, or ``--metadata`` with lm_eval):

* ``rec_dir``: a benchmark folder written by :meth:`~.benchmark.RecBenchmark.write`;
* else the default benchmark built from MovieLens (``movielens_dir``, else
  ``UNLEARN_MOVIELENS_DIR``, else recbole's wheel), cut by any
  :class:`~.benchmark.BenchmarkSettings` field given as metadata (``forget_fraction``, ``seed``, ...).

``forget_part`` chooses the forget task's documents: ``train_forget`` (default: the
interactions the request removes, as E2URec evaluates forgetting), ``test_forget``, or a
JSON-lines file of benchmark prompts (e.g. `unlearn stratify --group-by user_id`'s easy.json).
Tasks are lm-eval "class" tasks; their YAML files are beside this module.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from functools import lru_cache
from typing import Any

from lm_eval.api.instance import Instance
from lm_eval.api.metrics import mean

from unlearn_plugins.errors import DataError
from unlearn_plugins.evaluation.lm_eval_requests import PromptTask, metadata_tokenizer, request_metadata
from unlearn_plugins.evaluation.reference import sample_key

from ..prompts import NO, YES
from . import metrics as rm

log = logging.getLogger(__name__)

#: dataset_kwargs.rec_split value that means "the part named by metadata forget_part"
FORGET_PLACEHOLDER = "@forget"
FORGET_PARTS = ("train_forget", "test_forget")


@lru_cache(maxsize=2)
def _default_benchmark(folder: str | None, settings: tuple):
    from ..benchmark import BenchmarkSettings, build_benchmark
    from ..data import load_movielens

    return build_benchmark(load_movielens(folder), BenchmarkSettings(**dict(settings)))


def benchmark_samples(
    part: str, *, rec_dir: str | None = None, movielens_dir: str | None = None, settings: dict[str, Any] | None = None
) -> list:
    """The samples of one part: from a benchmark folder, else from the default benchmark."""
    from ..benchmark import FILES, BenchmarkSettings, load_part

    if part not in FILES:
        raise DataError(f"unknown MovieLens benchmark part {part!r}; parts: {', '.join(FILES)}")
    if rec_dir:
        if settings:
            raise DataError(
                f"metadata {sorted(settings)} cut the default benchmark; a benchmark folder (rec_dir "
                f"{rec_dir}) was cut when it was written: give one or the other"
            )
        return load_part(os.path.expanduser(str(rec_dir)), part)
    known = {f.name for f in dataclasses.fields(BenchmarkSettings)}
    bad = sorted(set(settings or {}) - known)
    if bad:
        raise DataError(f"unknown benchmark setting(s) {bad}; known: {', '.join(sorted(known))}")
    folder = str(movielens_dir) if movielens_dir else os.environ.get("UNLEARN_MOVIELENS_DIR") or None
    return _default_benchmark(folder, tuple(sorted((settings or {}).items()))).parts[part]


def _is_file(value: Any) -> bool:
    text = str(value)
    return text.endswith((".json", ".jsonl")) or os.path.isfile(os.path.expanduser(text))


def movielens_dataset(
    *,
    rec_split: str = "test_retain",
    forget_part: str = "train_forget",
    rec_dir: str | None = None,
    movielens_dir: str | None = None,
    system_prompt: str | None = None,
    **metadata: Any,
):
    """lm-eval ``custom_dataset``: one benchmark part as a DatasetDict {"test": ...} of
    documents with the chat-formatted prompt, the answer and its label."""
    import datasets

    from unlearn_plugins.data.qa import control_token_in, control_tokens, prompt_text

    from ..benchmark import BenchmarkSettings

    known = {f.name for f in dataclasses.fields(BenchmarkSettings)}
    settings = {k: v for k, v in metadata.items() if k in known}
    if rec_split == FORGET_PLACEHOLDER and _is_file(forget_part):
        from unlearn_plugins.data.qa import read_jsonl

        rec_split = str(forget_part)
        samples = read_jsonl(os.path.expanduser(rec_split))
    else:
        if rec_split == FORGET_PLACEHOLDER:
            if forget_part not in FORGET_PARTS:
                raise DataError(
                    f"metadata 'forget_part' must be one of {', '.join(FORGET_PARTS)} or a JSON-lines "
                    f"file of benchmark prompts, got {forget_part!r}"
                )
            rec_split = forget_part
        samples = benchmark_samples(rec_split, rec_dir=rec_dir, movielens_dir=movielens_dir, settings=settings)
    tok = metadata_tokenizer(metadata)
    specials = control_tokens(tok)
    docs = []
    for s in samples:
        if s.answer not in (YES, NO):
            raise DataError(f"{s.where}: answer {s.answer!r} is neither {YES!r} nor {NO!r}")
        found = control_token_in(s.question, specials)
        if found:
            raise DataError(
                f"{s.where}: the prompt contains the tokenizer's control token {found!r}, which lm-eval "
                f"would read as a control token, not text"
            )
        docs.append(
            {
                "key": doc_key(s),
                "split": rec_split,
                "where": s.where,
                "user_id": int(s.extra.get("user_id", -1)),
                "answer": s.answer,
                "label": int(s.answer == YES),
                "question": s.question,
                "prompt": prompt_text(tok, s.question, system_prompt),
            }
        )
    if not docs:
        raise DataError(f"MovieLens part {rec_split!r} has no samples")
    return datasets.DatasetDict({"test": datasets.Dataset.from_list(docs)})


def doc_key(sample) -> str:
    """A sample's id in reference files: its prompt, answer, user, movie and time (two users may
    share a prompt and an answer)."""
    e = sample.extra
    return sample_key(sample.question, f"{sample.answer}|{e.get('user_id')}|{e.get('item_id')}|{e.get('timestamp')}")


class MovieLensRecTask(PromptTask):
    """P(Yes) from two log-likelihoods; AUC, LogLoss and accuracy over the corpus."""

    OUTPUT_TYPE = "loglikelihood"
    METRICS = {"auc": True, "logloss": False, "acc": True}
    PROMPT_OWNER = "the MovieLens tasks"

    def construct_requests(self, doc, ctx, **kwargs):
        self._check_context(doc, ctx)
        meta = request_metadata(kwargs)
        return [
            Instance("loglikelihood", doc, (doc["prompt"], answer), i, metadata=meta)
            for i, answer in enumerate((YES, NO))
        ]

    def predicted(self, results) -> float:
        return rm.p_yes(results[0][0], results[1][0])

    def process_results(self, doc, results):
        p = self.predicted(results)
        return {"auc": [doc["label"], p], "logloss": [doc["label"], p], "acc": float(int(p > 0.5) == doc["label"])}

    def aggregation(self):
        return {"auc": rm.auc, "logloss": rm.logloss, "acc": mean}


class MovieLensForgetTask(MovieLensRecTask):
    """The forgotten users' interactions: the metrics above plus JSD to the retrained model's
    predictions (metadata ``retrain_reference``; NaN with a warning without one)."""

    METRICS = {"auc": True, "logloss": False, "acc": True, "jsd": False}

    def __init__(self, config: dict | None = None, **kwargs):
        super().__init__(config=config, **kwargs)
        docs = self.dataset["test"]
        self.split_label = docs[0]["split"]
        keys = list(docs["key"])
        refs = rm.references_from((self.config.metadata or {}).get("retrain_reference"))
        self.reference = next((r for r in refs if r.overlaps(keys)), None)
        if refs and self.reference is None:
            made_on = "; ".join(f"{r.path}: {r.describe()}" for r in refs)
            raise DataError(
                f"task {self.config.task} evaluates {self.split_label!r} ({len(keys)} samples) but no "
                f"prediction reference was made on it ({made_on}); "
                f"{rm.HINT.format(task=self.config.task)}"
            )

    def process_results(self, doc, results):
        out = super().process_results(doc, results)
        out["jsd"] = [doc["key"], out["auc"][1]]
        return out

    def _jsd(self, items) -> float:
        if self.reference is None:
            log.warning(
                "%s: jsd unavailable: no retrain reference; %s", self.config.task, rm.HINT.format(task=self.config.task)
            )
            return float("nan")
        keys = [k for k, _ in items]
        return rm.mean_jsd([p for _, p in items], self.reference.aligned(keys, task=self.config.task))

    def aggregation(self):
        return {**super().aggregation(), "jsd": self._jsd}
