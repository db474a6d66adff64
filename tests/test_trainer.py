"""The trainer, `unlearn run` and `unlearn finetune`: outputs, config precedence, bad input,
resume after SIGKILL, stop on NaN, two processes, residual initializers with ROL."""

from __future__ import annotations

import json
import math
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from support_training import launch_command, small_config, small_run, tiny_args

from unlearn_plugins.cli import main

ROOT = Path(__file__).resolve().parents[1]


pytestmark = pytest.mark.usefixtures("single_thread")


def assert_adapter_reproduces_merged(model_dir, out):
    """The saved adapter on the ORIGINAL base model equals the saved merged model."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(str(model_dir))
    peft_model = PeftModel.from_pretrained(base, str(out)).eval()
    merged = AutoModelForCausalLM.from_pretrained(str(out / "merged")).eval()
    ids = torch.tensor([[5, 17, 42, 99, 7, 3]])
    with torch.no_grad():
        assert torch.allclose(peft_model(input_ids=ids).logits, merged(input_ids=ids).logits, atol=1e-4)


def adapter_weights(folder):
    from safetensors.torch import load_file

    return load_file(str(Path(folder) / "adapter_model.safetensors"))


def max_diff(a, b):
    assert a.keys() == b.keys()
    return max((a[k] - b[k]).abs().max().item() for k in a)


def child_env():
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    env["CUDA_VISIBLE_DEVICES"] = ""  # the child runs on the CPU, as the test does
    return env


# ----------------------------------------------------------------------------- outputs and config


def test_run_writes_adapter_merged_model_and_run_json(tiny_model_dir, tofu_dir, tmp_path, capsys):
    config = tmp_path / "run.toml"
    config.write_text('objective = "npo"\nlr = 5e-4\nmax_steps = 3\n[objective_options]\nbeta = 0.2\nalpha = 0.5\n')
    out = tmp_path / "out"
    rc = main(
        tiny_args(
            tiny_model_dir,
            tofu_dir,
            out,
            "--config",
            str(config),
            "--objective-option",
            "beta=0.3",
            "--max-steps",
            "2",
            "--merge",
        )
    )
    assert rc == 0
    assert "unlearned 8 forget samples with npo: 2 steps" in capsys.readouterr().out
    record = json.loads((out / "run.json").read_text())
    cfg = record["config"]
    # precedence: defaults < TOML < flags; option tables merge key by key
    assert (cfg["objective"], cfg["lr"], cfg["max_steps"]) == ("npo", 1e-3, 2)
    assert cfg["objective_options"] == {"beta": 0.3, "alpha": 0.5}
    assert record["status"] == "completed" and record["steps"] == 2 and record["seed"] == 0
    assert [e["step"] for e in record["losses"]] == [1, 2]
    assert all(math.isfinite(e["loss"]) and "loss_forget" in e for e in record["losses"])
    assert record["objective"].startswith("npo(") and "beta=0.3" in record["objective"]
    assert {"torch", "transformers", "peft", "python"} <= set(record["versions"])
    assert record["wall_time_s"] > 0 and record["samples"] == {"forget": 8, "retain": 16}
    assert not (out / "checkpoints").exists()  # removed after success

    # a standard PEFT adapter: loads on the base model and equals the merged model
    weights = adapter_weights(out)
    assert any(k.endswith("lora_B.weight") and v.abs().max() > 0 for k, v in weights.items())
    assert_adapter_reproduces_merged(tiny_model_dir, out)


def test_default_lora_targets_every_decoder_linear(tiny_model):
    from unlearn_plugins.training.lora import build_lora_model, default_target_modules

    targets = default_target_modules(tiny_model)
    assert targets == ["down_proj", "gate_proj", "k_proj", "o_proj", "q_proj", "up_proj", "v_proj"]
    peft_model = build_lora_model(tiny_model, r=2, alpha=4, dropout=0.0, target_modules=None)
    wrapped = [n for n, m in peft_model.named_modules() if hasattr(m, "lora_A") and "default" in m.lora_A]
    assert len(wrapped) == 2 * 7 and not any("lm_head" in n or "embed" in n for n in wrapped)


@pytest.mark.parametrize(
    "extra,message",
    [
        (["--objective", "grad_difff"], "unknown unlearning objective 'grad_difff'; available: .*grad_diff.*npo"),
        (["--initializer", "nope"], "unknown adapter initializer 'nope'; available: .*gaussian"),
        (["--objective", "rol"], "is a regulariser"),
        (["--regularizer", "npo"], "not a regulariser"),
        (["--objective", "npo", "--objective-option", "beta=-1"], "beta"),
        (["--forget", "tofu:forget01[3:3]"], "selects no samples"),
        (["--objective", "grad_diff", "--no-retain"], "has a retain term"),
        (["--lora-r", "0"], "lora_r"),
    ],
)
def test_bad_input_is_rejected_before_training(extra, message, tiny_model_dir, tofu_dir, tmp_path, capsys):
    args = tiny_args(tiny_model_dir, tofu_dir, tmp_path / "out") + extra
    assert main(args) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: ") and __import__("re").search(message, err), err
    assert not (tmp_path / "out" / "run.json").exists()


def test_empty_forget_file_and_bad_config_file(tiny_model_dir, tofu_dir, tmp_path, capsys):
    empty = tmp_path / "empty.json"
    empty.write_text("")
    assert main(tiny_args(tiny_model_dir, tofu_dir, tmp_path / "a", "--forget", str(empty))) == 1
    assert "split is empty" in capsys.readouterr().err
    bad = tmp_path / "bad.toml"
    bad.write_text("learning_rate = 1\n")
    assert main(tiny_args(tiny_model_dir, tofu_dir, tmp_path / "b", "--config", str(bad))) == 1
    err = capsys.readouterr().err
    assert "bad.toml: unknown option 'learning_rate'" in err and "lr" in err


# ----------------------------------------------------------------------------- faults

KILL_SCRIPT = """
import json, os, signal, sys
from transformers import TrainerCallback
from unlearn_plugins.training import UnlearnConfig, run_unlearning

