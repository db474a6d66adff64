"""Hand-edited and damaged evaluations under `unlearn study --report-only`: a Forget Quality of 7.5 was averaged (4.166, interval [0, 1]), a NaN one dropped without a
word, a string Model Utility read as a number, and a list where an object belongs, a string
summary, a list Forget Quality, a string extraction strength or NaN samples gave tracebacks.
Every number the report reads is checked now: a damaged record is one `error:` line naming the
file and the field (nothing written), a damaged cached evaluation is a failed cell naming the
file (exit 1), never a number. A property test feeds randomly corrupted records and stage-cache
files and accepts only a report (exit 0) or exactly one `error:` line (exit 1), never a
traceback, never a number from a corrupt file.

Nothing is built: the study is `reglu_tofu` cut to one forget size and two methods (its cells
keep their cache keys), reported from the committed records in bench/results/reglu_tofu."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest
from support_checks import damage_file, property_settings

from unlearn_plugins.cli import main
from unlearn_plugins.study import builtin_studies
from unlearn_plugins.study.records import unpacked

pytestmark = pytest.mark.usefixtures("single_thread")

COMMITTED = Path(__file__).resolve().parents[1] / "bench" / "results" / "reglu_tofu"
CELL = "grad_diff/forget1/seed1"
CELL_FOLDER = "eval-grad_diff-forget1-seed1-*"


def small_study(folder: Path, label: str | None = None) -> Path:
    """reglu_tofu with forget size 1 and the methods grad_diff and ihl_fila only (``label``:
    another label for ihl_fila)."""
    text = builtin_studies()["reglu_tofu"].read_text().replace("forget_authors = [1, 2]", "forget_authors = [1]")
    head, rest = text.split("[[methods]]", 1)
    blocks = ["[[methods]]" + b for b in rest.split("[[methods]]")]
    blocks[-1], evaluation = blocks[-1].split("[evaluation]")
    kept = [b for b in blocks if 'name = "grad_diff"' in b or 'name = "ihl_fila"' in b]
    if label is not None:
        kept = [b.replace('label = "IHL + FILA"', f"label = {json.dumps(label)}") for b in kept]
    path = folder / "small.toml"
    path.write_text(head + "".join(kept) + "[evaluation]" + evaluation)
    return path


def run(capsys, *args) -> tuple[int, str, str]:
    code = main(["study", *map(str, args)])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def error_lines(err: str) -> list[str]:
    return [line for line in err.splitlines() if line.startswith("error:")]


def snapshot(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def no_constants(text: str) -> dict:
    """study.json parsed; a NaN or an infinity in it fails the test."""

    def refuse(name):
        raise AssertionError(f"study.json holds {name}")

    return json.loads(text, parse_constant=refuse)


@pytest.fixture(scope="module")
def study(tmp_path_factory, tofu_dir):
    """The small study, its records (only the folders it uses) and the baseline report."""
    root = tmp_path_factory.mktemp("corrupt-records")
    mp = pytest.MonkeyPatch()
    mp.setenv("UNLEARN_TOFU_DIR", str(tofu_dir))
    path = small_study(root)
    code = main(
        ["study", str(path), "--report-only", "--records", str(COMMITTED), "--cache-dir", str(root / "cache")]
        + ["--out", str(root / "baseline")]
    )
    assert code == 0
    baseline = no_constants((root / "baseline" / "study.json").read_text())
    used = {Path(f).name for c in baseline["cells"].values() for f in c["stages"]}
    records = root / "records"
    records.mkdir()
    committed = unpacked(COMMITTED)  # the committed records are packed
    for name in used & {p.name for p in committed.iterdir()}:
        shutil.copytree(committed / name, records / name)
    yield {"path": path, "records": records, "cache": root / "cache", "baseline": baseline, "root": root}
    mp.undo()


def recorded(records: Path, pattern: str = CELL_FOLDER, name: str = "results_*.json") -> Path:
    (path,) = records.glob(f"{pattern}/**/{name}")
    return path


def edit_summary(change):
    def apply(records: Path) -> None:
        path = recorded(records)
        data = json.loads(path.read_text())
        change(data["unlearn_summary"])
        path.write_text(json.dumps(data))

    return apply


def nan_sample(records: Path) -> None:
    path = recorded(records, name="samples_tofu_retain_prob_*.jsonl")
    lines = path.read_text().splitlines()
    row = json.loads(lines[0])
    row["prob"] = math.nan
    lines[0] = json.dumps(row)
    path.write_text("\n".join(lines) + "\n")


def set_value(*keys, value):
    def change(summary):
        for key in keys[:-1]:
            summary = summary[key]
        summary[keys[-1]] = value

    return change


def string_summary(records: Path) -> None:
    path = recorded(records)
    data = json.loads(path.read_text())
    data["unlearn_summary"] = "done"
    path.write_text(json.dumps(data))


RESULTS = "results_{date}.json"
SHAPES = {
    "a string MU": (
        edit_summary(set_value("model_utility", "value", value="0.35")),
        RESULTS + ": field 'unlearn_summary.model_utility.value' must be a number, got \"0.35\"",
    ),
    "a list where a dict belongs": (
        edit_summary(set_value("metrics", value=[0.5, 0.3])),
        RESULTS + ": field 'unlearn_summary.metrics' must be a JSON object, got list",
    ),
    "a string summary": (
        string_summary,
        RESULTS + ": field 'unlearn_summary' must be a JSON object, got \"done\"",
    ),
    "a list FQ": (
        edit_summary(set_value("forget_quality", value=[0.17])),
        RESULTS + ": field 'unlearn_summary.forget_quality' must be a JSON object, got list",
    ),
    "a string ES": (
        edit_summary(set_value("metrics", "tofu_forget_extraction_strength", "extraction_strength", value="high")),
        RESULTS + ": field 'unlearn_summary.metrics.tofu_forget_extraction_strength.extraction_strength' must be "
        'a number, got "high"',
    ),
    "NaN samples": (
        nan_sample,
        "samples_tofu_retain_prob_{date}.jsonl:1: field 'prob' is NaN, not a finite number",
    ),
    "FQ 7.5": (
        edit_summary(set_value("forget_quality", "tofu_forget_truth_ratio", "value", value=7.5)),
        RESULTS + ": field 'unlearn_summary.forget_quality.tofu_forget_truth_ratio.value' is 7.5, outside its "
        "range [0, 1]",
    ),
    "FQ NaN": (
        edit_summary(set_value("forget_quality", "tofu_forget_truth_ratio", "value", value=math.nan)),
        RESULTS + ": field 'unlearn_summary.forget_quality.tofu_forget_truth_ratio.value' is NaN, not a finite number",
    ),
    "FQ missing": (
        edit_summary(lambda s: s.pop("forget_quality")),
        RESULTS + ": no Forget Quality (every evaluation of a study has it; the file is damaged or was edited)",
    ),
}


def expected_file(records: Path, message: str) -> str:
    """``message`` (``{date}``: the evaluation's) after the damaged file's folder, named from
    its stage folder as the error names it."""
    results = recorded(records)
    return f"{results.parent.relative_to(records)}/{message.format(date=results.stem.removeprefix('results_'))}"


@pytest.mark.parametrize("shape", list(SHAPES))
def test_a_hand_edited_record_is_one_error_naming_file_and_field(shape, study, tmp_path, capsys):
    """Each shape used to give a traceback or a number (FQ 7.5 averaged,
    a NaN FQ dropped, a string MU read as 0.35). Now one error line names the record's file and
    field; the records and the last report are left as they were."""
    damage, message = SHAPES[shape]
    records = tmp_path / "records"
    shutil.copytree(study["records"], records)
    out = tmp_path / "report"
    code, _, err = run(
        capsys, study["path"], "--report-only", "--records", records, "--cache-dir", tmp_path / "c", "--out", out
    )
    assert code == 0, err[-2000:]
    report_before = snapshot(out)
    damage(records)
    records_before = snapshot(records)
    code, _, err = run(
        capsys, study["path"], "--report-only", "--records", records, "--cache-dir", tmp_path / "c2", "--out", out
    )
    assert code == 1 and "Traceback" not in err
    assert error_lines(err) == [err.strip().splitlines()[-1]]
    folder = next(records.glob(CELL_FOLDER))
    assert err.strip().splitlines()[-1] == (
        f"error: --records {records}: the recorded evaluation of {CELL}, {folder}, is unreadable "
        f"(CorruptEvaluation: {expected_file(records, message)}); remove that folder to rebuild the cell"
    )
    assert snapshot(records) == records_before and snapshot(out) == report_before
    assert not (tmp_path / "c2").exists() or not any((tmp_path / "c2").glob(CELL_FOLDER))


def test_a_hand_edited_record_in_a_pack_is_named_by_its_pack(study, tmp_path, capsys):
    """A record damaged before it was packed: the error names the pack and the folder in it,
    and says how to remove that folder from packed records."""
    from unlearn_plugins.study.records import pack

    damage, message = SHAPES["FQ 7.5"]
    records = tmp_path / "records"
    shutil.copytree(study["records"], records)
    damage(records)
    folder = next(records.glob(CELL_FOLDER)).name
    expected = expected_file(records, message)
    made = pack(records)
    code, _, err = run(
        capsys,
        study["path"],
        "--report-only",
        "--records",
        records,
        "--cache-dir",
        tmp_path / "c",
        "--out",
        tmp_path / "report",
    )
    assert code == 1 and "Traceback" not in err
    assert error_lines(err) == [
        f"error: --records {records}: the recorded evaluation of {CELL}, {made}:{folder}, is unreadable "
        f"(CorruptEvaluation: {expected}); unpack the records (unlearn records unpack {records}), remove that "
        "folder and pack them again to rebuild the cell"
    ]


def test_a_damaged_cached_evaluation_is_a_failed_cell_never_averaged(study, tmp_path, capsys):
    """FQ 7.5 in the stage cache: the old report averaged it into GradDiff's mean (with an
    interval of [0, 1]) and exited 0. Now the cell is failed with a message naming the file, the
    method's numbers are the other two seeds', and the exit status is 1."""
    cache = tmp_path / "cache"
    shutil.copytree(study["cache"], cache)
    path = recorded(cache)
    data = json.loads(path.read_text())
    data["unlearn_summary"]["forget_quality"]["tofu_forget_truth_ratio"]["value"] = 7.5
    path.write_text(json.dumps(data))
    out = tmp_path / "report"
    code, _, err = run(capsys, study["path"], "--report-only", "--cache-dir", cache, "--out", out)
    assert code == 1 and "Traceback" not in err
    assert error_lines(err) == [
        f"error: 1 finished cell(s) cannot be read: {CELL} (see {out}/summary.md; a run rebuilds them)"
    ]
    report = no_constants((out / "study.json").read_text())
    shown = str(path.relative_to(cache))
    assert report["cells"][CELL]["status"] == "failed"
    assert report["cells"][CELL]["error"] == (
        f"its evaluation is unreadable (CorruptEvaluation: {shown}: field "
        "'unlearn_summary.forget_quality.tofu_forget_truth_ratio.value' is 7.5, outside its range [0, 1])"
    )
    (group,) = [g for g in report["groups"] if g["method"] == "grad_diff"]
    base = study["baseline"]["cells"]
    assert group["seeds_done"] == [0, 2]
    assert group["metrics"]["forget_quality"]["values"] == [
        base[f"grad_diff/forget1/seed{s}"]["metrics"]["forget_quality"] for s in (0, 2)
    ]
    summary = (out / "summary.md").read_text()
    assert f"- `{CELL}`: its evaluation is unreadable (CorruptEvaluation: {shown}:" in summary
    assert "7.5" not in summary.split("## Failed cells")[0]


def test_a_pipe_in_a_method_label_is_escaped_and_a_line_break_refused(study, tmp_path, capsys):
    """A label with '|' added a column to summary.md's tables, one with a line
    break ended the row. '|' is escaped in every table row; a line break is refused when the
    study file is read, naming the file and the key."""
    out = tmp_path / "report"
    code, _, err = run(
        capsys,
        small_study(tmp_path, label="IHL | FILA"),
        "--report-only",
        "--cache-dir",
        study["cache"],
        "--out",
        out,
    )
    assert code == 0, err[-2000:]
    rows = [line for line in (out / "summary.md").read_text().splitlines() if "FILA" in line and "|" in line[:2]]
    assert rows and all(line.startswith("| IHL \\| FILA ") for line in rows)
    columns = {line.replace("\\|", "").count("|") for line in rows if "difference in mean" not in line}
    header = next(line for line in (out / "summary.md").read_text().splitlines() if line.startswith("| model |"))
    assert columns == {header.count("|")}

    bad = tmp_path / "bad"
    bad.mkdir()
    path = small_study(bad, label="IHL\nFILA")
    code, _, err = run(capsys, path, "--report-only", "--cache-dir", study["cache"], "--out", bad / "report")
    assert code == 1 and "Traceback" not in err
    assert err.strip().splitlines() == [
        f"error: {path}: [methods.ihl_fila] label: must be one line of text (it heads a row of the report's "
        "tables): no line breaks or control characters, got 'IHL\\nFILA'"
    ]
    assert not (bad / "report").exists()


# ----------------------------------------------------------------------------- property test

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import given  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

#: what a damaged or hand-edited file holds where a number or an object was
BAD_VALUES = [
    math.nan,
    math.inf,
    -math.inf,
    7.5,
    -0.25,
    1e300,
    10**400,
    "0.5",
    "",
    [],
    [0.5],
    {},
    {"value": 0.5},
    None,
    True,
]


def damage(path: Path, data) -> None:
    damage_file(
        path, data, BAD_VALUES, ways=["value", "value", "truncate"], prefer="unlearn_summary", empty_is_cut=True
    )


def same_or_none(got: dict, base: dict, where: str) -> None:
    """Each value the intact evaluation's, or n/a (None)."""
    for key, value in got.items():
        # peak_scope: a label; wall time and memory come from resources.json, whose plausible but
        # changed value (a damaged 1308.7 -> 0) no check can tell from a real one: only the
        # evaluation's numbers are held to the intact ones
        if value is not None and key not in ("peak_scope", "wall_s", "peak_rss_mb"):
            assert value == base.get(key), f"{where}: {key} = {value!r}, the intact evaluation has {base.get(key)!r}"


