"""Bad input and faults: a verdict stated from no data, a finished author dropped
with exit 0, recorded operating points restored unchecked, `--dry-run --records` miscounting,
checks that could run before any work, intervals outside a metric's range, a `[cud]` table
ignored, `unlearn-lm-eval --model hf-prefix`'s options, `UNLEARN_DISABLE_PLUGINS`, and messages
that mislead. Each case goes through the command line where a user meets it and asserts the exit
status and the one `error:` line (or warning) a user now sees.

The author-unit study is tests/author_records.py's: its records are made in code (nothing is
trained), so a report from them takes seconds. A property test at the end feeds randomly damaged
copies of them (operating points, sweep traces, retain evaluations, test cells) to
`--report-only`: a report whose verdict is stated only from complete data, or one `error:` line;
never a traceback, never a number from a damaged file."""

from __future__ import annotations

import json
import math
import os
import shutil
import sys
from pathlib import Path

import pytest
from author_records import STUDY, write_records
from support_checks import damage_file, property_settings

from unlearn_plugins.cli import main
from unlearn_plugins.study import builtin_studies

pytestmark = pytest.mark.usefixtures("single_thread")


def cli(capsys, *args) -> tuple[int, str, str]:
    code = main([str(a) for a in args])
    out, err = capsys.readouterr()
    return code, out, err


def error_line(err: str) -> str:
    """The command's one `error:` line, the last on stderr, and no traceback."""
    assert "Traceback" not in err, err
    lines = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(lines) == 1, err
    assert err.strip().splitlines()[-1] == lines[0], err
    return lines[0]


# ----------------------------------------------------------------------------- the author-unit study


@pytest.fixture(scope="module")
def synthetic(tmp_path_factory):
    """The study file, its records and a cache holding only the base model and the benchmarks
    (what planning builds), from one complete report."""
    root = tmp_path_factory.mktemp("round4")
    path = root / "study.toml"
    path.write_text(STUDY)
    write_records(path, root / "records", root / "scratch")
    assert main(["study", str(path), "--report-only", "--records", str(root / "records"),
                 "--cache-dir", str(root / "full-cache"), "--out", str(root / "complete")]) == 0  # fmt: skip
    base = root / "base-cache"
    base.mkdir()
    for folder in (root / "full-cache").iterdir():
        if folder.name.startswith(("base-", "bench-")):
            shutil.copytree(folder, base / folder.name)
    return {"root": root, "path": path, "records": root / "records", "base": base, "complete": root / "complete"}


def copy_of(synthetic, folder: Path) -> tuple[Path, Path]:
    """A copy of the records and a fresh cache (base model and benchmarks only) under ``folder``."""
    records, cache = folder / "records", folder / "cache"
    shutil.copytree(synthetic["records"], records)
    shutil.copytree(synthetic["base"], cache, copy_function=os.link)
    return records, cache


def report_only(capsys, synthetic, records, cache, out):
    return cli(capsys, "study", synthetic["path"], "--report-only", "--records", records, "--cache-dir", cache,
               "--out", out)  # fmt: skip


def test_the_complete_records_state_the_verdict(synthetic):
    report = json.loads((synthetic["complete"] / "study.json").read_text())
    assert report["analysis"]["verdict"]["holds"] is True and report["lacking"] is None
    assert [r["authors"] for r in report["analysis"]["families"]["primary"]["rows"]] == ["all 6"]
    assert (synthetic["complete"] / "verdict.md").read_text().splitlines()[2].startswith("**The claim holds: ")


def test_1_no_verdict_without_a_methods_operating_point(synthetic, tmp_path, capsys):
    """ReGLU's operating point deleted: its test cells cannot be keyed, it has no value on any
    author; the verdict was stated from the other method alone ("does not hold", exit 0)."""
    records, cache = copy_of(synthetic, tmp_path)
    for folder in records.glob("point-reglu-*"):
        shutil.rmtree(folder)
    code, out, err = report_only(capsys, synthetic, records, cache, tmp_path / "out")
    reason = "2 of 2 comparisons lack data (reglu has no value on any of the 6 test authors)"
    assert code == 1
    assert error_line(err) == f"error: no verdict: {reason} (see {tmp_path / 'out'}/summary.md)"
    assert f"No verdict: {reason}." in out
    report = json.loads((tmp_path / "out" / "study.json").read_text())
    assert report["analysis"]["verdict"]["holds"] is None and report["analysis"]["verdict"]["reason"] == reason
    assert f"**No verdict: {reason}.**" in (tmp_path / "out" / "verdict.md").read_text()
    assert "## No verdict" in (tmp_path / "out" / "summary.md").read_text()


