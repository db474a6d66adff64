"""Bad input and faults, round three (issue 32, items 5, 8, 10 and 11): a full disk, work thrown
away or overwritten, tracebacks and misleading messages. Each case goes through the CLI where a
user meets it and asserts the exit code, the one-line `error:` (what and where) and that nothing
already written was lost or left half-written.

A full or read-only disk is a small tmpfs mounted for the test (root only: skipped otherwise)."""

from __future__ import annotations

import contextlib
import errno
import gc
import json
import os
import re
import subprocess
from pathlib import Path

import pytest

from unlearn_plugins.cli import main
from unlearn_plugins.study import builtin_studies

pytestmark = pytest.mark.usefixtures("single_thread")

TINY = builtin_studies()["tiny"].read_text()


# ----------------------------------------------------------------------------- helpers


def tree(folder: Path) -> dict[str, bytes | None]:
    """Every path under ``folder`` with its bytes (None for folders)."""
    if not folder.exists():
        return {}
    return {str(p.relative_to(folder)): (p.read_bytes() if p.is_file() else None) for p in sorted(folder.rglob("*"))}


def cli(capsys, *args) -> tuple[int, str, str]:
    code = main([str(a) for a in args])
    out, err = capsys.readouterr()
    return code, out, err


def error_line(err: str) -> str:
    """The command's one `error:` line, the last on stderr, and no traceback (libraries may log
    other lines before it)."""
    assert "Traceback" not in err, err
    lines = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(lines) == 1, err
    assert err.strip().splitlines()[-1] == lines[0], err
    return lines[0]


@contextlib.contextmanager
def small_disk(folder: Path, size: str, *, read_only: bool = False):
    """A tmpfs of ``size`` mounted on ``folder`` (a full disk, or a read-only one)."""
    folder.mkdir(parents=True, exist_ok=True)
    options = f"size={size}" + (",ro" if read_only else "")
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(folder)], capture_output=True, text=True
    )
    if mounted.returncode:
        pytest.skip(f"cannot mount a small tmpfs here (needs root): {mounted.stderr.strip()}")
    try:
        yield folder
    finally:
        if subprocess.run(["umount", str(folder)], capture_output=True).returncode:
            gc.collect()  # a failed test's traceback may hold a file open there
            subprocess.run(["umount", "--lazy", str(folder)], check=True)


def fill(disk: Path, leave: int) -> None:
    """Fill ``disk`` but for ``leave`` bytes."""
    filler = disk / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT)
    try:
        while True:
            os.write(fd, b"\0" * 4096)
    except OSError as exc:
        assert exc.errno == errno.ENOSPC
    finally:
        os.close(fd)
    os.truncate(filler, max(filler.stat().st_size - leave, 0))


def train_args(command, model_dir, tofu_dir, out, *extra):
    data = ["--forget", "tofu:forget01[0:4]", "--retain", "tofu:retain99[0:8]"] if command == "run" else []
    data = data or ["--data", "tofu:forget01[0:4]"]
    return [
        command,
        "--model",
        model_dir,
        "--tofu-dir",
        tofu_dir,
        *data,
        "--max-length",
        "64",
        "--lora-r",
        "2",
        "--batch-size",
        "2",
        "--grad-accum",
        "1",
        "--device",
        "cpu",
        "--out",
        out,
        *extra,
    ]


def study_file(folder: Path, seeds=(0, 1), name: str = "tiny") -> Path:
    """The tiny study with other seeds (another study of the same name)."""
    text = TINY.replace("seeds = [0, 1]", f"seeds = {list(seeds)}").replace('name = "tiny"', f'name = "{name}"')
    path = folder / f"{name}-{'-'.join(map(str, seeds))}.toml"
    path.write_text(text)
    return path


