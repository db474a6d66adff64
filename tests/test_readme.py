"""README.md is a front door: short, with the sections a newcomer needs, its test command the one
CI runs, its component table the registered built-ins, its plugin example a working plugin, its
findings quotes of docs/results.md, and every docs page it links present. docs/cli.md names every
option of every verb."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

from unlearn_plugins.host import PluginHost, get_host
from unlearn_plugins.interfaces import ADAPTER_INITIALIZER, ATTACK, DIFFICULTY_SCORER, UNLEARNING_OBJECTIVE

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
SECTIONS = (
    "## Install",
    "## Two commands on a fresh machine",
    "## With your own model",
    "## On GPUs",
    "## Benchmarks",
    "## Components",
    "## A plugin in ten lines",
    "## What the studies found",
    "## Documentation",
)


def _flat(text: str) -> str:
    return " ".join(text.split())


def _section(title: str) -> str:
    start = README.index(title)
    end = README.find("\n## ", start + 1)
    return README[start : end if end != -1 else len(README)]


def test_the_readme_is_a_front_door():
    lines = README.splitlines()
    assert len(lines) <= 200, f"README.md has {len(lines)} lines; the reference manual belongs in docs/"
    headings = [line for line in lines if line.startswith("## ")]
    assert headings == list(SECTIONS), headings
    first_screen = "\n".join(lines[:20])
    assert "../shared" not in first_screen and "this machine kind" not in first_screen
    assert not re.search(r"\b[Ii]ssue \d|issue #", README), "history belongs in CHANGELOG.md and git"


def test_every_page_the_readme_links_exists():
    links = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", README)
    local = [link for link in links if "://" not in link]
    assert {"docs/cli.md", "docs/benchmarks.md", "docs/methods.md", "docs/plugins.md", "docs/study.md"} <= set(local)
    assert "docs/results.md" in local and "CHANGELOG.md" in local
    missing = sorted({link for link in local if not (ROOT / link).exists()})
    assert not missing, f"README.md links to missing pages: {missing}"


def test_the_readme_test_command_is_what_ci_runs():
    ci = (ROOT / ".ci" / "run").read_text().strip().splitlines()[-1]
    assert ci.startswith("bash .ci/setup && ")
    commands = re.findall(r"^bash \.ci/setup && .*$", _section("## Two commands on a fresh machine"), re.M)
    assert ci in commands, "README.md's test command differs from .ci/run's"
    assert "bash .ci/setup && .venv/bin/unlearn demo" in README


def test_the_demo_table_says_how_much_it_moves_between_cpus():
    text = _flat(_section("## Two commands on a fresh machine"))
    for said in ("ReGLU's Forget Quality 0.336 (here 0.571)", "IHL + FILA's 0.081 (here 0.336)",
                 "columns 0.468 / 0.572 (here 0.408 / 0.518)", "AMX"):  # fmt: skip
        assert said in text, said
    results = _flat((ROOT / "docs" / "results.md").read_text())
    for row in ("| ReGLU (rila + ihl + rol) | Forget Quality | 0.571 | 0.336 |",
                "| IHL + FILA | Forget Quality | 0.336 | 0.081 |",
                "| prob CUD-easy / prob CUD-hard | 0.408 / 0.518 | 0.468 / 0.572 |"):  # fmt: skip
        assert row in results, row


def test_the_component_table_is_the_registered_built_ins():
    host = get_host()
    rows = {
        "difficulty scorers": DIFFICULTY_SCORER,
        "adapter initializers": ADAPTER_INITIALIZER,
        "unlearning objectives": UNLEARNING_OBJECTIVE,
        "attacks": ATTACK,
    }
    table = _section("## Components")
    for label, kind in rows.items():
        (line,) = [line for line in table.splitlines() if line.startswith(f"| {label} |")]
        listed = set(re.findall(r"`([a-z0-9_]+)`", line.split("|")[3]))
        built_in = {c.name for c in host.list(kind) if host.plugins[c.plugin].source == "built-in"}
        assert listed == built_in, f"README's {label}: missing {built_in - listed}, unknown {listed - built_in}"


def test_the_task_names_in_the_component_table_exist():
    (line,) = [line for line in _section("## Components").splitlines() if line.startswith("| lm-eval tasks |")]
    names = set(re.findall(r"`([a-z0-9_]+)`", line.split("|")[3]))
    folders = (ROOT / "tasks", ROOT / "unlearn_plugins")
    yaml = " ".join(p.read_text() for folder in folders if folder.is_dir() for p in folder.rglob("*.yaml"))
    declared = set(re.findall(r"[a-z0-9_]+", yaml))
    assert names and not names - declared, f"README names tasks no task YAML declares: {sorted(names - declared)}"


def test_the_ten_line_plugin_works(tmp_path, monkeypatch):
    """The README's plugin, installed as an entry point, trains: its loss is a scalar with a gradient."""
    import importlib.metadata as md

    import torch

    from unlearn_plugins.testing import tiny_llama

    (block,) = re.findall(r"```python\n(.*?)```", _section("## A plugin in ten lines"), re.S)
    assert len([line for line in block.splitlines() if line.strip()]) <= 12
    (tmp_path / "readme_plugin.py").write_text(block)
    monkeypatch.syspath_prepend(str(tmp_path))
    sys.modules.pop("readme_plugin", None)
    host = PluginHost(entry_points=[md.EntryPoint(name="readme", value="readme_plugin", group="unlearn_plugins")])
    component = host.get(UNLEARNING_OBJECTIVE, "forget_ascent")
    assert component.plugin == "readme"
    objective = component.obj()
    model = tiny_llama()
    ids = torch.randint(0, 100, (2, 6))
    labels = ids.clone()
    labels[:, :3] = -100
    part = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": labels}
    loss = objective.loss(model, {"forget": part, "retain": dict(part)})
    assert loss.dim() == 0 and loss.requires_grad
    loss.backward()
    forget_only = objective.loss(model, {"forget": part})
    assert forget_only.item() < 0  # ascent: the negated NLL