def test_2_a_finished_author_left_out_is_said_and_exits_1(synthetic, tmp_path, capsys):
    """Author 15's retain evaluation deleted: its two finished test cells leave every
    comparison; the terminal said nothing and the exit status was 0."""
    records, cache = copy_of(synthetic, tmp_path)
    plan_eval = [d for d in records.glob("eval-retain-*") if (d / "eval-retain-author15").is_dir()]
    assert len(plan_eval) == 1
    shutil.rmtree(plan_eval[0])
    code, out, err = report_only(capsys, synthetic, records, cache, tmp_path / "out")
    assert code == 1
    assert error_line(err) == (
        "error: 2 finished cell(s) left out of the comparisons: ihl/author15/seed0, reglu/author15/seed0 (the "
        f"retain or target evaluation of author 15 is missing or unreadable): no verdict (see {tmp_path / 'out'}/summary.md)"
    )
    summary = (tmp_path / "out" / "summary.md").read_text()
    assert "| reglu | ihl | 5 (not 15) |" in summary  # which authors the comparison used
    assert "2 of 2 comparisons lack data (no method has a value on author(s) 15)" in summary


def _edit_point(records: Path, method: str, edit) -> Path:
    (path,) = records.glob(f"point-{method}-*/operating_point.json")
    result = json.loads(path.read_text())
    edit(result)
    path.write_text(json.dumps(result))
    return path


def test_3_a_recorded_operating_point_is_checked_before_it_is_restored(synthetic, tmp_path, capsys):
    records, cache = copy_of(synthetic, tmp_path)
    path = _edit_point(records, "reglu", lambda r: r["use"].update(lr=5, rol_weight=-3, epoch=999))
    code, _, err = report_only(capsys, synthetic, records, cache, tmp_path / "out")
    assert code == 1 and not (tmp_path / "out").exists()
    assert error_line(err) == (
        f"error: --records {records}: the recorded operating point of operating-point/reglu, {path}: field 'use': "
        "lr 5, rol_weight -3 is not a setting of the sweep (lr 0.001; rol_weight 0.1, 0.5); remove that folder to "
        "choose it again"
    )
    # a point of the grid that the rule does not choose from the recorded points, and a reason that
    # does not go with the point
    other = lambda r: r["use"].update({k: v for k, v in r["points"][0].items()}, index=0)  # noqa: E731
    _edit_point(records, "reglu", other)
    code, _, err = report_only(capsys, synthetic, records, cache, tmp_path / "out")
    assert code == 1 and "field 'use': lr0.001-rol_weight0.1-epoch1 is not the point the rule chooses" in error_line(
        err
    )
    shutil.rmtree(records)
    records, _ = copy_of(synthetic, tmp_path / "again")
    _edit_point(records, "ihl", lambda r: r.update(reason="lr 0.0003, epoch 2: " + r["reason"].split(": ", 1)[1]))
    code, _, err = report_only(capsys, synthetic, records, tmp_path / "again" / "cache", tmp_path / "out")
    assert code == 1 and "field 'reason': \"lr 0.0003, epoch 2: Forget Quality 0.4, " in error_line(err)


def test_4_dry_run_with_records_counts_what_a_run_would_do(synthetic, tmp_path, capsys):
    code, out, err = cli(capsys, "study", synthetic["path"], "--dry-run", "--records", synthetic["records"],
                         "--cache-dir", tmp_path / "empty")  # fmt: skip
    assert code == 0, err
    assert out.strip().splitlines()[-1] == (
        f"39 cells: 0 cached, 28 recorded, 11 not needed (only cached or recorded cells need them), 0 to build "
        f"(cache {tmp_path / 'empty'})"
    )
    assert "reglu/author18/seed0" in out and "waits for" not in out


