"""Is it really forgotten? One row per model (full, retain, each unlearned one) of its
membership inference (privleak, exact memorization, each attack's AUC) and of its forget
probability and ROUGE-L plain, under each probe and after each attack, from the summaries
`unlearn eval --mia --robustness` writes; the comparison tables and a plot of forget
probability before and after each attack. Used by `unlearn demo --robustness` and
bench/really_forgotten.py; the study report reads its rows too."""

from __future__ import annotations

from pathlib import Path

from ..errors import UnlearnError
from .robustness import METRICS

#: the membership-inference attacks, in the order of the table's columns
MIA_COLUMNS = ("loss", "zlib", "min_k", "min_k++", "gradnorm", "reference")
#: the attacks the demo and studies run on every model (int4: the quantization the field reports)
ATTACKS = ("relearn", "quantize")
ATTACK_OPTIONS = ("quantize.bits=4",)


def measure(
    model: str,
    adapter: str | None,
    out: Path,
    *,
    forget_split: str,
    holdout_split: str,
    tofu_dir: str | None,
    batch_size: int,
    device: str | None,
    dtype: str | None,
    mia_reference: str | None = None,
    save_mia_reference: str | None = None,
    max_gen_toks: int | None = None,
) -> dict:
    """`unlearn eval --mia --robustness` of one model into ``out`` (what it prints: ``out``.log);
    its summary. The retain model saves the MIA reference (``save_mia_reference``), the others
    read it (``mia_reference``): privleak and the reference attack. ``max_gen_toks``: the cap of
    the caller's own evaluation, so the plain ROUGE-L here is the one it reports."""
    import contextlib
    import io

    from ..options import parse_options
    from . import model_eval, robustness
    from .config import EvaluationConfig
    from .lm_eval_runner import read_outputs
    from .membership import MEMORIZATION_TASK, MIA_TASK

    attacks = list(ATTACKS)
    config = EvaluationConfig(
        model=model,
        out=str(out),
        adapter=adapter,
        device=device,
        dtype=dtype,
        batch_size=batch_size,
        max_gen_toks=max_gen_toks,
        tofu_dir=tofu_dir,
        forget_split=forget_split,
        mia=True,
        holdout_split=holdout_split,
        mia_reference=mia_reference,
        save_mia_reference=save_mia_reference,
        robustness=True,
        robustness_attacks=attacks,
        attack_option=list(ATTACK_OPTIONS),
    )
    request = model_eval.Request(
        config,
        tasks=list(dict.fromkeys([MIA_TASK, MEMORIZATION_TASK, *robustness.tasks_needed()])),
        attacks=attacks,
        attack_options=robustness.attack_options(parse_options(config.attack_option, "--attack-option"), attacks),
    )
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        outcome = model_eval.evaluate(request)
        print(model_eval.report(outcome))
    log = Path(f"{out}.log")
    log.write_text(printed.getvalue())
    if outcome.failed:
        raise UnlearnError(f"is it really forgotten? an attack on {adapter or model} failed: see {log}")
    return read_outputs(out).summary


def row(name: str, summary: dict) -> dict:
    """One model's figures, flat: membership inference, then each robustness metric plain, under
    each probe and attack (relearn also on the plain model over the same held-back samples), worst."""
    mia = summary.get("mia") or {}
    rob = (summary.get("robustness") or {}).get("metrics", {})
    out = {"model": name, "privleak": mia.get("privleak"), "exact_memorization": mia.get("exact_memorization")}
    for key in MIA_COLUMNS:
        out[f"auc_{key}"] = (mia.get("attacks", {}).get(key) or {}).get("auc")
    for metric in METRICS:
        entry = rob.get(metric) or {}
        out[f"{metric}:plain"] = entry.get("plain")
        for label, result in (entry.get("attacks") or {}).items():
            out[f"{metric}:{label}"] = result.get("value")
            if result.get("plain_same_samples") is not None:
                out[f"{metric}:{label}:plain_same_samples"] = result["plain_same_samples"]
        worst = entry.get("worst") or {}
        out[f"{metric}:worst"] = worst.get("value")
        out[f"{metric}:worst_attack"] = worst.get("attack")
    return out


