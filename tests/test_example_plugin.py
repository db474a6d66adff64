"""The documented example plugin (examples/unlearn-surprisal, one component of every kind),
installed with pip (offline, into a folder on PYTHONPATH), used through `unlearn` and through
lm-eval's own CLI on the tiny model and in a tiny `unlearn study`; and docs/plugins.md, whose code
blocks are its files."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "unlearn-surprisal"
DOCS = ROOT / "docs" / "plugins.md"
BIN = Path(sys.executable).parent


def pip_install(tmp_path_factory, version: str | None = None) -> Path:
    """A copy of the example (with another version in its pyproject.toml, if given) installed by
    pip into a folder of its own; returns that folder."""
    src = tmp_path_factory.mktemp("example") / "unlearn-surprisal"
    shutil.copytree(EXAMPLE, src, ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"))
    if version is not None:
        pyproject = src / "pyproject.toml"
        text = pyproject.read_text()
        assert 'version = "0.1.0"' in text
        pyproject.write_text(text.replace('version = "0.1.0"', f'version = "{version}"', 1))
    target = tmp_path_factory.mktemp("site")
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--no-deps",
            "--no-build-isolation",
            "--no-index",
            "-q",
            "--target",
            str(target),
            str(src),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr
    return target


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """The example installed by pip into its own folder (the checkout and the venv stay clean)."""
    return pip_install(tmp_path_factory)


def env_for(installed: Path, **extra) -> dict[str, str]:
    path = os.pathsep.join(p for p in (str(installed), os.environ.get("PYTHONPATH", "")) if p)
    return {**os.environ, "PYTHONPATH": path, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", **extra}


def unlearn(installed: Path, *args, **env):
    return subprocess.run(
        [str(BIN / "unlearn"), *map(str, args)],
        capture_output=True,
        text=True,
        timeout=600,
        env=env_for(installed, **env),
    )


@pytest.fixture(scope="module")
def listing(installed):
    out = unlearn(installed, "plugins", "--json")
    assert out.returncode == 0, out.stderr
    return {p["name"]: p for p in json.loads(out.stdout)}


# ----------------------------------------------------------------------------- the docs are the example


def doc_files() -> dict[str, str]:
    """Each ``<!-- file: PATH -->`` marker in docs/plugins.md and the code block after it."""
    text = DOCS.read_text()
    blocks = re.findall(r"<!-- file: (\S+) -->\n```\w*\n(.*?)```", text, flags=re.S)
    return dict(blocks)


def test_docs_code_blocks_are_the_example_files():
    blocks = doc_files()
    files = sorted(
        str(p.relative_to(ROOT))
        for p in EXAMPLE.rglob("*")
        if p.is_file() and p.suffix in (".py", ".toml", ".yaml") and "__pycache__" not in p.parts
    )
    assert sorted(blocks) == files  # every file of the example is on the page, and only those
    for path, block in blocks.items():
        assert block == (ROOT / path).read_text(), f"docs/plugins.md shows another {path}: copy the file verbatim"


def test_docs_have_a_section_per_hook():
    from unlearn_plugins.interfaces import HOOK_OF_KIND

    headings = re.findall(r"^## (\w+)\(register\)$", DOCS.read_text(), flags=re.M)
    assert headings == list(HOOK_OF_KIND.values())


# ----------------------------------------------------------------------------- installed and listed


def test_install_carries_the_task_folder_as_package_data(installed):
    package = installed / "unlearn_surprisal"
    assert (package / "tasks" / "surprisal_forget01.yaml").is_file()
    dist = next(installed.glob("unlearn_surprisal-*.dist-info"))
    assert "surprisal = unlearn_surprisal" in (dist / "entry_points.txt").read_text()


def test_plugins_lists_every_kind_with_module_options_and_path(installed, listing):
    example = listing["surprisal"]
    assert (example["source"], example["distribution"], example["version"]) == (
        "entry point",
        "unlearn-surprisal",
        "0.1.0",
    )
    assert example["errors"] == [] and not example["disabled"]
    components = {kind: {c["name"]: c for c in items} for kind, items in example["components"].items()}
    assert {kind: sorted(items) for kind, items in components.items()} == {
        "difficulty_scorer": ["max_surprisal"],
        "adapter_initializer": ["forget_subspace"],
        "unlearning_objective": ["capped_ascent"],
        "lm_eval_task_dir": ["surprisal"],
        "attack": ["weight_noise"],
    }
    objective = components["unlearning_objective"]["capped_ascent"]
    assert objective["module"] == "unlearn_surprisal.objective:CappedAscent"
    assert objective["options"] == [
        {
            "name": "cap",
            "type": "float",
            "help": "answer-token NLL (nats) at which a token is forgotten",
            "default": 5.0,
        },
        {
            "name": "alpha",
            "type": "float",
            "help": "weight of the retain NLL (0: no retain data needed)",
            "default": 1.0,
        },
    ]
    assert [o["name"] for o in components["adapter_initializer"]["forget_subspace"]["options"]] == [
        "max_examples",
        "batch_size",
    ]
    assert components["lm_eval_task_dir"]["surprisal"] == {
        "name": "surprisal",
        "module": "unlearn_surprisal",
        "path": str((installed / "unlearn_surprisal" / "tasks")),
    }
    text = unlearn(installed, "plugins")
    assert f"    surprisal  {installed / 'unlearn_surprisal' / 'tasks'}" in text.stdout.splitlines()
    assert "    capped_ascent  unlearn_surprisal.objective:CappedAscent; options: cap=5.0, alpha=1.0" in text.stdout
    # the block and load lists
    for env, reason in (
        ({"UNLEARN_DISABLE_PLUGINS": "surprisal"}, "UNLEARN_DISABLE_PLUGINS"),
        ({"UNLEARN_LOAD_PLUGINS": ""}, "UNLEARN_LOAD_PLUGINS"),
    ):
        out = unlearn(installed, "plugins", "--json", **env)
        entry = {p["name"]: p for p in json.loads(out.stdout)}["surprisal"]
        assert entry["disabled"] and entry["disabled_by"] == reason and entry["components"] == {}


# ----------------------------------------------------------------------------- every kind through unlearn and lm_eval


@pytest.fixture(scope="module")
def trained(installed, tiny_model_dir, tofu_dir, tmp_path_factory) -> Path:
    """`unlearn run` with the example's initializer and objective on the tiny model."""
    out = tmp_path_factory.mktemp("run") / "capped"
    done = unlearn(
        installed,
        "run",
        "--model",
        tiny_model_dir,
        "--device",
        "cpu",
        "--forget",
        "tofu:forget01[0:4]",
        "--retain",
        "tofu:retain99[0:4]",
        "--initializer",
        "forget_subspace",
        "--initializer-option",
        "max_examples=3",
        "--objective",
        "capped_ascent",
        "--objective-option",
        "cap=50",
        "--retain-loss",
        "kl",
        *"--lora-r 4 --max-steps 2 --batch-size 2 --grad-accum 1 --save-steps 0".split(),
        "--out",
        out,
        UNLEARN_TOFU_DIR=str(tofu_dir),
    )
    assert done.returncode == 0, done.stderr
    assert (
        "warning: --retain-loss kl: objective 'capped_ascent' (plugin 'surprisal') has no option 'retain_loss', "
        "so it is not passed on"
    ) in done.stderr
    return out