def check_report(report: dict, baseline: dict) -> None:
    """Every number in the report is the intact evaluation's (or n/a), and every mean is over
    exactly the cells the report shows as done."""
    base_cells = baseline["cells"]
    for cell_id, cell in report["cells"].items():
        if cell["status"] == "done":
            same_or_none(cell.get("metrics", {}), base_cells[cell_id].get("metrics", {}), cell_id)
            same_or_none(cell.get("resources", {}), base_cells[cell_id].get("resources", {}), cell_id)
        else:
            assert "metrics" not in cell
    base_refs = {(r["name"], r["forget"]): r for r in baseline["references"]}
    for row in report["references"]:
        if row["status"] == "done":
            same_or_none(row, base_refs[row["name"], row["forget"]], row["name"])
    for group in report["groups"]:
        done = [report["cells"][f"{group['method']}/forget{group['forget']}/seed{s}"] for s in group["seeds"]]
        done = [c for c in done if "metrics" in c]
        assert group["seeds_done"] == [c["seed"] for c in done]
        for key, stat in group["metrics"].items():
            source = "resources" if key in ("wall_s", "peak_rss_mb") else "metrics"
            assert stat["values"] == [c[source][key] for c in done if c[source].get(key) is not None], key


@property_settings(30)
@given(data=st.data())
def test_randomly_corrupted_records_and_stage_cache(data, study, tmp_path_factory, capsys):
    """Truncations, wrong JSON types, NaN / infinite / out-of-range
    numbers and missing keys in recorded or cached evaluation files give a report (exit 0) or
    exactly one `error:` line (exit 1), never a traceback, never a number from a corrupt file."""
    root = tmp_path_factory.mktemp("example")
    try:
        where = data.draw(st.sampled_from(["records", "cache"]))
        copy = root / where
        shutil.copytree(study[where], copy)
        files = sorted(
            p
            for p in copy.glob("*/**/*")
            if p.is_file()
            and p.suffix in (".json", ".jsonl")
            and p.relative_to(copy).parts[0].startswith(("eval-", "run-"))
        )
        for path in data.draw(st.lists(st.sampled_from(files), min_size=1, max_size=3, unique=True)):
            damage(path, data)
        args = ["--records", copy, "--cache-dir", root / "fresh"] if where == "records" else ["--cache-dir", copy]
        code, _, err = run(capsys, study["path"], "--report-only", *args, "--out", root / "out")
        assert "Traceback" not in err, err[-3000:]
        assert code in (0, 1), err[-3000:]
        if code == 1:
            assert error_lines(err) == [err.strip().splitlines()[-1]], err[-3000:]
        else:
            assert error_lines(err) == [], err[-3000:]
        if (root / "out" / "study.json").is_file():
            check_report(no_constants((root / "out" / "study.json").read_text()), study["baseline"])
        else:
            assert code == 1
    finally:
        shutil.rmtree(root, ignore_errors=True)


