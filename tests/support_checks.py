"""Pieces several test files share: the command lines they build, subprocess runs of lm-eval and
pip, the committed reports they read, and the damage their property tests do to JSON records.
One home for each, so that a change to a command line or a file layout is made once."""

from __future__ import annotations

import importlib.util
import json
import os
import random
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


# ----------------------------------------------------------------------------- command lines


def stratify_args(scores, tofu_dir, out, *extra, easy=1, hard=1, data: str | None = "tofu:forget01[0:4]") -> list:
    """`unlearn stratify` of ``scores`` into ``out`` (``data``: the split the scores are of, None
    for none), as strings."""
    given = ["--data", data] if data is not None else []
    args = ["stratify", scores, "--easy", easy, "--hard", hard, *given, "--tofu-dir", tofu_dir, "--out", out, *extra]
    return [str(a) for a in args]


def lm_eval(model_args: str, tasks: str, include_path, *flags, module="lm_eval", model="hf", env=None, **more_env):
    """``python -m lm_eval`` (or ``module``, a CLI of its shape) on one thread, its output captured;
    ``env`` instead of this process's environment, ``more_env`` added to it."""
    command = [sys.executable, "-m", module, "--model", model, "--model_args", model_args]
    command += ["--include_path", str(include_path), "--tasks", tasks, *map(str, flags)]
    env = {**(os.environ if env is None else env), "OMP_NUM_THREADS": "1", **more_env}
    return subprocess.run(command, capture_output=True, text=True, timeout=300, env=env)


def build_wheel(folder: Path) -> Path:
    """A wheel of this repository built by pip into ``folder`` (no dependencies, no isolation)."""
    pip = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(folder)]
    build = subprocess.run([*pip, str(ROOT)], capture_output=True, text=True, timeout=300)
    assert build.returncode == 0, build.stderr
    return next(folder.glob("unlearn_plugins-*.whl"))


