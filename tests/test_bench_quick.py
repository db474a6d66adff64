"""Every bench under bench/ runs (``--quick``: the tiny model, seconds to minutes) and prints one
JSON line with its figures finite and positive and the spread of its rounds; the memory bench
reads the demo's peak from `/usr/bin/time -v` output. Bench figures themselves are for an
idle machine (each file's docstring says how to run it in full)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.slow


def run_bench(name: str, *args: str, timeout: int = 900) -> dict:
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    env["CUDA_VISIBLE_DEVICES"] = ""  # the child runs on the CPU, as the test does
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench" / f"{name}.py"), "--quick", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = json.loads(proc.stdout.strip().splitlines()[-1])
    assert line["bench"] == name
    return line


def positive(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value > 0


def check_spread(spread: dict, rounds: int | None = None) -> None:
    assert spread["min"] <= spread["median"] <= spread["max"], spread
    if rounds is not None:
        assert spread["n"] == rounds


def test_memory_bench(tofu_dir, tmp_path):
    time_v = tmp_path / "time-v.txt"
    time_v.write_text('\tCommand being timed: "unlearn demo"\n\tMaximum resident set size (kbytes): 3145728\n')
    line = run_bench("memory", "--tofu-dir", str(tofu_dir), "--demo-rss-from", str(time_v))
    assert positive(line["npo_over_grad_ascent_rss"]) and positive(line["eap_ig_over_fwd_bwd_rss"])
    assert line["demo_peak_rss_gb"] == 3.0  # 3145728 kB
    for kind in ("baseline", "npo", "grad_ascent", "eap_ig", "fwd_bwd"):
        assert positive(line["peak_rss_mb"][kind]["median"])
        # every child loads the model: none is below the floor of importing and loading
        assert line["peak_rss_mb"][kind]["median"] >= line["peak_rss_mb"]["baseline"]["min"] * 0.9
    for name in ("npo_over_grad_ascent_rss", "eap_ig_over_fwd_bwd_rss"):
        check_spread(line["spread"][name], rounds=1)
    assert line["npo_reference_model"] == "adapter_disabled"  # NPO's reference: no copy of the model


def test_memory_bench_rejects_a_file_without_the_peak(tmp_path):
    bad = tmp_path / "not-time-v.txt"
    bad.write_text("real 1m2s\n")
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "memory.py"), "--demo-rss-from", str(bad)],
        capture_output=True,
        text=True,
        env=dict(os.environ, PYTHONPATH=str(ROOT)),
        timeout=300,
    )
    assert proc.returncode != 0
    assert proc.stderr.strip().splitlines()[-1].startswith(f"error: --demo-rss-from {bad}: no 'Maximum resident")


def test_scaling_bench(tofu_dir):
    line = run_bench("scaling", "--tofu-dir", str(tofu_dir))
    assert line["layers"] == [2, 4]
    for name in ("eap_ig_over_fwd_bwd", "trainer_over_bare_loop", "rila_over_forward"):
        assert set(line[name]) == {"2", "4"} and all(positive(v) for v in line[name].values())
        assert isinstance(line["within_bounds"][name], bool)
        for spread in line["spread"][name].values():
            check_spread(spread, rounds=1)
    sides = {"eap_ig", "fwd_bwd", "trainer_step", "bare_step", "rila", "forward"}
    assert set(line["exponent"]) == sides and all(math.isfinite(v) for v in line["exponent"].values())
    assert all(positive(s) for side in sides for s in line["seconds"][side].values())
    # where EAP-IG's time went at each depth: its parts add up to about its measured time
    for depth, parts in line["eap_ig_breakdown_s"].items():
        total = parts["sources"] + parts["forward"] + parts["backward"]
        assert 0 < parts["hooks"] < parts["backward"] and 0 < parts["hooks_share"] < 1, depth
        assert total <= line["seconds"]["eap_ig"][depth] * 1.5, depth


@pytest.mark.parametrize(
    "name, figures",
    [
        ("init_cost", ["rila_over_forward", "fila_over_rila"]),
        ("trainer_overhead", ["trainer_over_bare_loop"]),
        ("eap_ig", ["over_fwd_bwd"]),
        ("eval_speed", ["eval_over_forward"]),
    ],
)
def test_timing_benches_report_medians_with_their_spread(name, figures, tofu_dir):
    line = run_bench(name, "--tofu-dir", str(tofu_dir))
    for figure in figures:
        assert positive(line[figure])
        check_spread(line["spread"][figure])
        assert line["spread"][figure]["median"] == pytest.approx(line[figure], abs=1e-3)
    if name == "trainer_overhead":  # the bare loop replays the Trainer's batches: the same losses
        assert line["max_relative_loss_gap"] <= 1e-4


def test_eap_ig_patching_bench_reports_the_spread_over_seeds():
    line = run_bench("eap_ig_patching")
    assert line["seeds"] == 2 and len(line["per_seed"]) == 2
    for key in ("pearson", "spearman_abs", "top10pct_overlap"):
        assert math.isfinite(line[key])
        check_spread(line["spread"][key], rounds=2)