def test_the_cases_hypothesis_found(tmp_path):
    """Found by the random test above on a fresh machine: a recorded wall time of 1e300 or
    10**400 seconds (an infinite mean, an overflow) and a samples row whose doc_id no longer
    numbers the QA (the bootstrap pairs the parts' QA by it) are damage, not measurements."""
    from unlearn_plugins.benchmarks.tofu.study.report import CorruptEvaluation, _read_samples, _resources

    for seconds in (1e300, 10**400):
        folder = tmp_path / f"stage{len(str(seconds))}"
        folder.mkdir()
        (folder / "resources.json").write_text(json.dumps({"seconds": seconds, "peak_rss_mb": 10.0}))
        assert _resources([str(folder)])["wall_s"] is None
    rows = [{"doc_id": i, "prob": 0.5} for i in range(3)]
    for doc_id, shown in ((10**400, "a 401-digit number"), (1, "1"), (7, "7")):
        path = tmp_path / "samples.jsonl"
        path.write_text("".join(json.dumps(r) + "\n" for r in [*rows[:2], {"doc_id": doc_id, "prob": 0.5}]))
        with pytest.raises(CorruptEvaluation, match=f"0..2 once each .expected 2, found {shown}"):
            _read_samples(path, "samples.jsonl", ["prob"])
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert _read_samples(path, "samples.jsonl", ["prob"]) == rows