@pytest.fixture(scope="module")
def study_cache(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("study-cache")


@pytest.fixture(scope="module")
def tiny_report(study_cache, tmp_path_factory) -> Path:
    """The report of the built-in tiny study with nothing built (every cell `not run`)."""
    out = tmp_path_factory.mktemp("tiny-report") / "report"
    assert main(["study", "tiny", "--report-only", "--out", str(out), "--cache-dir", str(study_cache)]) == 0
    return out


# ----------------------------------------------------------------------------- item 5: a full disk


def test_eval_on_a_full_disk_is_an_error_and_leaves_nothing_half_written(tiny_model_dir, tofu_dir, tmp_path, capsys):
    """lm-eval's EvaluationTracker logs a failed write instead of raising: `results -> ...`, exit 0
    and 0-byte results_*.json and samples_*.jsonl were the result."""
    with small_disk(tmp_path / "disk", "8k") as disk:
        out = disk / "out"
        (out / "earlier").mkdir(parents=True)
        (out / "earlier" / "results_1.json").write_text("{}\n")
        before = tree(out)
        code, stdout, err = cli(
            capsys,
            "eval",
            "--model",
            tiny_model_dir,
            "--tofu-dir",
            tofu_dir,
            "--tasks",
            "tofu_forget01_truth_ratio",
            "--limit",
            "2",
            "--device",
            "cpu",
            "--out",
            out,
        )
        after = tree(out)
    assert code == 1 and "results ->" not in stdout
    line = error_line(err)
    assert re.fullmatch(
        rf"error: --out {re.escape(str(out))}: could not write {re.escape(str(out))}/\S+/"
        r"(samples_tofu_forget01_truth_ratio_|results_)\S+: No space left on device; "
        r"nothing of this evaluation was kept",
        line,
    ), line
    assert after == before


@pytest.mark.parametrize("command", ["run", "finetune"])
def test_training_on_a_full_disk_saves_no_half_adapter(command, tiny_model_dir, tofu_dir, tmp_path, capsys):
    """`unlearn run` and `finetune` raised an uncaught SafetensorError."""
    with small_disk(tmp_path / "disk", "20k") as disk:
        out = disk / "run"
        code, _, err = cli(
            capsys, *train_args(command, tiny_model_dir, tofu_dir, out, "--max-steps", "1", "--save-steps", "0")
        )
        left = tree(out)
    assert code == 1
    assert error_line(err) == (f"error: --out {out}: cannot save the trained adapter: No space left on device")
    assert not [name for name in left if not name.startswith("checkpoints")], left  # no adapter, no run.json


def test_a_checkpoint_on_a_full_disk_stops_training_naming_it(tiny_model_dir, tofu_dir, tmp_path, capsys):
    with small_disk(tmp_path / "disk", "40k") as disk:
        out = disk / "run"
        code, _, err = cli(
            capsys, *train_args("run", tiny_model_dir, tofu_dir, out, "--max-steps", "2", "--save-steps", "1")
        )
        left = tree(out)
    assert code == 1
    assert error_line(err) == (
        f"error: training stopped at step 1: cannot write the checkpoint {out}/checkpoints/checkpoint-1: "
        "No space left on device; no checkpoint was written before it"
    )
    assert sorted(left) == ["checkpoints", "checkpoints/run_config.json"]  # no half-written checkpoint


def test_a_study_report_on_a_full_disk_keeps_the_previous_report_whole(tiny_report, study_cache, tmp_path, capsys):
    """The report's files are written to temporaries and renamed together: a full disk used to
    leave a new study.json beside the old summary.md, with `[Errno 28]` naming no file."""
    with small_disk(tmp_path / "disk", "1m") as disk:
        out = disk / "report"
        out.mkdir()
        for path in tiny_report.iterdir():
            (out / path.name).write_bytes(path.read_bytes())
        marked = json.loads((out / "study.json").read_text())
        marked["marker"] = "the previous report"
        (out / "study.json").write_text(json.dumps(marked))
        # room for a new study.json and summary.md, not for pareto.png
        pages = sum(-(-(tiny_report / name).stat().st_size // 4096) for name in ("study.json", "summary.md"))
        fill(disk, leave=(pages + 1) * 4096)
        before = tree(out)
        code, _, err = cli(capsys, "study", "tiny", "--report-only", "--out", out, "--cache-dir", study_cache)
        after = tree(out)
    assert code == 1
    assert error_line(err) == (
        f"error: study report: cannot write {out}/pareto.png: No space left on device; the report in {out} is unchanged"
    )
    assert after == before


# ----------------------------------------------------------------------------- item 8: work thrown away or overwritten


def test_save_reference_without_a_truth_ratio_task_is_refused_before_the_model_loads(
    tiny_model_dir, tofu_dir, tmp_path, capsys, monkeypatch
):
    import unlearn_plugins.models as models

    def no_loading(*args, **kwargs):
        raise AssertionError("the model was loaded")

    monkeypatch.setattr(models, "load_model", no_loading)
    ref = tmp_path / "ref.json"
    code, _, err = cli(
        capsys,
        "eval",
        "--model",
        tiny_model_dir,
        "--tofu-dir",
        tofu_dir,
        "--tasks",
        "tofu_forget01_prob",
        "--limit",
        "2",
        "--save-reference",
        ref,
        "--out",
        tmp_path / "out",
    )
    assert code == 1
    assert error_line(err) == (
        "error: --save-reference needs exactly one forget truth-ratio task in the run (found: none); "
        "e.g. --tasks tofu_forget01_truth_ratio"
    )
    assert tree(tmp_path) == {}


@pytest.mark.parametrize(
    "flags",
    [
        ["--save-reference", "{d}/ref.json", "--retain-reference", "{d}/./ref.json"],
        ["--save-reference", "{d}/link.json", "--retain-reference", "{d}/ref.json"],
        ["--save-mia-reference", "{d}/ref.json", "--mia-reference", "{d}/ref.json", "--mia"],
    ],
)
def test_a_reference_is_never_saved_over_the_one_it_reads(flags, tiny_model_dir, tofu_dir, tmp_path, capsys):
    (tmp_path / "ref.json").write_text('{"the retain model": "reference"}\n')
    (tmp_path / "link.json").symlink_to(tmp_path / "ref.json")
    before = tree(tmp_path)
    args = [f.format(d=tmp_path) for f in flags]
    extra = ["--forget-split", "forget01", "--holdout-split", "holdout01"] if "--mia" in flags else []
    code, _, err = cli(
        capsys,
        "eval",
        "--model",
        tiny_model_dir,
        "--tofu-dir",
        tofu_dir,
        "--tasks",
        "tofu_forget01_truth_ratio",
        *args,
        *extra,
        "--out",
        tmp_path / "out",
    )
    assert code == 1
    save, given = args[0], args[1]
    read, path = args[2], args[3]
    assert error_line(err) == (
        f"error: {save} {given} and {read} {path} are the same file: this evaluation would overwrite it; "
        f"give {save} another file"
    )
    assert tree(tmp_path) == before


def test_another_study_of_the_same_name_does_not_replace_the_report(tiny_report, study_cache, tmp_path, capsys):
    """Two studies named "tiny" with other seeds replaced each other's report in the default
    --out (study-tiny) and mixed their logs; the same study may rewrite its own."""
    out = tmp_path / "study-tiny"
    out.mkdir()
    for path in tiny_report.iterdir():
        (out / path.name).write_bytes(path.read_bytes())
    before = tree(out)
    other = study_file(tmp_path, seeds=(0, 1, 2))
    code, _, err = cli(capsys, "study", other, "--report-only", "--out", out, "--cache-dir", study_cache)
    assert code == 1
    assert error_line(err) == (
        f"error: --out {out}: holds the report of another study named 'tiny' (other settings); give this one "
        f"another --out (or remove {out})"
    )
    assert tree(out) == before
    code, _, err = cli(capsys, "study", other, "--dry-run", "--cache-dir", study_cache)
    assert code == 0, err  # a dry run writes no report


def test_study_out_that_is_read_only_is_refused_before_any_work(study_cache, tmp_path, capsys):
    """Item 10: every worker failed with a traceback on its log, the --out error came at the end."""
    cache = tmp_path / "cache"
    with small_disk(tmp_path / "ro", "64k", read_only=True) as disk:
        code, _, err = cli(capsys, "study", "tiny", "--out", disk / "report", "--cache-dir", cache, "--threads", "1")
    assert code == 1
    assert error_line(err) == f"error: --out {disk / 'report'}: cannot create {disk / 'report'} (Read-only file system)"
    assert tree(cache) == {}
