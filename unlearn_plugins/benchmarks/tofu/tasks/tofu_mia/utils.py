"""Membership inference and exact memorization as lm-eval tasks (tasks/tofu_mia/).

``tofu_mia`` scores the forget split (metadata ``forget_split``) and a holdout split of QA the
model never saw (metadata ``holdout_split``: for a TOFU-style benchmark, other TOFU authors)
with the attacks that lm-eval's ``loglikelihood`` requests can express, open-unlearning's
definitions (:mod:`unlearn_plugins.evaluation.mia`): LOSS, zlib and Min-K% (k = 0.4, metadata
``mia_k``), each reported as the AUC of forget (label 0) vs holdout (label 1); with a reference
file of the retain model (metadata ``mia_reference``, see :mod:`.mia_reference`) also the
reference attack and privleak (MUSE's, on Min-K%). Min-K%++ needs the whole next-token
distribution and gradient-norm needs gradients: no lm-eval request type returns either, so
``unlearn eval --mia`` computes them on the model directly (:mod:`.membership`).

lm-eval returns only the SUM of a continuation's log-probabilities, so the per-token values
Min-K% needs come from one one-token request per answer position, (prompt + answer[:k],
answer[k]), the end token's from the whole answer's minus the others. Where the prefix ends in
whitespace, lm-eval moves it into the continuation: that request also covers the whitespace
token, whose own request comes before it, and the difference is exact. Every token's
log-probability is then exact; where a prefix does not re-tokenise to the same tokens (with
SmolLM2, 2 of the 28,072 answer positions of TOFU's forget10 and retain QA: a blank line inside
an answer) the tokens left share what the others leave, with a warning naming the sample. This
costs one forward pass per answer token.

``tofu_forget_exact_memorization``: open-unlearning's exact memorization, the fraction of answer
tokens (the end token left out) that are the model's greedy prediction given the true prefix,
from one one-token greedy generation per position (positions whose prefix text does not
re-tokenise to the same tokens are left out; ``em_offsets`` lists the positions measured).
"""

from __future__ import annotations

import logging
import zlib
from typing import Any, Sequence

from lm_eval.api.instance import Instance

from unlearn_plugins.data.qa import control_tokens, prompt_text
from unlearn_plugins.errors import DataError
from unlearn_plugins.evaluation import mia
from unlearn_plugins.evaluation.lm_eval_requests import (  # noqa: F401 - the MIA tasks' names
    answer_tokens,
    decode_ids,
    encode_ids,
    metadata_tokenizer,
    mia_requests,
    prefix_offsets,
    request_metadata,
    resolve_tokenizer,
    score_plan,
    token_logprobs,
    token_plan,
)
from unlearn_plugins.evaluation.mia import MIN_K, load_qa_split, mia_documents, n_evaluated  # noqa: F401 - the dataset builders' and the probes'
from unlearn_plugins.evaluation.mia_reference import HINT, MIAReference, mismatch, read_mia_reference
from unlearn_plugins.evaluation.reference import sample_key
from unlearn_plugins.interfaces import QASample

from ..tofu.utils import TofuTask, _refuse_control_tokens

log = logging.getLogger(__name__)

GREEDY = {"until": [], "max_gen_toks": 1, "do_sample": False, "temperature": 0.0}


# ----------------------------------------------------------------------------- data


def _docs(tok, rows: Sequence[tuple[QASample, str, str]], system_prompt: str | None, plan) -> list[dict]:
    eos = tok.eos_token
    if not eos:
        raise DataError(f"tokenizer {getattr(tok, 'name_or_path', '?')} has no eos token: TOFU scores the end token")
    specials = control_tokens(tok)
    docs = []
    for sample, member, label in rows:
        _refuse_control_tokens({"question": sample.question, "answer": sample.answer}, specials, sample.where)
        prompt = prompt_text(tok, sample.question, system_prompt)
        doc = {
            "key": sample_key(sample.question, sample.answer),
            "member": member,
            "split": label,
            "where": sample.where,
            "question": sample.question,
            "answer": sample.answer,
            "prompt": prompt,
        }
        doc.update(plan(tok, prompt, sample.answer + eos, sample.where))
        docs.append(doc)
    return docs


def mia_dataset(
    *,
    forget_split: str | None = None,
    holdout_split: str | None = None,
    tofu_dir: str | None = None,
    system_prompt: str | None = None,
    **metadata: Any,
):
    """lm-eval ``custom_dataset`` of ``tofu_mia``: forget and holdout documents, interleaved."""
    import datasets

    rows = mia_documents(forget_split, holdout_split, tofu_dir)
    tok = metadata_tokenizer(metadata)
    return datasets.DatasetDict({"test": datasets.Dataset.from_list(_docs(tok, rows, system_prompt, token_plan))})


def memorization_plan(tok, prompt: str, continuation: str, where: str) -> dict[str, Any]:
    """One greedy one-token generation per answer position but the last (the end token)."""
    prompt, continuation, answer, _ = answer_tokens(tok, prompt, continuation, where)
    offsets = prefix_offsets(tok, prompt, continuation, answer)
    positions = [k for k in range(len(answer) - 1) if offsets[k] is not None]
    return {
        "score_prompt": prompt,
        "score_continuation": continuation,
        "n_tokens": [len(answer)],
        "em_offsets": [offsets[k] for k in positions],
        "em_targets": [decode_ids(tok, answer[k : k + 1]) for k in positions],
    }


