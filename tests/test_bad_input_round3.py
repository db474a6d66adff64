"""Bad input and faults: a full disk, work thrown
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


def eval_cli(capsys, model_dir, tofu_dir, tasks, *args) -> tuple[int, str, str]:
    """`unlearn eval` of ``tasks`` on the model in ``model_dir``."""
    return cli(capsys, "eval", "--model", model_dir, "--tofu-dir", tofu_dir, "--tasks", tasks, *args)


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


# ----------------------------------------------------------------------------- a full disk


def test_eval_on_a_full_disk_is_an_error_and_leaves_nothing_half_written(tiny_model_dir, tofu_dir, tmp_path, capsys):
    """lm-eval's EvaluationTracker logs a failed write instead of raising: `results -> ...`, exit 0
    and 0-byte results_*.json and samples_*.jsonl were the result."""
    with small_disk(tmp_path / "disk", "8k") as disk:
        out = disk / "out"
        (out / "earlier").mkdir(parents=True)
        (out / "earlier" / "results_1.json").write_text("{}\n")
        before = tree(out)
        flags = ["--limit", "2", "--device", "cpu", "--out", out]
        code, stdout, err = eval_cli(capsys, tiny_model_dir, tofu_dir, "tofu_forget01_truth_ratio", *flags)
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


# ----------------------------------------------------------------------------- work thrown away or overwritten


def test_save_reference_without_a_truth_ratio_task_is_refused_before_the_model_loads(
    tiny_model_dir, tofu_dir, tmp_path, capsys, monkeypatch
):
    import unlearn_plugins.models as models

    def no_loading(*args, **kwargs):
        raise AssertionError("the model was loaded")

    monkeypatch.setattr(models, "load_model", no_loading)
    ref = tmp_path / "ref.json"
    flags = ["--limit", "2", "--save-reference", ref, "--out", tmp_path / "out"]
    code, _, err = eval_cli(capsys, tiny_model_dir, tofu_dir, "tofu_forget01_prob", *flags)
    assert code == 1
    assert error_line(err) == (
        "error: --save-reference needs exactly one forget truth-ratio task in the run (found: none), or tasks "
        "that keep a retain reference (MUSE's) without one; e.g. --tasks tofu_forget01_truth_ratio or --tasks muse_news"
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
    flags = [*args, *extra, "--out", tmp_path / "out"]
    code, _, err = eval_cli(capsys, tiny_model_dir, tofu_dir, "tofu_forget01_truth_ratio", *flags)
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
    """Every worker failed with a traceback on its log, the --out error came at the end."""
    cache = tmp_path / "cache"
    with small_disk(tmp_path / "ro", "64k", read_only=True) as disk:
        code, _, err = cli(capsys, "study", "tiny", "--out", disk / "report", "--cache-dir", cache, "--threads", "1")
    assert code == 1
    assert error_line(err) == f"error: --out {disk / 'report'}: cannot create {disk / 'report'} (Read-only file system)"
    assert tree(cache) == {}


# ----------------------------------------------------------------------------- tracebacks


def test_a_dask_scheduler_address_that_is_not_one_is_refused_before_any_work(tmp_path, capsys):
    pytest.importorskip("distributed")
    code, _, err = cli(
        capsys, "study", "tiny", "--executor", "dask", "--scheduler", "notanaddress", "--out", tmp_path / "r"
    )
    assert code == 1
    assert error_line(err) == (
        "error: --scheduler notanaddress: not a Dask scheduler address (missing port number in address "
        "'notanaddress'); give tcp://HOST:PORT, e.g. tcp://10.0.0.5:8786"
    )
    assert tree(tmp_path) == {}


def test_max_gen_toks_over_the_models_length_is_refused(tiny_model_dir, tofu_dir, tmp_path, capsys):
    flags = ["--max-gen-toks", "100000", "--out", tmp_path / "out"]
    code, _, err = eval_cli(capsys, tiny_model_dir, tofu_dir, "tofu_forget01_rouge", *flags)
    assert code == 1
    assert error_line(err) == (
        f"error: --max-gen-toks 100000: over the model's maximum length (512 tokens, max_position_embeddings in "
        f"{tiny_model_dir / 'config.json'}); give at most 512"
    )
    assert tree(tmp_path) == {}


def test_a_huge_gen_margin_is_refused_when_the_study_is_read(tmp_path, capsys):
    path = tmp_path / "study.toml"
    path.write_text(TINY.replace("gen_margin = 4", "gen_margin = 1000000000000"))
    code, _, err = cli(capsys, "study", path, "--dry-run", "--cache-dir", tmp_path / "cache")
    assert code == 1
    assert error_line(err) == f"error: {path}: [evaluation] gen_margin: must be <= 4096, got 1000000000000"
    assert not (tmp_path / "cache").exists()


def test_a_corrupt_response_cache_is_named(tiny_model_dir, tofu_dir, tmp_path, capsys):
    from unlearn_plugins.evaluation.lm_eval_runner import keyed_cache_path
    from unlearn_plugins.models import resolve_model

    db = Path(keyed_cache_path(str(tmp_path / "cache"), resolve_model(str(tiny_model_dir)), None, "torch.float32"))
    db = db.with_name(db.name + "_rank0.db")
    db.write_bytes(b"not an SQLite database, but a file someone cut short")
    before = tree(tmp_path)
    flags = ["--limit", "1", "--device", "cpu", "--use-cache", tmp_path / "cache", "--out", tmp_path / "out"]
    code, _, err = eval_cli(capsys, tiny_model_dir, tofu_dir, "tofu_forget01_prob", *flags)
    assert code == 1
    assert error_line(err) == (
        f"error: --use-cache: {db} is not a readable SQLite database (file is not a database); remove it to start "
        "the cache afresh"
    )
    assert tree(tmp_path) == before


@pytest.mark.parametrize("out,what", [(".", "the current folder"), ("..", "a folder holding the current one")])
def test_attack_out_that_holds_the_current_folder_is_refused(out, what, tiny_model_dir, tmp_path, capsys, monkeypatch):
    here = tmp_path / "here"
    here.mkdir()
    monkeypatch.chdir(here)
    code, _, err = cli(capsys, "attack", "--attack", "quantize", "--model", tiny_model_dir, "--out", out)
    assert code == 1
    assert error_line(err) == (
        f"error: --out {out}: is {what}; the attacked model replaces its --out folder as a whole: give a folder of "
        "its own, e.g. --out attacked"
    )
    assert tree(tmp_path) == {"here": None}


@pytest.mark.parametrize(
    "meta,says",
    [
        ({"anchors": [1, 2]}, "anchors must be an object of anchor groups, got list"),
        ({"anchors": {"all": [1]}}, "anchors.all must be an object with easy and hard lists, got list"),
        (
            {"stable_by_objective": {"npo": {"easy": [7], "hard": []}}},
            "stable_by_objective.npo.easy[0] must be an object with a question and an answer, got 7",
        ),
    ],
)
def test_stratify_names_a_malformed_metadata_file(meta, says, tofu_dir, tmp_path, capsys):
    from unlearn_plugins.data.qa import load_split

    samples = load_split("tofu:forget01[0:6]", tofu_dir)
    scores = tmp_path / "s.jsonl"
    scores.write_text("".join(json.dumps({"index": s.index, "score": i / 10}) + "\n" for i, s in enumerate(samples)))
    (tmp_path / "s.jsonl.meta.json").write_text(json.dumps(meta))
    before = tree(tmp_path)
    args = ["--easy", "1", "--hard", "1", "--data", "tofu:forget01[0:6]", "--tofu-dir", tofu_dir]
    code, _, err = cli(capsys, "stratify", scores, *args, "--out", tmp_path / "o")
    assert code == 1
    assert error_line(err) == f"error: {tmp_path / 's.jsonl.meta.json'}: {says}"
    assert tree(tmp_path) == before


def test_plugins_lists_a_component_whose_default_factory_raises(tmp_path):
    import sys
    import textwrap

    (tmp_path / "factory_plugin.py").write_text(
        textwrap.dedent("""
        import dataclasses
        from unlearn_plugins import hookimpl

        def boom():
            raise ValueError("no default here")

        @dataclasses.dataclass
        class Scorer:
            weights: list = dataclasses.field(default_factory=boom)

            def score(self, samples, *, model, tokenizer):
                return [0.0 for _ in samples]

        @hookimpl
        def register_difficulty_scorers(register):
            register("factory", Scorer)
        """)
    )
    info = tmp_path / "factory_plugin-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: factory-plugin\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("[unlearn_plugins]\nfactory-plugin = factory_plugin\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])}
    for extra in ([], ["--json"]):
        done = subprocess.run(
            [sys.executable, "-m", "unlearn_plugins.cli", "plugins", *extra],
            capture_output=True,
            text=True,
            env=env,
            timeout=300,
        )
        assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
        assert "<default_factory raised ValueError: no default here>" in done.stdout


def test_a_weight_file_holding_a_malicious_pickle_is_refused_unrun(tiny_model_dir, tofu_dir, tmp_path, capsys):
    import shutil

    import torch

    class Payload:
        def __reduce__(self):
            return (os.system, (f"touch {tmp_path / 'ran'}",))

    model = tmp_path / "model"
    model.mkdir()
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json"):
        shutil.copy(tiny_model_dir / name, model / name)
    torch.save({"model.embed_tokens.weight": Payload()}, model / "pytorch_model.bin")
    before = tree(tmp_path)
    code, _, err = cli(capsys, "probs", "--model", model, "--tofu-dir", tofu_dir, "--data", "tofu:forget01[0:2]")
    assert code == 1
    assert error_line(err) == (
        f"error: --model {model}: {model / 'pytorch_model.bin'} is not loadable as weights: a pickle holding a "
        "reference to posix.system, which could run code if loaded; refused, nothing of it was run (use safetensors "
        "weights from a source you trust)"
    )
    assert tree(tmp_path) == before  # and the payload did not run


# ----------------------------------------------------------------------------- misleading messages


def test_forget_split_takes_the_tofu_prefix(tiny_model_dir, tofu_dir, tmp_path, capsys):
    """`--forget-split tofu:forget01` said "split 'tofu:forget01' not found ... available: forget01"."""
    from unlearn_plugins.evaluation.lm_eval_runner import read_outputs

    common = ["--model", tiny_model_dir, "--tofu-dir", tofu_dir, "--tasks", "tofu_forget_prob", "--limit", "2"]
    for split, out in (("tofu:forget01", "a"), ("forget01", "b")):
        code, _, err = cli(capsys, "eval", *common, "--forget-split", split, "--device", "cpu", "--out", tmp_path / out)
        assert code == 0, err[-2000:]
    a, b = (read_outputs(tmp_path / out).summary["metrics"] for out in "ab")
    assert a == b


def test_robustness_attacks_measure_a_plain_split_name(tiny_model_dir, tofu_dir, tmp_path, capsys):
    """The quantize attack (and plugin attacks) failed with the same self-contradicting message
    when --forget-split was a plain TOFU name."""
    args = ["--model", tiny_model_dir, "--tofu-dir", tofu_dir, "--robustness", "--robustness-attacks", "quantize"]
    code, out, err = cli(
        capsys, "eval", *args, "--forget-split", "forget01", "--limit", "1", "--device", "cpu", "--out", tmp_path / "o"
    )
    assert code == 0, err[-3000:]
    assert "failed" not in out and "not found" not in err
    assert re.search(r"\|quantize \(attack\)\s*\|\s*\d", out), out


@pytest.mark.parametrize("name", ["loop.json", "loop"])
def test_a_symlink_loop_as_data_is_named_as_one(name, tiny_model_dir, tofu_dir, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / name).symlink_to(name)
    code, _, err = cli(capsys, "probs", "--model", tiny_model_dir, "--tofu-dir", tofu_dir, "--data", name)
    assert code == 1
    assert error_line(err) == f"error: data '{name}': {name} is a symbolic link loop (it leads back to itself)"


def test_study_errors_name_the_study_files_keys_not_flags(tmp_path, capsys):
    """`[model] base` was reported as `--model X`, `[benchmark] tofu_dir` as "from --tofu-dir"."""
    base = tmp_path / "base.toml"
    base.write_text(TINY.replace('base = "tiny-llama"', 'base = "/nonexistent/model"'))
    tofu = tmp_path / "tofu.toml"
    tofu.write_text(TINY.replace('source = "generated"', 'source = "tofu"\ntofu_dir = "/nonexistent/tofu"'))
    for path, says in (
        (base, "[model] base: /nonexistent/model: no such folder"),
        (tofu, "[benchmark] tofu_dir: TOFU folder not found: /nonexistent/tofu"),
    ):
        code, _, err = cli(capsys, "study", path, "--dry-run", "--cache-dir", tmp_path / "cache")
        assert code == 1
        assert error_line(err) == f"error: {path}: {says}"
        assert "--model" not in err and "--tofu-dir" not in err


def test_a_target_given_as_an_adapter_folder_is_refused_naming_its_base(tiny_model_dir, tmp_path, capsys):
    """Its cells failed late, each with a 2 KB regex of module names."""
    adapter = tmp_path / "adapter"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text(json.dumps({"base_model_name_or_path": str(tiny_model_dir)}))
    (adapter / "adapter_model.safetensors").write_bytes(b"")
    head, rest = TINY.split("[target]", 1)
    path = tmp_path / "study.toml"
    path.write_text(
        head
        + f'[target]\ngiven = "{adapter}"\n\n[retain.given]\n1 = "{tiny_model_dir}"\n\n[budget]'
        + rest.split("[budget]", 1)[1]
    )
    code, _, err = cli(capsys, "study", path, "--dry-run", "--cache-dir", tmp_path / "cache")
    assert code == 1
    assert error_line(err) == (
        f"error: {path}: [target] given: {adapter} is a LoRA adapter folder (trained on {tiny_model_dir}), not a "
        "whole model; merge it into its base (unlearn finetune --merge writes OUT/merged) and give that folder"
    )


def test_non_finite_option_values_are_refused_when_checked(tiny_model_dir, tofu_dir, tmp_path, capsys):
    """`alpha = inf` was accepted; training then stopped on a non-finite loss advising a lower --lr."""
    path = tmp_path / "study.toml"
    path.write_text(
        TINY.replace('objective = "grad_diff"', 'objective = "grad_diff"\nobjective_options = { alpha = inf }')
    )
    code, _, err = cli(capsys, "study", path, "--dry-run", "--cache-dir", tmp_path / "cache")
    assert code == 1
    assert error_line(err) == (
        f"error: {path}: [methods.grad_diff] objective: objective 'grad_diff' (plugin 'builtin-objectives') rejected "
        "its options {'alpha': inf}: option 'alpha' must be a finite number, got inf"
    )
    out = tmp_path / "run"
    code, _, err = cli(
        capsys,
        *train_args("run", tiny_model_dir, tofu_dir, out, "--objective-option", "alpha=Infinity", "--max-steps", "1"),
    )
    assert code == 1
    assert error_line(err) == (
        "error: objective 'grad_diff' (plugin 'builtin-objectives') rejected its options {'alpha': inf}: option "
        "'alpha' must be a finite number, got inf"
    )
    assert not out.exists()
