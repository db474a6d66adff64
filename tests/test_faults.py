"""Faults and integrity: corrupt model caches and weight files, NaN outputs,
adapters trained on another base, locks on output folders, no trace of runs that fail before
training, resumable scoring, and broken checkpoints on --resume.

Each test asserts the exit code, the one-line `error:` message (what and where), and that no
file was lost or left behind.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from support_training import SMALL_DATA, SMALL_SIZES, score_args
from support_training import tiny_args as small_run_args

from unlearn_plugins.cli import main

ROOT = Path(__file__).resolve().parents[1]
DATA = "tofu:forget01[0:7]"

pytestmark = pytest.mark.usefixtures("single_thread")


def child_env():
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    env["CUDA_VISIBLE_DEVICES"] = ""  # the child runs on the CPU, as the test does
    return env


def error_line(capsys) -> str:
    """The command's one `error:` line (and no traceback)."""
    err = capsys.readouterr().err
    assert "Traceback" not in err, err
    lines = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(lines) == 1, err
    return lines[0]


def tree(folder: Path) -> dict[str, bytes]:
    """Every file under ``folder`` with its bytes (what must be neither lost nor left behind)."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def tiny_args(model_dir, tofu_dir, out, *extra):
    """The small run of tests/support_training.py, on the CPU."""
    return small_run_args(model_dir, tofu_dir, out, "--device", "cpu", *extra)


#: the run the concurrency and resume tests compare with: 6 steps, a checkpoint every 2
STEPS = ["--max-steps", "6", "--save-steps", "2"]
RUN_CONFIG = {**SMALL_DATA, **SMALL_SIZES, "device": "cpu", "max_steps": 6, "save_steps": 2}


def adapter_weights(folder):
    from safetensors.torch import load_file

    return load_file(str(Path(folder) / "adapter_model.safetensors"))


def assert_same_adapter(a, b):
    wa, wb = adapter_weights(a), adapter_weights(b)
    assert wa.keys() == wb.keys()
    for key in wa:
        assert torch.allclose(wa[key], wb[key], rtol=1e-5, atol=1e-7), key


@pytest.fixture(scope="module")
def straight_run(tiny_model_dir, tofu_dir, tmp_path_factory):
    """An undisturbed 6-step run (the adapter an interrupted or contested run must end with)."""
    out = tmp_path_factory.mktemp("straight") / "run"
    assert main(tiny_args(tiny_model_dir, tofu_dir, out, *STEPS)) == 0
    return out


HOLD_SCRIPT = """
import sys
from unlearn_plugins import files
kind, path = sys.argv[1], sys.argv[2]
lock = files.exclusive_lock(path, "test") if kind == "exclusive_lock" else getattr(files, kind)(path)
with lock:
    print("held", flush=True)
    sys.stdin.read()
"""


@contextlib.contextmanager
def held(kind: str, path) -> int:
    """Another process holding a lock (``files.folder_lock`` / ``file_lock`` / ``exclusive_lock``)
    until the block ends; yields its pid."""
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLD_SCRIPT, kind, str(path)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=child_env(),
    )
    try:
        assert proc.stdout.readline().strip() == "held"
        yield proc.pid
    finally:
        proc.stdin.close()
        proc.wait(timeout=60)


# ----------------------------------------------------------------------------- cache hashes, NaN outputs


@pytest.fixture
def tiny_cache(tmp_path, monkeypatch):
    """The embedded-model cache with the GGUF conversion replaced by saving the tiny model:
    (cache folder, list of conversions)."""
    from unlearn_plugins import models
    from unlearn_plugins.testing import save_tiny_model

    gguf = tmp_path / "fake.gguf"
    gguf.write_bytes(b"GGUF" + bytes(60))
    calls = []

    def convert(source, out):
        calls.append(out)
        save_tiny_model(out)

    monkeypatch.setattr(models, "_gguf_path", lambda alias: gguf)
    monkeypatch.setattr(models, "convert_gguf", convert)
    return tmp_path / "cache", calls


def _nan_bytes_in_place(path: Path) -> None:
    """Overwrite the first tensor's first 4 values with fp32 NaN, keeping size and mtime."""
    st = path.stat()
    data = bytearray(path.read_bytes())
    start = 8 + int.from_bytes(data[:8], "little")
    data[start : start + 16] = b"\x00\x00\xc0\x7f" * 4
    path.write_bytes(bytes(data))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert path.stat().st_size == st.st_size and path.stat().st_mtime_ns == st.st_mtime_ns