class KillAt(TrainerCallback):
    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == int(sys.argv[2]):
            os.kill(os.getpid(), signal.SIGKILL)  # no clean-up of any kind

run_unlearning(UnlearnConfig(**json.loads(sys.argv[1])), callbacks=[KillAt()])
"""


def test_resume_after_sigkill_matches_uninterrupted_run(tiny_model_dir, tofu_dir, tmp_path):
    """Killed at step 3 (last checkpoint: 2) and resumed, the run ends with the same adapter
    as one that was never interrupted. NPO (reference model) and LoRA dropout (RNG state)."""
    flags = ["--objective", "npo", "--max-steps", "6", "--save-steps", "2", "--lora-dropout", "0.1"]
    killed = tmp_path / "killed"
    options = {"objective": "npo", "max_steps": 6, "save_steps": 2, "lora_dropout": 0.1}  # as the flags say
    config = {"out": str(killed), **small_run(tiny_model_dir, tofu_dir, **options)}
    proc = subprocess.run(
        [sys.executable, "-c", KILL_SCRIPT, json.dumps(config), "3"],
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == -9, proc.stderr[-2000:]
    ckpts = killed / "checkpoints"
    assert (ckpts / "checkpoint-2" / "trainer_state.json").exists()
    assert not (killed / "adapter_model.safetensors").exists()
    # a kill while saving checkpoint 4 would leave a folder without trainer_state.json
    (ckpts / "checkpoint-4").mkdir()
    (ckpts / "checkpoint-4" / "adapter_model.safetensors").write_bytes(b"truncated")

    assert main(tiny_args(tiny_model_dir, tofu_dir, killed, *flags, "--resume")) == 0
    record = json.loads((killed / "run.json").read_text())
    assert record["resumed_from"].endswith("checkpoint-2") and record["steps"] == 6

    straight = tmp_path / "straight"
    assert main(tiny_args(tiny_model_dir, tofu_dir, straight, *flags)) == 0
    assert max_diff(adapter_weights(killed), adapter_weights(straight)) <= 1e-5
    losses = [e["loss"] for e in json.loads((straight / "run.json").read_text())["losses"]]
    assert [e["loss"] for e in record["losses"]] == pytest.approx(losses, rel=1e-5)

    # resuming with different training options is refused; a finished run cannot be resumed
    assert main(tiny_args(tiny_model_dir, tofu_dir, straight, *flags, "--resume")) == 1
    assert main(tiny_args(tiny_model_dir, tofu_dir, straight, *flags)) == 1  # neither --resume nor --overwrite


class NanAtStep:
    """grad_ascent whose loss becomes NaN from the given call on (one call per step here)."""

    needs_reference_model = False
    needs_retain_data = False

    def __init__(self, step):
        from unlearn_plugins.objectives.gradient import GradAscent

        self.inner, self.step, self.calls = GradAscent(), step, 0

    def loss(self, model, batch, reference_model=None):
        self.calls += 1
        value = self.inner.loss(model, batch)
        self.last_terms = self.inner.last_terms
        return value * float("nan") if self.calls >= self.step else value


def test_nan_loss_stops_and_keeps_last_good_checkpoint(tiny_model_dir, tofu_dir, tmp_path):
    from unlearn_plugins.training import TrainingError, run_unlearning

    out = tmp_path / "nan"
    config = small_config(out, tiny_model_dir, tofu_dir, retain=None, max_steps=8, save_steps=2)
    with pytest.raises(TrainingError, match=r"loss is nan at optimizer step 4.*checkpoint-2"):
        run_unlearning(config, objective=NanAtStep(4))
    record = json.loads((out / "run.json").read_text())
    assert record["status"] == "failed" and record["last_good_checkpoint"].endswith("checkpoint-2")
    assert [e["step"] for e in record["losses"]] == [1, 2, 3]
    assert not (out / "adapter_model.safetensors").exists()
    assert not (out / "checkpoints" / "checkpoint-4").exists()
    weights = adapter_weights(out / "checkpoints" / "checkpoint-2")
    assert all(torch.isfinite(v).all() for v in weights.values())


# ----------------------------------------------------------------------------- two processes


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


SLOW_RANK1 = """
import os, sys, time
import unlearn_plugins.training.run as run

