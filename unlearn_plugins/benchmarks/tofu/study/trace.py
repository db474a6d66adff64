"""A traced unlearning run (``[sweep]``): at the end of every epoch the adapter is
saved and the cheap trace measures are taken, with no generation and no full evaluation.

Measures (:data:`.design.TRACE_MEASURES`), per epoch:

- ``forget_quality``, ``ks_statistic``, ``wasserstein_log``: the forget truth ratios (each QA's
  paraphrased answer against its perturbed ones, TOFU's definition in
  :func:`..metrics.truth_ratio`) against the retain model's, through
  :func:`.statistics.truth_ratio_distances`;
- ``forget_prob``: the mean length-normalised probability of the forget answers;
- ``heldout_prob``: the same over held-out QA (real authors, world facts, retain authors).

The per-answer likelihoods come from :func:`..likelihood.answer_nll` over :func:`..data.qa.
encode_qa` encodings (the answer and the end token scored, as TOFU scores them). The retain
model's reference ratios are computed by the same function (:func:`truth_ratios`), so the
trace compares like with like; its numbers may differ in the last digits from the lm-eval
tasks', which tokenise prompt and answer together. Measuring runs in eval mode without
gradients and draws no random numbers: a traced run trains exactly as the untraced one, so
its epoch-e adapter is the e-epoch run's (with a constant learning rate, which [sweep] asks for).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, Sequence

from unlearn_plugins.training import lora

from .. import metrics as tm
from .statistics import truth_ratio_distances

TRACE_FILE = "trace.jsonl"
#: the folder of the adapter saved after epoch e: ``epoch{e}``
EPOCH_DIR = "epoch{}"


def _encode(tokenizer, question: str, answer: str, max_length: int, system_prompt: str | None):
    from unlearn_plugins.data.qa import encode_qa

    return encode_qa(tokenizer, question, answer, max_length=max_length, system_prompt=system_prompt)


def _mean_nlls(model, tokenizer, pairs: Sequence[tuple[str, str]], *, max_length: int, batch_size: int, system_prompt):
    """Mean answer-token NLL (answer and end token) of each (question, answer)."""
    from unlearn_plugins.likelihood import answer_nll

    encoded = [_encode(tokenizer, q, a, max_length, system_prompt) for q, a in pairs]
    return [
        tm.mean_nll(-total, n) for total, n in answer_nll(model, encoded, tokenizer.pad_token_id, batch_size=batch_size)
    ]


def _with_eval_mode(model, compute):
    was_training = model.training
    model.eval()
    try:
        return compute()
    finally:
        if was_training:
            model.train()


def truth_ratios(
    model, tokenizer, rows, *, max_length: int = 512, batch_size: int = 8, system_prompt: str | None = None
) -> list[float]:
    """Per forget QA (``rows``: QASample-like, with ``extra`` paraphrased_answer and
    perturbed_answer) its truth ratio: the perturbed answers' mean NLL against the paraphrased
    answer's (:func:`..metrics.truth_ratio`)."""
    pairs, spans = [], []
    for row in rows:
        perturbed = list(row.extra["perturbed_answer"])
        spans.append((len(pairs), len(perturbed)))
        pairs.append((row.question, row.extra["paraphrased_answer"]))
        pairs.extend((row.question, p) for p in perturbed)
    nlls = _with_eval_mode(
        model,
        lambda: _mean_nlls(
            model, tokenizer, pairs, max_length=max_length, batch_size=batch_size, system_prompt=system_prompt
        ),
    )
    return [tm.truth_ratio(nlls[start], nlls[start + 1 : start + 1 + n]) for start, n in spans]


def answer_probabilities(
    model, tokenizer, rows, *, max_length: int = 512, batch_size: int = 8, system_prompt: str | None = None
) -> list[float]:
    """Per QA the length-normalised probability of its answer."""
    nlls = _with_eval_mode(
        model,
        lambda: _mean_nlls(
            model,
            tokenizer,
            [(r.question, r.answer) for r in rows],
            max_length=max_length,
            batch_size=batch_size,
            system_prompt=system_prompt,
        ),
    )
    return [tm.probability(x) for x in nlls]


def trace_point(
    model,
    tokenizer,
    *,
    forget,
    reference_ratios: Sequence[float],
    heldout=(),
    measures: Sequence[str] = ("forget_quality", "ks_statistic", "wasserstein_log", "forget_prob"),
    max_length: int = 512,
    batch_size: int = 8,
    system_prompt: str | None = None,
) -> dict[str, Any]:
    """The trace measures of ``model`` now (only those in ``measures``)."""
    options = {"max_length": max_length, "batch_size": batch_size, "system_prompt": system_prompt}
    out: dict[str, Any] = {}
    if {"forget_quality", "ks_statistic", "wasserstein_log"} & set(measures):
        distances = truth_ratio_distances(truth_ratios(model, tokenizer, forget, **options), reference_ratios)
        out.update({k: distances[k] for k in ("forget_quality", "ks_statistic", "wasserstein_log") if k in measures})
    if "forget_prob" in measures:
        probs = answer_probabilities(model, tokenizer, forget, **options)
        out["forget_prob"] = sum(probs) / len(probs)
    if "heldout_prob" in measures and heldout:
        probs = answer_probabilities(model, tokenizer, heldout, **options)
        out["heldout_prob"] = sum(probs) / len(probs)
    return out


def _trainer_callback():
    from transformers import TrainerCallback

    return TrainerCallback