def test_cache_manifest_records_content_hashes_and_redoes_a_changed_file(tiny_cache, monkeypatch, capsys):
    from unlearn_plugins import files, models

    cache, calls = tiny_cache
    folder = models.embedded_model_dir("smollm2-135m", cache=cache)
    manifest = json.loads((folder / models.MANIFEST).read_text())
    assert manifest["format"] == 2
    listed = {p.name for p in folder.iterdir() if p.name != models.MANIFEST}
    assert set(manifest["files"]) == listed
    for name, entry in manifest["files"].items():  # the hash, computed here independently
        content = (folder / name).read_bytes()
        assert entry == {"size": len(content), "sha256": hashlib.sha256(content).hexdigest()}

    # later loads in this process trust an unchanged size and mtime: no file is hashed again
    hashed = []
    real_sha256 = hashlib.sha256
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(hashlib, "sha256", lambda *a: hashed.append(1) or real_sha256(*a))
        assert models.embedded_model_dir("smollm2-135m", cache=cache) == folder
    assert hashed == [] and len(calls) == 1

    # NaN bytes written without a change of size or mtime: the next process's first load (its
    # hash check) finds them and converts again, instead of giving nan probabilities
    _nan_bytes_in_place(folder / "model.safetensors")
    monkeypatch.setattr(files, "_HASHES", {})  # a new process
    capsys.readouterr()
    assert models.embedded_model_dir("smollm2-135m", cache=cache) == folder and len(calls) == 2
    assert (
        "model.safetensors changed content since the conversion; converting smollm2-135m again"
        in capsys.readouterr().err
    )
    assert models._cache_is_valid(folder)
    assert sorted(p.name for p in (cache / "models").iterdir()) == [folder.name]  # no temporary left

    # within a process, a change of mtime is enough to hash again
    path = folder / "model.safetensors"
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF
    path.write_bytes(bytes(data))
    assert models.embedded_model_dir("smollm2-135m", cache=cache) == folder and len(calls) == 3

    # a format-1 manifest (sizes only) is not trusted either
    manifest = json.loads((folder / models.MANIFEST).read_text())
    (folder / models.MANIFEST).write_text(
        json.dumps({"format": 1, "files": {k: v["size"] for k, v in manifest["files"].items()}})
    )
    models.embedded_model_dir("smollm2-135m", cache=cache)
    assert len(calls) == 4


@pytest.fixture(scope="module")
def nan_model_dir(tmp_path_factory):
    """A tiny model folder whose final norm weight is NaN (every output becomes NaN)."""
    from unlearn_plugins.testing import tiny_llama, tiny_tokenizer

    folder = tmp_path_factory.mktemp("nan-model")
    tok = tiny_tokenizer()
    model = tiny_llama(len(tok))
    model.config.eos_token_id = model.config.pad_token_id = tok.eos_token_id
    with torch.no_grad():
        model.model.norm.weight[3] = float("nan")
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


def test_nan_outputs_are_an_error_not_a_probability(nan_model_dir, tofu_dir, tmp_path, capsys):
    args = ["--model", str(nan_model_dir), "--device", "cpu", "--tofu-dir", str(tofu_dir), "--data", DATA]
    assert main(["probs", *args]) == 1
    assert error_line(capsys) == (
        f"error: the output of model {nan_model_dir} is NaN/inf (samples at positions 0, 1, 2, 3, 4, ... of 7): "
        f"its weights are corrupt or diverged, so no probability or score can be computed"
    )
    out = tmp_path / "scores.jsonl"
    assert main(["score", "--scorer", "loss", *args, "--out", str(out)]) == 1
    assert "is NaN/inf (samples at positions 0, 1, 2, 3, 4, ... of 7)" in error_line(capsys)
    assert list(tmp_path.iterdir()) == []  # no scores, no partial file, no lock file


