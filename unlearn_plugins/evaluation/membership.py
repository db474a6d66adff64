"""`unlearn eval --mia`: the membership-inference attacks lm-eval cannot run, and one summary of
them all, written into the same results file as the lm-eval tasks.

Min-K%++ needs the model's whole next-token distribution at every answer position and
gradient-norm needs gradients; lm-eval's request types return a continuation's summed
log-probability (and whether it is greedy), nothing else. So these two are computed here, on
the model itself, over exactly the documents of the ``tofu_mia`` task (same splits, same
interleaving, same ``--limit``) with :mod:`unlearn_plugins.evaluation.mia`; LOSS, zlib, Min-K%
and the reference attack come from the task. privleak (MUSE's, on Min-K%) is the task's; for
the other attacks it is reported with the same formula when the reference file has their AUC.
"""

from __future__ import annotations

from typing import Any

from ..data.qa import encode_qa
from ..errors import DataError
from . import mia
from .mia import MIN_K, mia_documents, n_evaluated
from .mia_reference import HINT, read_mia_reference, write_mia_reference
from .reference import sample_key

MIA_TASK = "tofu_mia"
MEMORIZATION_TASK = "tofu_forget_exact_memorization"
TASK_ATTACKS = {"loss": "auc_loss", "zlib": "auc_zlib", "min_k": "auc_min_k", "reference": "auc_reference"}
DIRECT_ATTACKS = ("min_k++", "gradnorm")


def direct_attacks(
    model,
    tokenizer,
    *,
    forget_split: str,
    holdout_split: str,
    tofu_dir: str | None = None,
    limit: int | float | None = None,
    system_prompt: str | None = None,
    batch_size: int = 8,
    k: float = MIN_K,
    p: float = 2,
) -> dict[str, Any]:
    """Per-sample scores and AUCs of Min-K%++ and gradient-norm on the ``tofu_mia`` documents."""
    rows = mia_documents(forget_split, holdout_split, tofu_dir)
    rows = rows[: n_evaluated(len(rows), limit)]
    members = [m for _, m, _ in rows]
    if len(set(members)) < 2:
        raise DataError(f"--limit {limit} keeps {len(rows)} document(s): the MIA AUCs need forget and holdout samples")
    examples = [
        encode_qa(tokenizer, s.question, s.answer, system_prompt=system_prompt, where=s.where) for s, _, _ in rows
    ]
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    scores = {
        "min_k++": mia.sample_statistics(model, examples, pad, attacks=["min_k++"], k=k, batch_size=batch_size)[
            "min_k++"
        ],
        "gradnorm": mia.gradnorm_scores(model, examples, pad, p=p),
    }
    aucs = {
        name: mia.auc(
            [v for v, m in zip(values, members) if m == "forget"],
            [v for v, m in zip(values, members) if m == "holdout"],
        )
        for name, values in scores.items()
    }
    return {
        "keys": [sample_key(s.question, s.answer) for s, _, _ in rows],
        "members": members,
        "scores": scores,
        "aucs": aucs,
        "k": k,
        "p": p,
    }


def check_before_loading(
    forget_split: str, holdout_split: str, *, tofu_dir: str | None, limit: int | float | None, reference: str | None
) -> None:
    """The splits and the reference file, checked as the task will check them, before a model loads."""
    from .mia_reference import mismatch

    rows = mia_documents(forget_split, holdout_split, tofu_dir)
    if reference:
        ref = read_mia_reference(reference)
        keys = [sample_key(s.question, s.answer) for s, _, _ in rows]
        if not ref.matches(keys):
            labels = {m: label for _, m, label in rows}
            raise DataError(
                mismatch(
                    ref, MIA_TASK, labels.get("forget", forget_split), labels.get("holdout", holdout_split), len(keys)
                )
            )
        n = n_evaluated(len(rows), limit)
        if n != len(ref.keys):
            raise DataError(
                f"MIA reference {ref.path} covers {len(ref.keys)} samples but {MIA_TASK} will evaluate "
                f"{n}: use the --limit the reference was made with, or {HINT}"
            )