def load_bench_script(name: str):
    """bench/NAME.py imported as the module ``name`` (registered in sys.modules: its dataclasses
    look their module up)."""
    spec = importlib.util.spec_from_file_location(name, ROOT / "bench" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


# ----------------------------------------------------------------------------- small studies


def author_study_toml(
    name: str, authors: int, test_authors: list[int], reserved: int, *, ceiling="", rest="", rol_weights="[0.1, 0.5]"
) -> str:
    """An author-unit study on tiny-llama and ``authors`` generated authors: a fine-tuned target,
    per-author retain models, IHL and ReGLU (ROL weight swept over ``rol_weights``) on one budget, and
    the primary comparison of ReGLU's Forget Quality with IHL's; ``ceiling``: its [noise_ceiling]
    table (with a blank line after it), ``rest``: the tables after those ([sweep], more
    [[methods]] and [[comparisons]], [evaluation], ...)."""
    return f"""
model = {{ base = "tiny-llama", max_length = 128 }}

[study]
name = "{name}"
seeds = [0]

[benchmark]
source = "generated"
authors = {authors}
unit = "author"
test_authors = {test_authors}
reserved_author = {reserved}

[target]
seed = 0
finetune = {{ lr = 1e-3, epochs = 1.0, lora_r = 8, lora_alpha = 16.0, batch_size = 8 }}

[retain]

{ceiling}[budget]
batch_size = 4
lora_r = 8
lora_alpha = 16.0

[[methods]]
name = "ihl"
objective = "ihl"
initializer = "kaiming"

[[methods]]
name = "reglu"
objective = "ihl"
initializer = "rila"
regularizer = "rol"
sweep = {{ rol_weight = {rol_weights} }}

[[comparisons]]
family = "primary"
metric = "forget_quality"
method = "reglu"
rivals = ["ihl"]

{rest}"""


# ----------------------------------------------------------------------------- committed reports


def committed_study(*folders: str) -> dict:
    """docs/study/<folders...>/study.json."""
    return json.loads(ROOT.joinpath("docs", "study", *folders, "study.json").read_text())


def results_section(heading: str, until: str = "\n## ") -> str:
    """docs/results.md from ``heading`` to the next ``until``."""
    text = (ROOT / "docs" / "results.md").read_text()
    start = text.index(heading)
    return text[start : text.index(until, start + 1)]


def report_fixtures(folder: str, heading: str, *, name="section", until="\n## ", one_line=False):
    """Module-scoped fixtures for a test of docs/results.md against a committed report: ``study``
    (docs/study/FOLDER/study.json) and ``name``, the page's section from ``heading`` to the next
    ``until`` (``one_line``: its words on one line, so that wrapping does not matter)."""
    import pytest

    @pytest.fixture(scope="module", name="study")
    def study() -> dict:
        return committed_study(folder)

    @pytest.fixture(scope="module", name=name)
    def section() -> str:
        text = results_section(heading, until)
        return " ".join(text.split()) if one_line else text

    return study, section


# ----------------------------------------------------------------------------- Model Utility samples


def mu_samples(sizes: dict[str, int], rng: random.Random) -> dict[str, list[dict]]:
    """Per-QA values of the nine Model Utility parts, ``sizes[split]`` QA each (truth ratios raw,
    as the tasks log them), drawn from ``rng`` in the parts' order."""
    from unlearn_plugins.benchmarks.tofu.study.report import MU_PARTS

    rows: dict[str, list[dict]] = {}
    for split, parts in MU_PARTS.items():
        for doc in range(sizes[split]):
            for task, metric in parts:
                value = rng.uniform(0.3, 1.6) if metric == "truth_ratio" else rng.uniform(0.05, 0.95)
                task_rows = rows.setdefault(task, [])
                row = next((r for r in task_rows if r["doc_id"] == doc), None)
                if row is None:
                    task_rows.append(row := {"doc_id": doc})
                row[metric] = value
    return rows


# ----------------------------------------------------------------------------- damaged JSON records


def property_settings(max_examples: int):
    """Hypothesis' settings for a property test over copies of records: no deadline and no example
    database (each example runs a report), function-scoped fixtures allowed (each example copies
    what it damages into a folder of its own)."""
    from hypothesis import HealthCheck, settings

    return settings(
        max_examples=max_examples,
        deadline=None,
        database=None,
        suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    )


def json_nodes(value, path=()):
    """Every (path, value) inside a JSON value."""
    yield path, value
    if isinstance(value, dict):
        for key, item in value.items():
            yield from json_nodes(item, (*path, key))
    elif isinstance(value, list):
        for i, item in enumerate(value):
            yield from json_nodes(item, (*path, i))


def damaged_json(value, data, bad_values: list, prefer: str | None = None):
    """``value`` with one node replaced by one of ``bad_values``, or one key removed, drawn by
    Hypothesis' ``data`` (paths under the top-level key ``prefer`` drawn more often)."""
    from hypothesis import strategies as st

    paths = [p for p, _ in json_nodes(value) if p]
    if not paths:
        return data.draw(st.sampled_from(bad_values))
    preferred = [p for p in paths if p[0] == prefer]
    path = data.draw(st.sampled_from(preferred if preferred and data.draw(st.booleans()) else paths))
    parent = value
    for key in path[:-1]:
        parent = parent[key]
    if isinstance(parent, dict) and data.draw(st.booleans()):
        del parent[path[-1]]
    else:
        parent[path[-1]] = data.draw(st.sampled_from(bad_values))
    return value


def damage_file(path: Path, data, bad_values: list, *, ways: list[str], prefer=None, empty_is_cut=False) -> None:
    """A JSON or JSON-lines file cut short or with one value damaged (one line's, in JSON lines),
    the way drawn from ``ways`` ("value" or "truncate"); ``empty_is_cut``: an empty file is cut."""
    from hypothesis import strategies as st

    raw = path.read_bytes()
    how = data.draw(st.sampled_from(ways))
    if how == "truncate" or (empty_is_cut and not raw.strip()):
        path.write_bytes(raw[: data.draw(st.integers(0, max(len(raw) - 1, 0)))])
    elif path.suffix == ".jsonl":
        lines = raw.decode().splitlines()
        i = data.draw(st.integers(0, len(lines) - 1))
        lines[i] = json.dumps(damaged_json(json.loads(lines[i]), data, bad_values, prefer))
        path.write_text("\n".join(lines) + "\n")
    else:
        path.write_text(json.dumps(damaged_json(json.loads(raw), data, bad_values, prefer)))
