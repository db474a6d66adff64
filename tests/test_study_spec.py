"""`unlearn study` files: the built-in studies, grid expansion, and one exact error line per
kind of mistake (no model, data or training needed)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from unlearn_plugins.cli import main
from unlearn_plugins.study import StudyError, builtin_studies, expand, load_study
from unlearn_plugins.study.spec import SCHEDULE_FIELDS, study_tables

TABLES = study_tables()  # the core's and the default study kind's (TOFU's author-unit tables)

ROOT = Path(__file__).resolve().parents[1]
TINY = builtin_studies()["tiny"].read_text()


def test_builtin_studies_are_listed(capsys):
    assert set(builtin_studies()) >= {"reglu_tofu", "tiny"}
    assert main(["study", "--list"]) == 0
    out = capsys.readouterr().out
    assert "reglu_tofu " in out and "(6 methods x 2 forget sizes x 3 seeds = 36 runs)" in out
    assert "tiny " in out and "(2 methods x 1 forget sizes x 2 seeds = 4 runs)" in out


def test_reglu_tofu_grid():
    study = load_study("reglu_tofu")
    cells = expand(study)
    ids = [c.id for c in cells]
    assert ids[:7] == [
        "target",
        "retain/forget1",
        "eval-retain/forget1",
        "eval-full/forget1",
        "retain/forget2",
        "eval-retain/forget2",
        "eval-full/forget2",
    ]
    methods = ["grad_diff", "ihl", "ihl_fila", "ihl_vila", "ihl_rila", "reglu"]
    # seed-major: a study stopped early has every method and forget size at its first seeds
    assert ids[7:] == [f"{m}/forget{k}/seed{s}" for s in (0, 1, 2) for k in (1, 2) for m in methods]
    by_id = {c.id: c for c in cells}
    assert by_id["reglu/forget2/seed1"].deps == ("target", "eval-retain/forget2")
    assert by_id["eval-full/forget1"].deps == ("target", "eval-retain/forget1")
    assert by_id["eval-retain/forget2"].deps == ("retain/forget2",)
    # every cell is listed after the cells it needs
    seen = set()
    for cell in cells:
        assert set(cell.deps) <= seen, cell.id
        seen.add(cell.id)

    config = {m.name: m.config for m in study.methods}
    assert (config["reglu"]["objective"], config["reglu"]["initializer"], config["reglu"]["regularizer"]) == (
        "ihl",
        "rila",
        "rol",
    )
    assert config["reglu"]["regularizer_options"] == {"weight": 0.5, "rank": 128}
    assert [config[m]["initializer"] for m in methods] == ["kaiming", "kaiming", "fila", "vila", "rila", "rila"]
    assert [config[m]["objective"] for m in methods] == ["grad_diff"] + ["ihl"] * 5
    assert all(config[m]["regularizer"] is None for m in methods[:-1])
    # one budget for all: the reference's schedule, whatever a preset says
    for name in methods:
        assert {
            k: config[name][k]
            for k in (
                "lr",
                "epochs",
                "batch_size",
                "grad_accum",
                "lr_scheduler",
                "warmup_epochs",
                "weight_decay",
                "lora_r",
                "lora_alpha",
                "dtype",
            )
        } == {
            "lr": 1e-4,
            "epochs": 5.0,
            "batch_size": 4,
            "grad_accum": 8,
            "lr_scheduler": "linear",
            "warmup_epochs": 1.0,
            "weight_decay": 0.01,
            "lora_r": 32,
            "lora_alpha": 64.0,
            "dtype": "bf16",
        }, name
    assert study.forget_sizes == (1, 2) and study.authors == 20 and study.seeds == (0, 1, 2)
    assert study.evaluation.mu_size >= 400 and "tofu_forget_extraction_strength" in study.evaluation.tasks


def test_reglu_tofu_target_is_the_cud_studys_recipe(monkeypatch):
    """The same recipe as bench/cud_stratification.py's target: same model, data (its 400 QA are
    the benchmark's 20 authors, in order), fine-tuning options, seed and length; one thread
    instead of two (the study's two workers share 2 cores)."""
    spec = importlib.util.spec_from_file_location("cud_stratification", ROOT / "bench" / "cud_stratification.py")
    cud = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, cud)  # its dataclasses look themselves up there
    spec.loader.exec_module(cud)
    config = cud.StudyConfig()
    study = load_study("reglu_tofu")
    assert study.model == config.model
    assert config.data == "tofu:forget10_perturbed" and study.source == "tofu" and study.authors == 20
    assert study.target.finetune == config.finetune
    assert study.max_length == config.max_length
    assert study.target.threads == 1 and config.target_threads == 2
    assert study.target.seed == 0  # the CUD study fine-tunes with seed=0
    assert study.retain.finetune == config.finetune and study.retain.threads == 1


