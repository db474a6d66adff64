"""Studies whose unit of replication is the forget author (``reglu_tofu_v2``): the
study file's tables for them, their validation and their grid of cells.

``[benchmark] unit = "author"`` makes every test author (``test_authors``, TOFU ids) its own
forget set, forgotten alone with its own retain model; ``reserved_author`` is used only to
choose each method's operating point. The tables this module reads (docs/study.md):

- ``[noise_ceiling]``: ``authors`` (reserved or test authors), ``seeds``: more retain models
  (the retain recipe at those seeds), each evaluated against the seed-0 one (the ceiling);
- ``[sweep]``: on the reserved author, one traced run per method, learning rate (``lr``) and
  method setting (a method's ``sweep = {rol_weight = [...], rol_rank = [...]}``), ``epochs``
  long, ``trace``-d every epoch; ``heldout``: the QA of the held-out probability;
  ``model_utility_evaluations_max``: full evaluations per method while choosing;
- ``[operating_point]``: the rule (:meth:`.operating_point.Rule.from_mapping`);
- ``[[comparisons]]``: the families of paired comparisons over the test authors, fixed before
  the run (``method`` against each of ``rivals``, or ``pairs``; ``method = "leader"`` with
  ``post_hoc = true``: the best mean against the others, exploratory);
- ``[statistics]``: ``alternative``, ``alpha``, ``correction`` (Holm);
- ``[verdict]``: ``method``, ``family``, ``utility_margin``;
- ``[evaluation] report``: metrics reported beside Forget Quality.

Every mistake is one line ``FILE: [table] key: what is wrong``, as :mod:`.spec`'s. This module
does not import :mod:`.spec` (spec imports it): the reader and the parsed study are handed in.
"""

from __future__ import annotations

import copy
import dataclasses
import math
from dataclasses import dataclass, field
from itertools import product
from typing import Any

from .operating_point import OperatingPointError, Rule
from .statistics import ALTERNATIVES, minimum_units

UNITS = ("author",)
#: the tables an author-unit study adds to :data:`.spec.TABLES`
TABLES = ("noise_ceiling", "sweep", "operating_point", "comparisons", "statistics", "verdict")
#: the [benchmark] keys an author-unit study adds
BENCHMARK_KEYS = ("unit", "test_authors", "reserved_author")
#: measures a traced sweep run can take every epoch (no full evaluation)
TRACE_MEASURES = ("forget_quality", "ks_statistic", "wasserstein_log", "forget_prob", "heldout_prob")
#: parts of the held-out probability: TOFU's real-authors and world-facts QA (at most as many as
#: TOFU has), and retain-author QA
HELDOUT_PARTS = {"real_authors": 100, "world_facts": 117, "retain_authors": None}
#: metrics a comparison can be made on (per test author, paired)
COMPARISON_METRICS = ("forget_quality", "ks_statistic", "wasserstein_log", "model_utility", "forget_prob")
#: metrics where lower is better (closer to the retain model)
LOWER_IS_BETTER = frozenset({"ks_statistic", "wasserstein_log", "forget_prob"})
#: [evaluation] report: reported beside Forget Quality
REPORT_EXTRAS = ("ks_statistic", "wasserstein_log", "model_utility_paired")
#: a method's ``sweep`` keys: ROL's weight and rank (the rank also RILA's retain basis, rol_rank)
METHOD_SWEEP_KEYS = ("rol_weight", "rol_rank")
CORRECTIONS = ("holm",)
LEADER = "leader"
#: the most traced sweep runs a study may declare (each is a full unlearning run; a grid beyond
#: this is a typing mistake, and building its cells' list alone takes minutes)
MAX_SWEEP_RUNS = 1000
#: TOFU's author ids are 0-199; a benchmark of N authors takes the last N (forget10_perturbed)
TOFU_LAST_AUTHOR = 199


@dataclass(frozen=True)
class Comparison:
    family: str
    metric: str
    #: (method, rival) pairs; empty for the post hoc leader family (decided by the results)
    pairs: tuple[tuple[str, str], ...]
    method: str | None = None  # the method compared with each rival ("leader": post hoc)
    post_hoc: bool = False