checked = run.check_output


def late_check(*args, **kwargs):
    if os.environ.get("RANK") == "1":  # rank 1 checks the folder late, as under a loaded CI machine
        time.sleep(float(os.environ["SLOW_RANK1_S"]))
    return checked(*args, **kwargs)


run.check_output = late_check
from unlearn_plugins.cli import main

sys.exit(main())
"""


def launch_two(script: list[str], args: list[str], env: dict) -> subprocess.CompletedProcess:
    command = launch_command(*script, *args, port=free_port())
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=400)


def test_two_processes_when_one_checks_the_output_folder_late(tiny_model_dir, tofu_dir, tmp_path):
    """The flaky CI failure (rank 1 exits 1 while rank 0 waits at a barrier): rank 0 created the
    checkpoint folder (the Trainer does) before rank 1 had checked --out, so rank 1 found "a run"
    there and refused. Every process now checks the folder before any writes to it."""
    script = tmp_path / "slow_rank1.py"
    script.write_text(SLOW_RANK1)
    out = tmp_path / "two"
    env = dict(child_env(), SLOW_RANK1_S="8")
    proc = launch_two(
        [str(script)], tiny_args(tiny_model_dir, tofu_dir, out, "--max-steps", "1", "--save-steps", "0"), env
    )
    failing = "\n".join(line for line in proc.stderr.splitlines() if line.startswith(("[rank", "error:")))[-4000:]
    assert proc.returncode == 0, failing + "\n---\n" + proc.stderr[-3000:]
    assert json.loads((out / "run.json").read_text())["status"] == "completed"


def test_two_processes_match_one_process(tiny_model_dir, tofu_dir, tmp_path):
    """`accelerate launch --multi_gpu --num_processes 2` on CPU (gloo) vs one process with the
    same global batch through gradient accumulation (batch 2 x 2 accumulation steps).

    Both take the same samples per optimizer step (accelerate's seeded sampler; process k gets
    batch 2i+k) and average the same two per-micro-batch mean losses, so they are the same
    computation; only the order of floating-point sums in the gradient all-reduce differs.
    Tolerance 1e-5 relative on the final loss and 1e-5 absolute on the weights covers that
    rounding over 4 steps and catches any real difference (a different data order or loss
    scaling changes the loss in the 2nd-3rd digit).
    """
    flags = ["--max-steps", "4", "--save-steps", "0"]
    two = tmp_path / "two"
    proc = launch_two(["-m", "unlearn_plugins.cli"], tiny_args(tiny_model_dir, tofu_dir, two, *flags), child_env())
    # the failing rank's own error (a traceback's [rankN] lines, or the CLI's one error: line;
    # a peer's "connection closed" comes last): those lines first
    failing = "\n".join(line for line in proc.stderr.splitlines() if line.startswith(("[rank", "error:")))[-4000:]
    assert proc.returncode == 0, failing + "\n---\n" + proc.stderr[-3000:]
    record = json.loads((two / "run.json").read_text())
    assert record["num_processes"] == 2 and record["distributed"] == "MULTI_CPU"

    one = tmp_path / "one"
    args = tiny_args(tiny_model_dir, tofu_dir, one, *flags)
    args[args.index("--grad-accum") + 1] = "2"
    assert main(args) == 0
    single = json.loads((one / "run.json").read_text())
    assert single["num_processes"] == 1
    assert record["final_loss"] == pytest.approx(single["final_loss"], rel=1e-5)
    assert max_diff(adapter_weights(two), adapter_weights(one)) <= 1e-5


# ----------------------------------------------------------------------------- residual init + ROL


class ToyResidualInit:
    """A PiSSA-like residual init: B, A from the top singular vectors of W0, base W0 - s B A;
    also hands over a retain basis (random orthonormal) for ROL."""

    def initialize(self, peft_model, *, forget, retain, tokenizer):
        from unlearn_plugins.interfaces import InitResult

        basis = {}
        gen = torch.Generator().manual_seed(1)
        with torch.no_grad():
            for name, module in peft_model.named_modules():
                if not (hasattr(module, "lora_A") and "default" in module.lora_A):
                    continue
                w = module.get_base_layer().weight
                r, s = module.r["default"], module.scaling["default"]
                u, sv, vh = torch.linalg.svd(w, full_matrices=False)
                b = u[:, :r] * sv[:r].sqrt()
                a = sv[:r].sqrt()[:, None] * vh[:r] / s
                module.lora_B["default"].weight.copy_(b)
                module.lora_A["default"].weight.copy_(a)
                w.sub_(s * b @ a)
                basis[name] = torch.linalg.qr(torch.randn(w.shape[0], 3, generator=gen))[0]
        return InitResult(retain_basis=basis, residual=True, info={"init": "toy_residual"})


def test_residual_init_saves_a_plain_adapter_and_feeds_rol(tiny_model_dir, tofu_dir, tmp_path):
    from unlearn_plugins.training import run_unlearning

    out = tmp_path / "res"
    rol = {"regularizer": "rol", "regularizer_options": {"weight": 0.5}}
    config = small_config(out, tiny_model_dir, tofu_dir, max_steps=2, merge=True, **rol)
    result = run_unlearning(config, initializer=ToyResidualInit())
    record = result.record
    assert record["context"]["rol_basis"] == {"from_initializer": 14, "random": 0}
    assert all("loss_rol" in e for e in record["losses"])
    adapter_config = json.loads((out / "adapter_config.json").read_text())
    assert adapter_config["r"] == 8  # PEFT's conversion: [A; A0], [B, -B0]
    # the saved adapter applies to the ORIGINAL base weights and reproduces the trained model
    assert_adapter_reproduces_merged(tiny_model_dir, out)


# ----------------------------------------------------------------------------- finetune


def test_finetune_authors_full_and_lora(tiny_model_dir, tofu_dir, tmp_path, capsys):
    from transformers import AutoModelForCausalLM

    out = tmp_path / "ft"
    common = [
        "finetune",
        "--model",
        str(tiny_model_dir),
        "--tofu-dir",
        str(tofu_dir),
        "--data",
        "tofu:full",
        "--max-length",
        "48",
        "--batch-size",
        "4",
        "--grad-accum",
        "1",
        "--max-steps",
        "2",
    ]
    assert main(common + ["--authors", "0,1", "--full-finetune", "--out", str(out)]) == 0
    record = json.loads((out / "run.json").read_text())
    assert record["samples"] == {"train": 40} and record["parameters"]["trainable"] == record["parameters"]["total"]
    AutoModelForCausalLM.from_pretrained(str(out))  # a complete model folder
    assert main(common + ["--data", "tofu:full[0:8]", "--merge", "--out", str(tmp_path / "ftl")]) == 0
    assert (tmp_path / "ftl" / "adapter_config.json").exists()
    AutoModelForCausalLM.from_pretrained(str(tmp_path / "ftl" / "merged"))
    assert main(common + ["--authors", "250", "--out", str(tmp_path / "x")]) == 1
    assert "out of range; the split has 200 authors" in capsys.readouterr().err


@pytest.mark.slow
def test_embedded_model_finetune_then_unlearn(embedded_model_dir, tofu_dir, tmp_path):
    """SmolLM2-135M: LoRA steps on 2 QA raise their probability; grad_diff then lowers it."""
    from unlearn_plugins.data.qa import encode_samples, load_split
    from unlearn_plugins.likelihood import answer_nll, answer_probability
    from unlearn_plugins.models import load_model

    data = "tofu:full[0:2]"
    samples = load_split(data, tofu_dir)

    def mean_prob(model_dir):
        model, tok = load_model(str(model_dir), device="cpu")
        stats = answer_nll(model, encode_samples(tok, samples, max_length=128), tok.pad_token_id)
        return sum(answer_probability(s, n) for s, n in stats) / len(stats)

    common = [
        "--model",
        str(embedded_model_dir),
        "--tofu-dir",
        str(tofu_dir),
        "--max-length",
        "128",
        "--batch-size",
        "2",
        "--grad-accum",
        "1",
        "--lora-r",
        "8",
        "--save-steps",
        "0",
        "--lr",
        "2e-3",
        "--merge",
    ]
    before = mean_prob(embedded_model_dir)
    ft = tmp_path / "ft"
    assert main(["finetune", *common, "--data", data, "--max-steps", "6", "--out", str(ft)]) == 0
    tuned = mean_prob(ft / "merged")
    assert tuned > before + 0.05, (before, tuned)
    un = tmp_path / "un"
    assert (
        main(
            [
                "run",
                *common,
                "--model",
                str(ft / "merged"),
                "--forget",
                data,
                "--retain",
                "tofu:full[20:22]",
                "--objective",
                "grad_diff",
                "--max-steps",
                "2",
                "--out",
                str(un),
            ]
        )
        == 0
    )
    after = mean_prob(un / "merged")
    assert after < tuned - 0.05, (tuned, after)


def test_reglu_preset_sets_the_recipe_and_flags_override_it():
    import argparse

    from unlearn_plugins.commands import run as run_cmd
    from unlearn_plugins.training import UnlearnConfig

    parser = argparse.ArgumentParser()
    run_cmd.add_parser(parser.add_subparsers())
    args = parser.parse_args(
        ["run", "--preset", "reglu", "--out", "x", "--lr", "3e-4", "--regularizer-option", "weight=1.0"]
    )
    config = run_cmd.resolve_config(UnlearnConfig, args)
    assert (config.objective, config.initializer, config.regularizer) == ("ihl", "rila", "rol")
    assert (config.lora_r, config.lora_alpha, config.epochs) == (32, 64.0, 5.0)
    assert config.initializer_options == {"beta": 0.7, "rol_rank": 128}
    assert config.lr == 3e-4 and config.regularizer_options == {"weight": 1.0, "rank": 128}
    bad = parser.parse_args(["run", "--preset", "nope", "--out", "x"])
    with pytest.raises(Exception, match="unknown preset 'nope'; presets: reglu"):
        run_cmd.resolve_config(UnlearnConfig, bad)


def test_unlearn_run_passes_its_seed_to_components_that_take_one(tiny_model_dir, tofu_dir, tmp_path):
    """A component with a `seed` option got the study's seed in a study but its
    own default from `unlearn run --seed S`; now both pass the run's seed where none is set."""
    out = tmp_path / "run"
    args = tiny_args(tiny_model_dir, tofu_dir, out, "--max-steps", "1", "--save-steps", "0", "--seed", "5")
    args += ["--initializer", "fila", "--objective", "rmu"]
    assert main(args) == 0
    components = json.loads((out / "run.json").read_text())["components"]
    assert components["initializer"]["options"]["seed"] == 5
    assert components["objective"]["options"]["seed"] == 5
    fixed = tmp_path / "fixed"
    args = tiny_args(tiny_model_dir, tofu_dir, fixed, "--max-steps", "1", "--save-steps", "0", "--seed", "5")
    args += ["--initializer", "fila", "--initializer-option", "seed=2"]
    assert main(args) == 0
    assert json.loads((fixed / "run.json").read_text())["components"]["initializer"]["options"]["seed"] == 2