def test_non_finite_scores_are_refused():
    from unlearn_plugins.errors import UnlearnError
    from unlearn_plugins.interfaces import QASample
    from unlearn_plugins.scoring import score_samples

    class Infinite:
        def score(self, samples, *, model, tokenizer):
            return [1.0, float("-inf")]

    samples = [QASample("q0", "a0", 0, "f.json", 1), QASample("q1", "a1", 1, "f.json", 2)]
    with pytest.raises(UnlearnError, match=r"^scorer 'inf' returned -inf for sample 1 \(f.json:2\)$"):
        score_samples(Infinite(), samples, model=None, tokenizer=None, scorer_name="inf")


# ----------------------------------------------------------------------------- corrupt weight files


def _corrupt(path: Path, how: str) -> None:
    data = path.read_bytes()
    if how == "empty":
        path.write_bytes(b"")
    elif how == "truncated":
        path.write_bytes(data[: len(data) // 2])
    elif how == "cut":  # inside the header
        path.write_bytes(data[:100])
    else:  # a garbled header
        path.write_bytes(b"\xff" * 16 + data[16:])


@pytest.mark.parametrize(
    "how,says",
    [
        ("empty", "is empty (0 bytes)"),
        ("truncated", "is truncated ("),
        ("cut", "is truncated (100 bytes, its header alone needs "),
        ("garbled", "is not a readable safetensors file (corrupted header)"),
    ],
)
def test_corrupt_model_weights_are_one_line_errors(how, says, tiny_model_dir, tofu_dir, tmp_path, capsys):
    model = tmp_path / "model"
    shutil.copytree(tiny_model_dir, model)
    _corrupt(model / "model.safetensors", how)
    assert main(["probs", "--model", str(model), "--device", "cpu", "--tofu-dir", str(tofu_dir), "--data", DATA]) == 1
    line = error_line(capsys)
    assert line.startswith(f"error: --model {model}: {model / 'model.safetensors'} {says}"), line
    # the same check before training, which then leaves no trace
    out = tmp_path / "run"
    assert main(tiny_args(model, tofu_dir, out, "--max-steps", "1")) == 1
    assert error_line(capsys).startswith(f"error: --model {model}: {model / 'model.safetensors'} {says}")
    assert not out.exists()


@pytest.fixture(scope="module")
def trained(tiny_model_dir, tofu_dir, tmp_path_factory):
    """A 1-step adapter trained on a copy of the tiny model (base folder, adapter folder)."""
    root = tmp_path_factory.mktemp("trained")
    base = root / "base"
    shutil.copytree(tiny_model_dir, base)
    assert main(tiny_args(base, tofu_dir, root / "adapter", "--max-steps", "1")) == 0
    return base, root / "adapter"


def probs(model, adapter, tofu_dir):
    return main(
        [
            "probs",
            "--model",
            str(model),
            "--adapter",
            str(adapter),
            "--device",
            "cpu",
            "--tofu-dir",
            str(tofu_dir),
            "--data",
            "tofu:forget01[0:2]",
        ]
    )


@pytest.mark.parametrize(
    "damage,says",
    [
        ("no_config", "no adapter_config.json in the folder (not a PEFT adapter)"),
        ("no_weights", "no adapter weights in the folder (adapter_model.safetensors or adapter_model.bin)"),
        ("empty", "adapter_model.safetensors is empty (0 bytes)"),
        ("truncated", "adapter_model.safetensors is truncated ("),
    ],
)
def test_broken_adapter_folders_are_one_line_errors(damage, says, trained, tofu_dir, tmp_path, capsys):
    base, adapter = trained
    broken = tmp_path / "adapter"
    shutil.copytree(adapter, broken)
    if damage == "no_config":
        (broken / "adapter_config.json").unlink()
    elif damage == "no_weights":
        (broken / "adapter_model.safetensors").unlink()
    else:
        _corrupt(broken / "adapter_model.safetensors", damage)
    before = tree(broken)
    assert probs(base, broken, tofu_dir) == 1
    line = error_line(capsys)
    assert line.startswith(f"error: --adapter {broken}: ") and says in line, line
    assert tree(broken) == before


# ----------------------------------------------------------------------------- the adapter's base


def weights_digest(folder: Path) -> str:
    """The fingerprint as the adapter's run.json must record it: SHA-256 over
    '<file name> <sha256 of its content>' lines of the weight files, computed here."""
    digest = hashlib.sha256()
    for path in sorted(folder.glob("model*.safetensors")):
        digest.update(f"{path.name} {hashlib.sha256(path.read_bytes()).hexdigest()}\n".encode())
    return digest.hexdigest()


def test_adapter_on_another_base_with_the_same_shapes_is_refused(trained, tofu_dir, tmp_path, capsys):
    from unlearn_plugins.models import load_model
    from unlearn_plugins.testing import save_tiny_model

    base, adapter = trained
    recorded = json.loads((adapter / "run.json").read_text())["base_model"]
    assert recorded == {"name_or_path": str(base.resolve()), "fingerprint": weights_digest(base)}

    # the same weights elsewhere (a moved or copied base) are the same base
    moved = tmp_path / "moved"
    shutil.copytree(base, moved)
    assert probs(moved, adapter, tofu_dir) == 0
    capsys.readouterr()

    # another model with the same shapes (another seed): refused, naming both
    other = save_tiny_model(tmp_path / "other", seed=1)
    assert probs(other, adapter, tofu_dir) == 1
    assert error_line(capsys) == (
        f"error: --adapter {adapter} was trained on other base weights: its run.json records {base.resolve()} "
        f"(weights {recorded['fingerprint'][:12]}), --model {other} has weights {weights_digest(other)[:12]}; "
        f"pass --allow-other-base to load it anyway"
    )

    # the base folder retrained in place (same name, other weights): refused too
    retrained = tmp_path / "retrained"
    shutil.copytree(base, retrained)
    shutil.copy(other / "model.safetensors", retrained / "model.safetensors")
    copy = tmp_path / "adapter-copy"
    shutil.copytree(adapter, copy)
    run = json.loads((copy / "run.json").read_text())
    run["base_model"]["name_or_path"] = str(retrained)
    (copy / "run.json").write_text(json.dumps(run))
    assert probs(retrained, copy, tofu_dir) == 1
    assert "was trained on other base weights" in error_line(capsys)

    # without run.json (a third-party adapter): adapter_config.json's base_model_name_or_path decides
    (copy / "run.json").unlink()
    config = json.loads((copy / "adapter_config.json").read_text())
    config["base_model_name_or_path"] = str(base.resolve())
    (copy / "adapter_config.json").write_text(json.dumps(config))
    assert probs(other, copy, tofu_dir) == 1
    assert error_line(capsys) == (
        f"error: --adapter {copy} was trained on {base.resolve()}, not on --model {other}; "
        f"pass --allow-other-base to load it anyway"
    )

    # the override, in the library and on the command line
    model, _ = load_model(str(other), device="cpu", adapter=str(adapter), allow_other_base=True)
    assert type(model).__name__.startswith("Peft")
    capsys.readouterr()
    assert (
        main(
            [
                "probs",
                "--model",
                str(other),
                "--adapter",
                str(adapter),
                "--device",
                "cpu",
                "--allow-other-base",
                "--tofu-dir",
                str(tofu_dir),
                "--data",
                "tofu:forget01[0:2]",
            ]
        )
        == 0
    )
    assert "mean answer probability over 2 samples" in capsys.readouterr().out


# ----------------------------------------------------------------------------- locks


PAUSE_SCRIPT = """
import json, sys, time
from pathlib import Path
from transformers import TrainerCallback
from unlearn_plugins.training import UnlearnConfig, run_unlearning

class PauseAt(TrainerCallback):
    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == 3:
            Path(sys.argv[2]).write_text("paused")
            while not Path(sys.argv[3]).exists():
                time.sleep(0.05)

run_unlearning(UnlearnConfig(**json.loads(sys.argv[1])), callbacks=[PauseAt()])
"""


def test_second_run_on_a_locked_out_is_refused_and_the_first_finishes_undisturbed(
    tiny_model_dir, tofu_dir, tmp_path, straight_run, capsys
):
    out = tmp_path / "contested"
    paused, go = tmp_path / "paused", tmp_path / "go"
    config = {"out": str(out), "model": str(tiny_model_dir), "tofu_dir": str(tofu_dir), **RUN_CONFIG}
    first = subprocess.Popen(
        [sys.executable, "-c", PAUSE_SCRIPT, json.dumps(config), str(paused), str(go)],
        env=child_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.time() + 240
        while not paused.exists():
            assert first.poll() is None and time.time() < deadline, first.communicate()[1][-3000:]
            time.sleep(0.1)
        before = tree(out)
        assert "checkpoints/checkpoint-2/optimizer.pt" in before
        expected = (
            f"error: --out {out} is in use by pid {first.pid} (lock file {out / '.unlearn.lock'}); "
            f"wait for it to finish or write elsewhere"
        )
        for extra in (["--overwrite"], [], ["--resume"]):
            assert main(tiny_args(tiny_model_dir, tofu_dir, out, *STEPS, *extra)) == 1
            assert error_line(capsys) == expected
            assert tree(out) == before  # nothing deleted, nothing added
    finally:
        go.write_text("go")
        _, err = first.communicate(timeout=300)
    assert first.returncode == 0, err[-3000:]
    assert_same_adapter(out, straight_run)
    assert json.loads((out / "run.json").read_text())["steps"] == 6
    assert not (out / ".unlearn.lock").exists() and not (out / "checkpoints").exists()


def test_score_eval_and_demo_outputs_are_locked(tiny_model_dir, tofu_dir, tmp_path, capsys):
    from unlearn_plugins.errors import UnlearnError
    from unlearn_plugins.evaluation import lm_eval_runner as runner

    scores = tmp_path / "scores.jsonl"
    scores.write_text("old\n")
    with held("file_lock", scores) as pid:
        assert main(score_args("length", tiny_model_dir, tofu_dir, DATA, scores)) == 1
        assert error_line(capsys) == (
            f"error: --out {scores} is in use by pid {pid} (lock file "
            f"{tmp_path / '.scores.jsonl.lock'}); wait for it to finish or write elsewhere"
        )
    assert scores.read_text() == "old\n"

    report = tmp_path / "report"
    with held("folder_lock", report) as pid:
        demo = ["demo", "--fast", "--model", str(tiny_model_dir), "--data", "generated"]
        assert main([*demo, "--cache-dir", str(tmp_path / "cache"), "--out", str(report)]) == 1
        assert error_line(capsys).startswith(f"error: --out {report} is in use by pid {pid} (lock file")
        evaluation = runner.Evaluation(results={"results": {}}, summary={"tasks": []}, samples={})
        with pytest.raises(UnlearnError, match=f"--out {report} is in use by pid {pid}"):
            runner.write_outputs(report, evaluation)
    assert not report.exists() and not (tmp_path / "cache").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["scores.jsonl"]  # no lock file left either


def test_a_demo_stage_being_built_by_another_process_is_refused(tmp_path):
    import io

    from unlearn_plugins.errors import UnlearnError
    from unlearn_plugins.stages import Stages

    stages = Stages(tmp_path, total=1, stream=io.StringIO())
    folder = stages.folder("bench", "tofu", "abc")
    built = []
    with held("exclusive_lock", tmp_path / f".{folder.name}.lock") as pid:
        with pytest.raises(UnlearnError, match=f"^stage {folder} is in use by pid {pid} "):
            stages.run("benchmark", folder, built.append)
    assert built == [] and list(tmp_path.iterdir()) == []
    stages.run("benchmark", folder, lambda tmp: (tmp / "x").write_text("1"))
    assert sorted(p.name for p in tmp_path.iterdir()) == [folder.name]


# ----------------------------------------------------------------------------- no trace


class RaisingInit:
    def initialize(self, peft_model, *, forget, retain, tokenizer):
        from unlearn_plugins.errors import UnlearnError

        raise UnlearnError("initializer 'broken': cannot initialise")


def test_runs_that_fail_before_training_leave_no_trace(tiny_model_dir, tofu_dir, tmp_path, capsys):
    from unlearn_plugins.errors import UnlearnError
    from unlearn_plugins.training import UnlearnConfig, run_unlearning

    out = tmp_path / "out"
    assert main(tiny_args(tmp_path / "no-model", tofu_dir, out, "--max-steps", "1")) == 1
    assert error_line(capsys) == f"error: --model {tmp_path / 'no-model'}: no such folder"
    assert not out.exists()
    assert main(tiny_args(tiny_model_dir, tofu_dir, out, "--max-steps", "1", "--dtype", "float8")) in (1, 2)
    assert "float8" in capsys.readouterr().err
    assert not out.exists()
    config = UnlearnConfig(
        out=str(out), model=str(tiny_model_dir), tofu_dir=str(tofu_dir), **{**RUN_CONFIG, "max_steps": 1}
    )
    with pytest.raises(UnlearnError, match="initializer 'broken'"):
        run_unlearning(config, initializer=RaisingInit())
    assert not out.exists()

    # the corrected command then runs, without --overwrite or --resume
    assert main(tiny_args(tiny_model_dir, tofu_dir, out, "--max-steps", "1")) == 0
    capsys.readouterr()
    done = tree(out)
    assert "run.json" in done and ".unlearn.lock" not in done

    # --overwrite with a failing set-up keeps the earlier run whole
    assert main(tiny_args(tmp_path / "no-model", tofu_dir, out, "--max-steps", "1", "--overwrite")) == 1
    error_line(capsys)
    with pytest.raises(UnlearnError, match="initializer 'broken'"):
        run_unlearning(UnlearnConfig(**{**config.to_dict(), "overwrite": True}), initializer=RaisingInit())
    assert tree(out) == done


# ----------------------------------------------------------------------------- resumable scoring


def score(tiny_model_dir, tofu_dir, out, *options):
    return main(score_args("loss", tiny_model_dir, tofu_dir, DATA, out, *options))


def test_score_checks_its_output_path_first(tiny_model_dir, tofu_dir, tmp_path, capsys, monkeypatch):
    from unlearn_plugins import models

    loads = []
    monkeypatch.setattr(models, "from_pretrained", lambda *a, **k: loads.append(1))
    folder = tmp_path / "folder"
    folder.mkdir()
    assert score(tiny_model_dir, tofu_dir, folder) == 1
    assert error_line(capsys) == f"error: --out {folder} is a folder; give a file name, e.g. {folder / 'scores.jsonl'}"
    (tmp_path / "file").write_text("x")
    assert score(tiny_model_dir, tofu_dir, tmp_path / "file" / "s.jsonl") == 1
    assert (
        error_line(capsys)
        == f"error: --out {tmp_path / 'file' / 's.jsonl'}: {tmp_path / 'file'} is a file, not a folder"
    )
    assert loads == [] and sorted(p.name for p in tmp_path.iterdir()) == ["file", "folder"]


class Interrupt:
    """LossScorer.score that raises ``exc`` on call number ``at`` (counting every call)."""

    def __init__(self, monkeypatch, at=None, exc=KeyboardInterrupt):
        from unlearn_plugins.scorers.baselines import LossScorer

        real = vars(LossScorer)["score"]
        self.real, self.calls, self.at, self.exc = getattr(real, "real", real), [], at, exc
        monkeypatch.setattr(LossScorer, "score", self)

    def __get__(self, scorer, owner):
        def score(samples, *, model, tokenizer):
            self.calls.append([s.index for s in samples])
            if len(self.calls) == self.at:
                raise self.exc("stopped")
            return self.real(scorer, samples, model=model, tokenizer=tokenizer)

        return score


def test_interrupted_scoring_resumes_from_the_partial_file(tiny_model_dir, tofu_dir, tmp_path, capsys, monkeypatch):
    from unlearn_plugins import scoring

    monkeypatch.setattr(scoring, "CHUNK_SIZE", 2)  # 7 samples: chunks [0,1] [2,3] [4,5] [6]
    straight = tmp_path / "straight.jsonl"
    assert score(tiny_model_dir, tofu_dir, straight) == 0
    expected = straight.read_text()

    out = tmp_path / "scores.jsonl"
    partial = tmp_path / "scores.jsonl.partial.jsonl"
    stop = Interrupt(monkeypatch, at=3)  # Ctrl-C in the third chunk
    assert score(tiny_model_dir, tofu_dir, out) == 130
    assert not out.exists()
    lines = [json.loads(line) for line in partial.read_text().splitlines()]
    assert list(lines[0]) == ["partial"] and [e["pos"] for e in lines[1:]] == [0, 1, 2, 3]
    assert [e["row"] for e in lines[1:]] == [json.loads(line) for line in expected.splitlines()[:4]]

    # a kill while appending leaves a cut line: it is dropped, the rows before it are kept
    with partial.open("a") as handle:
        handle.write('{"pos": 4, "row": {"ind')
    stop = Interrupt(monkeypatch)
    capsys.readouterr()
    assert score(tiny_model_dir, tofu_dir, out) == 0
    assert "notice: resuming an interrupted scoring: 4 of 7 samples already scored" in capsys.readouterr().err
    assert stop.calls == [[4, 5], [6]]  # only the chunks not finished before
    assert out.read_text() == expected
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "scores.jsonl",
        "scores.jsonl.meta.json",
        "straight.jsonl",
        "straight.jsonl.meta.json",
    ]

    # a failure (not only Ctrl-C) keeps the finished chunks too; other settings start afresh
    out.unlink()
    stop = Interrupt(monkeypatch, at=2, exc=RuntimeError)
    capsys.readouterr()
    assert score(tiny_model_dir, tofu_dir, out) == 1  # one error line naming the scorer and its plugin
    assert "error: scorer 'loss' (plugin 'builtin-scorers') raised RuntimeError: stopped" in capsys.readouterr().err
    assert len(partial.read_text().splitlines()) == 1 + 2
    stop = Interrupt(monkeypatch)
    assert score(tiny_model_dir, tofu_dir, out, "max_length=48") == 0
    assert "left by a scoring with other settings" in capsys.readouterr().err
    assert len(stop.calls) == 4 and not partial.exists()


def test_a_failed_final_write_keeps_the_scores_for_the_next_run(
    tiny_model_dir, tofu_dir, tmp_path, capsys, monkeypatch
):
    import errno

    from unlearn_plugins import files

    out = tmp_path / "scores.jsonl"
    real = files.write_jsonl

    def disk_full(path, rows):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(files, "write_jsonl", disk_full)
    assert score(tiny_model_dir, tofu_dir, out) == 1
    assert error_line(capsys) == (
        f"error: --out {out}: cannot write (No space left on device); the 7 scores are kept in "
        f"{tmp_path / 'scores.jsonl.partial.jsonl'} and the same command writes them without scoring again"
    )
    monkeypatch.setattr(files, "write_jsonl", real)
    stop = Interrupt(monkeypatch)
    assert score(tiny_model_dir, tofu_dir, out) == 0
    assert stop.calls == [] and len(out.read_text().splitlines()) == 7
    assert sorted(p.name for p in tmp_path.iterdir()) == ["scores.jsonl", "scores.jsonl.meta.json"]


# ----------------------------------------------------------------------------- broken checkpoints on --resume


class StopAt:
    """Ctrl-C after optimizer step 5 (checkpoints 2 and 4 are on disk)."""

    def __new__(cls):
        from transformers import TrainerCallback

        class _Stop(TrainerCallback):
            def on_step_end(self, args, state, control, **kwargs):
                if state.global_step == 5:
                    raise KeyboardInterrupt

        return _Stop()


@pytest.mark.parametrize("broken", ["optimizer.pt", "adapter_model.safetensors"])
def test_resume_skips_a_truncated_file_in_the_latest_checkpoint(
    broken, tiny_model_dir, tofu_dir, tmp_path, straight_run, capsys
):
    from unlearn_plugins.training import UnlearnConfig, run_unlearning

    out = tmp_path / "run"
    config = UnlearnConfig(out=str(out), model=str(tiny_model_dir), tofu_dir=str(tofu_dir), **RUN_CONFIG)
    with pytest.raises(KeyboardInterrupt):
        run_unlearning(config, callbacks=[StopAt()])
    latest = out / "checkpoints" / "checkpoint-4" / broken
    latest.write_bytes(latest.read_bytes()[:100])
    capsys.readouterr()
    assert main(tiny_args(tiny_model_dir, tofu_dir, out, *STEPS, "--resume")) == 0
    err = capsys.readouterr().err
    assert f"notice: skipping {out / 'checkpoints' / 'checkpoint-4'}: {broken} is truncated or corrupted" in err
    assert "Traceback" not in err
    record = json.loads((out / "run.json").read_text())
    assert record["resumed_from"].endswith("checkpoint-2") and record["steps"] == 6
    assert_same_adapter(out, straight_run)
    assert not (out / "checkpoints").exists() and not (out / ".unlearn.lock").exists()