@dataclass(frozen=True)
class Sweep:
    author: int
    lr: tuple[float, ...]
    epochs: int
    trace: tuple[str, ...]
    heldout: dict
    model_utility_evaluations_max: int
    #: method -> its settings besides lr (a method's ``sweep``: every combination), [{}] for none
    settings: dict

    def runs(self, method: str) -> list[dict]:
        """The traced runs of ``method``: one per (lr, setting), in the declared order."""
        return [{"lr": lr, **setting} for lr in self.lr for setting in self.settings.get(method, [{}])]


@dataclass(frozen=True)
class Design:
    unit: str
    test_authors: tuple[int, ...]
    reserved_author: int | None
    noise_ceiling: dict | None  # {"authors": (...), "seeds": (...)}
    sweep: Sweep | None
    operating_point: dict | None  # the Rule's fields
    comparisons: tuple[Comparison, ...] = ()
    statistics: dict = field(default_factory=dict)
    verdict: dict | None = None
    report: tuple[str, ...] = ()

    @property
    def authors(self) -> tuple[int, ...]:
        """Every author with a retain model: the reserved one first, then the test authors."""
        return ((self.reserved_author,) if self.reserved_author is not None else ()) + self.test_authors

    def rule(self) -> Rule | None:
        return Rule(**self.operating_point) if self.operating_point is not None else None


# ----------------------------------------------------------------------------- reading


def split_tables(data: dict) -> tuple[dict, dict]:
    """(the study's tables without what this module reads, what it reads): the first goes to
    :mod:`.spec`'s reader as before, the second to :func:`read_design`. ``forget_authors``
    defaults to 1 when ``unit`` is given (each author is forgotten alone)."""
    data = copy.copy(data)
    extra: dict[str, Any] = {"tables": {t: data.pop(t) for t in TABLES if t in data}}
    bench = data.get("benchmark")
    if isinstance(bench, dict):
        bench = dict(bench)
        extra["benchmark"] = {k: bench.pop(k) for k in BENCHMARK_KEYS if k in bench}
        if "unit" in extra["benchmark"]:
            extra["forget_authors"] = bench.get("forget_authors")
            bench.setdefault("forget_authors", 1)
        data["benchmark"] = bench
    methods = data.get("methods")
    if isinstance(methods, list) and all(isinstance(m, dict) for m in methods):
        sweeps = {}
        stripped = []
        for i, entry in enumerate(methods):
            entry = dict(entry)
            if "sweep" in entry:
                sweeps[i] = (entry.get("name"), entry.pop("sweep"))
            stripped.append(entry)
        data["methods"] = stripped
        extra["method_sweeps"] = sweeps
    evaluation = data.get("evaluation")
    if isinstance(evaluation, dict) and "report" in evaluation:
        evaluation = dict(evaluation)
        extra["report"] = evaluation.pop("report")
        data["evaluation"] = evaluation
    return data, extra


def refuse_for_movielens(reader, extra: dict) -> None:
    """A MovieLens study forgets users, not authors: the author-unit keys and tables are refused
    by name (they were split off the tables before its reader saw them)."""
    for key in extra.get("benchmark", {}):
        raise reader.error(
            "benchmark",
            key,
            'is for an author-unit study (source = "tofu" or "generated"); a MovieLens study forgets users',
        )
    for name in extra.get("tables", {}):
        raise _table_error(
            reader, name, 'is for an author-unit study ([benchmark] unit = "author", source "tofu" or "generated")'
        )
    for name, _ in extra.get("method_sweeps", {}).values():
        raise reader.error(f"methods.{name}", "sweep", 'is for an author-unit study ([benchmark] unit = "author")')
    if "report" in extra:
        raise reader.error("evaluation", "report", 'is for an author-unit study ([benchmark] unit = "author")')


def benchmark_author_ids(source: str, authors: int) -> range:
    """The author ids of a benchmark of ``authors`` authors: TOFU's (and the generated source's,
    which has 20 authors 0-19) last ``authors``."""
    if source == "tofu":
        return range(TOFU_LAST_AUTHOR + 1 - authors, TOFU_LAST_AUTHOR + 1)
    from unlearn_plugins.data import synthetic

    return range(synthetic.N_AUTHORS - authors, synthetic.N_AUTHORS)


