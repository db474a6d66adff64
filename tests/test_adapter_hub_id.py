"""Adapters trained from the `smollm2-135m` alias load anywhere: they name
the hub model HuggingFaceTB/SmolLM2-135M-Instruct as their base, so PEFT's
AutoPeftModelForCausalLM finds it by hub id (here: offline, with a local Hugging Face cache
standing in for the hub), while our loader keeps resolving the alias to its local conversion."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

from unlearn_plugins.models import ALIAS_HUB_IDS, MANIFEST

HUB_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"
PROMPT_IDS = [1, 9690, 198, 2683, 314, 253, 5356]

AUTOPEFT = """
import json, sys, torch
from peft import AutoPeftModelForCausalLM
model = AutoPeftModelForCausalLM.from_pretrained(sys.argv[1])
model.eval()
with torch.no_grad():
    logits = model(input_ids=torch.tensor([json.loads(sys.argv[2])])).logits[0, -1]
print(json.dumps({"base": model.peft_config["default"].base_model_name_or_path, "logits": logits.tolist()}))
"""


def hub_cache_with(folder, root):
    """A Hugging Face hub cache (models--ORG--NAME/refs/main, snapshots/REV) holding ``folder``."""
    repo = root / ("models--" + HUB_ID.replace("/", "--"))
    revision = "0" * 40
    snapshot = repo / "snapshots" / revision
    snapshot.mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(revision)
    for path in folder.iterdir():
        if path.is_file() and path.name != MANIFEST:
            (snapshot / path.name).symlink_to(path)
    return root


def autopeft(adapter, cache, tmp_path):
    env = {
        **os.environ,
        "HF_HUB_CACHE": str(cache),
        "HF_HOME": str(tmp_path / "hf-home"),
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "OMP_NUM_THREADS": "1",
    }
    return subprocess.run(
        [sys.executable, "-c", AUTOPEFT, str(adapter), json.dumps(PROMPT_IDS)],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )


def test_our_loader_takes_the_hub_id_as_the_alias_base(tmp_path, tiny_model_dir):
    """An adapter naming the hub id (no run.json beside it) is accepted for the alias, which
    resolves to its local conversion, and refused for another base."""
    import torch
    from safetensors.torch import save_file

    from unlearn_plugins.errors import ModelError
    from unlearn_plugins.models import check_adapter

    assert ALIAS_HUB_IDS["smollm2-135m"] == HUB_ID
    adapter = tmp_path / "adapter"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text(json.dumps({"base_model_name_or_path": HUB_ID}))
    save_file({"w": torch.zeros(2)}, str(adapter / "adapter_model.safetensors"))
    check_adapter(str(adapter), spec="smollm2-135m", where=str(tmp_path / "cache" / "smollm2-135m-98362432"))
    with pytest.raises(ModelError, match=f"was trained on {HUB_ID}, not on --model"):
        check_adapter(str(adapter), spec=str(tiny_model_dir), where=str(tiny_model_dir))


@pytest.mark.slow
def test_adapter_from_the_alias_loads_by_hub_id(embedded_model_dir, tiny_model_dir, tmp_path):
    import torch

    from unlearn_plugins.errors import ModelError
    from unlearn_plugins.models import load_model
    from unlearn_plugins.training import UnlearnConfig, run_unlearning

    forget = tmp_path / "forget.json"
    forget.write_text(
        "".join(
            json.dumps({"question": f"Who wrote book {i}?", "answer": f"Author {i} wrote it."}) + "\n" for i in range(2)
        )
    )
    out = tmp_path / "adapter"
    run_unlearning(
        UnlearnConfig(
            out=str(out),
            model="smollm2-135m",
            device="cpu",
            forget=str(forget),
            retain=None,
            objective="grad_ascent",
            max_steps=1,
            batch_size=2,
            grad_accum=1,
            lora_r=4,
            lora_alpha=8.0,
            target_modules=["q_proj", "v_proj"],
            lr=1e-3,
            save_steps=0,
            merge=True,
        )
    )
    config = json.loads((out / "adapter_config.json").read_text())
    assert config["base_model_name_or_path"] == HUB_ID
    merged = json.loads((out / "merged" / "config.json").read_text())
    assert merged.get("_name_or_path", HUB_ID) == HUB_ID  # transformers >= 5 no longer writes the field
    assert str(embedded_model_dir) not in (out / "merged" / "config.json").read_text()
    base = json.loads((out / "run.json").read_text())["base_model"]
    assert base["name_or_path"] == HUB_ID and base["alias"] == "smollm2-135m" and len(base["fingerprint"]) == 64

    # PEFT's own loader, offline: the hub id resolves through the (stand-in) hub cache
    result = autopeft(out, hub_cache_with(embedded_model_dir, tmp_path / "hub"), tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    loaded = json.loads(result.stdout.strip().splitlines()[-1])
    assert loaded["base"] == HUB_ID
    # ... and gives what our loader gives (alias resolved locally, the adapter applied)
    model, _ = load_model("smollm2-135m", device="cpu", dtype="float32", adapter=str(out))
    with torch.no_grad():
        ours = model(input_ids=torch.tensor([PROMPT_IDS])).logits[0, -1]
    assert torch.allclose(torch.tensor(loaded["logits"]), ours, atol=1e-4)
    base_model, _ = load_model("smollm2-135m", device="cpu", dtype="float32")
    with torch.no_grad():
        plain = base_model(input_ids=torch.tensor([PROMPT_IDS])).logits[0, -1]
    assert not torch.allclose(plain, ours, atol=1e-4)  # the adapter was applied, not only the base
    # without the model in the cache, the hub id cannot be resolved offline: that is the path taken
    (tmp_path / "empty-hub").mkdir()
    assert autopeft(out, tmp_path / "empty-hub", tmp_path).returncode != 0

    # our loader, for an adapter without run.json (copied alone): the hub id names the alias's model
    bare = tmp_path / "bare"
    bare.mkdir()
    for name in ("adapter_config.json", "adapter_model.safetensors"):
        shutil.copy(out / name, bare / name)
    load_model("smollm2-135m", device="cpu", adapter=str(bare))
    with pytest.raises(ModelError, match=f"was trained on {HUB_ID}, not on --model"):
        load_model(str(tiny_model_dir), device="cpu", adapter=str(bare))