def test_tiny_grid_and_options():
    study = load_study("tiny")
    assert [c.id for c in expand(study)] == [
        "target",
        "retain/forget1",
        "eval-retain/forget1",
        "eval-full/forget1",
        "grad_diff/forget1/seed0",
        "ihl_fila/forget1/seed0",
        "grad_diff/forget1/seed1",
        "ihl_fila/forget1/seed1",
    ]
    assert study.model == "tiny-llama" and study.source == "generated"
    assert study.retain.finetune == study.target.finetune  # an absent [retain] copies the target's recipe


#: the demo's cells: its models on forget size 1, then one seed of each method
DEMO_CELLS = ["target", "retain/forget1", "cud/forget1", "eval-retain/forget1", "eval-full/forget1"] + [
    f"{method}/forget1/seed0" for method in ("reglu", "grad_diff", "ihl_fila")
]


def test_the_demo_is_a_study_with_a_cud_cell_and_a_fast_variant():
    """`unlearn demo` runs the built-in study `demo` (unlearn_plugins/benchmarks/tofu/demo.toml)."""
    study = load_study("demo")
    assert Path(study.path) == ROOT / "unlearn_plugins" / "benchmarks" / "tofu" / "demo.toml"
    assert [c.id for c in expand(study)] == DEMO_CELLS
    assert study.source == "auto" and study.authors == 3 and study.forget_sizes == (1,)
    assert study.cud.anchor_pool == 10 and study.cud.strata == 5 and study.cud.scorer["max_rows"] == 6
    # [budget] is every method's; ReGLU keeps the rest of its preset ([study] one_budget = false)
    reglu, grad_diff, _ = study.methods
    assert reglu.config["lr"] == grad_diff.config["lr"] == 2.5e-4 and reglu.config["lora_r"] == 16
    assert reglu.config["lr_scheduler"] == "linear" and grad_diff.config["lr_scheduler"] == "constant"
    assert reglu.config["warmup_epochs"] == 1.0 and grad_diff.config["warmup_epochs"] is None
    # --fast: the variant's tables replace the study's whole (no key of the default's left behind)
    fast = load_study("demo", variant="fast")
    assert fast.authors == 2 and fast.max_length == 128 and fast.evaluation.gen_margin == 4
    assert fast.cud.strata == 3 and "max_rows" not in fast.cud.scorer and "check_steps" not in fast.cud.scorer
    assert [m.name for m in fast.methods] == ["reglu", "grad_diff", "ihl_fila"]
    assert fast.methods[1].config["lr"] == 1e-3
    with pytest.raises(StudyError, match=r"demo.toml: no variant 'slow' \(its variants: fast\)"):
        load_study("demo", variant="slow")
    # a study's new tables leave the digests (and reports) of the studies without them as they were
    assert "cud" not in load_study("tiny").settings() and "one_budget" not in load_study("tiny").settings()