def read_design(reader, extra: dict, study) -> Design | None:
    """The author-unit part of a study (None for a study without ``[benchmark] unit``), checked
    against the parsed ``study`` (its methods, retain recipe, source); ``reader``: :mod:`.spec`'s
    ``_Reader`` (its ``error`` and value checks)."""
    bench = extra.get("benchmark", {})
    tables = extra.get("tables", {})
    if "unit" not in bench:
        if bench:
            key = next(iter(bench))
            raise reader.error("benchmark", key, 'needs unit = "author" (each test author forgotten alone)')
        for name in tables:
            raise _table_error(reader, name, 'needs [benchmark] unit = "author"')
        if extra.get("method_sweeps"):
            name, _ = next(iter(extra["method_sweeps"].values()))
            raise reader.error(f"methods.{name}", "sweep", 'needs [benchmark] unit = "author" and a [sweep] table')
        if "report" in extra:
            raise reader.error("evaluation", "report", 'needs [benchmark] unit = "author"')
        return None
    unit = reader.get("benchmark", bench, "unit", "str", choices=UNITS)
    if study.source not in ("tofu", "generated"):
        raise reader.error(
            "benchmark", "source", 'must be "tofu" or "generated" with unit = "author" (author ids depend on it)'
        )
    forget_authors = extra.get("forget_authors")
    if forget_authors is not None and forget_authors not in (1, [1]):
        raise reader.error("benchmark", "forget_authors", "must be 1 (or left out): each author is forgotten alone")
    ids = benchmark_author_ids(study.source, study.authors)
    tests = reader.int_list("benchmark", bench, "test_authors", minimum=ids.start, maximum=ids.stop - 1)
    reserved = None
    if "reserved_author" in bench:
        reserved = reader.get("benchmark", bench, "reserved_author", "int", minimum=ids.start, maximum=ids.stop - 1)
        if reserved in tests:
            raise reader.error("benchmark", "reserved_author", f"{reserved} is also a test author")
    if study.retain_given:
        raise reader.error(
            "retain", "given", "an author-unit study fine-tunes a retain model per author: give a recipe"
        )
    if study.cud is not None:
        raise reader.error(
            "cud",
            None,
            "an author-unit study has no CUD cell (each test author is forgotten whole, alone); remove the table",
        )
    for m in study.methods:
        if m.name == LEADER:
            raise reader.error(
                f"methods.{m.name}",
                "name",
                f'"{LEADER}" is reserved for the post hoc comparison of the best method ([[comparisons]] method = '
                f'"{LEADER}"); give the method another name',
            )
    known = (reserved, *tests) if reserved is not None else tests

    noise = None
    if "noise_ceiling" in tables:
        t = _table(reader, tables, "noise_ceiling")
        reader.keys("noise_ceiling", t, ("authors", "seeds"))
        authors = reader.int_list("noise_ceiling", t, "authors", minimum=ids.start, maximum=ids.stop - 1)
        stray = [a for a in authors if a not in known]
        if stray:
            raise reader.error("noise_ceiling", "authors", f"{stray[0]} is neither the reserved nor a test author")
        seeds = reader.int_list("noise_ceiling", t, "seeds", minimum=0, maximum=2**32 - 1)
        if study.retain.seed in seeds:
            raise reader.error(
                "noise_ceiling",
                "seeds",
                f"{study.retain.seed} is the retain recipe's seed (the reference): list the other seeds",
            )
        noise = {"authors": authors, "seeds": seeds}

    method_names = [m.name for m in study.methods]
    sweep = None
    if "sweep" in tables:
        sweep = _sweep(reader, _table(reader, tables, "sweep"), extra.get("method_sweeps", {}), study, reserved)
    else:
        for name, _ in extra.get("method_sweeps", {}).values():
            raise reader.error(f"methods.{name}", "sweep", "needs a [sweep] table (the runs it adds are traced there)")
    rule = None
    if "operating_point" in tables:
        if sweep is None:
            raise reader.error("operating_point", None, "needs a [sweep] table (the rule chooses among its points)")
        t = _table(reader, tables, "operating_point")
        try:
            rule = Rule.from_mapping(t)
        except (OperatingPointError, TypeError) as exc:
            key = next((k for k in ("tolerance", "band", "on_none") if str(exc).startswith(k)), None)
            raise reader.error("operating_point", key, str(exc)) from None
    elif sweep is not None:
        rule = Rule()

    statistics = {"alternative": "two-sided", "alpha": 0.05, "correction": "holm"}
    if "statistics" in tables:
        t = _table(reader, tables, "statistics")
        reader.keys("statistics", t, tuple(statistics))
        statistics["alternative"] = reader.get("statistics", t, "alternative", "str", "two-sided", choices=ALTERNATIVES)
        statistics["alpha"] = _number(reader, "statistics", t, "alpha", 0.05, low=0, high=1, open_ends=True)
        statistics["correction"] = reader.get("statistics", t, "correction", "str", "holm", choices=CORRECTIONS)
    comparisons = _comparisons(reader, tables.get("comparisons"), method_names) if "comparisons" in tables else ()
    verdict = None
    if "verdict" in tables:
        verdict = _verdict(reader, _table(reader, tables, "verdict"), comparisons, method_names, tests, statistics)
    report: tuple[str, ...] = ()
    if "report" in extra:
        report = _name_list(reader, "evaluation", "report", extra["report"], REPORT_EXTRAS, "metric", "metric names")
    return Design(
        unit=unit,
        test_authors=tests,
        reserved_author=reserved,
        noise_ceiling=noise,
        sweep=sweep,
        operating_point=dataclasses.asdict(rule) if rule is not None else None,
        comparisons=comparisons,
        statistics=statistics,
        verdict=verdict,
        report=report,
    )