def fmt(value) -> str:
    if isinstance(value, str):
        return value
    return "n/a" if value is None else f"{value:.3f}"


def membership_table(rows: list[dict]) -> str:
    keys = ["privleak", "exact_memorization", *(f"auc_{k}" for k in MIA_COLUMNS)]
    head = ["model", "privleak", "exact memorization", *(f"AUC {k}" for k in MIA_COLUMNS)]
    lines = ["| " + " | ".join(head) + " |", "|---" * len(head) + "|"]
    for r in rows:
        lines.append(f"| {r['model']} | " + " | ".join(fmt(r.get(k)) for k in keys) + " |")
    return "\n".join(lines)


def attack_table(rows: list[dict], metric: str, title: str) -> str:
    """Plain, each probe and attack, and the worst case of one forget metric; relearn's cell also
    gives the plain value on the samples it is measured on (the other half of the forget set)."""
    labels = []
    for r in rows:
        for key in r:
            parts = key.split(":")
            if parts[0] == metric and len(parts) == 2 and parts[1] not in ("plain", "worst", "worst_attack"):
                if parts[1] not in labels:
                    labels.append(parts[1])
    head = ["model", f"{title}: plain", *labels, "worst (attack)"]
    lines = ["| " + " | ".join(head) + " |", "|---" * len(head) + "|"]
    for r in rows:
        cells = [fmt(r.get(f"{metric}:plain"))]
        for label in labels:
            cell = fmt(r.get(f"{metric}:{label}"))
            same = r.get(f"{metric}:{label}:plain_same_samples")
            if same is not None:
                cell += f" (plain {fmt(same)})"
            cells.append(cell)
        worst = r.get(f"{metric}:worst")
        cells.append("n/a" if worst is None else f"{fmt(worst)} ({r.get(f'{metric}:worst_attack')})")
        lines.append(f"| {r['model']} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def table(rows: list[dict]) -> str:
    """The three tables: membership inference, then forget probability and ROUGE-L under attack."""
    return "\n\n".join(
        [
            membership_table(rows),
            attack_table(rows, "prob", "forget prob"),
            attack_table(rows, "rougeL_recall", "forget ROUGE-L"),
        ]
    )


def plot_under_attack(rows: list[dict], path: Path, metric: str = "prob") -> None:
    """Grouped bars: per model, the forget metric plain and under each probe and attack (relearn's
    bar is measured on the held-back half; the plain model on that half is the black tick)."""
    from ..plots import finish_png, pyplot

    labels = []
    for r in rows:
        for key in r:
            parts = key.split(":")
            if parts[0] == metric and len(parts) == 2 and parts[1] not in ("worst", "worst_attack"):
                if parts[1] not in labels:
                    labels.append(parts[1])
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(max(6.4, 1.4 * len(rows) + 2), 4.6))
    width = 0.8 / max(1, len(labels))
    for j, label in enumerate(labels):
        xs = [i + (j - (len(labels) - 1) / 2) * width for i in range(len(rows))]
        values = [r.get(f"{metric}:{label}") for r in rows]
        ax.bar(
            [x for x, v in zip(xs, values) if v is not None],
            [v for v in values if v is not None],
            width,
            label="plain" if label == "plain" else label,
        )
        same = [r.get(f"{metric}:{label}:plain_same_samples") for r in rows]
        if any(v is not None for v in same):
            ax.scatter(
                [x for x, v in zip(xs, same) if v is not None],
                [v for v in same if v is not None],
                marker="_",
                s=200,
                color="black",
                label=f"{label}: plain model on the same samples",
                zorder=3,
            )
    ax.set_xticks(range(len(rows)))
    ax.set_xticklabels([r["model"] for r in rows], rotation=15, ha="right", fontsize=8)
    ax.set_ylabel("forget probability" if metric == "prob" else f"forget {metric}")
    ax.set_title("Forget set before and after each probe and attack (higher = remembered)")
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=7, loc="best")
    finish_png(fig, path)