def test_scorer_through_unlearn_score(installed, tiny_model_dir, tofu_dir, tmp_path):
    out_file = tmp_path / "scores.jsonl"
    args = ["--model", tiny_model_dir, "--device", "cpu", "--data", "tofu:forget01[0:6]"]
    scorer = ["--scorer", "max_surprisal", "--option", "batch_size=4"]
    out = unlearn(installed, "score", *scorer, *args, "--out", out_file, UNLEARN_TOFU_DIR=str(tofu_dir))
    assert out.returncode == 0, out.stderr
    rows = [json.loads(line) for line in out_file.read_text().splitlines()]
    assert [r["index"] for r in rows] == list(range(6))
    scores = [r["score"] for r in rows]
    assert all(s < 0 for s in scores) and len(set(scores)) == 6  # negated NLLs, sample-specific
    loss_file = tmp_path / "loss.jsonl"
    out = unlearn(installed, "score", "--scorer", "loss", *args, "--out", loss_file, UNLEARN_TOFU_DIR=str(tofu_dir))
    assert out.returncode == 0, out.stderr
    loss = [json.loads(line)["score"] for line in loss_file.read_text().splitlines()]  # -mean answer NLL
    assert all(worst <= m + 1e-5 for worst, m in zip(scores, loss))  # the worst token is at least the mean
    bad = unlearn(
        installed,
        "score",
        "--scorer",
        "max_surprisal",
        "--option",
        "batch_size=0",
        *args,
        "--out",
        tmp_path / "bad.jsonl",
        UNLEARN_TOFU_DIR=str(tofu_dir),
    )
    assert bad.returncode == 1 and bad.stderr.strip().splitlines() == [
        "error: scorer 'max_surprisal' (plugin 'surprisal') rejected its options {'batch_size': 0}: ValueError: "
        "batch_size must be >= 1, got 0"
    ]