def mia_summary(
    metrics: dict[str, dict[str, Any]], direct: dict[str, Any] | None, *, reference_path: str | None
) -> dict[str, Any] | None:
    """What ``unlearn eval`` records under ``mia``: per attack its AUC, the retain model's and the
    privleak between them, and where it was computed (None when the run has no MIA)."""
    task = metrics.get(MIA_TASK)
    if task is None and direct is None:
        return None
    reference = read_mia_reference(reference_path) if reference_path else None
    attacks: dict[str, dict[str, Any]] = {}
    for name, metric in TASK_ATTACKS.items():
        if task is not None and task.get(metric) is not None:
            attacks[name] = {"auc": task[metric], "via": f"lm-eval task {MIA_TASK}"}
    for name in DIRECT_ATTACKS:
        if direct is not None:
            attacks[name] = {"auc": direct["aucs"][name], "via": "unlearn eval --mia (on the model)"}
    for name, entry in attacks.items():
        ref = reference.aucs.get(name) if reference is not None and name != "reference" else None
        entry["retain_auc"] = ref
        entry["privleak"] = mia.privleak(entry["auc"], ref) if ref is not None else None
    summary: dict[str, Any] = {
        "attacks": attacks,
        "privleak": (task or {}).get("privleak"),
        "reference": reference_path,
    }
    if reference is None:
        summary["note"] = "privleak and the reference attack unavailable: no --mia-reference; " + HINT
    em = metrics.get(MEMORIZATION_TASK, {}).get("exact_memorization")
    if em is not None:
        summary["exact_memorization"] = em
    if direct is not None:
        summary["samples"] = {m: direct["members"].count(m) for m in ("forget", "holdout")}
    return summary


def save_mia_reference(
    path: str,
    samples: dict[str, list[dict]],
    metrics: dict[str, dict[str, Any]],
    direct: dict[str, Any] | None,
    *,
    model: str | None,
    adapter: str | None,
) -> None:
    """Write this model's ``tofu_mia`` per-sample losses and every AUC as an MIA reference."""
    rows = sorted(samples.get(MIA_TASK) or [], key=lambda r: r["doc_id"])
    if not rows:
        raise DataError(f"--save-mia-reference needs the {MIA_TASK} task in the run (--tasks {MIA_TASK}, or --mia)")
    keys = [r["auc_loss"][0] for r in rows]
    members = [r["auc_loss"][1] for r in rows]
    losses = [float(r["auc_loss"][2]) for r in rows]
    task = metrics[MIA_TASK]
    aucs = {name: task[metric] for name, metric in TASK_ATTACKS.items() if name != "reference"}
    if direct is not None:
        if sorted(direct["keys"]) != sorted(keys):
            raise DataError(
                "--save-mia-reference: the attacks computed on the model saw other samples than "
                f"{MIA_TASK}; this is a bug"
            )
        aucs.update(direct["aucs"])
    split = {m: next(r["doc"]["split"] for r in rows if r["doc"]["member"] == m) for m in ("forget", "holdout")}
    write_mia_reference(
        path,
        forget_split=split["forget"],
        holdout_split=split["holdout"],
        keys=keys,
        members=members,
        losses=losses,
        aucs=aucs,
        model=model,
        adapter=adapter,
    )


def mia_table(summary: dict[str, Any]) -> str:
    """The ``mia`` summary as a Markdown table in lm-eval's make_table style."""
    from ..tables import lm_eval_table

    def fmt(value):
        return "n/a" if value is None else f"{value:.4f}"

    rows = [
        [name, fmt(e["auc"]), fmt(e.get("retain_auc")), fmt(e.get("privleak")), e["via"]]
        for name, e in summary["attacks"].items()
    ]
    lines = [
        lm_eval_table(["MIA attack", "AUC", "retain AUC", "privleak", "via"], rows),
        "AUC: forget (0) vs holdout (1); 1 = the forget set looks trained on. privleak (MUSE, Min-K%): "
        f"{fmt(summary.get('privleak'))}",
    ]
    if summary.get("note"):
        lines.append("note: " + summary["note"])
    return "\n".join(lines)
