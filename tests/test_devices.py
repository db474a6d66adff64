"""Devices on a CPU machine, with fake GPUs: which GPU a study's workers and the CUD scorer's
anchor runs get under an inherited CUDA_VISIBLE_DEVICES, more workers than GPUs refused unless
the study shares them, the GPU a stage ran on recorded, bf16 only where native, and stage keys
and records that name the device type and precision."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest

from unlearn_plugins.errors import UnlearnError
from unlearn_plugins.process import check_gpu_share, gpu_for, visible_gpus

ROOT = Path(__file__).resolve().parents[1]


def fake_gpus(monkeypatch, count: int, mask: str | None) -> None:
    """torch sees ``count`` CUDA devices (the mask's, when one is set)."""
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: count > 0)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: count)
    if mask is None:
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    else:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", mask)


# ----------------------------------------------------------------------------- one rule


@pytest.mark.parametrize(
    "mask, count, expected",
    [
        (None, 4, ["0", "1", "2", "3", "0"]),  # no mask: every GPU
        ("2,3", 2, ["2", "3", "2", "3", "2"]),  # the mask's GPUs, not physical 0 and 1
        ("3,1", 2, ["3", "1", "3", "1", "3"]),  # in the mask's order
        ("GPU-aaa,GPU-bbb", 2, ["GPU-aaa", "GPU-bbb", "GPU-aaa", "GPU-bbb", "GPU-aaa"]),
    ],
)
def test_a_slot_maps_through_the_inherited_mask(mask, count, expected):
    env = {} if mask is None else {"CUDA_VISIBLE_DEVICES": mask}
    assert [gpu_for(slot, count, env) for slot in range(5)] == expected
    assert visible_gpus(count, env) == expected[:count]


def test_a_mask_that_hides_every_gpu_leaves_none_to_hand_out():
    assert visible_gpus(0, {"CUDA_VISIBLE_DEVICES": ""}) == []
    with pytest.raises(ValueError):
        gpu_for(0, 0, {"CUDA_VISIBLE_DEVICES": ""})


def test_local_workers_get_the_masks_gpus(monkeypatch):
    from unlearn_plugins.study import executors

    fake_gpus(monkeypatch, 2, "2,3")
    started = []

    class FakeProcess:
        def __init__(self, target, args, name, daemon):
            started.append(args[4])  # the gpu handed to _local_worker

        def start(self):
            pass

    executor = executors.LocalExecutor(workers=4, threads=1, per_gpu=2)
    monkeypatch.setattr(executor.ctx, "Process", FakeProcess)
    for slot in range(4):
        executor._spawn(slot)
    assert started == ["2", "3", "2", "3"]  # not "0", "1": the physical GPUs 0 and 1 of the old rule
    assert "GPU 2,3[k mod 2]" in executor.describe()

    # and the worker sees exactly that one
    import os

    monkeypatch.setattr("torch.set_num_threads", lambda n: None)
    for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "TOKENIZERS_PARALLELISM"):
        monkeypatch.setenv(name, os.environ.get(name, "1"))  # _pin sets them: put back after the test
    executors._pin(1, "3")
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "3"


def test_cpu_cells_hand_out_no_gpu(monkeypatch):
    from unlearn_plugins.study import executors

    fake_gpus(monkeypatch, 2, None)
    executor = executors.LocalExecutor(workers=5, threads=1, use_gpus=False)  # --device cpu: no refusal
    assert executor.gpus == 0 and "GPU" not in executor.describe()


def test_dask_workers_get_the_masks_gpus(monkeypatch):
    import distributed

    from unlearn_plugins.study import executors

    pinned = []
    monkeypatch.setattr(executors, "_pin", lambda threads, gpu: pinned.append(gpu))
    monkeypatch.setattr(executors, "execute_cell", lambda task, emit: {"status": "done"})
    monkeypatch.setattr(distributed, "Queue", lambda name: SimpleNamespace(put=lambda event: None))
    task = SimpleNamespace(plan=SimpleNamespace(cell=SimpleNamespace(id="c")))
    for index in range(3):
        monkeypatch.setattr(distributed, "get_worker", lambda index=index: SimpleNamespace(name=index, address="w"))
        executors._dask_cell(task, "events", 1, ["2", "3"])
    assert pinned == ["2", "3", "2"]


def test_more_workers_than_gpus_is_refused_unless_the_study_shares_them(monkeypatch):
    from unlearn_plugins.study import executors

    fake_gpus(monkeypatch, 2, "2,3")
    with pytest.raises(UnlearnError, match=r"--workers 3: .* 2 GPU\(s\) .* workers_per_gpu = 2"):
        executors.LocalExecutor(workers=3, threads=1)
    executors.LocalExecutor(workers=4, threads=1, per_gpu=2)  # shared on purpose
    check_gpu_share(9, 0, 1)  # no GPU: CPU workers, any number