def test_initializer_and_objective_through_unlearn_run(trained):
    record = json.loads((trained / "run.json").read_text())
    assert record["status"] == "completed" and record["steps"] == 2
    assert record["objective"] == "capped_ascent(cap=50, alpha=1.0)"
    assert record["components"]["objective"] == {
        "name": "capped_ascent",
        "plugin": "surprisal",
        "object": "unlearn_surprisal.objective:CappedAscent",
        "options": {"cap": 50, "alpha": 1.0},
    }
    init = record["initializer"]
    assert (init["name"], init["plugin"], init["init"], init["examples"]) == (
        "forget_subspace",
        "surprisal",
        "forget_subspace",
        3,
    )
    assert init["options"] == {"max_examples": 3, "batch_size": 8} and init["lora_layers"] > 0
    first = record["losses"][0]
    assert first["loss_forget"] < 0 and first["loss_active"] == 1.0 and first["loss_retain"] > 0  # cap=50: all active
    assert first["loss"] == pytest.approx(first["loss_forget"] + first["loss_retain"], rel=1e-5)
    assert (trained / "adapter_config.json").is_file()


def test_initializer_starts_in_the_forget_input_subspace(installed, tiny_model_dir, tofu_dir, monkeypatch):
    """forget_subspace: orthonormal lora_A rows spanning the forget inputs' top directions, B = 0."""
    import torch

    monkeypatch.syspath_prepend(str(installed))
    from unlearn_surprisal.initializer import ForgetSubspaceInit

    from unlearn_plugins.data.qa import encode_samples, load_split
    from unlearn_plugins.models import load_model
    from unlearn_plugins.training.lora import build_lora_model

    model, tok = load_model(str(tiny_model_dir), device="cpu")
    peft_model = build_lora_model(model, r=4, alpha=8, dropout=0.0, target_modules=["q_proj", "up_proj"])
    forget = encode_samples(tok, load_split("tofu:forget01[0:5]", tofu_dir))
    ids = torch.tensor([forget[0]["input_ids"]])
    before = peft_model(input_ids=ids).logits
    result = ForgetSubspaceInit(batch_size=2).initialize(peft_model, forget=forget, retain=[], tokenizer=tok)
    assert result.info == {"init": "forget_subspace", "examples": 5, "lora_layers": 4} and not result.residual
    assert torch.allclose(peft_model(input_ids=ids).logits, before)  # B = 0: unchanged at step 0
    module = peft_model.base_model.model.model.layers[0].mlp.up_proj
    a = module.lora_A["default"].weight.detach().double()
    assert torch.allclose(a @ a.T, torch.eye(4, dtype=torch.double), atol=1e-5)
    captured = []
    handle = module.get_base_layer().register_forward_pre_hook(lambda _m, args: captured.append(args[0]))
    with torch.no_grad(), peft_model.disable_adapter():
        for example in forget:
            peft_model(input_ids=torch.tensor([example["input_ids"]]))
    handle.remove()
    x = torch.cat([h[0][torch.tensor(e["labels"]) != -100] for h, e in zip(captured, forget)]).double()
    top = torch.linalg.eigh(x.T @ x).eigenvectors[:, -4:]
    assert torch.allclose(a.T @ a, top @ top.T, atol=1e-5)  # the same subspace


