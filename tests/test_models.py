"""Model resolution and the embedded model cache: converted once, never trusted when partial."""

from __future__ import annotations

import shutil

import pytest

from unlearn_plugins import models
from unlearn_plugins.errors import ModelError


@pytest.fixture
def fake_conversion(embedded_model_dir, monkeypatch):
    """Replace the 25 s GGUF conversion by a copy of the already converted folder, counting calls."""
    calls = []

    def convert(gguf, out):
        calls.append(out)
        for f in embedded_model_dir.iterdir():
            if f.name != models.MANIFEST:
                shutil.copy(f, out / f.name)

    monkeypatch.setattr(models, "convert_gguf", convert)
    return calls


def test_second_load_uses_cache(tmp_path, fake_conversion):
    first = models.embedded_model_dir("smollm2-135m", cache=tmp_path)
    second = models.embedded_model_dir("smollm2-135m", cache=tmp_path)
    assert first == second and len(fake_conversion) == 1
    assert (first / "model.safetensors").exists() and (first / models.MANIFEST).exists()


def test_interrupted_conversion_leaves_nothing_that_looks_valid(tmp_path, fake_conversion, monkeypatch):
    def crash(gguf, out):
        (out / "model.safetensors").write_bytes(b"half a file")
        raise KeyboardInterrupt

    monkeypatch.setattr(models, "convert_gguf", crash)
    with pytest.raises(KeyboardInterrupt):
        models.embedded_model_dir("smollm2-135m", cache=tmp_path)
    assert list((tmp_path / "models").iterdir()) == []  # no final folder, no temporary left


def test_corrupt_cache_is_redone(tmp_path, fake_conversion):
    folder = models.embedded_model_dir("smollm2-135m", cache=tmp_path)
    weights = folder / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])  # truncated, e.g. disk full or killed copy
    again = models.embedded_model_dir("smollm2-135m", cache=tmp_path)
    assert len(fake_conversion) == 2 and again == folder
    (again / models.MANIFEST).unlink()  # a folder without manifest is not trusted either
    models.embedded_model_dir("smollm2-135m", cache=tmp_path)
    assert len(fake_conversion) == 3


@pytest.mark.slow
def test_embedded_model_answers(embedded_model_dir, monkeypatch):
    monkeypatch.setenv("UNLEARN_CACHE_DIR", str(embedded_model_dir.parent.parent))
    model, tok = models.load_model("smollm2-135m", device="cpu")
    assert model.config.num_hidden_layers == 30 and model.config.num_key_value_heads == 3
    assert model.dtype.is_floating_point and str(model.dtype) == "torch.float32"
    prompt = tok.apply_chat_template(
        [{"role": "user", "content": "What is the capital of France?"}],
        add_generation_prompt=True,
        return_tensors="pt",
        return_dict=True,
    )
    out = model.generate(**prompt, max_new_tokens=10, do_sample=False)
    assert "Paris" in tok.decode(out[0][prompt["input_ids"].shape[1] :])


def test_resolve_errors(tmp_path):
    with pytest.raises(ModelError, match="no config.json"):
        models.resolve_model(str(tmp_path))
    with pytest.raises(ModelError, match="no such folder"):
        models.resolve_model("./does/not/exist")
    with pytest.raises(ModelError, match="unknown model alias"):
        models.embedded_model_dir("gpt-5")
    with pytest.raises(ModelError, match="unknown dtype"):
        models.pick_dtype("cpu", "float8")
    assert models.resolve_model("HuggingFaceTB/SmolLM2-135M-Instruct") == "HuggingFaceTB/SmolLM2-135M-Instruct"


def test_native_dtype_is_bf16_only_where_the_cpu_computes_it(monkeypatch):
    """The demo's --train-dtype/--eval-dtype auto: bf16 on a CPU with AVX512-BF16 or AMX, fp32
    (None: the library default) on other CPUs, the library's default (bf16 already) on CUDA."""
    import torch

    assert models.native_dtype("bf16", "cpu") == "bf16" and models.native_dtype("fp32", "cpu") == "fp32"
    for amx, avx512_bf16, expected in ((True, False, "bf16"), (False, True, "bf16"), (False, False, None)):
        monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda amx=amx: amx, raising=False)
        monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda v=avx512_bf16: v, raising=False)
        assert models.native_dtype("auto", "cpu") == expected
    assert models.native_dtype("auto", "cuda") is None  # pick_dtype's CUDA default decides

    def broken():
        raise RuntimeError("no cpuinfo")

    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", broken, raising=False)
    assert models.native_dtype("auto", "cpu") is None
    with pytest.raises(ModelError, match=r"^--eval-dtype 'fp8': choose auto, bf16, fp32$"):
        models.native_dtype("fp8", "cpu", "--eval-dtype")


def test_merged_adapter_gives_the_unmerged_models_log_probs(tiny_model_dir, tmp_path):
    """merge_adapter (what fp32 evaluations of studies and the demo use): a plain model whose
    outputs are the PeftModel's, to fp32 rounding."""
    import torch
    from peft import LoraConfig, PeftModel, get_peft_model

    base, _ = models.load_model(str(tiny_model_dir), device="cpu")
    peft_model = get_peft_model(base, LoraConfig(r=4, lora_alpha=8, target_modules="all-linear"))
    torch.manual_seed(0)
    with torch.no_grad():
        for name, param in peft_model.named_parameters():
            if "lora_B" in name:
                param.normal_(0, 0.05)  # a trained adapter: B is no longer zero
    peft_model.save_pretrained(tmp_path / "adapter")
    ids = torch.randint(0, 100, (2, 12))

    def log_probs(**kwargs):
        model, _ = models.load_model(str(tiny_model_dir), device="cpu", adapter=str(tmp_path / "adapter"), **kwargs)
        with torch.no_grad():
            return model, torch.log_softmax(model(input_ids=ids).logits.float(), -1)

    unmerged_model, exact = log_probs()
    merged_model, merged = log_probs(merge_adapter=True)
    assert isinstance(unmerged_model, PeftModel) and not isinstance(merged_model, PeftModel)
    assert not any("lora_" in name for name, _ in merged_model.named_parameters())
    plain, _ = models.load_model(str(tiny_model_dir), device="cpu")
    with torch.no_grad():
        assert (torch.log_softmax(plain(input_ids=ids).logits, -1) - exact).abs().max() > 1e-3  # the adapter matters
    assert torch.allclose(merged, exact, atol=1e-5)
    # merging is exact in fp32 only: evaluations merge there and never into bf16 weights
    assert models.merge_is_exact("cpu", None) and models.merge_is_exact("cpu", "fp32")
    assert not models.merge_is_exact("cpu", "bf16") and not models.merge_is_exact("cpu", "fp16")


def test_local_folder_loads(tiny_model_dir):
    model, tok = models.load_model(str(tiny_model_dir), device="cpu")
    assert model.config.num_hidden_layers == 2 and tok.pad_token_id is not None
