"""A WMDP study (``[benchmark] source = "wmdp"``) as `unlearn study` reaches it, the study part of
the benchmark (:class:`unlearn_plugins.interfaces.Benchmark`): :func:`read` its tables,
:func:`expand` its cells, :func:`plan` their stages (:mod:`.cells`), :func:`grid` for `unlearn
study --list`; the core's runner runs it (``--report-only`` too) and writes :func:`write_report`
(:mod:`.report`); :func:`refuse` names the options it does not take yet.

The cells: the base model's evaluation; the target (``corpus = "synthetic"``: the base model
fine-tuned on the forget documents, so that it knows the facts before it is asked to forget them;
``corpus = "real"``: the base model itself, as WMDP's RMU run starts from zephyr) and its
evaluation; then seed x method: unlearning from the raw forget and retain text (windows of
``[model] max_length`` tokens, ``text:`` data) and its evaluation. MUSE's two run criteria
replace that last with a grid (``[benchmark] forget_fractions``: one cell per fraction of the
forget documents, each from the target; ``sequential_folds``: one cell per fold, each from the
model the fold before left; :mod:`.parts`)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

from unlearn_plugins.study.spec import Cell, Study

#: the [benchmark] keys of a WMDP study
KEYS = (
    "source",
    "corpus",
    "pathogens",
    "compounds",
    "retain_documents",
    "data_seed",
    "wmdp_dir",
    "forget_corpus",
    "retain_corpus",
    "mmlu_per_subject",
    "forget_fractions",
    "sequential_folds",
)
#: the tasks every WMDP study evaluates, per corpus
REQUIRED = {"synthetic": ("wmdp_synthetic_cloze", "wmdp_synthetic", "wmdp_mmlu"), "real": ("wmdp_local", "wmdp_mmlu")}


@dataclass(frozen=True)
class WmdpBench:
    """[benchmark] of a WMDP study."""

    corpus: str  # synthetic | real
    synthetic: dict | None  # synthetic.Settings as a dict (corpus = "synthetic")
    wmdp_dir: str | None  # corpus = "real": the local folder (None: $UNLEARN_WMDP_DIR)
    forget_corpus: str | None = None  # corpus = "real": a corpus name of .data or a text: spec
    retain_corpus: str | None = None
    mmlu_per_subject: int = 20
    #: scalability: each method x seed unlearns these fractions of the forget documents (:mod:`.parts`)
    forget_fractions: tuple[float, ...] = ()
    #: sustainability: the forget documents in this many folds, unlearned one after another
    sequential_folds: int = 0

    #: keys added after the first WMDP study: left out of its digest and report while unset
    LATER_FIELDS = {"forget_fractions": (), "sequential_folds": 0}

    @property
    def grid(self) -> str | None:
        """The study's grid over the forget corpus: "scalability", "sustainability" or None."""
        return "scalability" if self.forget_fractions else "sustainability" if self.sequential_folds else None


def _refuse_author_unit(reader, extra: dict) -> None:
    for key in extra.get("benchmark", {}):
        raise reader.error("benchmark", key, "is for an author-unit study; a WMDP study forgets documents")
    for name in extra.get("tables", {}):
        raise reader.error(name, None, "is for an author-unit study; not available in a WMDP study")
    for name, _ in extra.get("method_sweeps", {}).values():
        raise reader.error(f"methods.{name}", "sweep", "is for an author-unit study")
    if "report" in extra:
        raise reader.error("evaluation", "report", "is for an author-unit study")