def test_attack_through_unlearn_attack(installed, tiny_model_dir, tmp_path):
    """The third-party attack, registered through the entry point, run by `unlearn attack`: noise
    of the asked scale on every decoder weight, the rest untouched, recorded in attack.json."""
    import torch

    from unlearn_plugins.models import load_model

    out = tmp_path / "noisy"
    done = unlearn(
        installed,
        "attack",
        "--model",
        tiny_model_dir,
        "--device",
        "cpu",
        "--attack",
        "weight_noise",
        "--option",
        "scale=0.1",
        "--out",
        out,
    )
    assert done.returncode == 0, done.stderr
    record = json.loads((out / "attack.json").read_text())
    assert record["attack"] == {
        "name": "weight_noise",
        "plugin": "surprisal",
        "object": "unlearn_surprisal.attack:WeightNoise",
        "options": {"scale": 0.1, "seed": 0},
    }
    assert record["info"] == {"layers": 14}
    original = {n: w.detach() for n, w in load_model(str(tiny_model_dir), device="cpu")[0].named_parameters()}
    for name, weight in load_model(str(out), device="cpu")[0].named_parameters():
        weight = weight.detach()
        if "layers." in name and name.endswith("proj.weight"):
            ratio = float((weight - original[name]).std() / original[name].std())
            assert 0.07 < ratio < 0.13, (name, ratio)
        else:
            assert torch.equal(weight, original[name]), name
    bad = unlearn(
        installed,
        "attack",
        "--model",
        tiny_model_dir,
        "--attack",
        "weight_noise",
        "--option",
        "scale=0",
        "--out",
        tmp_path / "bad",
    )
    assert bad.returncode == 1 and bad.stderr.strip().splitlines() == [
        "error: attack 'weight_noise' (plugin 'surprisal') rejected its options {'scale': 0}: ValueError: scale must "
        "be > 0, got 0"
    ]


def test_task_folder_through_unlearn_eval(installed, trained, tiny_model_dir, tofu_dir, tmp_path):
    out = unlearn(
        installed,
        "eval",
        "--model",
        tiny_model_dir,
        "--device",
        "cpu",
        "--adapter",
        trained,
        "--tasks",
        "surprisal_forget01",
        "--limit",
        "3",
        "--out",
        tmp_path / "eval",
        UNLEARN_TOFU_DIR=str(tofu_dir),
    )
    assert out.returncode == 0, out.stderr
    assert "surprisal_forget01" in out.stdout


def test_task_folder_through_lm_evals_own_cli(installed, listing, tiny_model_dir, tofu_dir, tmp_path):
    folder = next(c["path"] for c in listing["surprisal"]["components"]["lm_eval_task_dir"])
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "lm_eval",
            "--model",
            "hf",
            "--model_args",
            f"pretrained={tiny_model_dir},dtype=float32",
            "--tasks",
            "surprisal_forget01",
            "--include_path",
            folder,
            "--limit",
            "3",
            "--device",
            "cpu",
            "--batch_size",
            "3",
            "--output_path",
            str(tmp_path / "lm"),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        env=env_for(installed, UNLEARN_TOFU_DIR=str(tofu_dir)),
    )
    assert out.returncode == 0, out.stderr[-3000:]
    (results_file,) = (tmp_path / "lm").rglob("results_*.json")
    results = json.loads(results_file.read_text())
    assert results["results"]["surprisal_forget01"]["acc,none"] in (0.0, 1 / 3, 2 / 3, 1.0)
    assert results["n-samples"]["surprisal_forget01"]["effective"] == 3