def _table_error(reader, name: str, what: str):
    where = f"[[{name}]]" if name == "comparisons" else f"[{name}]"
    return type(reader.error(name, None, ""))(f"{reader.path}: {where}: {what}")


def _table(reader, tables: dict, name: str) -> dict:
    value = tables[name]
    if not isinstance(value, dict):
        raise _table_error(reader, name, f"must be a table, got {_show(value)}")
    return value


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _number(reader, table, values, key, default, *, low=None, high=None, open_ends=False) -> float:
    if key not in values:
        return default
    value = values[key]
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise reader.error(table, key, f"must be a finite number, got {_show(value)}")
    if open_ends and ((low is not None and value <= low) or (high is not None and value >= high)):
        raise reader.error(table, key, f"must be between {low:g} and {high:g} (exclusive), got {value!r}")
    if not open_ends and low is not None and value < low:
        raise reader.error(table, key, f"must be >= {low:g}, got {value!r}")
    return float(value)


def _name_list(reader, table: str, key: str, value: Any, known, what: str, listed: str | None = None) -> tuple:
    """``value``: a list of ``known`` names, none twice (``what``: one of them; ``listed``: the
    list's words in the error, by default ``what`` + "s")."""
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise reader.error(table, key, f"must be a list of {listed or what + 's'}, got {_show(value)}")
    _known(reader, table, key, value, known, what)
    _once(reader, table, key, value, f"lists a {what} twice")
    return tuple(value)


def _known(reader, table: str, key: str, value: list, known, what: str, label: str = "known") -> None:
    """Refuse a name of ``value`` outside ``known`` (the error lists them after ``label``)."""
    for v in value:
        if v not in known:
            raise reader.error(table, key, f"unknown {what} {v!r}; {label}: {', '.join(known)}")


def _once(reader, table: str, key: str, value: list, twice: str | None = None) -> None:
    """Refuse a list with a value twice (``twice``: the error; by default it names the value)."""
    if len(set(value)) != len(value):
        raise reader.error(table, key, twice or f"{next(v for v in value if value.count(v) > 1)!r} is listed twice")


