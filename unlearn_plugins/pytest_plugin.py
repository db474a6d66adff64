"""Pytest fixtures for plugin authors, registered with pytest through the ``pytest11`` entry point:
a plugin's tests get them by installing unlearn-plugins, with nothing from this repository's
tests/. Everything is built in code or from the TOFU rows shipped in the package, so the tests
run offline in seconds on a CPU.

- ``unlearn_tiny_tokenizer``: a byte-level BPE tokenizer with SmolLM2's chat template and tokens;
- ``unlearn_tiny_model``: a fresh random 2-layer Llama (grouped-query attention) for it;
- ``unlearn_tiny_model_dir``: that model and tokenizer saved as a Hugging Face folder (for the CLI);
- ``unlearn_tofu_dir``: a small folder in TOFU's format (``forget01``, ``forget01_perturbed``,
  ``retain99``, ``retain_perturbed``, ``real_authors_perturbed``, ``world_facts_perturbed``,
  ``full``) made of the real TOFU rows shipped with the package (TOFU, MIT licence);
- ``unlearn_lora_model``: the tiny model with a LoRA adapter (r 4) on every linear layer, as
  ``unlearn run`` builds it;
- ``unlearn_reference_model``: a frozen copy of the tiny model, what an objective with
  ``needs_reference_model`` is given;
- ``unlearn_attack_context``: the host's :class:`~unlearn_plugins.attacks.context.Context` for an
  attack on the tiny model, with ``tofu:forget01`` of ``unlearn_tofu_dir`` as its forget data.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

#: split -> (shipped file, first row, rows): authors 196-199 of TOFU's forget10_perturbed, 20 QA each
_SPLITS = {
    "forget01": ("authors_197-199_perturbed.json", 20, 40),
    "forget01_perturbed": ("authors_197-199_perturbed.json", 20, 40),
    "retain99": ("author_196_perturbed.json", 0, 20),
    "retain_perturbed": ("author_196_perturbed.json", 0, 20),
    "real_authors_perturbed": ("real_authors_1-20_perturbed.json", 0, 20),
    "world_facts_perturbed": ("world_facts_1-20_perturbed.json", 0, 20),
}
_PLAIN = {"forget01", "retain99"}  # TOFU's plain splits have question and answer only


def write_tofu_folder(folder: Path) -> Path:
    """A small TOFU-format folder (see the module docstring) in ``folder``."""
    from .host import required_benchmark_part

    # the TOFU rows shipped with the package (the demo's authors; TOFU's MIT licence beside them)
    shipped = required_benchmark_part("tofu", "data").SHIPPED_TOFU
    folder.mkdir(parents=True, exist_ok=True)
    rows = {}
    for split, (name, start, count) in _SPLITS.items():
        lines = (shipped / name).read_text(encoding="utf-8").splitlines()[start : start + count]
        records = [json.loads(line) for line in lines]
        if split in _PLAIN:
            records = [{"question": r["question"], "answer": r["answer"]} for r in records]
        rows[split] = records
        (folder / f"{split}.json").write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    everyone = (shipped / "authors_197-199_perturbed.json").read_text(encoding="utf-8").splitlines()
    full = rows["retain99"] + [{"question": r["question"], "answer": r["answer"]} for r in map(json.loads, everyone)]
    (folder / "full.json").write_text("".join(json.dumps(r) + "\n" for r in full), encoding="utf-8")
    return folder


@pytest.fixture(scope="session")
def unlearn_tiny_tokenizer():
    from .testing import tiny_tokenizer

    return tiny_tokenizer()


@pytest.fixture
def unlearn_tiny_model(unlearn_tiny_tokenizer):
    from .testing import tiny_llama

    return tiny_llama(len(unlearn_tiny_tokenizer))


@pytest.fixture(scope="session")
def unlearn_tiny_model_dir(tmp_path_factory) -> Path:
    from .testing import save_tiny_model

    return save_tiny_model(tmp_path_factory.mktemp("unlearn-tiny-model"))


@pytest.fixture(scope="session")
def unlearn_tofu_dir(tmp_path_factory) -> Path:
    return write_tofu_folder(tmp_path_factory.mktemp("unlearn-tofu"))


@pytest.fixture
def unlearn_lora_model(unlearn_tiny_model):
    from .training.lora import build_lora_model

    return build_lora_model(unlearn_tiny_model, r=4, alpha=8.0, dropout=0.0, target_modules=None)


@pytest.fixture
def unlearn_reference_model(unlearn_tiny_model):
    import copy

    return copy.deepcopy(unlearn_tiny_model).eval().requires_grad_(False)


@pytest.fixture
def unlearn_attack_context(unlearn_tiny_model_dir, unlearn_tofu_dir, tmp_path):
    from .attacks.context import Context

    return Context(
        model=str(unlearn_tiny_model_dir),
        out=tmp_path / "attacked",
        forget="tofu:forget01",
        tofu_dir=str(unlearn_tofu_dir),
    )