def memorization_dataset(
    *,
    forget_split: str | None = None,
    tofu_dir: str | None = None,
    system_prompt: str | None = None,
    **metadata: Any,
):
    """lm-eval ``custom_dataset`` of ``tofu_forget_exact_memorization``."""
    import datasets

    samples, label = load_qa_split(forget_split, tofu_dir, "forget")
    tok = metadata_tokenizer(metadata)
    docs = _docs(tok, [(s, "forget", label) for s in samples], system_prompt, memorization_plan)
    return datasets.DatasetDict({"test": datasets.Dataset.from_list(docs)})


# ----------------------------------------------------------------------------- tasks


def _split_members(items) -> tuple[list[str], list[float], list[float]]:
    keys = [k for k, _, _ in items]
    forget = [s for _, m, s in items if m == "forget"]
    holdout = [s for _, m, s in items if m == "holdout"]
    return keys, forget, holdout


class TofuMIATask(TofuTask):
    """AUCs of LOSS, zlib, Min-K%, the reference attack, and privleak (see the module docstring).
    Each per-sample value is ``[key, member, score]`` (the samples file keeps the scores)."""

    METRICS = {"auc_loss": False, "auc_zlib": False, "auc_min_k": False, "auc_reference": False, "privleak": True}

    def __init__(self, config: dict | None = None, **kwargs):
        super().__init__(config=config, **kwargs)
        metadata = self.config.metadata or {}
        self.k = float(metadata.get("mia_k", MIN_K))
        if not 0 < self.k <= 1:
            raise DataError(f"task {self.config.task}: metadata 'mia_k' must be in (0, 1], got {self.k}")
        docs = self.dataset["test"]
        self.forget_split = next((d["split"] for d in docs if d["member"] == "forget"), "")
        self.holdout_split = next((d["split"] for d in docs if d["member"] == "holdout"), "")
        self.reference = self._pick_reference(list(docs["key"]), metadata.get("mia_reference"))

    def _pick_reference(self, keys: list[str], value: Any) -> MIAReference | None:
        if value in (None, ""):
            return None
        ref = read_mia_reference(value)
        if not ref.matches(keys):
            raise DataError(mismatch(ref, self.config.task, self.forget_split, self.holdout_split, len(keys)))
        return ref

    def construct_requests(self, doc, ctx, **kwargs):
        self._check_context(doc, ctx)
        return mia_requests(doc, request_metadata(kwargs))

    def process_results(self, doc, results):
        logps, shared = token_logprobs(doc, results)
        if shared:
            log.warning(
                "%s: %s: %d answer tokens could not be scored one by one (their prefix does not re-tokenise "
                "to the same tokens); they share the log-probability the others leave",
                self.config.task,
                doc["where"],
                shared,
            )
        loss = -sum(logps) / len(logps)
        scores = {
            "auc_loss": loss,
            "auc_zlib": loss / len(zlib.compress(doc["answer"].encode("utf-8"))),
            "auc_min_k": mia.min_k_score(logps[:-1], self.k),
            "auc_reference": loss,
            "privleak": mia.min_k_score(logps[:-1], self.k),
        }
        return {name: [doc["key"], doc["member"], value] for name, value in scores.items()}

    def _auc(self, items) -> float:
        _, forget, holdout = _split_members(items)
        return mia.auc(forget, holdout)

    def _unavailable(self, what: str) -> float:
        log.warning("%s: %s unavailable: no MIA reference (metadata mia_reference); %s", self.config.task, what, HINT)
        return float("nan")

    def _auc_reference(self, items) -> float:
        if self.reference is None:
            return self._unavailable("auc_reference")
        keys, _, _ = _split_members(items)
        self.reference.check_evaluated(keys, task=self.config.task)
        ref = self.reference.loss_of()
        return self._auc([[k, m, s - ref[k]] for k, m, s in items])

    def _privleak(self, items) -> float:
        if self.reference is None:
            return self._unavailable("privleak")
        keys, _, _ = _split_members(items)
        self.reference.check_evaluated(keys, task=self.config.task)
        if "min_k" not in self.reference.aucs:
            raise DataError(f"MIA reference {self.reference.path} has no Min-K% AUC (field 'auc': 'min_k'); {HINT}")
        return mia.privleak(self._auc(items), self.reference.aucs["min_k"])

    def aggregation(self):
        return {
            "auc_loss": self._auc,
            "auc_zlib": self._auc,
            "auc_min_k": self._auc,
            "auc_reference": self._auc_reference,
            "privleak": self._privleak,
        }


class TofuExactMemorizationTask(TofuTask):
    """Exact memorization of the forget answers (see the module docstring)."""

    OUTPUT_TYPE = "generate_until"
    METRICS = {"exact_memorization": True}

    def construct_requests(self, doc, ctx, **kwargs):
        self._check_context(doc, ctx)
        meta = request_metadata(kwargs)
        prompt, cont = doc["score_prompt"], doc["score_continuation"]
        return [
            Instance("generate_until", doc, (prompt + cont[:offset], dict(GREEDY)), i, metadata=meta)
            for i, offset in enumerate(doc["em_offsets"])
        ]

    def process_results(self, doc, results):
        hits = [got == target for got, target in zip(results, doc["em_targets"])]
        return {"exact_memorization": sum(hits) / len(hits) if hits else float("nan")}