def _number_list(reader, table: str, values: dict, key: str, *, integer: bool, positive: bool = True) -> tuple:
    value = values.get(key)
    if not isinstance(value, list) or not value:
        kind = "integers" if integer else "numbers"
        raise reader.error(table, key, f"must be a non-empty list of {kind}, got {_show(value)}")
    for v in value:
        bad = isinstance(v, bool) or not isinstance(v, int if integer else (int, float))
        if bad or (not integer and not math.isfinite(v)):
            raise reader.error(table, key, f"must be a list of {'integers' if integer else 'numbers'}, got {_show(v)}")
        if positive and v <= 0:
            raise reader.error(table, key, f"each value must be > 0, got {v!r}")
    _once(reader, table, key, value)
    return tuple(v if integer else float(v) for v in value)


def _sweep(reader, t: dict, method_sweeps: dict, study, reserved: int | None) -> Sweep:
    reader.keys("sweep", t, ("author", "lr", "epochs", "trace", "heldout", "model_utility_evaluations_max"))
    if reserved is None:
        raise reader.error("sweep", None, "needs [benchmark] reserved_author (the sweep runs on it alone)")
    author = reader.get("sweep", t, "author", "int", reserved)
    if author != reserved:
        raise reader.error(
            "sweep",
            "author",
            f"must be the reserved author ({reserved}): a test author's own runs would choose its operating point",
        )
    if "lr" not in t:
        raise reader.error("sweep", "lr", "missing")
    lrs = _number_list(reader, "sweep", t, "lr", integer=False)
    epochs = reader.get("sweep", t, "epochs", "int", required=True, minimum=1)
    trace = _name_list(reader, "sweep", "trace", t.get("trace", ["forget_quality"]), TRACE_MEASURES, "measure")
    if "forget_quality" not in trace:
        raise reader.error("sweep", "trace", "must include forget_quality (the operating-point rule ranks by it)")
    heldout: dict = {}
    if "heldout" in t:
        h = reader.get("sweep", t, "heldout", "table")
        reader.keys("sweep.heldout", h, tuple(HELDOUT_PARTS))
        retain_qa = (study.authors - 1) * 20
        for part, most in HELDOUT_PARTS.items():
            most = retain_qa if most is None else most
            heldout[part] = reader.get("sweep.heldout", h, part, "int", 0, minimum=0, maximum=most)
    if "heldout_prob" in trace and not any(heldout.values()):
        raise reader.error("sweep", "heldout", "missing: trace heldout_prob needs its QA (real_authors, ...)")
    evaluations = reader.get("sweep", t, "model_utility_evaluations_max", "int", 4, minimum=1)

    # the budget: the sweep sets lr and epochs; the epoch-e checkpoint is the e-epoch run only
    # with a constant learning rate and no warmup
    for key, why in (("lr", "[sweep] lr"), ("epochs", "[sweep] epochs"), ("max_steps", "[sweep] epochs")):
        if key in study.budget:
            raise reader.error("budget", key, f"is each method's operating point ({why}); remove it")
    for method in study.methods:
        config = method.config
        if config.get("lr_scheduler") != "constant" or any(
            config.get(k) for k in ("warmup_steps", "warmup_ratio", "warmup_epochs")
        ):
            raise reader.error(
                "budget",
                "lr_scheduler",
                f'must be "constant" without warmup with a [sweep] (method {method.name}: '
                f"{config.get('lr_scheduler')!r}): the epoch-e checkpoint of a traced run is the e-epoch run "
                f"only then",
            )
    settings = {}
    by_name = {m.name: m for m in study.methods}
    runs = 0
    for m in study.methods:  # counted before any setting's components are built
        sizes = [
            len(v) if isinstance(v, list) else 1 for v in (_method_sweeps_of(method_sweeps, m.name) or {}).values()
        ]
        runs += len(lrs) * math.prod(sizes)
    if runs > MAX_SWEEP_RUNS:
        raise reader.error(
            "sweep",
            "lr",
            f"{len(lrs)} learning rates x the methods' sweep settings make {runs:,} traced runs, each a full "
            f"unlearning run of {epochs} epoch(s); at most {MAX_SWEEP_RUNS:,}",
        )
    for name, values in method_sweeps.values():
        settings[name] = _method_sweep(reader, name, values, by_name[name])
    return Sweep(
        author=author,
        lr=lrs,
        epochs=epochs,
        trace=tuple(trace),
        heldout=heldout,
        model_utility_evaluations_max=evaluations,
        settings=settings,
    )