def _grid(reader, bench: dict, wmdp: WmdpBench) -> WmdpBench:
    """``forget_fractions`` or ``sequential_folds`` (:mod:`.parts`), checked against the synthetic
    corpus's document count (a real corpus's: when the study is planned)."""
    from . import parts

    if "forget_fractions" in bench and "sequential_folds" in bench:
        raise reader.error("benchmark", "sequential_folds", "one grid at a time: remove forget_fractions or this key")
    fractions, folds = (), 0
    if "forget_fractions" in bench:
        given = bench["forget_fractions"]
        if not isinstance(given, list) or not given:
            raise reader.error("benchmark", "forget_fractions", f"must be a non-empty list of numbers, got {given!r}")
        for f in given:
            if isinstance(f, bool) or not isinstance(f, (int, float)) or not 0 < f <= 1:
                raise reader.error("benchmark", "forget_fractions", f"each must be a number in (0, 1], got {f!r}")
        if any(b <= a for a, b in zip(given, given[1:])):
            raise reader.error("benchmark", "forget_fractions", f"must be increasing, got {given}")
        fractions = tuple(float(f) for f in given)
    if "sequential_folds" in bench:
        folds = reader.get("benchmark", bench, "sequential_folds", "int", minimum=2)
    if wmdp.synthetic is not None and (fractions or folds):
        documents = wmdp.synthetic["pathogens"] + wmdp.synthetic["compounds"]
        why = parts.check(documents, fractions, folds)
        if why:
            raise reader.error("benchmark", "forget_fractions" if fractions else "sequential_folds", why)
    return dataclasses.replace(wmdp, forget_fractions=fractions, sequential_folds=folds)


def read(reader, data: dict, bench: dict, extra: dict, **head) -> Study:
    """A study on WMDP (``reader``: the study file's reader, :mod:`unlearn_plugins.study.spec`)."""
    from . import data as wmdp_data
    from .synthetic import Settings

    _refuse_author_unit(reader, extra)
    reader.keys("benchmark", bench, KEYS)
    corpus = reader.get("benchmark", bench, "corpus", "str", "synthetic", choices=("synthetic", "real"))
    per_subject = reader.get("benchmark", bench, "mmlu_per_subject", "int", 20, minimum=1)
    if corpus == "synthetic":
        for key in ("wmdp_dir", "forget_corpus", "retain_corpus"):
            if key in bench:
                raise reader.error("benchmark", key, 'only applies to corpus = "real"')
        defaults = Settings()
        settings = Settings(
            pathogens=reader.get("benchmark", bench, "pathogens", "int", defaults.pathogens, minimum=1, maximum=200),
            compounds=reader.get("benchmark", bench, "compounds", "int", defaults.compounds, minimum=0, maximum=200),
            retain_documents=reader.get(
                "benchmark", bench, "retain_documents", "int", defaults.retain_documents, minimum=1
            ),
            seed=reader.get("benchmark", bench, "data_seed", "int", defaults.seed, minimum=0),
        )
        wmdp = WmdpBench("synthetic", dataclasses.asdict(settings), None, mmlu_per_subject=per_subject)
    else:
        for key in ("pathogens", "compounds", "retain_documents", "data_seed"):
            if key in bench:
                raise reader.error("benchmark", key, 'only applies to corpus = "synthetic"')
        wmdp_dir = reader.get("benchmark", bench, "wmdp_dir", "str")
        wmdp = WmdpBench(
            "real",
            None,
            str(reader.relative(wmdp_dir)) if wmdp_dir else None,
            reader.get("benchmark", bench, "forget_corpus", "str", wmdp_data.FORGET_CORPORA[0]),
            reader.get("benchmark", bench, "retain_corpus", "str", wmdp_data.RETAIN_CORPORA[0]),
            per_subject,
        )
    wmdp = _grid(reader, bench, wmdp)
    target_t, retain_t = reader.table(data, "target"), reader.table(data, "retain")
    if retain_t:
        raise reader.error("retain", None, "a WMDP study has no retain model (WMDP has none); remove the table")
    if "given" in target_t:
        raise reader.error("target", "given", "not available in a WMDP study yet (its target is taught or the base)")
    if corpus == "real" and target_t:
        raise reader.error("target", None, 'corpus = "real" unlearns the base model itself; remove [target]')
    if corpus == "synthetic" and not target_t:
        raise reader.error("target", None, "missing: the recipe that teaches the synthetic facts ([target.finetune])")
    target = reader.recipe("target", target_t, None) if target_t else None
    budget = reader.budget(data)
    methods = reader.methods(data, budget, head["max_length"], head["one_budget"])
    evaluation = reader.evaluation(data, required=())
    if "tasks" not in reader.table(data, "evaluation"):
        evaluation = dataclasses.replace(evaluation, tasks=REQUIRED[corpus])
    missing = [t for t in REQUIRED[corpus] if t not in evaluation.tasks]
    if missing:
        raise reader.error(
            "evaluation", "tasks", f"must include {', '.join(missing)} (the WMDP study reports them beside each other)"
        )
    if "cud" in data:
        raise reader.error("cud", None, "not available in a WMDP study")
    return reader.benchmark_study(
        "wmdp",
        target=target,
        retain=None,
        budget=budget,
        methods=methods,
        evaluation=evaluation,
        benchmark=wmdp,
        **head,
    )


