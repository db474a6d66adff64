"""Author-unit studies (unlearn_plugins/study/design.py): the tables of reglu_tofu_v2
read by the spec parser, one exact error line per kind of mistake, the grid (per-author retain
models, the noise ceiling, the sweep, the operating points, test cells waiting for them), the
dry run, and a per-author benchmark."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from support_checks import author_study_toml

from unlearn_plugins.cli import main
from unlearn_plugins.study import StudyError, builtin_studies, expand, load_study

#: a small author-unit study: tiny-llama, 6 generated authors (ids 14-19), 2 test authors
AUTHORS = author_study_toml(
    "tiny_authors",
    6,
    [18, 19],
    14,
    ceiling="[noise_ceiling]\nauthors = [14]\nseeds = [1]\n\n",
    rest="""[[methods]]
name = "control"
objective = "ihl"
initializer = "random_residual"
initializer_options = { norm_from = "rila", beta = 0.7 }

[sweep]
author = 14
lr = [1e-4, 1e-3]
epochs = 2
trace = ["forget_quality", "wasserstein_log"]

[operating_point]
tolerance = 0.05

[[comparisons]]
family = "control"
metric = "wasserstein_log"
pairs = [["reglu", "control"]]

[evaluation]
mu_size = 4
batch_size = 8
gen_margin = 4
report = ["ks_statistic"]
""",
)


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "study.toml"
    path.write_text(text)
    return path


def test_reglu_tofu_v2_is_read_and_expanded():
    study = load_study("reglu_tofu_v2")
    design = study.design
    assert design.test_authors == tuple(range(190, 200)) and design.reserved_author == 180
    assert design.noise_ceiling == {"authors": (180, 190), "seeds": (1, 2)}
    assert design.sweep.lr == (1e-4, 3e-4, 1e-3) and design.sweep.epochs == 10
    assert design.rule().tolerance == 0.02 and design.rule().band == "below"
    assert [c.family for c in design.comparisons] == ["primary", "wasserstein", "control", "leader"]
    assert design.comparisons[2].pairs == (("ihl_rila", "ihl_random_residual"), ("reglu", "ihl_random_residual"))
    assert design.verdict == {"method": "reglu", "family": "primary", "utility_margin": 0.02}
    assert study.method("ihl_random_residual").config["initializer"] == "random_residual"
    cells = expand(study)
    kinds = {}
    for cell in cells:
        kinds[cell.kind] = kinds.get(cell.kind, 0) + 1
    # 11 authors' retain models + 4 noise-ceiling seeds; 30 traced runs; 7 methods x 10 authors
    assert kinds == {
        "target": 1,
        "retain": 15,
        "eval_retain": 11,
        "eval_full": 11,
        "eval_ceiling": 4,
        "sweep": 30,
        "operating_point": 7,
        "method": 70,
    }
    by_id = {c.id: c for c in cells}
    assert by_id["reglu/author193/seed0"].deps == ("target", "eval-retain/author193", "operating-point/reglu")
    assert by_id["ceiling/author190/seed2"].deps == ("retain/author190/seed2", "eval-retain/author190")
    assert len([c for c in cells if c.id.startswith("sweep/reglu/")]) == 12
    assert all(c.author == 180 for c in cells if c.kind in ("sweep", "operating_point"))
    assert not any(c.author == 180 for c in cells if c.kind == "method")  # never a test author
    seen = set()
    for cell in cells:  # every cell after the cells it needs
        assert set(cell.deps) <= seen, cell.id
        seen.add(cell.id)


def test_reglu_tofu_v2_is_listed(capsys):
    assert "reglu_tofu_v2" in builtin_studies()
    assert main(["study", "--list"]) == 0
    out = capsys.readouterr().out
    assert (
        "(7 methods x 10 test authors x 1 seeds = 70 runs, 30 traced sweep runs on author 180, 15 retain models)" in out
    )
    assert "reglu_tofu " in out  # v1 stays


def test_the_grid_of_a_small_author_study(tmp_path):
    study = load_study(str(write(tmp_path, AUTHORS)))
    assert study.forget_sizes == (1,)  # each author forgotten alone
    ids = [c.id for c in expand(study)]
    assert ids == [
        "target",
        "retain/author14",
        "eval-retain/author14",
        "eval-full/author14",
        "retain/author14/seed1",
        "ceiling/author14/seed1",
        "retain/author18",
        "eval-retain/author18",
        "eval-full/author18",
        "retain/author19",
        "eval-retain/author19",
        "eval-full/author19",
        "sweep/ihl/lr0.0001",
        "sweep/ihl/lr0.001",
        "operating-point/ihl",
        "sweep/reglu/lr0.0001-rol_weight0.1",
        "sweep/reglu/lr0.0001-rol_weight0.5",
        "sweep/reglu/lr0.001-rol_weight0.1",
        "sweep/reglu/lr0.001-rol_weight0.5",
        "operating-point/reglu",
        "sweep/control/lr0.0001",
        "sweep/control/lr0.001",
        "operating-point/control",
        *[f"{m}/author{a}/seed0" for a in (18, 19) for m in ("ihl", "reglu", "control")],
    ]
    from unlearn_plugins.benchmarks.tofu.study.design import apply_setting

    reglu = study.method("reglu")
    config = apply_setting(reglu.config, {"lr": 1e-3, "rol_weight": 0.5, "rol_rank": 16})
    assert config["lr"] == 1e-3 and config["regularizer_options"] == {"weight": 0.5, "rank": 16}
    assert config["initializer_options"]["rol_rank"] == 16  # RILA's retain basis: the same rank
    # the settings (and so the digest) of studies without the new tables are as before
    assert "design" not in load_study("tiny").settings() and "design" in study.settings()


def test_dry_run_lists_the_cells_and_what_waits(tmp_path, capsys):
    path = write(tmp_path, AUTHORS)
    cache = tmp_path / "cache"
    assert main(["study", str(path), "--dry-run", "--cache-dir", str(cache)]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    rows = {line.split()[0]: line for line in lines[2:-1]}
    assert len(rows) == 29
    assert rows["operating-point/reglu"].split()[1:5] == ["target,", "sweep/reglu/*", "(4),", "eval-full/author14"]
    # the traced runs need the reserved author's retain model itself (their reference truth ratios)
    assert rows["sweep/ihl/lr0.001"].split()[1:4] == ["target,", "retain/author14,", "eval-retain/author14"]
    assert "unlearn + evaluate  waits for operating-point/reglu" in rows["reglu/author19/seed0"]
    assert rows["sweep/ihl/lr0.001"].split()[-2:] == ["to", "build"]
    assert lines[-1] == f"29 cells: 0 cached, 29 to build (6 waiting for an operating point) (cache {cache})"
    assert not cache.exists()  # a dry run writes nothing


def test_a_per_author_benchmark(tmp_path):
    from unlearn_plugins.benchmarks.tofu.data import build_benchmark, load_benchmark
    from unlearn_plugins.errors import UnlearnError

    build_benchmark(tmp_path / "b", tofu=None, n_authors=6, n_forget=1, eval_size=4, forget_ids=[15])
    bench = load_benchmark(tmp_path / "b")
    assert bench.forget_authors == [15] and bench.retain_authors == [14, 16, 17, 18, 19]
    forget = [json.loads(line) for line in (tmp_path / "b" / "forget.json").read_text().splitlines()]
    full = [json.loads(line) for line in (tmp_path / "b" / "full.json").read_text().splitlines()]
    assert forget == full[20:40]  # the second of the six authors
    build_benchmark(tmp_path / "last", tofu=None, n_authors=6, n_forget=1, eval_size=4)
    assert (tmp_path / "last" / "full.json").read_text() == (tmp_path / "b" / "full.json").read_text()
    with pytest.raises(UnlearnError, match="must be 1 distinct authors of the benchmark's 14-19"):
        build_benchmark(tmp_path / "c", tofu=None, n_authors=6, n_forget=1, eval_size=4, forget_ids=[3])


def replace(old: str, new: str) -> str:
    assert old in AUTHORS, old
    return AUTHORS.replace(old, new)


ERRORS = [
    (replace('unit = "author"', 'unit = "seed"'), "[benchmark] unit: must be one of 'author', got 'seed'"),
    (replace("test_authors = [18, 19]", "test_authors = [18, 25]"), "[benchmark] test_authors: each value must be between 14 and 19, got 25"),
    (replace("reserved_author = 14", "reserved_author = 18"), "[benchmark] reserved_author: 18 is also a test author"),
    (replace("authors = 6\n", "authors = 6\nforget_authors = [2]\n"), "[benchmark] forget_authors: must be 1 (or left out): each author is forgotten alone"),
    (replace('source = "generated"', 'source = "auto"'), '[benchmark] source: must be "tofu" or "generated" with unit = "author" (author ids depend on it)'),
    (replace("authors = [14]\nseeds = [1]", "authors = [15]\nseeds = [1]"), "[noise_ceiling] authors: 15 is neither the reserved nor a test author"),
    (replace("authors = [14]\nseeds = [1]", "authors = [14]\nseeds = [0, 1]"), "[noise_ceiling] seeds: 0 is the retain recipe's seed (the reference): list the other seeds"),
    (replace("authors = [14]\nseeds = [1]", "authors = [14]\nseeds = [1]\nmore = 2"), "[noise_ceiling] more: unknown key"),
    (replace("author = 14\nlr", "author = 18\nlr"), "[sweep] author: must be the reserved author (14): a test author's own runs would choose its operating point"),
    (replace("lr = [1e-4, 1e-3]", "lr = [1e-4, -1e-3]"), "[sweep] lr: each value must be > 0, got -0.001"),
    (replace("lr = [1e-4, 1e-3]", "lr = [1e-4, 1e-4]"), "[sweep] lr: 0.0001 is listed twice"),
    (replace("epochs = 2\n", "epochs = 0\n"), "[sweep] epochs: must be >= 1, got 0"),
    (replace('trace = ["forget_quality", "wasserstein_log"]', 'trace = ["forget_quality", "bleu"]'), "[sweep] trace: unknown measure 'bleu'; known: forget_quality, ks_statistic, wasserstein_log, forget_prob, heldout_prob"),
    (replace('trace = ["forget_quality", "wasserstein_log"]', 'trace = ["wasserstein_log"]'), "[sweep] trace: must include forget_quality (the operating-point rule ranks by it)"),
    (replace('trace = ["forget_quality", "wasserstein_log"]', 'trace = ["forget_quality", "heldout_prob"]'), "[sweep] heldout: missing: trace heldout_prob needs its QA (real_authors, ...)"),
    (replace("[budget]\n", "[budget]\nlr = 1e-4\n"), "[budget] lr: is each method's operating point ([sweep] lr); remove it"),
    (replace("[budget]\n", '[budget]\nlr_scheduler = "linear"\n'), "[budget] lr_scheduler: must be \"constant\" without warmup with a [sweep] (method ihl: 'linear')"),
    (replace("tolerance = 0.05", "tolerance = -1"), "[operating_point] tolerance: tolerance must be a finite number"),
    (replace("tolerance = 0.05", "tol = 0.05"), "[operating_point]: unknown key(s) of the operating-point rule: tol"),
    (replace("sweep = { rol_weight = [0.1, 0.5] }", "sweep = { rol_scale = [0.1] }"), "[methods.reglu] sweep: unknown key 'rol_scale'; known: rol_weight, rol_rank"),
    (replace("sweep = { rol_weight = [0.1, 0.5] }", "sweep = { rol_weight = [0.1, -1.0] }"), "[methods.reglu.sweep] rol_weight: each value must be > 0, got -1.0"),
    (replace('regularizer = "rol"\nsweep', "sweep"), '[methods.reglu] sweep: sweeps ROL settings: needs regularizer = "rol"'),
    (replace('rivals = ["ihl"]', 'rivals = ["ihl", "npo"]'), "[comparisons.primary] rivals: unknown method 'npo'; methods: ihl, reglu, control"),
    (replace('rivals = ["ihl"]', 'rivals = ["reglu"]'), "[comparisons.primary] rivals: 'reglu' is the method itself"),
    (replace('metric = "wasserstein_log"', 'metric = "bleu"'), "[comparisons.control] metric: must be one of 'forget_quality', 'ks_statistic', 'wasserstein_log', 'model_utility', 'forget_prob', got 'bleu'"),
    (replace('family = "control"', 'family = "primary"'), "[comparisons.primary] family: 'primary' is used by another [[comparisons]] table"),
    (replace('pairs = [["reglu", "control"]]', 'pairs = [["reglu", "control"], ["control", "reglu"]]'), "[comparisons.control] pairs: control vs reglu is declared twice"),
    (replace('pairs = [["reglu", "control"]]', 'pairs = [["reglu"]]'), "[comparisons.control] pairs: each pair must be [method, rival], got ['reglu']"),
    (replace('method = "reglu"\nrivals', 'method = "leader"\nrivals'), '[comparisons.primary] post_hoc: must be true with method = "leader"'),
    (AUTHORS + '\n[verdict]\nmethod = "reglu"\nfamily = "primary"\n', "[verdict] family: with 2 test authors no comparison of 'primary' can reach alpha 0.05 after Holm over 1 (needs at least 6 authors: statistics.minimum_units)"),
    (AUTHORS + '\n[verdict]\nmethod = "reglu"\nfamily = "control"\n', "[verdict] family: must be a declared (not post hoc) family of reglu against rivals, got 'control'"),
    (AUTHORS + "\n[statistics]\nalpha = 1.5\n", "[statistics] alpha: must be between 0 and 1 (exclusive), got 1.5"),
    (replace('report = ["ks_statistic"]', 'report = ["ks_pvalue"]'), "[evaluation] report: unknown metric 'ks_pvalue'; known: ks_statistic, wasserstein_log, model_utility_paired"),
    (replace("[retain]\n", '[retain]\ngiven = { "1" = "somewhere" }\n'), "[retain] given: an author-unit study fine-tunes a retain model per author: give a recipe"),
]  # fmt: skip


@pytest.mark.parametrize("text, message", ERRORS, ids=[m.split(":")[0] + str(i) for i, (_, m) in enumerate(ERRORS)])
def test_one_error_line_naming_the_table_and_key(tmp_path, text, message):
    path = write(tmp_path, text)
    with pytest.raises(StudyError) as info:
        load_study(str(path))
    assert str(info.value).startswith(f"{path}: {message}"), str(info.value)
    assert "\n" not in str(info.value)


TINY = builtin_studies()["tiny"].read_text()


@pytest.mark.parametrize(
    "extra, message",
    [
        ("\n[sweep]\nlr = [1e-4]\nepochs = 2\n", '[sweep]: needs [benchmark] unit = "author"'),
        ('\n[[comparisons]]\nfamily = "a"\n', '[[comparisons]]: needs [benchmark] unit = "author"'),
    ],
)
def test_the_new_tables_need_authors_as_the_unit(tmp_path, extra, message):
    path = write(tmp_path, TINY + extra)
    with pytest.raises(StudyError, match="^" + re.escape(f"{path}: {message}")):
        load_study(str(path))
    path = write(tmp_path, TINY.replace("[benchmark]\n", "[benchmark]\ntest_authors = [2]\n"))
    with pytest.raises(StudyError, match=r'\[benchmark\] test_authors: needs unit = "author"'):
        load_study(str(path))