def _method_sweeps_of(method_sweeps: dict, name: str) -> dict | None:
    """A method's ``sweep`` table as written (None without one, or when it is not a table)."""
    found = next((values for n, values in method_sweeps.values() if n == name), None)
    return found if isinstance(found, dict) else None


def _method_sweep(reader, name: str, values: Any, method) -> list[dict]:
    """Every combination of a method's ``sweep`` values, each checked by building its components."""
    table = f"methods.{name}"
    if not isinstance(values, dict) or not values:
        raise reader.error(table, "sweep", f"must be a table of lists (rol_weight = [...], ...), got {_show(values)}")
    for key in values:
        if key not in METHOD_SWEEP_KEYS:
            raise reader.error(table, "sweep", f"unknown key {key!r}; known: {', '.join(METHOD_SWEEP_KEYS)}")
    if method.config.get("regularizer") != "rol":
        raise reader.error(table, "sweep", 'sweeps ROL settings: needs regularizer = "rol"')
    lists = {
        key: _number_list(reader, f"{table}.sweep", values, key, integer=key == "rol_rank")
        for key in METHOD_SWEEP_KEYS
        if key in values
    }
    combos = [dict(zip(lists, combo)) for combo in product(*lists.values())]
    for combo in combos:
        reader.components(table, apply_setting(method.config, combo))
    return combos


def apply_setting(config: dict, setting: dict) -> dict:
    """A method's resolved config with one sweep setting (lr, rol_weight, rol_rank) applied."""
    config = copy.deepcopy(config)
    if "lr" in setting:
        config["lr"] = setting["lr"]
    if "rol_weight" in setting:
        config["regularizer_options"] = {**(config.get("regularizer_options") or {}), "weight": setting["rol_weight"]}
    if "rol_rank" in setting:
        config["regularizer_options"] = {**(config.get("regularizer_options") or {}), "rank": setting["rol_rank"]}
        if config.get("initializer") in ("rila", "random_residual"):  # the retain basis ROL reads
            config["initializer_options"] = {
                **(config.get("initializer_options") or {}),
                "rol_rank": setting["rol_rank"],
            }
    return config