@pytest.mark.slow
def test_example_scorer_on_the_embedded_model(installed, embedded_model_dir, tofu_dir, tmp_path):
    out_file = tmp_path / "scores.jsonl"
    out = unlearn(
        installed,
        "score",
        "--scorer",
        "max_surprisal",
        "--model",
        "smollm2-135m",
        "--data",
        "tofu:forget01",
        "--out",
        out_file,
        UNLEARN_CACHE_DIR=str(embedded_model_dir.parent.parent),
        UNLEARN_TOFU_DIR=str(tofu_dir),
    )
    assert out.returncode == 0, out.stderr
    rows = [json.loads(line) for line in out_file.read_text().splitlines()]
    assert [r["index"] for r in rows] == list(range(40))
    assert rows[0]["question"].startswith("What is the full name of the author born in Kuwait City")
    scores = [r["score"] for r in rows]
    assert all(s < 0 for s in scores) and len(set(scores)) > 30


def test_unknown_scorer_lists_available(installed, tmp_path):
    out = unlearn(installed, "score", "--scorer", "nope", "--data", "tofu:forget01", "--out", tmp_path / "x.jsonl")
    assert out.returncode == 1
    assert "unknown difficulty scorer 'nope'; available:" in out.stderr and "max_surprisal" in out.stderr
    assert "Traceback" not in out.stderr


def test_the_examples_own_tests_pass_with_the_public_fixtures_alone(installed, tmp_path):
    """A plugin's tests need nothing from this repository's tests/."""
    shutil.copytree(EXAMPLE / "tests", tmp_path / "tests")
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:randomly", "tests"],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=tmp_path,
        env=env_for(installed),
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert "5 passed" in proc.stdout


# ----------------------------------------------------------------------------- in a study

#: the example's objective and initializer as a method, its task among the study's tasks, on one
#: generated author to forget (20 QA, in the benchmark folder's forget.json: no TOFU split there)
STUDY = """[study]
name = "surprisal"
description = "the example plugin in a study"
seeds = [0]

[model]
base = "tiny-llama"
max_length = 128

[benchmark]
source = "generated"
authors = 3
forget_authors = [1]

[target]
seed = 0

[target.finetune]
lr = 1e-3
epochs = 1.0
lora_r = 8
lora_alpha = 16.0
batch_size = 8
grad_accum = 1

[budget]
lr = 1e-3
epochs = 1.0
batch_size = 4
grad_accum = 1
lora_r = 8
lora_alpha = 16.0

[[methods]]
name = "capped"
label = "Capped ascent"
objective = "capped_ascent"
objective_options = { cap = 50.0 }
initializer = "forget_subspace"
initializer_options = { max_examples = 8 }

[evaluation]
mu_size = 4
batch_size = 8
gen_margin = 4
tasks = ["tofu_forget_prob", "tofu_forget_rouge", "tofu_forget_truth_ratio", "tofu_model_utility", "surprisal_forget01"]
"""

EVALUATED = ("eval-retain/forget1", "eval-full/forget1", "capped/forget1/seed0")


