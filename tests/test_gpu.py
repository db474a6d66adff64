"""What only a CUDA machine can check (``pytest -m gpu``; skipped, with the reason, elsewhere):
workers on the GPUs the mask names, bf16 autocast training, two processes over NCCL, and the
prompt-shared evaluation equal to HFLM in fp32 on CUDA. bench/gpu_check.sh runs them."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.gpu


def cuda_env(**extra) -> dict:
    return dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT), **extra)


def test_a_child_given_a_slots_gpu_runs_on_that_physical_gpu():
    """gpu_for's mask entry, handed to a child, is the GPU the parent sees at that index: the
    same UUID, for every slot (one more slot than GPUs: it wraps round)."""
    import torch

    from unlearn_plugins.process import gpu_for, gpu_identity

    n = torch.cuda.device_count()
    probe = "from unlearn_plugins.process import gpu_identity; print(gpu_identity(0))"
    for slot in range(n + 1):
        env = cuda_env(CUDA_VISIBLE_DEVICES=gpu_for(slot, n))
        done = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, check=True)
        assert done.stdout.strip() == gpu_identity(slot % n)
        assert done.stdout.strip().startswith("GPU-")


def test_a_stage_on_the_gpu_records_its_uuid(tmp_path):
    import torch

    from unlearn_plugins.process import gpu_identity
    from unlearn_plugins.study.cells import measured

    def build(tmp):
        torch.ones(1024, 1024, device="cuda").sum().item()

    measured(build, {"cell": "c", "device_type": "cuda", "dtype": "bfloat16"})(tmp_path)
    record = json.loads((tmp_path / "resources.json").read_text())
    assert record["gpu"] == gpu_identity() and record["peak_cuda_mb"] >= 4.0


def run_args(model_dir, tofu_dir, out, *extra) -> list[str]:
    args = ["run", "--model", str(model_dir), "--tofu-dir", str(tofu_dir), "--forget", "tofu:forget01[0:8]"]
    args += ["--retain", "tofu:retain99[0:16]", "--max-length", "64", "--lora-r", "4", "--batch-size", "2"]
    return [*args, "--grad-accum", "2", "--save-steps", "0", "--device", "cuda", "--out", str(out), *extra]


#: a short fp32 run: two processes and one give the same numbers
FP32 = ["--max-steps", "4", "--mixed-precision", "no", "--dtype", "float32"]


def two_gpu_args(model_dir, tofu_dir, out, what: str) -> list[str]:
    """The fp32 run's arguments for each of two processes, one GPU each (the launcher's: no
    --device), with the global batch of one process; skipped on fewer than 2 GPUs."""
    import torch

    if torch.cuda.device_count() < 2:
        pytest.skip(f"needs 2 GPUs for {what}; this machine has {torch.cuda.device_count()}")
    args = run_args(model_dir, tofu_dir, out, *FP32)
    args[args.index("--grad-accum") + 1] = "1"
    args.remove("--device")
    args.remove("cuda")
    return args


def assert_one_process_matches(model_dir, tofu_dir, one, two, record: dict) -> None:
    """One process of the same run in ``one``: the two-process run's loss and adapter (1e-4)."""
    from test_trainer import adapter_weights, max_diff

    from unlearn_plugins.cli import main

    assert main(run_args(model_dir, tofu_dir, one, *FP32)) == 0
    single = json.loads((one / "run.json").read_text())
    assert record["final_loss"] == pytest.approx(single["final_loss"], rel=1e-4)
    assert max_diff(adapter_weights(two), adapter_weights(one)) <= 1e-4


def test_bf16_autocast_training_on_cuda(tiny_model_dir, tofu_dir, tmp_path):
    """The default on CUDA: bf16 autocast where the GPU computes bf16 natively, fp32 elsewhere."""
    from unlearn_plugins.cli import main
    from unlearn_plugins.models import cuda_bf16_native

    assert main(run_args(tiny_model_dir, tofu_dir, tmp_path / "run", "--max-steps", "4")) == 0
    record = json.loads((tmp_path / "run" / "run.json").read_text())
    assert record["device"].startswith("cuda")
    assert record["mixed_precision"] == ("bf16" if cuda_bf16_native() else "no")
    assert math.isfinite(record["final_loss"])


def test_two_processes_over_nccl_match_one_process(tiny_model_dir, tofu_dir, tmp_path):
    """test_trainer's two-process check (there on CPU, gloo) on two GPUs: NCCL all-reduce, fp32."""
    two = tmp_path / "two"
    args = two_gpu_args(tiny_model_dir, tofu_dir, two, "NCCL")
    from test_trainer import launch_two

    proc = launch_two(["-m", "unlearn_plugins.cli"], args, cuda_env(CUDA_VISIBLE_DEVICES="0,1"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    record = json.loads((two / "run.json").read_text())
    assert record["num_processes"] == 2 and record["device"].startswith("cuda")
    assert_one_process_matches(tiny_model_dir, tofu_dir, tmp_path / "one", two, record)


def test_prefix_shared_evaluation_equals_hflm_in_fp32_on_cuda(tiny_model_dir, tofu_dir):
    from test_prefix_lm import _assert_same, _evaluate

    old = _evaluate(tiny_model_dir, tofu_dir, "hf", device="cuda", dtype="float32")
    new = _evaluate(tiny_model_dir, tofu_dir, "prefix", device="cuda", dtype="float32")
    _assert_same(old, new)


def test_fsdp_on_two_gpus_matches_one_process(tiny_model_dir, tofu_dir, tmp_path):
    """The shipped FSDP configuration (examples/accelerate/fsdp.yaml), fp32, on two GPUs: the run
    says it was sharded, and its loss and adapter are one process's with the same global batch.
    (On CPU processes accelerate does not shard: it runs DDP, MULTI_CPU, whatever the file says.)"""
    two = tmp_path / "two"
    args = two_gpu_args(tiny_model_dir, tofu_dir, two, "FSDP")
    from test_trainer import free_port

    launch = [sys.executable, "-m", "accelerate.commands.launch", "--config_file"]
    launch += [str(ROOT / "examples" / "accelerate" / "fsdp.yaml"), "--num_processes", "2", "--mixed_precision", "no"]
    launch += ["--main_process_port", str(free_port()), "-m", "unlearn_plugins.cli", *args]
    proc = subprocess.run(launch, env=cuda_env(CUDA_VISIBLE_DEVICES="0,1"), capture_output=True, text=True, timeout=400)
    assert proc.returncode == 0, proc.stderr[-3000:]
    record = json.loads((two / "run.json").read_text())
    assert record["num_processes"] == 2 and record["distributed"] == "FSDP"
    assert_one_process_matches(tiny_model_dir, tofu_dir, tmp_path / "one", two, record)
