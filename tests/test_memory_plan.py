"""The memory plan: its arithmetic on a small config, the Llama-3-8B plan the docs print, and a
run that does not fit refused before anything is loaded."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from unlearn_plugins import memory_plan as mp
from unlearn_plugins.errors import UnlearnError

LLAMA3_8B = Path(__file__).parent / "data" / "llama-3-8b" / "config.json"
#: a small Llama's config.json: 3 layers of width 64, MLP 160, 4 heads (2 of them key/value), an untied head
SMALL = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 300, "tie_word_embeddings": False}
SMALL |= {"hidden_size": 64, "intermediate_size": 160, "num_hidden_layers": 3, "max_position_embeddings": 128}
SMALL |= {"num_attention_heads": 4, "num_key_value_heads": 2}


@pytest.fixture
def small_config(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(SMALL))
    return path


def test_shape_counts_what_transformers_builds(small_config):
    from transformers import LlamaConfig, LlamaForCausalLM

    shape = mp.model_shape(str(small_config))
    model = LlamaForCausalLM(LlamaConfig(**{k: v for k, v in SMALL.items() if k != "architectures"}))
    assert shape.params == sum(p.numel() for p in model.parameters())
    h, i, kv = 64, 160, 2 * 16  # kv: 2 heads of 16
    assert dict((n, (a, b)) for n, a, b in shape.block_linears) == {
        "q_proj": (h, h),
        "k_proj": (h, kv),
        "v_proj": (h, kv),
        "o_proj": (h, h),
        "gate_proj": (h, i),
        "up_proj": (h, i),
        "down_proj": (i, h),
    }
    assert shape.outside_params == 2 * 300 * h + h  # embeddings, untied head, final norm
    assert not shape.tied
    # a rank-4 LoRA on every linear layer: r (in + out) per layer, what PEFT builds
    assert shape.lora_params(4) == 3 * 4 * ((h + h) * 2 + (h + kv) * 2 + (h + i) * 2 + (i + h))
    from peft import LoraConfig, get_peft_model

    lora = get_peft_model(
        model,
        LoraConfig(r=4, target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]),
    )
    assert shape.lora_params(4) == sum(p.numel() for p in lora.parameters() if p.requires_grad)


def test_tied_embeddings_counted_once(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**SMALL, "tie_word_embeddings": True}))
    shape = mp.model_shape(str(path))
    assert shape.tied and shape.outside_params == 300 * 64 + 64


def test_training_stage_arithmetic(small_config):
    shape = mp.model_shape(str(small_config))
    n = shape.params
    full = mp.training_stage(shape, device="cpu", full_finetune=True, batch_size=2, length=10, reference=True)
    assert full.parts["weights"] == n * 4
    assert full.parts["gradients"] == n * 4
    assert full.parts["optimizer"] == 2 * n * 4  # AdamW: two fp32 moments
    assert full.parts["reference model"] == n * 4  # no autocast on CPU: the weights' dtype
    eight = mp.training_stage(shape, device="cuda", full_finetune=True, optim="adamw_bnb_8bit", reference=True)
    assert eight.parts["optimizer"] == 2 * n  # two bytes per parameter
    assert eight.parts["reference model"] == n * 2  # bf16 under bf16 autocast
    ada = mp.training_stage(shape, device="cpu", full_finetune=True, optim="adafactor")
    assert ada.parts["optimizer"] == 4 * shape.factored() < n
    lora = mp.training_stage(shape, device="cuda", lora_r=4, reference=True)
    assert lora.parts["weights"] == n * 2  # a bf16 base on CUDA
    assert lora.parts["lora adapter"] == lora.parts["gradients"] == shape.lora_params(4) * 4
    assert "reference model" not in lora.parts  # computed on the trained model's own weights
    # activations scale with rows x length; checkpointing keeps a block's input per block
    a1 = mp.training_stage(shape, batch_size=1, length=10).parts["activations"]
    a2 = mp.training_stage(shape, batch_size=2, length=20).parts["activations"]
    assert a2 == 4 * a1
    ckpt = mp.training_stage(shape, batch_size=2, length=20, gradient_checkpointing=True).parts["activations"]
    assert ckpt < a2 / 2
    total = sum(full.parts.values())
    assert full.total == total and full.model_bytes() == total - full.parts["runtime"]


def test_mrd_and_eap_ig_arithmetic(small_config):
    shape = mp.model_shape(str(small_config))
    layer = mp.mrd_stage(shape, precision="fp64", chunk="layer")
    whole = mp.mrd_stage(shape, precision="fp64", chunk="model")
    assert whole.parts["fp64 copy of the model"] == shape.params * 8
    assert layer.parts["fp64 embedding, head and one block"] == (shape.outside_params + shape.block_params) * 8
    eap = mp.eap_ig_stage(shape, steps=5, max_rows=20, length=16)
    n_src, n_dst = 1 + 3 * 4 + 3, 3 * (3 * 4 + 1) + 1
    assert eap.parts["activation differences (fp32)"] == 4 * n_src * 16 * 64 * 4  # 4 samples per pass
    assert eap.parts["score matrices (fp32)"] == (4 + 20) * n_src * n_dst * 4


def test_parse_size_and_fit():
    assert mp.parse_size("80GB") == 80 * 2**30 == mp.parse_size("80GiB")
    assert mp.parse_size("512MiB") == 512 * 2**20
    with pytest.raises(UnlearnError, match="give a size"):
        mp.parse_size("lots")
    stage = mp.Stage("run", "cuda", {"weights": 3 * 2**30})
    mp.check_fits([stage], 4 * 2**30, "--device-memory")
    with pytest.raises(UnlearnError, match="does not fit.*nothing was loaded"):
        mp.check_fits([stage], 2 * 2**30, "--device-memory")


def test_llama3_8b_plan_fits_80gb():
    """The four runs docs/memory.md prints for Llama-3-8B on one 80 GB card, each under 80 GiB,
    and the whole fp64 copy MRD kept before over it."""
    shape = mp.model_shape(str(LLAMA3_8B))
    assert shape.params == 8_030_261_248  # Meta-Llama-3-8B
    limit = 80 * 2**30
    lora_npo = mp.training_stage(shape, device="cuda", reference=True, batch_size=4, length=256)
    full_graddiff = mp.training_stage(
        shape,
        device="cuda",
        full_finetune=True,
        weight_dtype="bfloat16",
        optim="adamw_bnb_8bit",
        gradient_checkpointing=True,
        batch_size=4,
        length=256,
    )
    eap_ig = mp.eap_ig_stage(shape, device="cuda", length=256, samples=20)
    mrd = mp.mrd_stage(shape, device="cuda", length=256)
    for stage in (lora_npo, full_graddiff, eap_ig, mrd):
        assert stage.total < limit, (stage.name, stage.total / 2**30)
    assert mp.mrd_stage(shape, device="cuda", chunk="model", length=256).total > limit
    # full fine-tuning as it was (fp32 AdamW, no checkpointing, a reference copy) does not fit
    assert mp.training_stage(shape, device="cuda", full_finetune=True, reference=True, length=256).total > limit


def _cli(*args, cwd=None):
    return subprocess.run(
        [sys.executable, "-m", "unlearn_plugins.cli", *args], capture_output=True, text=True, cwd=cwd, timeout=600
    )


def test_plan_command_llama3_8b():
    proc = _cli(
        "plan", "--model", str(LLAMA3_8B), "--device", "cuda", "--device-memory", "80GB",
        "--objective", "npo", "--stages", "run,eap_ig,mrd", "--length", "256", "--json",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    lines = [json.loads(line) for line in proc.stdout.splitlines()]
    assert [line["stage"].split(" ")[0] for line in lines] == ["run", "score", "score"]
    assert all(line["total_gib"] < 80 for line in lines)
    proc = _cli("plan", "--model", str(LLAMA3_8B), "--device", "cuda", "--device-memory", "40GB", "--stages", "run")
    assert proc.returncode == 1 and "does not fit" in proc.stderr and "Traceback" not in proc.stderr


def test_optimizer_needing_bitsandbytes_is_refused(monkeypatch):
    import importlib.util

    from unlearn_plugins.training.config import UnlearnConfig

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "bitsandbytes" else real(name, *a)
    )
    with pytest.raises(UnlearnError, match="needs the package bitsandbytes"):
        UnlearnConfig(out="x", optim="paged_adamw_8bit").validate()
    UnlearnConfig(out="x", optim="adafactor").validate()
    assert mp.optimizer_needs_bitsandbytes("adamw_bnb_8bit") and not mp.optimizer_needs_bitsandbytes("adamw_torch")


def test_oversized_run_refused_before_loading(tmp_path, tofu_dir):
    """A model folder with a config and a tokenizer but no weights: the plan refuses the run
    (--device-memory too small) before any load (a load would fail on the missing weights), and
    nothing is written."""
    from unlearn_plugins.testing import tiny_tokenizer

    folder = tmp_path / "config-only"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(SMALL))
    tiny_tokenizer().save_pretrained(folder)
    out = tmp_path / "run"
    args = ["--model", str(folder), "--tofu-dir", str(tofu_dir), "--forget", "tofu:forget01[0:4]",
            "--retain", "tofu:retain90[0:4]", "--max-steps", "1", "--device", "cpu"]  # fmt: skip
    proc = _cli("run", *args, "--out", str(out), "--device-memory", "1MB")
    assert proc.returncode == 1
    assert "does not fit" in proc.stderr and "nothing was loaded" in proc.stderr, proc.stderr
    assert "weight" not in proc.stderr.split("does not fit")[0]  # not a load error
    assert not out.exists()
    dry = _cli("run", *args, "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert "memory plan for" in dry.stdout and "gradients" in dry.stdout


def test_gradient_checkpointing_reaches_the_trainer(tmp_path):
    from unlearn_plugins.training.config import UnlearnConfig
    from unlearn_plugins.training.run import training_arguments

    def on(args):
        return getattr(args, "activation_checkpointing", None) or getattr(args, "gradient_checkpointing", False)

    config = UnlearnConfig(out=str(tmp_path / "o"), device="cpu", gradient_checkpointing=True)
    assert on(training_arguments(config)) is True
    assert not on(training_arguments(UnlearnConfig(out=str(tmp_path / "o"), device="cpu")))


def test_release_memory_empties_the_cuda_cache(monkeypatch):
    import torch

    from unlearn_plugins.process import release_memory

    calls = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: calls.append(1))
    release_memory()
    assert calls == [1]