def test_workers_per_gpu_is_a_checked_study_option(tmp_path, capsys, monkeypatch):
    from unlearn_plugins.cli import main
    from unlearn_plugins.study import builtin_studies, load_study

    text = builtin_studies()["tiny"].read_text()
    shared = tmp_path / "shared.toml"
    shared.write_text(text.replace("[study]\n", "[study]\nworkers_per_gpu = 2\n", 1))
    assert load_study(str(shared)).workers_per_gpu == 2
    assert load_study(str(shared)).digest() == load_study(str(builtin_studies()["tiny"])).digest()
    bad = tmp_path / "bad.toml"
    bad.write_text(text.replace("[study]\n", "[study]\nworkers_per_gpu = 0\n", 1))
    assert main(["study", str(bad), "--dry-run"]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("error:") and "workers_per_gpu" in err and len(err.splitlines()) == 1

    # three workers on two (fake) GPUs: refused before any work, in one line
    fake_gpus(monkeypatch, 2, "2,3")
    out = tmp_path / "out"
    assert main(["study", str(builtin_studies()["tiny"]), "--workers", "3", "--out", str(out)]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: --workers 3") and len(err.splitlines()) == 1 and not out.exists()


def test_anchor_run_children_get_the_processs_gpu_through_the_mask(monkeypatch):
    import subprocess

    from unlearn_plugins.interfaces import QASample
    from unlearn_plugins.scorers.cud.anchor_runs import TrainerAnchorRunner

    fake_gpus(monkeypatch, 2, "5,7")
    seen = {}

    def fake_run(cmd, env, check):
        seen.update(env)
        return SimpleNamespace(returncode=1)

    monkeypatch.setattr(subprocess, "run", fake_run)
    with pytest.raises(UnlearnError):
        TrainerAnchorRunner().losses_in_child(
            [QASample(0, "q?", "a.")], spec="m", gpu=1, objective="grad_ascent", seed=0
        )
    assert seen["CUDA_VISIBLE_DEVICES"] == "7"


# ----------------------------------------------------------------------------- the GPU a stage ran on


def test_a_stage_records_the_physical_gpu_it_ran_on(tmp_path, monkeypatch):
    import torch

    from unlearn_plugins.study.cells import measured

    build = measured(lambda tmp: None, {"cell": "c", "device_type": "cpu", "dtype": "float32"})
    (tmp_path / "cpu").mkdir()
    build(tmp_path / "cpu")
    record = json.loads((tmp_path / "cpu" / "resources.json").read_text())
    assert record["gpu"] is None and record["device_type"] == "cpu" and record["dtype"] == "float32"

    fake_gpus(monkeypatch, 1, "3")
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda: None)
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda: 0)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    uuid = "8f2c1a9e-0000-4000-8000-000000000003"
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: SimpleNamespace(uuid=uuid))
    (tmp_path / "gpu").mkdir()
    measured(lambda tmp: None, {"cell": "c", "device_type": "cuda", "dtype": "bfloat16"})(tmp_path / "gpu")
    assert json.loads((tmp_path / "gpu" / "resources.json").read_text())["gpu"] == f"GPU-{uuid}"
    (tmp_path / "cpu-on-a-gpu-machine").mkdir()  # --device cpu: no GPU named
    build(tmp_path / "cpu-on-a-gpu-machine")
    assert json.loads((tmp_path / "cpu-on-a-gpu-machine" / "resources.json").read_text())["gpu"] is None


# ----------------------------------------------------------------------------- bf16 only where native


@pytest.mark.parametrize("native, capability, expected", [(True, 8, "bfloat16"), (False, 7, "float32")])
def test_bf16_is_the_cuda_default_only_where_the_gpu_computes_it(monkeypatch, native, capability, expected):
    import torch

    from unlearn_plugins.models import pick_dtype

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    # emulated bf16 (V100, T4): torch's plain is_bf16_supported() says True
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True: including_emulation or native)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (capability, 0))
    assert str(pick_dtype("cuda")) == f"torch.{expected}"
    assert str(pick_dtype("cpu")) == "torch.float32"


# ----------------------------------------------------------------------------- keys and records


def tiny_study(tmp_path):
    from unlearn_plugins.study import builtin_studies, load_study

    return load_study(str(builtin_studies()["tiny"]))


def stage_folders(plan) -> dict[str, list[str]]:
    return {cid: [Path(s.folder).name for s in cp.stages] for cid, cp in plan.cells.items()}