def test_unlearn_study_demo_dry_run_lists_its_cells(tmp_path, tiny_model_dir, capsys):
    """`unlearn study demo --dry-run` (here the demo's --fast variant on the tiny model, as a
    file naming it): the demo's cells, nothing built."""
    text = (ROOT / "unlearn_plugins" / "benchmarks" / "tofu" / "demo.toml").read_text()
    path = _write(tmp_path, text.replace('base = "smollm2-135m"', f'base = "{tiny_model_dir}"'))
    assert main(["study", str(path), "--variant", "fast", "--dry-run", "--cache-dir", str(tmp_path / "c")]) == 0
    out = capsys.readouterr().out
    assert [line.split()[0] for line in out.splitlines()[2:-1]] == DEMO_CELLS
    assert "cud/forget1              target" in out and "cud " in out
    assert out.splitlines()[-1] == f"8 cells: 0 cached, 8 to build (cache {tmp_path / 'c'})"
    assert not (tmp_path / "c").exists()


def test_source_auto_falls_back_to_generated_authors(tmp_path):
    """[benchmark] source = "auto" (the demo's --data auto): a TOFU folder that is not there, or
    one without enough authors, gives the generated authors (a study with source "tofu" is refused
    instead, test_bad_input_round3)."""
    from unlearn_plugins.benchmarks.tofu.study.cells import plan_study

    text = TINY.replace('source = "generated"', 'source = "auto"\ntofu_dir = "/nonexistent/tofu"')
    plan = plan_study(load_study(str(_write(tmp_path, text))), cache=tmp_path / "cache", dry_run=True)
    assert plan.benches[1]["source"] == "generated" and plan.benches[1]["description"] == "generated fictitious authors"
    assert not (tmp_path / "cache").exists()


def test_a_method_without_a_retain_set(tmp_path):
    """[[methods]] retain = false (the MovieLens demo's NegGrad): its unlearning run gets no retain
    set, and its cache key is not that of the same method with one."""
    from unlearn_plugins.benchmarks.tofu.study.cells import plan_study

    text = TINY + '\n[[methods]]\nname = "ga"\nobjective = "grad_ascent"\nretain = false\n'
    text += '\n[[methods]]\nname = "ga_retain"\nobjective = "grad_ascent"\n'
    study = load_study(str(_write(tmp_path, text)))
    assert study.method("ga").settings == {"objective": "grad_ascent", "retain": False}
    plan = plan_study(study, cache=tmp_path / "cache", dry_run=True)
    (ga,), (with_retain,) = (
        [c.stages[0] for c in plan.cells.values() if c.cell.method == m and c.cell.seed == study.seeds[0]]
        for m in ("ga", "ga_retain")
    )
    assert ga.params["retain"] is None and "retain" not in with_retain.params
    assert ga.folder.rsplit("-", 1)[1] != with_retain.folder.rsplit("-", 1)[1]
    with pytest.raises(StudyError, match=r"\[methods.ga\] retain: is set by the study; only retain = false"):
        load_study(str(_write(tmp_path, text.replace("retain = false", "retain = true"))))


def _write(tmp_path, text: str) -> Path:
    path = tmp_path / "study.toml"
    path.write_text(text)
    return path


def _variant(old: str, new: str) -> str:
    assert old in TINY, old
    return TINY.replace(old, new, 1)