class TraceCallback(_trainer_callback()):
    """A Trainer callback: after every epoch, save the adapter in ``out/epoch{e}`` (a standard
    PEFT adapter relative to the original base, also after a residual init) and append the
    trace measures to ``out/trace.jsonl`` (one JSON object per epoch: epoch, step, adapter,
    seconds spent measuring, and the measures)."""

    def __init__(
        self, out: str | Path, tokenizer, *, forget, reference_ratios, heldout=(), save_adapters=True, **options
    ):
        """``options``: :func:`trace_point`'s (``measures``, ``max_length``, ``batch_size``,
        ``system_prompt``), the same defaults."""
        self.out = Path(out)
        self.tokenizer = tokenizer
        # lists: the data may be a one-pass iterable, measured every epoch
        self.point = {"forget": list(forget), "reference_ratios": list(reference_ratios), "heldout": list(heldout)}
        self.options = options
        self.save_adapters = save_adapters
        self.points: list[dict[str, Any]] = []

    def on_epoch_end(self, args, state, control, model=None, **kwargs):
        if model is None or not state.is_world_process_zero:
            return
        epoch = int(round(state.epoch or 0))
        started = time.perf_counter()
        point: dict[str, Any] = {"epoch": epoch, "step": int(state.global_step)}
        if self.save_adapters:
            folder = self.out / EPOCH_DIR.format(epoch)
            save_epoch_adapter(model, folder, Path(args.output_dir) / lora.INITIAL_ADAPTER)
            point["adapter"] = folder.name
        point.update(trace_point(model, self.tokenizer, **self.point, **self.options))
        point["seconds"] = round(time.perf_counter() - started, 2)
        self.points.append(point)
        self.out.mkdir(parents=True, exist_ok=True)
        with open(self.out / TRACE_FILE, "a", encoding="utf-8") as handle:
            handle.write(json.dumps(point) + "\n")


def save_epoch_adapter(model, folder: Path, initial: Path) -> None:
    """The active adapter alone (not a reference's frozen copy), converted to a plain LoRA of
    the original base when the run started from a residual init (``initial`` exists)."""
    kwargs: dict[str, Any] = {"selected_adapters": [lora.active_adapter(model)]}
    if initial.is_dir():
        kwargs["path_initial_model_for_weight_conversion"] = str(initial)
    model.save_pretrained(str(folder), **kwargs)


def read_trace(out: str | Path) -> list[dict[str, Any]]:
    """The points a traced run wrote, in epoch order."""
    path = Path(out) / TRACE_FILE
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


PERTURBED_FIELDS = ("question", "answer", "paraphrased_answer", "perturbed_answer")
#: [sweep] heldout part -> the benchmark file its QA come from (the first N; retain authors: N
#: spread evenly over the retain set)
HELDOUT_FILES = {
    "real_authors": "real_authors_perturbed.json",
    "world_facts": "world_facts_perturbed.json",
    "retain_authors": "retain.json",
}
REFERENCE_FILE = "reference_ratios.json"


def heldout_rows(bench: str | Path, counts: dict) -> list:
    """The held-out QA of ``[sweep] heldout`` from a benchmark folder."""
    from unlearn_plugins.data.qa import read_jsonl

    out = []
    for part, n in counts.items():
        if not n:
            continue
        rows = read_jsonl(Path(bench) / HELDOUT_FILES[part])
        if part == "retain_authors":
            step = max(1, len(rows) // n)
            rows = rows[::step]
        out.extend(rows[:n])
    return out


def build_sweep(tmp: Path, p: dict) -> None:
    """A sweep stage (:mod:`.design_plan`): one traced unlearning run on the reserved author.
    ``p``: config (the method's resolved UnlearnConfig values at this lr and setting, epochs =
    the sweep's), model (the target), bench (the reserved author's benchmark folder),
    reference_model (its retain model), trace (the measures), heldout (part -> QA count),
    max_length, batch_size, device. Writes ``run/`` (the run, its final adapter), ``trace/``
    (``trace.jsonl`` and ``epoch{e}/`` adapters) and the reference's truth ratios."""
    from unlearn_plugins.data.qa import load_split
    from unlearn_plugins.files import write_json
    from unlearn_plugins.models import load_model, load_tokenizer
    from unlearn_plugins.process import release_memory
    from unlearn_plugins.training import UnlearnConfig, run_unlearning

    bench = Path(p["bench"])
    forget = load_split(str(bench / "forget.json"), require=PERTURBED_FIELDS)
    options = {"max_length": p["max_length"], "batch_size": p["batch_size"]}
    reference_model, tok = load_model(p["reference_model"], device=p["device"])
    reference = truth_ratios(reference_model, tok, forget, **options)
    del reference_model
    release_memory()
    write_json(tmp / REFERENCE_FILE, {"model": p["reference_model"], "truth_ratios": reference})
    callback = TraceCallback(
        tmp / "trace",
        load_tokenizer(p["model"]),
        forget=forget,
        reference_ratios=reference,
        heldout=heldout_rows(bench, p["heldout"]),
        measures=p["trace"],
        **options,
    )
    run_unlearning(
        UnlearnConfig(
            out=str(tmp / "run"),
            model=p["model"],
            forget=str(bench / "forget.json"),
            retain=str(bench / "retain.json"),
            device=p["device"],
            **p["config"],
        ),
        callbacks=[callback],
    )


__all__ = [
    "TraceCallback",
    "build_sweep",
    "heldout_rows",
    "trace_point",
    "truth_ratios",
    "answer_probabilities",
    "read_trace",
    "TRACE_FILE",
]