def test_the_findings_quote_the_results_page():
    """Each quoted verdict of README's findings is a sentence of docs/results.md (whose sentences
    the study tests check against the records), and reglu_tofu_v2's is its generated verdict."""
    from unlearn_plugins.benchmarks.tofu.study import author_report as ar

    findings = _flat(_section("## What the studies found"))
    results = _flat((ROOT / "docs" / "results.md").read_text())
    quotes = re.findall(r'"(.+?)"', findings)
    assert len(quotes) >= 3
    for quote in quotes:
        assert quote in results, quote
    block = ar.verdict_block(json.loads((ROOT / "docs" / "study" / "reglu_tofu_v2" / "study.json").read_text()))
    headline = block.splitlines()[2]
    assert headline.startswith("**The claim does not hold") and headline in findings
    said = {  # README's figure: the sentence of docs/results.md it comes from
        "-0.037 [-0.068, -0.007]": "-0.037, 95% interval [-0.068, -0.007]",
        "smallest Holm p 0.459": "the smallest Holm p is 0.459",
        "+0.04 [-0.04, +0.13]": "the Spearman was +0.04 [-0.04, +0.13] (95%)",
        "-0.17 [-0.25, -0.09]": "between anchor pools -0.17 [-0.25, -0.09]",
        "(+0.5 points, interval -2.7 to +3.7) against the paper's -14.1": "(+0.5, interval -2.7 to +3.7)",
        "(AUC 0.87-1.00)": "almost perfectly (AUC 0.87-1.00",
    }
    for readme_form, results_form in said.items():
        assert readme_form in findings, readme_form
        assert results_form in results, results_form
    assert "The paper reports -14.1 points for CUD's hard sets" in results


def _options(parser) -> list[str]:
    out = []
    for action in parser._actions:
        long = [o for o in action.option_strings if o.startswith("--")]
        if long and long[0] not in ("--help", "--debug", "--verbosity"):
            out.append(long[0])
    return out


@pytest.mark.parametrize("page", ["cli.md"])
def test_docs_cli_names_every_option_of_every_verb(page):
    from unlearn_plugins import cli

    text = (ROOT / "docs" / page).read_text()
    missing = []
    for name, sub in cli.subcommands(cli.build_parser()).items():
        heading = re.search(rf"^## .*`unlearn {name}`.*$", text, re.M)
        assert heading, f"docs/cli.md has no section for `unlearn {name}`"
        end = text.find("\n## ", heading.end())
        section = text[heading.start() : end if end != -1 else len(text)]
        missing += [f"{name} {o}" for o in _options(sub) if f"`{o}" not in section]
    assert not missing, f"docs/cli.md does not describe: {', '.join(missing)}"


def _slug(heading: str) -> str:
    """GitHub's anchor of a Markdown heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_links_between_the_front_door_and_the_pages_land_on_a_heading():
    pages = [ROOT / "README.md"] + [ROOT / "docs" / f"{n}.md" for n in ("cli", "benchmarks", "results", "development")]
    broken = []
    for page in pages:
        for target, anchor in re.findall(r"\]\(([^)#\s]*\.md)?#([^)\s]+)\)", page.read_text()):
            path = (page.parent / target) if target else page
            if not path.is_file():
                broken.append(f"{page.name}: {target} missing")
                continue
            text = re.sub(r"```.*?```", "", path.read_text(), flags=re.S)
            slugs = {_slug(h) for h in re.findall(r"^#+ (.+)$", text, re.M)}
            if anchor not in slugs:
                broken.append(f"{page.relative_to(ROOT)}: {target or page.name}#{anchor}")
    assert not broken, "links to no heading: " + "; ".join(broken)


def test_the_gpu_sections_8b_figures_are_the_memory_pages():
    """The README's Llama-3-8B figures are rows of docs/memory.md's table (itself checked against
    `unlearn plan` by tests/test_memory_plan.py)."""
    memory = (ROOT / "docs" / "memory.md").read_text()
    gpu = _flat(_section("## On GPUs"))
    assert "Nothing here has run on a real GPU yet" in gpu
    for row, quoted in (
        ("| LoRA NPO (r 32, bf16 base, batch 4, 256 tokens) | 30.6 |", "LoRA NPO 30.6 GiB"),
        ("| full GradDiff, bf16 weights, adamw_bnb_8bit, checkpointing | 47.4 |", "checkpointing) 47.4"),
        ("| EAP-IG, 20 QA (CUD score matrices, max_rows 20) | 76.2 |", "EAP-IG of 20 QA 76.2"),
        ("| MRD fp64, one block at a time (default) | 35.8 |", "MRD 35.8"),
    ):
        assert row in memory and quoted in gpu, quoted