def test_stage_keys_name_the_device_type_and_precision(tmp_path):
    from unlearn_plugins.study.cells import planned_as
    from unlearn_plugins.study.runner import plan_cells

    study = tiny_study(tmp_path)
    cpu = plan_cells(study, cache=tmp_path, device="cpu", dry_run=True)
    assert cpu.identity == ("cpu", "float32")
    with planned_as(("cuda", "bfloat16")):
        bf16 = plan_cells(study, cache=tmp_path, device="cuda", dry_run=True)
    with planned_as(("cuda", "float32")):
        fp32 = plan_cells(study, cache=tmp_path, device="cuda", dry_run=True)
    keys = [stage_folders(p) for p in (cpu, bf16, fp32)]
    assert keys[0].keys() == keys[1].keys() == keys[2].keys()
    for cell in keys[0]:  # every stage of every cell: three devices/precisions, three keys
        for a, b, c in zip(keys[0][cell], keys[1][cell], keys[2][cell]):
            assert len({a, b, c}) == 3, cell
    # the benchmark does not depend on the device: one key
    assert cpu.benches[study.forget_sizes[0]]["key"] == bf16.benches[study.forget_sizes[0]]["key"]


def test_records_from_another_device_are_refused_unless_asked_for(tmp_path, capsys):
    """A CPU record (written before records named their device: no device_type) on a CUDA
    bf16 run is refused with one line; --records-any-device restores it."""
    from unlearn_plugins.cli import main
    from unlearn_plugins.stages import DONE
    from unlearn_plugins.study import builtin_studies
    from unlearn_plugins.study.cells import planned_as
    from unlearn_plugins.study.records import unpacked
    from unlearn_plugins.study.runner import plan_cells, plan_restored

    study = tiny_study(tmp_path)
    cache, records = tmp_path / "cache", tmp_path / "records"
    cpu = plan_cells(study, cache=cache, device="cpu")
    cell = next(cp for cp in cpu.cells.values() if cp.cell.kind == "eval_retain")
    name = Path(cell.stages[-1].folder).name
    # a committed CPU evaluation record (its resources.json says no device: made before they did)
    committed = next(unpacked(ROOT / "bench" / "results" / "reglu_tofu").glob("eval-retain-*"))
    shutil.copytree(committed, records / name)
    assert (records / name / DONE).is_file() and "device_type" not in (records / name / "resources.json").read_text()

    with planned_as(("cuda", "bfloat16")):
        with pytest.raises(UnlearnError, match=r"made on cpu in float32, this run is on cuda in bfloat16"):
            plan_restored(study, cache=cache, device="cuda", stream=None, records=records)
        code = main(
            ["study", str(builtin_studies()["tiny"]), "--report-only", "--records", str(records)]
            + ["--out", str(tmp_path / "out"), "--cache-dir", str(cache)]
        )
        err = capsys.readouterr().err
        errors = [line for line in err.splitlines() if line.startswith("error:")]
        assert code == 1 and len(errors) == 1 and "--records-any-device" in errors[0], err
        assert "Traceback" not in err
        plan = plan_restored(study, cache=cache, device="cuda", stream=None, records=records, records_any_device=True)
    gpu_cell = plan.cells[cell.cell.id]
    assert Path(gpu_cell.stages[-1].folder).name != name  # its own key ...
    assert gpu_cell.stages[-1].done  # ... holding the CPU record, as asked

    # on the CPU the same record is this run's own: restored, nothing refused
    plain = plan_restored(study, cache=tmp_path / "cache2", device="cpu", stream=None, records=records)
    assert plain.cells[cell.cell.id].stages[-1].done


def test_without_torchs_uuid_the_gpu_is_named_through_the_mask(monkeypatch):
    import torch

    from unlearn_plugins.process import gpu_identity

    fake_gpus(monkeypatch, 2, "GPU-aaa,GPU-bbb")
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 1)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: object())  # an older torch: no uuid
    assert gpu_identity() == "GPU-bbb" and gpu_identity(0) == "GPU-aaa" and gpu_identity("cpu") is None


def test_the_demo_puts_one_worker_on_each_gpu_by_default(monkeypatch):
    from unlearn_plugins.commands.demo import default_workers

    monkeypatch.setattr("os.sched_getaffinity", lambda pid: {0, 1, 2, 3})
    fake_gpus(monkeypatch, 1, None)
    assert default_workers() == 1 and default_workers("cpu") == 2  # one GPU: one worker on it
    fake_gpus(monkeypatch, 0, None)
    assert default_workers() == 2