def test_6_intervals_are_cut_to_the_metrics_range_and_the_report_says_so(synthetic):
    report = json.loads((synthetic["complete"] / "study.json").read_text())
    from unlearn_plugins.benchmarks.tofu.study.author_report import RANGES

    for method, summaries in report["summaries"].items():
        for key, s in summaries.items():
            lo, hi = RANGES[key]
            if s.get("low") is not None:
                assert s["low"] >= (lo if lo is not None else -math.inf), (method, key, s)
                assert s["high"] <= (hi if hi is not None else math.inf), (method, key, s)
    ihl = report["summaries"]["ihl"]["forget_quality"]
    assert ihl["low"] == 0.0 and ihl["mean"] - (ihl["high"] - ihl["mean"]) < 0  # the t interval reached below 0
    assert (
        "cut to the metric's range: Forget Quality, KS statistic" in (synthetic["complete"] / "summary.md").read_text()
    )


# ----------------------------------------------------------------------------- study files


def author_study(tmp_path: Path, text: str = STUDY, name: str = "s.toml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def refused_dry_run(capsys, path: Path, *extra) -> str:
    """`unlearn study PATH --dry-run`: exit 1 and its one `error:` line."""
    code, _, err = cli(capsys, "study", path, "--dry-run", *extra)
    assert code == 1
    return error_line(err)


def test_7_a_cud_table_in_an_author_unit_study_is_refused(tmp_path, capsys):
    path = author_study(tmp_path, STUDY + "\n[cud]\nanchor_pool = 4\n")
    assert refused_dry_run(capsys, path) == (
        f"error: {path}: [cud]: an author-unit study has no CUD cell (each test author is forgotten whole, alone); "
        "remove the table"
    )


def test_5_cud_scorer_objectives_are_checked_when_the_study_is_read(tmp_path, capsys):
    text = builtin_studies()["tiny"].read_text() + '\n[cud]\n[cud.scorer]\nobjectives = ["grad_diff", "nosuch"]\n'
    path = author_study(tmp_path, text)
    line = refused_dry_run(capsys, path)
    assert line.startswith(
        f"error: {path}: [cud.scorer] objectives: unknown unlearning objective 'nosuch'; available: "
    )
    assert "grad_diff" in line


MOVIELENS_STUDY = Path(__file__).resolve().parents[1] / "unlearn_plugins" / "benchmarks" / "movielens" / "demo.toml"
MOVIELENS = MOVIELENS_STUDY.read_text()


def write_grouplens(folder: Path, users: int = 10) -> Path:
    from test_demo_movielens import write_grouplens as write

    return write(folder, users=users)


def test_5_movielens_users_beyond_the_data_before_any_work(tmp_path, capsys, tiny_model_dir):
    data = write_grouplens(tmp_path / "ml")
    text = MOVIELENS.replace("users = 20\n", f'users = 100000\nmovielens_dir = "{data}"\n', 1)
    path = author_study(tmp_path, text)
    assert (
        refused_dry_run(capsys, path, "--cache-dir", tmp_path / "cache")
        == f"error: {path}: [benchmark] users: 100000 users asked, but the MovieLens data in {data} has 10"
    )
    # the demo: said before its target is trained
    code, _, err = cli(capsys, "demo", "--benchmark", "movielens", "--fast", "--model", tiny_model_dir, "--users",
                       "100000", "--movielens-dir", data, "--cache-dir", tmp_path / "cache", "--out", tmp_path / "o")  # fmt: skip
    assert code == 1
    assert error_line(err) == f"error: --users 100000 users asked, but the MovieLens data in {data} has 10"
    assert not list((tmp_path / "cache").glob("**/rec-target-*"))


def test_10_a_movielens_study_with_author_unit_keys(tmp_path, capsys):
    path = author_study(tmp_path, MOVIELENS.replace('source = "movielens"', 'source = "movielens"\nunit = "author"'))
    assert refused_dry_run(capsys, path) == (
        f'error: {path}: [benchmark] unit: is for an author-unit study (source = "tofu" or "generated"); a '
        "MovieLens study forgets users"
    )


def test_10_benchmark_known_keys_name_the_author_unit_keys(tmp_path, capsys):
    path = author_study(tmp_path, STUDY.replace("reserved_author = 12", "reserved_author = 12\nreserved = 1"))
    assert refused_dry_run(capsys, path) == (
        f"error: {path}: [benchmark] reserved: unknown key; known keys: source, tofu_dir, authors, forget_authors, "
        "unit, test_authors, reserved_author"
    )


def test_10_a_given_target_in_an_author_unit_study_gets_a_hint_it_can_follow(tmp_path, capsys, tiny_model_dir):
    recipe = "seed = 0\nfinetune = { lr = 1e-3, epochs = 1.0, lora_r = 8, lora_alpha = 16.0, batch_size = 8 }\n"
    assert recipe in STUDY
    text = STUDY.replace(recipe, f'given = "{tiny_model_dir}"\n')
    path = author_study(tmp_path, text)
    assert refused_dry_run(capsys, path) == (
        f"error: {path}: [retain]: the target is given, so the retain models need a recipe ([retain.finetune], "
        "seed): an author-unit study fine-tunes a retain model per author"
    )


def test_10_a_method_named_leader_is_refused(tmp_path, capsys):
    path = author_study(
        tmp_path, STUDY.replace('name = "ihl"', 'name = "leader"').replace('rivals = ["ihl"]', 'rivals = ["leader"]')
    )
    assert refused_dry_run(capsys, path) == (
        f'error: {path}: [methods.leader] name: "leader" is reserved for the post hoc comparison of the best method '
        '([[comparisons]] method = "leader"); give the method another name'
    )


def test_10_a_huge_sweep_is_refused_with_its_size_at_once(tmp_path, capsys):
    import time

    lrs = ", ".join(f"{(i + 1) * 1e-5:g}" for i in range(200))
    weights = ", ".join(f"{(i + 1) / 1000:g}" for i in range(200))
    text = STUDY.replace("lr = [1e-3]", f"lr = [{lrs}]").replace("rol_weight = [0.1, 0.5]", f"rol_weight = [{weights}]")
    path = author_study(tmp_path, text)
    started = time.perf_counter()
    code, _, err = cli(capsys, "study", path, "--dry-run")
    assert code == 1 and time.perf_counter() - started < 30
    assert error_line(err) == (
        f"error: {path}: [sweep] lr: 200 learning rates x the methods' sweep settings make 40,200 traced runs, each "
        "a full unlearning run of 2 epoch(s); at most 1,000"
    )


def test_10_a_home_that_is_a_file_gets_the_cache_hint(tmp_path, capsys, monkeypatch):
    home = tmp_path / "home"
    home.write_text("not a folder")
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("UNLEARN_CACHE_DIR")
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    code, _, err = cli(capsys, "eval", "--model", "smollm2-135m", "--tasks", "tofu_forget01", "--out", tmp_path / "o")
    assert code == 1
    line = error_line(err)
    assert "Not a directory" in line and line.endswith(
        f"(the default cache folder {home}/.cache/unlearn-plugins cannot be used: set UNLEARN_CACHE_DIR to a folder "
        "that can be written)"
    )


# ----------------------------------------------------------------------------- plugins


def test_9_a_misspelt_disabled_plugin_is_said(capsys, monkeypatch):
    monkeypatch.setenv("UNLEARN_DISABLE_PLUGINS", "builtin-taks")
    with pytest.warns(RuntimeWarning) as caught:  # printed as `warning: ...` outside pytest
        code, _, _ = cli(capsys, "plugins")
    assert code == 0
    said = [str(w.message) for w in caught if "UNLEARN_DISABLE_PLUGINS" in str(w.message)]
    assert len(said) == 1 and said[0].startswith(
        "UNLEARN_DISABLE_PLUGINS names 'builtin-taks': no such plugin (plugins: builtin-scorers, builtin-tasks, "
    )


def test_9_a_disabled_task_folder_is_named_by_unknown_tasks(capsys, monkeypatch, tiny_model_dir, tmp_path):
    monkeypatch.setenv("UNLEARN_DISABLE_PLUGINS", "builtin-tofu")
    code, _, err = cli(capsys, "eval", "--model", tiny_model_dir, "--tasks", "tofu_forget01_truth_ratio", "--limit",
                       "1", "--device", "cpu", "--out", tmp_path / "o")  # fmt: skip
    assert code == 1
    line = error_line(err)
    assert line.startswith("error: unknown lm-eval task(s): tofu_forget01_truth_ratio. ")
    assert line.endswith("; not loaded: plugin 'builtin-tofu' (built-in) is disabled by UNLEARN_DISABLE_PLUGINS")


# ----------------------------------------------------------------------------- unlearn-lm-eval --model hf-prefix


@pytest.fixture
def lm_eval_env(monkeypatch, tofu_dir):
    monkeypatch.setenv("UNLEARN_TOFU_DIR", str(tofu_dir))


def lm_eval_cli(capsys, monkeypatch, *args) -> tuple[int, str]:
    from unlearn_plugins.evaluation import lm_eval_cli as command

    tasks = str(Path(__file__).resolve().parents[1] / "unlearn_plugins" / "benchmarks" / "tofu" / "tasks")
    monkeypatch.setattr(sys, "argv", ["unlearn-lm-eval", "--model", "hf-prefix", "--tasks", "tofu_forget01_truth_ratio",
                                      "--include_path", tasks, *map(str, args)])  # fmt: skip
    with pytest.raises(SystemExit) as exit_:
        command.main()
    return exit_.value.code, capsys.readouterr().err


@pytest.fixture(scope="module")
def other_base_adapter(tmp_path_factory, tiny_model_dir):
    """A LoRA adapter trained (made) on a copy of the tiny model in another folder."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    root = tmp_path_factory.mktemp("adapter")
    other = shutil.copytree(tiny_model_dir, root / "other-model")
    model = AutoModelForCausalLM.from_pretrained(other)
    get_peft_model(model, LoraConfig(r=2, target_modules=["q_proj"])).save_pretrained(root / "adapter")
    return root / "adapter", other


def test_8_hf_prefix_refuses_bad_options_in_one_line(
    capsys, monkeypatch, tiny_model_dir, tmp_path, other_base_adapter, lm_eval_env
):
    model = f"pretrained={tiny_model_dir}"
    empty = tmp_path / "no-weights"
    empty.mkdir()
    shutil.copy(tiny_model_dir / "config.json", empty / "config.json")
    adapter, other = other_base_adapter
    cases = [
        (("--model_args", model, "--batch_size", "0"),
         "error: --batch_size 0: must be an integer >= 1, 'auto' or 'auto:N' (N >= 1)"),
        (("--model_args", model, "--batch_size", "-1"),
         "error: --batch_size -1: must be an integer >= 1, 'auto' or 'auto:N' (N >= 1)"),
        (("--model_args", f"{model},dtype=nonsense"),
         "error: --model_args dtype=nonsense: not a torch dtype; give auto, float32, bfloat16 or float16"),
        (("--model_args", f"pretrained={empty}"),
         f"error: --model_args pretrained={empty}: no model weights (model.safetensors, ...) in the folder"),
        (("--model_args", model, "--limit", "0"),
         "error: --limit 0: must be > 0 (documents per task, or a fraction of them below 1)"),
        (("--model_args", f"{model},peft={adapter}"),
         f"error: --model_args peft={adapter} was trained on {other}, not on pretrained={tiny_model_dir}; add "
         "allow_other_base=True to --model_args to load it anyway"),
    ]  # fmt: skip
    import torch

    if not torch.cuda.is_available():
        cases.append(
            (
                ("--model_args", model, "--device", "cuda"),
                "error: --device cuda: this machine has no CUDA device (give --device cpu)",
            )
        )
    for args, expected in cases:
        code, err = lm_eval_cli(capsys, monkeypatch, *args)
        assert (code, error_line(err)) == (1, expected), args


def test_8_hf_prefix_names_an_option_it_does_not_take(capsys, monkeypatch, tiny_model_dir, lm_eval_env):
    code, err = lm_eval_cli(capsys, monkeypatch, "--model_args", f"pretrained={tiny_model_dir},nosuchkey=3", "--device",
                            "cpu", "--limit", "1")  # fmt: skip
    assert code == 1
    assert error_line(err) == (
        "error: --model_args: LlamaForCausalLM.__init__() got an unexpected keyword argument 'nosuchkey': not an "
        "option of hf-prefix (HFLM's options, draft_tokens, allow_other_base, or the model's from_pretrained keywords)"
    )


# ----------------------------------------------------------------------------- property test

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import given  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

#: what a damaged or hand-edited file holds where a number or an object was: none of them a
#: plausible value of any field (a plausible one, 0.4 for 0.6, no check can tell from a real one)
BAD_VALUES = [math.nan, math.inf, -math.inf, -7.5, "0.5", "", [], [0.5], {}, {"value": 0.5}, None, True]
#: what is damaged: a file of a kind, or a whole record folder deleted
TARGETS = {
    "operating point": ("point-*/operating_point.json",),
    "sweep trace": ("sweep-*/trace/trace.jsonl",),
    "retain evaluation": ("eval-retain-*/reference.json", "eval-retain-*/*/*.json*"),
    "test cell": ("eval-ihl-*/*/*.json*", "eval-reglu-*/*/*.json*"),
}
FOLDERS = ("point-*", "sweep-*", "eval-retain-*", "eval-ihl-*", "eval-reglu-*")


def damage(path: Path, data) -> None:
    damage_file(path, data, BAD_VALUES, ways=["value", "value", "value", "truncate"])


def same_numbers(report: dict, baseline: dict) -> None:
    """Every per-author number and operating point in the report is the intact records' (or
    missing): none comes from a damaged file."""
    for method, per in report["per_author"].items():
        for author, numbers in per.items():
            base = baseline["per_author"][method][author]
            for key, value in numbers.items():
                assert value == base[key], (method, author, key)
    for author, ref in report["references"].items():
        for name, numbers in ref.items():
            assert numbers is None or numbers == baseline["references"][author][name], (author, name)
    for method, op in report["operating_points"].items():
        base = baseline["operating_points"][method]
        assert op["use"] in (None, base["use"]), method
        for point in op["points"]:
            (same,) = [
                p for p in base["points"] if all(p.get(k) == point.get(k) for k in ("lr", "rol_weight", "epoch"))
            ]
            for key, value in point.items():
                assert value is None or value == same.get(key), (method, point, key)


@property_settings(8)
@given(data=st.data())
def test_randomly_damaged_author_records(data, synthetic, tmp_path_factory, capsys):
    """Damaged operating points, sweep traces, retain evaluations and test cells under
    `--report-only`: a report whose verdict is stated only from complete data (else "no
    verdict" and exit 1), or one `error:` line; never a traceback, never a damaged number."""
    root = tmp_path_factory.mktemp("damaged")
    try:
        records, cache = copy_of(synthetic, root)
        for _ in range(data.draw(st.integers(1, 3))):
            if data.draw(st.integers(0, 3)) == 0:  # a record folder deleted
                folders = sorted(p for pattern in FOLDERS for p in records.glob(pattern))
                shutil.rmtree(data.draw(st.sampled_from(folders)))
                continue
            kind = data.draw(st.sampled_from(sorted(TARGETS)))
            files = sorted(p for pattern in TARGETS[kind] for p in records.glob(pattern) if p.is_file())
            if files:
                damage(data.draw(st.sampled_from(files)), data)
        code, out, err = report_only(capsys, synthetic, records, cache, root / "out")
        assert "Traceback" not in err, err[-3000:]
        assert code in (0, 1), err[-3000:]
        errors = [line for line in err.splitlines() if line.startswith("error:")]
        assert errors == ([err.strip().splitlines()[-1]] if code else []), err[-3000:]
        if not (root / "out" / "study.json").is_file():
            assert code == 1
            return
        report = json.loads((root / "out" / "study.json").read_text(), parse_constant=pytest.fail)
        same_numbers(report, json.loads((synthetic["complete"] / "study.json").read_text()))
        verdict = report["analysis"]["verdict"]
        complete = all(len(report["per_author"][m]) == 6 for m in ("ihl", "reglu"))
        if verdict["holds"] is not None:  # stated: from complete data only
            assert complete and report["lacking"] is None and code == 0, report["lacking"]
            assert verdict["holds"] is True  # the intact records' verdict
        else:
            assert not complete or report["lacking"]
            assert code == 1 and ("no verdict: " in errors[0] or "left out of the comparisons" in errors[0])
            assert (root / "out" / "verdict.md").read_text().splitlines()[2].startswith("**No verdict: ")
    finally:
        shutil.rmtree(root, ignore_errors=True)