def _comparisons(reader, entries: Any, methods: list[str]) -> tuple[Comparison, ...]:
    if not isinstance(entries, list) or not entries or not all(isinstance(e, dict) for e in entries):
        raise _table_error(
            reader, "comparisons", f"must be an array of tables ([[comparisons]] ...), got {_show(entries)}"
        )
    out: list[Comparison] = []
    for i, entry in enumerate(entries, 1):
        family = entry.get("family")
        table = f"comparisons.{family}" if isinstance(family, str) and family else f"comparisons #{i}"
        reader.keys(table, entry, ("family", "metric", "method", "rivals", "pairs", "post_hoc"))
        family = reader.get(table, entry, "family", "str", required=True)
        if any(c.family == family for c in out):
            raise reader.error(table, "family", f"{family!r} is used by another [[comparisons]] table")
        metric = reader.get(table, entry, "metric", "str", required=True, choices=COMPARISON_METRICS)
        post_hoc = entry.get("post_hoc", False)
        if not isinstance(post_hoc, bool):
            raise reader.error(table, "post_hoc", f"must be true or false, got {_show(post_hoc)}")
        method = reader.get(table, entry, "method", "str", None)
        if method is not None and method != LEADER and method not in methods:
            raise reader.error(table, "method", f"unknown method {method!r}; methods: {', '.join(methods)}, or leader")
        pairs: list[tuple[str, str]] = []
        if method == LEADER:
            if not post_hoc:
                raise reader.error(
                    table, "post_hoc", 'must be true with method = "leader" (the leader is picked after the results)'
                )
            for key in ("rivals", "pairs"):
                if key in entry:
                    raise reader.error(table, key, "the leader is compared with every other method: remove it")
        elif "rivals" in entry:
            if "pairs" in entry:
                raise reader.error(table, "pairs", "give rivals (with method) or pairs, not both")
            if method is None:
                raise reader.error(table, "method", "missing: rivals are compared with it")
            rivals = _names(reader, table, "rivals", entry["rivals"], methods)
            if method in rivals:
                raise reader.error(table, "rivals", f"{method!r} is the method itself")
            pairs = [(method, r) for r in rivals]
        elif "pairs" in entry:
            if method is not None:
                raise reader.error(table, "method", "give pairs or method with rivals, not both")
            value = entry["pairs"]
            if not isinstance(value, list) or not value:
                raise reader.error(
                    table, "pairs", f"must be a non-empty list of [method, rival] pairs, got {_show(value)}"
                )
            for pair in value:
                if not isinstance(pair, list) or len(pair) != 2:
                    raise reader.error(table, "pairs", f"each pair must be [method, rival], got {_show(pair)}")
                a, b = _names(reader, table, "pairs", pair, methods)
                pairs.append((a, b))
        else:
            raise reader.error(table, "rivals", "missing: give method and rivals, or pairs")
        seen: set[frozenset] = set()
        for a, b in pairs:
            if frozenset((a, b)) in seen:
                raise reader.error(table, "pairs" if "pairs" in entry else "rivals", f"{a} vs {b} is declared twice")
            seen.add(frozenset((a, b)))
        out.append(Comparison(family=family, metric=metric, pairs=tuple(pairs), method=method, post_hoc=post_hoc))
    return tuple(out)


def _names(reader, table: str, key: str, value: Any, methods: list[str]) -> list[str]:
    if not isinstance(value, list) or not value or not all(isinstance(v, str) for v in value):
        raise reader.error(table, key, f"must be a non-empty list of method names, got {_show(value)}")
    _known(reader, table, key, value, methods, "method", "methods")
    _once(reader, table, key, value)
    return list(value)


def _verdict(reader, t: dict, comparisons, methods, tests, statistics) -> dict:
    reader.keys("verdict", t, ("method", "family", "utility_margin"))
    method = reader.get("verdict", t, "method", "str", required=True, choices=methods)
    family = reader.get("verdict", t, "family", "str", required=True)
    chosen = next((c for c in comparisons if c.family == family), None)
    if chosen is None:
        known = ", ".join(c.family for c in comparisons) or "none"
        raise reader.error("verdict", "family", f"no [[comparisons]] family {family!r} (declared: {known})")
    if chosen.post_hoc or chosen.method != method:
        raise reader.error(
            "verdict", "family", f"must be a declared (not post hoc) family of {method} against rivals, got {family!r}"
        )
    margin = _number(reader, "verdict", t, "utility_margin", 0.02, low=0)
    m, alpha, alternative = len(chosen.pairs), statistics["alpha"], statistics["alternative"]
    needed = minimum_units(m, alpha, alternative)
    if len(tests) < needed:
        raise reader.error(
            "verdict",
            "family",
            f"with {len(tests)} test authors no comparison of {family!r} can reach alpha {alpha:g} after Holm over "
            f"{m} (needs at least {needed} authors: statistics.minimum_units)",
        )
    return {"method": method, "family": family, "utility_margin": margin}


# ----------------------------------------------------------------------------- the grid


def setting_name(setting: dict) -> str:
    """A sweep run's name: ``lr0.0001`` plus its method setting (``-rol_weight0.1-rol_rank16``)."""
    return "-".join(f"{k}{v:g}" for k, v in setting.items())