def expand(study: Study) -> list[Cell]:
    """The base model's evaluation, the target (taught: synthetic) and its evaluation, then
    seed x method (unlearning from the raw text, then the evaluation)."""
    from . import parts

    wmdp = study.benchmark
    cells = [Cell("eval-base", "eval_base", "evaluate the base model (before it is taught)")]
    target_deps: tuple[str, ...] = ()
    if wmdp.corpus == "synthetic":
        cells.append(Cell("target", "target", "teach the base model the synthetic facts (the forget documents)"))
        cells.append(Cell("eval-target", "eval_full", "evaluate the taught model", deps=("target",)))
        target_deps = ("target",)
    for seed in study.seeds:
        for method in study.methods:
            name, label = f"{method.name}/seed{seed}", f"{method.label}, seed {seed}"
            if not wmdp.grid:
                cells.append(Cell.run(name, label, method, seed, target_deps))
            for f in wmdp.forget_fractions:  # each from the target, on a nested part
                part = parts.fraction_name(f)
                cells.append(
                    Cell.run(f"{name}/{part}", f"{label}, {f:g} of the forget documents", method, seed, target_deps)
                )
            for k in range(1, wmdp.sequential_folds + 1):  # each from the model the one before left
                before = (f"{name}/{parts.fold_name(k - 1)}",) if k > 1 else target_deps
                request = f"{label}, request {k} of {wmdp.sequential_folds} (fold {k})"
                cells.append(Cell.run(f"{name}/{parts.fold_name(k)}", request, method, seed, before))
    return cells


def plan(study: Study, **options):
    """The cells' stages (:func:`.cells.plan_wmdp_study`)."""
    from .cells import plan_wmdp_study

    return plan_wmdp_study(study, **options)


def grid(study: Study) -> str:
    wmdp = study.benchmark
    runs = len(study.methods) * len(study.seeds)
    corpus = "synthetic facts taught first" if wmdp.corpus == "synthetic" else "the real corpora"
    if wmdp.forget_fractions:
        n = len(wmdp.forget_fractions)
        return f"{len(study.methods)} methods x {len(study.seeds)} seeds x {n} forget fractions = {runs * n} runs ({corpus})"
    if wmdp.sequential_folds:
        k = wmdp.sequential_folds
        return f"{len(study.methods)} methods x {len(study.seeds)} seeds x {k} sequential requests = {runs * k} runs ({corpus})"
    return f"{len(study.methods)} methods x {len(study.seeds)} seeds = {runs} runs ({corpus})"


#: where `unlearn study`'s line about failed cells points (the report names them, not why)
FAILED_CELLS_SEE = "logs: {out}/logs"


def refuse(study, args) -> None:
    """--records, refused before any work: a WMDP study's cells are not recorded yet."""
    from unlearn_plugins.errors import UnlearnError

    if args.records:
        raise UnlearnError(f"--records: not available for a WMDP study ({study.path}) yet")


def write_report(out: Path, plan, results: dict, run: dict) -> tuple[list[str], str, dict, None]:
    """Its report (:func:`.report.write_report`) as the core's runner writes a study's: (files,
    table, cells left out, why no verdict); a --report-only one states no wall time."""
    from . import report

    table, files = report.write_report(out, plan, results, wall_s=run.get("wall_time_s"))
    return files, table, {}, None


__all__ = ["read", "expand", "plan", "grid", "refuse", "write_report", "WmdpBench"]