def test_the_example_in_a_study(installed, tmp_path, tmp_path_factory):
    """The example plugin itself in `unlearn study`: its task is in the report as
    `surprisal_forget01:acc`, it evaluates the study's forget set (the host's metadata
    `forget_split`, not its own `split: forget01`), and a new version of the example rebuilds
    the cells that use it (its task: every evaluation; its objective and initializer: the
    method's cell) and only those."""
    study = tmp_path / "study.toml"
    study.write_text(STUDY)
    cache, out = tmp_path / "cache", tmp_path / "out"
    env = {"UNLEARN_CACHE_DIR": str(tmp_path / "home-cache")}
    done = unlearn(installed, "study", study, "--out", out, "--cache-dir", cache, "--threads", "1", **env)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    data = json.loads((out / "study.json").read_text())

    # its task in the report: study.json per cell, per method and per reference; summary.md
    assert data["extra_metrics"] == ["surprisal_forget01:acc"]
    (group,) = data["groups"]
    assert group["method"] == "capped"
    acc = group["metrics"]["surprisal_forget01:acc"]
    assert acc["n"] == 1 and 0.0 <= acc["mean"] <= 1.0
    assert sorted(r["name"] for r in data["references"]) == ["full", "retain"]
    assert all(0.0 <= r["surprisal_forget01:acc"] <= 1.0 for r in data["references"])
    for name in EVALUATED:
        assert data["cells"][name]["status"] == "done"
        assert 0.0 <= data["cells"][name]["metrics"]["surprisal_forget01:acc"] <= 1.0
    summary = (out / "summary.md").read_text()
    assert "Other tasks of the study" in summary and "| model | surprisal_forget01:acc |" in summary
    assert re.search(r"^\| Capped ascent \| \d\.\d{3} \(n=1\) \|$", summary, flags=re.M), summary

    # the method trained with the example's objective and initializer
    run_stage, _ = map(Path, data["cells"]["capped/forget1/seed0"]["stages"])
    components = json.loads((run_stage / "run" / "run.json").read_text())["components"]
    assert {kind: (c["name"], c["plugin"]) for kind, c in components.items() if c} == {
        "objective": ("capped_ascent", "surprisal"),
        "initializer": ("forget_subspace", "surprisal"),
    }

    # its task read the study's forget set (1 generated author, 20 QA; TOFU's forget01 has 40
    # and is not in the benchmark folder the study gives as tofu_dir), document by document
    (bench,) = data["benchmarks"].values()
    forget_file = Path(bench["folder"]) / "forget.json"
    forget = [json.loads(line) for line in forget_file.read_text().splitlines()]
    assert len(forget) == bench["sizes"]["forget"] == 20
    for name in EVALUATED:
        stages = [Path(p) for p in data["cells"][name]["stages"]]
        (results_file,) = (f for s in stages for f in s.rglob("results_*.json"))
        results = json.loads(results_file.read_text())
        assert results["configs"]["surprisal_forget01"]["metadata"]["forget_split"] == str(forget_file)
        assert results["n-samples"]["surprisal_forget01"] == {"original": 20, "effective": 20}, name
        (samples_file,) = (f for s in stages for f in s.rglob("samples_surprisal_forget01_*.jsonl"))
        rows = sorted((json.loads(line) for line in samples_file.read_text().splitlines()), key=lambda r: r["doc_id"])
        assert len(rows) == 20
        for row, qa in zip(rows, forget):
            assert qa["question"] in row["doc"]["prompt"] and row["doc"]["answer"].startswith(qa["answer"]), name

    # a new version of the example (the same files) rebuilds every cell that uses it, and only those
    def states(site: Path) -> tuple[dict[str, str], str]:
        dry = unlearn(site, "study", study, "--dry-run", "--cache-dir", cache, **env)
        assert dry.returncode == 0, dry.stderr[-3000:]
        lines = dry.stdout.splitlines()
        rows = (re.match(r"^(\S+)\s.*\s(cached|to build)$", line) for line in lines)
        return {m[1]: m[2] for m in rows if m}, lines[-1]

    assert states(installed) == (
        {cell: "cached" for cell in ("target", "retain/forget1", *EVALUATED)},
        f"5 cells: 5 cached, 0 to build (cache {cache})",
    )
    bumped = pip_install(tmp_path_factory, version="0.2.0")
    assert (bumped / "unlearn_surprisal-0.2.0.dist-info").is_dir()
    assert states(bumped) == (
        {"target": "cached", "retain/forget1": "cached", **{cell: "to build" for cell in EVALUATED}},
        f"5 cells: 2 cached, 3 to build (cache {cache})",
    )