def cells(study) -> list[dict]:
    """The grid of an author-unit study, as :class:`.spec.Cell` fields, each cell after the cells
    it needs: the target; per author (reserved first) its retain model and the evaluations of it
    and of the target on that author's split; the noise ceiling's retain seeds and their
    evaluations against the seed-0 retain model; the sweep's traced runs on the reserved author and
    each method's operating point; then seed x test author x method, each waiting for its
    method's operating point."""
    design: Design = study.design
    out: list[dict] = []

    def add(cell_id: str, kind: str, label: str, **fields) -> None:
        out.append(dict(id=cell_id, kind=kind, label=label, **fields))

    target = None
    if study.target.given is None:
        target = "target"
        add("target", "target", f"fine-tune the target on {study.authors} authors", forget=None)
    before_target = (target,) if target else ()
    ceiling = design.noise_ceiling or {"authors": (), "seeds": ()}
    for a in design.authors:
        role = "reserved author" if a == design.reserved_author else "author"
        retain = f"retain/author{a}"
        add(retain, "retain", f"fine-tune the retain model ({role} {a})", author=a)
        ref = f"eval-retain/author{a}"
        add(ref, "eval_retain", f"evaluate the retain model ({role} {a})", author=a, deps=(retain,))
        label = f"evaluate the target ({role} {a})"
        add(f"eval-full/author{a}", "eval_full", label, author=a, deps=(*before_target, ref))
        if a in ceiling["authors"]:
            for s in ceiling["seeds"]:
                other = f"retain/author{a}/seed{s}"
                label = f"fine-tune the retain model, seed {s} ({role} {a}; noise ceiling)"
                add(other, "retain", label, author=a, seed=s)
                label = f"evaluate retain seed {s} against seed {study.retain.seed} ({role} {a}; noise ceiling)"
                add(f"ceiling/author{a}/seed{s}", "eval_ceiling", label, author=a, seed=s, deps=(other, ref))
    point: dict[str, str] = {}
    if design.sweep is not None:
        sweep = design.sweep
        ref = f"eval-retain/author{sweep.author}"
        for method in study.methods:
            runs = []
            for setting in sweep.runs(method.name):
                cell_id = f"sweep/{method.name}/{setting_name(setting)}"
                shown = ", ".join(f"{k} {v:g}" for k, v in setting.items())
                label = f"{method.label}: traced run, {shown}, {sweep.epochs} epochs (author {sweep.author})"
                # the reference truth ratios come from the retain model itself (trace.py),
                # so a fresh machine rebuilds it even where its evaluation is recorded
                deps = (*before_target, f"retain/author{sweep.author}", ref)
                add(cell_id, "sweep", label, author=sweep.author, method=method.name, deps=deps)
                runs.append(cell_id)
            point[method.name] = f"operating-point/{method.name}"
            label = (
                f"{method.label}: operating point (Model Utility at up to "
                f"{sweep.model_utility_evaluations_max} points, the rule)"
            )
            # its Model Utility evaluations load the target under each point's adapter
            deps = (*before_target, *runs, f"eval-full/author{sweep.author}")
            add(point[method.name], "operating_point", label, author=sweep.author, method=method.name, deps=deps)
    for seed in study.seeds:
        for a in design.test_authors:
            for method in study.methods:
                deps = tuple(d for d in (target, f"eval-retain/author{a}", point.get(method.name)) if d)
                cell_id, label = f"{method.name}/author{a}/seed{seed}", f"{method.label}, author {a}, seed {seed}"
                add(cell_id, "method", label, author=a, method=method.name, seed=seed, deps=deps)
    for cell in out:
        cell.setdefault("forget", 1)  # each author is forgotten alone
    return out


def describe_grid(study) -> str:
    """One line for ``unlearn study --list``: the runs an author-unit study makes."""
    design: Design = study.design
    methods, tests, seeds = len(study.methods), len(design.test_authors), len(study.seeds)
    text = f"{methods} methods x {tests} test authors x {seeds} seeds = {methods * tests * seeds} runs"
    if design.sweep is not None:
        n = sum(len(design.sweep.runs(m.name)) for m in study.methods)
        text += f", {n} traced sweep runs on author {design.sweep.author}"
    retain = len(design.authors)
    if design.noise_ceiling:
        retain += len(design.noise_ceiling["authors"]) * len(design.noise_ceiling["seeds"])
    return text + f", {retain} retain models"


__all__ = ["Design", "Sweep", "Comparison", "split_tables", "read_design", "cells", "describe_grid", "apply_setting"]
