"""lm-eval's own task conformance checks, run on every task this package ships.

The checks are lm-eval's ``TestBaseTasks`` (lm-evaluation-harness, tests/test_tasks.py), ported
as they are; only the loading differs: lm-eval parametrises over tasks built at import time
with ``get_task_dict``, here each task is built on first use by a TaskManager that includes our
task folder (``lm_eval --include_path`` does the same), with the data each task family reads:
TOFU (the tiny model's tokenizer, ``../shared/data/tofu``), MMLU (``../shared/data/mmlu``) and
the WMDP test fixture. A task whose data is absent is skipped, not passed.
"""

from __future__ import annotations

from itertools import islice
from pathlib import Path

import pytest

FIXTURES = Path(__file__).resolve().parent / "fixtures"


def builtin_folders() -> list[Path]:
    """The built-in task folders: the core's (tasks/) and each built-in benchmark's."""
    from unlearn_plugins.host import get_host
    from unlearn_plugins.interfaces import LM_EVAL_TASK_DIR

    host = get_host()
    return [Path(c.obj).resolve() for c in host.list(LM_EVAL_TASK_DIR) if host.plugins[c.plugin].source == "built-in"]


def shipped_tasks() -> list[str]:
    """Every leaf task of the built-in task folders (from lm-eval's YAML index: no data read)."""
    from lm_eval.tasks import TaskManager

    folders = builtin_folders()
    manager = TaskManager(include_path=[str(f) for f in folders], include_defaults=False)
    return sorted(
        name
        for name in manager.all_subtasks
        if any(Path(manager.task_index[name].yaml_path).resolve().is_relative_to(f) for f in folders)
    )


TASKS = shipped_tasks()
_BUILT: dict[str, object] = {}


@pytest.fixture
def task_class(request, tiny_model_dir):
    """The task named by the test's parameter, built once per session."""
    from lm_eval.tasks import TaskManager

    name = request.param
    if name not in _BUILT:
        metadata = {"tokenizer": str(tiny_model_dir), "wmdp_dir": str(FIXTURES / "wmdp")}
        if name.startswith("tofu_"):
            metadata.update(
                tofu_dir=str(request.getfixturevalue("tofu_dir")),
                forget_split="forget01",
                holdout_split="real_authors_perturbed",
            )
        elif name.startswith("mmlu_local") or name == "wmdp_mmlu":
            metadata["mmlu_dir"] = str(request.getfixturevalue("mmlu_dir"))
        elif name.startswith("muse_"):
            from muse_fixture import write_muse_fixture

            metadata["muse_dir"] = str(
                write_muse_fixture(request.getfixturevalue("tmp_path_factory").mktemp("muse"), n=10)
            )
        folders = [str(f) for f in builtin_folders()]
        manager = TaskManager(include_path=folders, include_defaults=False, metadata=metadata)
        _BUILT[name] = manager.load([name])["tasks"][name]
    return _BUILT[name]


def multiple_inputs(task) -> bool:
    """``Task.multiple_input`` in the installed lm-eval, ``multiple_inputs`` in newer ones."""
    return bool(getattr(task, "multiple_inputs", getattr(task, "multiple_input", False)))


def first_docs(task, limit: int) -> list:
    """The task's first ``limit`` test documents (validation documents where it has no test split)."""
    return (
        list(islice(task.test_docs(), limit)) if task.has_test_docs() else list(islice(task.validation_docs(), limit))
    )


@pytest.fixture()
def limit() -> int:
    return 10


def test_every_task_family_is_checked():
    """The parametrisation below covers the whole folder (a task lm-eval cannot index would
    silently drop out of it)."""
    assert sum(t.startswith("tofu_") for t in TASKS) == 23 + 2 + 4  # TOFU, MIA (tofu_mia/), probes (tofu_probes/)
    assert sum(t.startswith("mmlu_local_") for t in TASKS) == 57
    assert [t for t in TASKS if t.startswith("wmdp_local_")] == [
        "wmdp_local_bio",
        "wmdp_local_chem",
        "wmdp_local_cyber",
    ]


@pytest.mark.parametrize("task_class", TASKS, indirect=True)
class TestBaseTasks:
    """lm-eval's TestBaseTasks, verbatim but for the fixture above and :func:`multiple_inputs`."""

    def test_download(self, task_class):
        task_class.download()
        assert task_class.dataset is not None

    def test_has_training_docs(self, task_class):
        assert task_class.has_training_docs() in [True, False]

    def test_check_training_docs(self, task_class):
        if task_class.has_training_docs():
            assert task_class._config["training_split"] is not None

    def test_has_validation_docs(self, task_class):
        assert task_class.has_validation_docs() in [True, False]

    def test_check_validation_docs(self, task_class):
        if task_class.has_validation_docs():
            assert task_class._config["validation_split"] is not None

    def test_has_test_docs(self, task_class):
        assert task_class.has_test_docs() in [True, False]

    def test_check_test_docs(self, task_class):
        task = task_class
        if task.has_test_docs():
            assert task._config["test_split"] is not None

    def test_should_decontaminate(self, task_class):
        task = task_class
        assert task.should_decontaminate() in [True, False]
        if task.should_decontaminate():
            assert task._config["doc_to_decontamination_query"] is not None

    def test_doc_to_text(self, task_class, limit):
        task = task_class
        arr = first_docs(task, limit)
        _array = [task.doc_to_text(doc) for doc in arr]
        # space convention; allow txt to have length 0 for perplexity-like tasks since the model tacks an <|endoftext|> on
        target_delimiter: str = task.config.target_delimiter
        if not multiple_inputs(task):
            for x in _array:
                assert isinstance(x, str)
                assert (x[-1].isspace() is False if len(x) > 0 else True) if target_delimiter.isspace() else True, (
                    "doc_to_text ends in a whitespace and target delimiter also a whitespace"
                )

    def test_create_choices(self, task_class, limit):
        task = task_class
        arr = first_docs(task, limit)
        if "multiple_choice" in task._config.output_type:
            _array = [task.doc_to_choice(doc) for doc in arr]
            assert all(isinstance(x, list) for x in _array)
            assert all(isinstance(x[0], str) for x in _array)

    def test_doc_to_target(self, task_class, limit):
        task = task_class
        arr = first_docs(task, limit)
        _array_target = [task.doc_to_target(doc) for doc in arr]
        if task._config.output_type == "multiple_choice":
            assert all(isinstance(label, (int, str)) for label in _array_target)

    def test_build_all_requests(self, task_class, limit):
        task_class.build_all_requests(rank=1, limit=limit, world_size=1)
        assert task_class.instances is not None

    def test_construct_requests(self, task_class, limit):
        task = task_class
        arr = first_docs(task, limit)
        # ctx is "" for multiple input tasks
        requests = [
            task.construct_requests(doc=doc, ctx=[""] if multiple_inputs(task) else task.doc_to_text(doc))
            for doc in arr
        ]
        assert len(requests) == limit if limit else True