BAD = [
    (
        "unknown table",
        TINY + "\n[extra]\nx = 1\n",
        "[extra]: unknown table; tables: " + ", ".join(TABLES),
    ),
    (
        "top-level key",
        "seeds = [1]\n" + TINY,
        "seeds: unknown top-level key; keys belong in a table (" + ", ".join(f"[{t}]" for t in TABLES) + ")",
    ),
    (
        "unknown key",
        _variant("seeds = [0, 1]", "seeds = [0, 1]\nseed = 3"),
        "[study] seed: unknown key; known keys: name, description, seeds, ci, one_budget, workers_per_gpu",
    ),
    ("repeated seed", _variant("seeds = [0, 1]", "seeds = [0, 0]"), "[study] seeds: 0 is listed twice"),
    (
        "seeds not a list",
        _variant("seeds = [0, 1]", 'seeds = "0"'),
        "[study] seeds: must be a non-empty list of integers, got '0'",
    ),
    (
        "ci",
        _variant("seeds = [0, 1]", 'seeds = [0, 1]\nci = "z"'),
        "[study] ci: must be one of 't', 'bootstrap', got 'z'",
    ),
    ("no model", _variant('base = "tiny-llama"\n', ""), "[model] base: missing"),
    (
        "max_length type",
        _variant("max_length = 128", 'max_length = "long"'),
        "[model] max_length: must be an integer, got 'long'",
    ),
    (
        "forget size",
        _variant("forget_authors = [1]", "forget_authors = [1, 3]"),
        "[benchmark] forget_authors: each value must be between 1 and 2, got 3",
    ),
    (
        "source",
        _variant('source = "generated"', 'source = "hub"'),
        "[benchmark] source: must be one of 'tofu', 'generated', 'auto', 'movielens', 'wmdp', got 'hub'",
    ),
    (
        "too many authors",
        _variant("authors = 3", "authors = 21"),
        "[benchmark] authors: must be <= 20 (the TOFU authors with paraphrased and perturbed answers, "
        "forget10_perturbed), got 21",
    ),
    (
        "study-controlled recipe key",
        _variant("[target.finetune]\n", '[target.finetune]\nout = "x"\n'),
        "[target.finetune] out: is set by the study (paths, seed, max_length in [model], device on the command "
        "line); remove it",
    ),
    (
        "recipe range",
        _variant(
            "lr = 1e-3\nepochs = 1.0\nlora_r = 8\nlora_alpha = 16.0\nbatch_size = 8",
            "lr = 1e-3\nepochs = -1.0\nlora_r = 8\nlora_alpha = 16.0\nbatch_size = 8",
        ),
        "[target.finetune] epochs: must be a finite number > 0, got -1.0",
    ),
    (
        "budget range",
        _variant("[budget]\nlr = 1e-3", "[budget]\nlr = -1"),
        "[budget] lr: must be a finite number > 0, got -1.0",
    ),
    (
        "budget type",
        _variant("[budget]\nlr = 1e-3", '[budget]\nlr = 1e-3\nlora_dropout = "x"'),
        "[budget] lora_dropout: must be of type float, got 'x'",
    ),
    (
        "method key in the budget",
        _variant("[budget]\n", '[budget]\nobjective = "npo"\n'),
        "[budget] objective: belongs to a method: set it in [[methods]]",
    ),
    (
        "budget key in a method",
        _variant('objective = "grad_diff"', 'objective = "grad_diff"\nlr = 0.1'),
        "[methods.grad_diff] lr: is a budget setting: set it in [budget] (one budget for every method)",
    ),
    (
        "unknown method key",
        _variant('objective = "grad_diff"', 'objective = "grad_diff"\nflavour = 1'),
        "[methods.grad_diff] flavour: unknown key; known keys: objective, objective_options, retain_loss, "
        "initializer, initializer_options, regularizer, regularizer_options, full_finetune",
    ),
    (
        "unknown preset",
        _variant('objective = "grad_diff"', 'preset = "fast"'),
        "[methods.grad_diff] preset: unknown preset 'fast'; presets: reglu, sibl",
    ),
    (
        "objective option",
        _variant('objective = "grad_diff"', 'objective = "grad_diff"\nobjective_options = { gamma = -1.0 }'),
        "[methods.grad_diff] objective: objective 'grad_diff' (plugin 'builtin-objectives') rejected its options "
        "{'gamma': -1.0}: option 'gamma' must be a number >= 0, got -1.0",
    ),
    (
        "duplicate method",
        TINY + '\n[[methods]]\nname = "grad_diff"\nobjective = "npo"\n',
        "[methods.grad_diff] name: 'grad_diff' is used by another method",
    ),
    ("no methods", TINY[: TINY.index("[[methods]]")], "[[methods]]: missing (one [[methods]] table per method)"),
    (
        "presets disagree",
        TINY + '\n[[methods]]\nname = "reglu"\npreset = "reglu"\n',
        "[budget] lr_scheduler: the methods would train with different values (grad_diff: 'constant', ihl_fila: "
        "'constant', reglu: 'linear', from their presets); set it in [budget] so every method uses one",
    ),
    (
        "required task",
        _variant("[evaluation]\n", '[evaluation]\ntasks = ["tofu_forget_prob"]\n'),
        "[evaluation] tasks: must include tofu_forget_rouge, tofu_forget_truth_ratio, tofu_model_utility (every "
        "study reports Forget Quality, Model Utility, forget probability and ROUGE-L)",
    ),
    (
        "evaluation dtype",
        _variant("gen_margin = 4", 'gen_margin = 4\ndtype = "bf8"'),
        "[evaluation] dtype: must be one of 'float32', 'fp32', 'bfloat16', 'bf16', 'float16', 'fp16', got 'bf8'",
    ),
    (
        "evaluation robustness",
        _variant("gen_margin = 4", 'gen_margin = 4\nrobustness = "yes"'),
        "[evaluation] robustness: must be true or false, got 'yes'",
    ),
    (
        "cud scorer option the study sets",
        TINY + '\n[cud]\n[cud.scorer]\nanchor_data = "tofu:forget01"\n',
        "[cud.scorer] anchor_data: is set by the study (anchor_pool, [cud.unlearn], the target); remove it",
    ),
    (
        "cud scorer option",
        TINY + '\n[cud]\n[cud.scorer]\nvector = "dense"\n',
        "[cud.scorer]: scorer 'cud' (plugin 'builtin-scorers') rejected its options {'vector': 'dense'}: "
        "scorer cud: option vector='dense'; choose one of binary, signed",
    ),
    (
        "cud anchor runs' option",
        TINY + '\n[cud]\n[cud.unlearn]\nobjective = "npo"\n',
        "[cud.unlearn] objective: unknown key; known keys: " + ", ".join((*SCHEDULE_FIELDS, "full_finetune")),
    ),
    ("cud strata", TINY + "\n[cud]\nstrata = 0\n", "[cud] strata: must be >= 1, got 0"),
    (
        "one budget",
        _variant("seeds = [0, 1]", 'seeds = [0, 1]\none_budget = "no"'),
        "[study] one_budget: must be true or false, got 'no'",
    ),
    (
        "a variant of the study table",
        TINY + "\n[variants.fast.study]\nseeds = [0]\n",
        "[variants.fast.study]: a variant replaces tables of the study (model, benchmark, target, retain, "
        "budget, methods, evaluation, cud, sharded, noise_ceiling, sweep, operating_point, comparisons, "
        "statistics, verdict)",
    ),
    (
        "retain given for another size",
        _variant("[target]\n", '[retain]\ngiven = { "2" = "x" }\n\n[target]\n'),
        "[retain.given] 2: must be a forget size of [benchmark] forget_authors (1)",
    ),
]


