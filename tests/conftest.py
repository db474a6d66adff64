"""Shared fixtures: the tiny model built in code, the TOFU reference data, the embedded model."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SHARED_TOFU = Path(os.environ.get("UNLEARN_TEST_TOFU_DIR", ROOT.parent / "shared" / "data" / "tofu"))
SHARED_MMLU = Path(os.environ.get("UNLEARN_TEST_MMLU_DIR", ROOT.parent / "shared" / "data" / "mmlu"))


def pytest_configure(config):
    """Under pytest-xdist (``-n 2``), one torch thread per worker process, set before any test
    module imports torch: two workers each spinning two OpenMP threads on two cores make tiny
    ops many times slower. Subprocesses that tests start inherit it."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
            os.environ[name] = "1"
    # transformers and datasets install a stderr handler when first imported, bound to the
    # sys.stderr of that moment: imported here, not inside a test whose captured stderr closes
    # after it (a later test's log record would hit the closed file: "--- Logging error ---")
    # (huggingface_hub's is installed lazily, by its first get_logger: called here too)
    import datasets
    import huggingface_hub.utils.logging
    import transformers

    for library in (datasets.utils.logging, huggingface_hub.utils.logging, transformers.utils.logging):
        library.get_logger("unlearn_plugins.tests")
    # lm-eval installs its handler on the first setup_logging (an evaluation in the process):
    # installed here, its level left as it was
    import logging

    import lm_eval.utils

    lm_eval_logger = logging.getLogger("lm_eval")
    level = lm_eval_logger.level
    lm_eval.utils.setup_logging()
    lm_eval_logger.setLevel(level)


def pytest_collection_finish(session):
    """What collection imported (torch, transformers, lm-eval, every test module) lives for the
    whole run: moved out of the garbage collector's view, so the full collections of the tests
    (the Trainer makes one at each training start, ``release_memory`` one after each stage) scan
    what the tests made, not ~0.5M long-lived objects each (0.4-1.5 s a collection)."""
    from unlearn_plugins.process import freeze_libraries

    freeze_libraries()


def pytest_collection_modifyitems(config, items):
    """``gpu`` tests skip, saying why,
    where no CUDA device is usable."""
    gpu_items = [item for item in items if item.get_closest_marker("gpu")]
    if not gpu_items:
        return
    import torch

    if torch.cuda.is_available():
        return
    reason = pytest.mark.skip(reason="needs a CUDA GPU: torch.cuda.is_available() is False on this machine")
    for item in gpu_items:
        item.add_marker(reason)


@pytest.fixture(autouse=True)
def _device_is_chosen(request, monkeypatch):
    """Every test runs on the CPU unless it is marked ``gpu``: on a CUDA machine the defaults
    (device, dtype, mixed precision) would otherwise turn to CUDA and bf16 and the fp32
    exactness tests would compare bf16 numbers. The processes a test starts inherit the empty
    CUDA_VISIBLE_DEVICES."""
    if request.node.get_closest_marker("gpu"):
        yield
        return
    import torch

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    yield


@pytest.fixture(scope="session", autouse=True)
def _test_cache(tmp_path_factory):
    """A cache folder for the whole run (UNLEARN_CACHE_DIR set by CI is kept, so the
    embedded model is converted once per machine, not once per test). Under pytest-xdist the
    workers' caches share one ``models`` folder, so the embedded model is converted once per
    run, not once per worker (its conversion is safe between processes)."""
    if not os.environ.get("UNLEARN_CACHE_DIR"):
        cache = tmp_path_factory.mktemp("unlearn-cache")
        if os.environ.get("PYTEST_XDIST_WORKER"):
            shared = tmp_path_factory.getbasetemp().parent / "unlearn-models"
            shared.mkdir(exist_ok=True)
            (cache / "models").symlink_to(shared, target_is_directory=True)
        os.environ["UNLEARN_CACHE_DIR"] = str(cache)
    yield


@pytest.fixture(autouse=True)
def _fresh_host(monkeypatch):
    """Every test sees a plugin host built from its own environment."""
    import unlearn_plugins

    monkeypatch.delenv("UNLEARN_DISABLE_PLUGINS", raising=False)
    monkeypatch.delenv("UNLEARN_PLUGINS_STRICT", raising=False)
    monkeypatch.delenv("UNLEARN_LOAD_PLUGINS", raising=False)
    unlearn_plugins.reset_host()
    yield
    unlearn_plugins.reset_host()


@pytest.fixture(scope="module")
def single_thread():
    """One torch thread for modules of tiny-tensor tests: OpenMP spin-waits make tiny ops
    up to ~150x slower when the machine's cores are shared."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def tofu_dir() -> Path:
    if not (SHARED_TOFU / "forget01.json").exists():
        pytest.skip(f"TOFU reference data not found at {SHARED_TOFU}")
    return SHARED_TOFU


@pytest.fixture(scope="session")
def mmlu_dir() -> Path:
    if not (SHARED_MMLU / "test").is_dir():
        pytest.skip(f"MMLU reference data not found at {SHARED_MMLU}")
    return SHARED_MMLU


# the tiny model's fixtures are the ones this package gives plugin authors (its pytest plugin)
@pytest.fixture(scope="session")
def tiny_tokenizer(unlearn_tiny_tokenizer):
    return unlearn_tiny_tokenizer


@pytest.fixture
def tiny_model(unlearn_tiny_model):
    """A fresh randomly initialised 2-layer Llama with grouped-query attention."""
    return unlearn_tiny_model


@pytest.fixture(scope="session")
def tiny_model_dir(unlearn_tiny_model_dir) -> Path:
    """A tiny model + tokenizer saved as a Hugging Face folder (for CLI tests)."""
    return unlearn_tiny_model_dir


@pytest.fixture(scope="session")
def embedded_model_dir() -> Path:
    """The embedded SmolLM2-135M converted once into the test cache."""
    pytest.importorskip("gguf")
    import fcntl

    from unlearn_plugins.models import cache_dir, embedded_model_dir

    models = cache_dir() / "models"
    models.mkdir(parents=True, exist_ok=True)
    # one process converts while another pytest-xdist worker waits for it, instead of both converting
    with open(models / ".tests-convert.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            return embedded_model_dir("smollm2-135m")
        except Exception as exc:  # the package is part of the test set-up; say so loudly
            pytest.fail(f"embedded model unavailable: {exc}")