@pytest.mark.parametrize("text, message", [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_bad_study_file_is_one_exact_error(tmp_path, capsys, text, message):
    path = _write(tmp_path, text)
    with pytest.raises(StudyError) as info:
        load_study(str(path))
    assert str(info.value) == f"{path}: {message}"
    # the command prints it as one line, without a traceback, before any work
    assert main(["study", str(path), "--out", str(tmp_path / "out"), "--cache-dir", str(tmp_path / "c")]) == 1
    err = capsys.readouterr().err
    assert err == f"error: {path}: {message}\n"
    assert not (tmp_path / "out").exists() and not (tmp_path / "c").exists()


def test_not_toml_and_unknown_study(tmp_path, capsys):
    path = _write(tmp_path, "[study\nseeds = 1")
    assert main(["study", str(path)]) == 1
    assert capsys.readouterr().err.startswith(f"error: {path}: not valid TOML: ")
    assert main(["study", "no_such_study"]) == 1
    assert capsys.readouterr().err == (
        "error: no_such_study: no such study file or built-in study (built-in: "
        f"{', '.join(builtin_studies())}; see unlearn study --list)\n"
    )
    assert main(["study", "tiny", "--workers", "0"]) == 1
    assert capsys.readouterr().err == "error: --workers must be an integer >= 1, got 0\n"


def test_relative_paths_resolve_against_the_study_file(tmp_path):
    model = tmp_path / "models" / "base"
    model.mkdir(parents=True)
    text = _variant('base = "tiny-llama"', 'base = "models/base"')
    path = _write(tmp_path, text)
    assert load_study(str(path)).model == str(model)


def test_stage_keys_change_with_what_a_stage_depends_on_and_nothing_else(tmp_path):
    """Content keys: another unlearning budget re-runs the method cells only; another target
    recipe re-runs everything that reads the target; another evaluation re-runs evaluations."""
    from unlearn_plugins.benchmarks.tofu.study.cells import plan_study

    def folders(text: str) -> dict[str, list[str]]:
        plan = plan_study(load_study(str(_write(tmp_path, text))), cache=tmp_path / "cache", dry_run=True)
        return {cid: [s.folder for s in cp.stages] for cid, cp in plan.cells.items()}

    base = folders(TINY)
    assert len({f for fs in base.values() for f in fs}) == 12  # 4 single-stage cells + 4 x (unlearn, evaluate)
    assert not (tmp_path / "cache").exists()  # a dry run writes nothing

    def changed(text: str) -> set[str]:
        other = folders(text)
        return {cid for cid in base if base[cid] != other[cid]}

    methods = {c for c in base if c.count("/") == 2}
    assert changed(_variant("[budget]\nlr = 1e-3", "[budget]\nlr = 2e-3")) == methods
    assert changed(_variant('description = "', 'description = "renamed: ')) == set()
    assert (
        changed(_variant("[target]\nseed = 0", "[retain]\nseed = 0\n\n[target]\nseed = 1"))
        == {"target", "eval-full/forget1"} | methods
    )
    assert changed(_variant("gen_margin = 4", "gen_margin = 5")) == set(base) - {"target", "retain/forget1"}
    evaluations = set(base) - {"target", "retain/forget1"}  # the method cells' evaluate stages
    assert changed(_variant("gen_margin = 4", 'gen_margin = 4\ndtype = "bf16"')) == evaluations
    # robustness measures every model, the retain one too; leaving it false changes no key
    assert changed(_variant("gen_margin = 4", "gen_margin = 4\nrobustness = true")) == evaluations
    assert changed(_variant("gen_margin = 4", "gen_margin = 4\nrobustness = false")) == set()
    # the scoring: the same numbers (to 1e-5) with fp32 weights, another evaluation in bf16
    assert changed(_variant("gen_margin = 4", 'gen_margin = 4\nscoring = "hf"')) == set()
    bf16 = folders(_variant("gen_margin = 4", 'gen_margin = 4\ndtype = "bf16"'))
    hf16 = folders(_variant("gen_margin = 4", 'gen_margin = 4\ndtype = "bf16"\nscoring = "hf"'))
    assert {c for c in base if bf16[c] != hf16[c]} == evaluations
    one = folders(_variant("seeds = [0, 1]", "seeds = [1]"))
    assert one["grad_diff/forget1/seed1"] == base["grad_diff/forget1/seed1"]  # a cell does not depend on the grid


def test_wheel_ships_the_builtin_studies(tmp_path):
    import zipfile

    from support_checks import build_wheel

    names = zipfile.ZipFile(build_wheel(tmp_path)).namelist()
    # the study layer's and the benchmarks' (the demos' among them)
    assert {p.relative_to(ROOT).as_posix() for p in builtin_studies().values()} <= set(names)
