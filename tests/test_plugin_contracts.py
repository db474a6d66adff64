"""What the host promises a plugin, and what it checks of one.

A third-party plugin module is written to a temporary folder and loaded through an entry point,
then used through the `unlearn` CLI on the tiny model: options are declared, listed and checked
the same way for every component; `--retain-loss` reaches only objectives that take it; run.json
records a plugin component by name and options; and a component that raises or returns the wrong
thing fails with one `error:` line naming it and its plugin, with nothing half-written."""

from __future__ import annotations

import importlib.metadata as md
import json
import sys
import textwrap
from pathlib import Path

import pytest

import unlearn_plugins
from unlearn_plugins.cli import main
from unlearn_plugins.errors import PluginError, UnlearnError
from unlearn_plugins.host import PluginHost, get_host
from unlearn_plugins.interfaces import QASample

pytestmark = pytest.mark.usefixtures("single_thread")

PLUGIN = '''
from dataclasses import dataclass, field
from typing import Annotated

from unlearn_plugins import InitResult, hookimpl
from unlearn_plugins.likelihood import token_nll


def forget_nll(model, batch):
    part = batch["forget"]
    logits = model(input_ids=part["input_ids"], attention_mask=part["attention_mask"]).logits
    nll, mask = token_nll(logits, part["labels"])
    return (nll * mask).sum() / mask.sum()


class FaultyScorer:
    """Misbehaves as told."""

    def __init__(self, mode: Annotated[str, "what to do wrong"] = "ok"):
        self.mode = mode

    def score(self, samples, *, model, tokenizer):
        n = len(samples)
        if self.mode == "raise":
            raise RuntimeError("scorer exploded")
        return {"none": None, "inf": [float("inf")] * n, "text": ["0.5"] * n, "bool": [True] * n,
                "short": [1.0] * (n - 1), "index": [{"score": 1.0, "index": 99}] * n,
                "question": [{"score": 1.0, "question": "?"}] * n}.get(self.mode, [1.0] * n)


class PlainObjective:
    """A plain class with keyword options and no __repr__: gradient ascent scaled by `scale`."""

    needs_reference_model = False

    def __init__(self, scale: Annotated[float, "multiplies the forget NLL"] = 1.0):
        self.scale = scale

    def loss(self, model, batch, reference_model=None):
        return -self.scale * forget_nll(model, batch)


@dataclass
class FaultyObjective:
    returns: str = field(default="float", metadata={"help": "what loss() returns"})
    needs_reference_model = False

    def loss(self, model, batch, reference_model=None):
        value = forget_nll(model, batch)
        if self.returns == "raise":
            raise ValueError("objective exploded")
        return {"float": lambda: float(value), "vector": lambda: value.repeat(3),
                "detached": lambda: value.detach()}[self.returns]()


@dataclass
class RetainHungry:
    """Needs retain data, and has no alpha."""

    needs_reference_model = False
    needs_retain_data = True

    def loss(self, model, batch, reference_model=None):
        return forget_nll(model, batch)


@dataclass
class PickyObjective:
    cap: float = field(default=1.0, metadata={"help": "a positive number"})
    needs_reference_model = False

    def __post_init__(self):
        if self.cap <= 0:
            raise ValueError(f"cap must be > 0, got {self.cap}")

    def loss(self, model, batch, reference_model=None):
        return forget_nll(model, batch)


class FaultyInit:
    def __init__(self, returns: str = "raise"):
        self.returns = returns

    def initialize(self, peft_model, *, forget, retain, tokenizer):
        if self.returns == "raise":
            raise RuntimeError("initializer exploded")
        return {"init": "not an InitResult"}


@hookimpl
def register_difficulty_scorers(register):
    register("faulty", FaultyScorer)


@hookimpl
def register_unlearning_objectives(register):
    register("plain", PlainObjective)
    register("faulty_objective", FaultyObjective)
    register("retain_hungry", RetainHungry)
    register("picky", PickyObjective)


@hookimpl
def register_adapter_initializers(register):
    register("faulty_init", FaultyInit)
'''


@pytest.fixture
def plugin(tmp_path_factory, monkeypatch):
    """The plugin above, installed as entry point `contracts` (module contracts_plugin)."""
    folder = tmp_path_factory.mktemp("plugin")
    (folder / "contracts_plugin.py").write_text(textwrap.dedent(PLUGIN))
    monkeypatch.syspath_prepend(str(folder))
    sys.modules.pop("contracts_plugin", None)
    ep = md.EntryPoint(name="contracts", value="contracts_plugin", group="unlearn_plugins")
    unlearn_plugins.host._HOST = PluginHost(entry_points=[ep])
    return get_host()


@pytest.fixture
def data(tmp_path_factory):
    """Four forget and four retain samples in TOFU's JSON-lines format."""
    folder = tmp_path_factory.mktemp("data")
    for name, who in (("forget", "Basil"), ("retain", "Maria")):
        rows = [
            {"question": f"What did {who} write in year {i}?", "answer": f"{who} wrote book number {i}."}
            for i in range(4)
        ]
        (folder / f"{name}.json").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return folder


def snapshot(root: Path) -> dict[str, bytes | None]:
    return {str(p.relative_to(root)): (p.read_bytes() if p.is_file() else None) for p in sorted(root.rglob("*"))}


def one_error(capsys, *args) -> str:
    """Run the CLI: exit 1 with exactly one `error:` line on stderr."""
    code = main([str(a) for a in args])
    err = capsys.readouterr().err
    lines = [line for line in err.strip().splitlines() if "it/s]" not in line]
    assert code == 1 and len(lines) == 1 and lines[0].startswith("error: "), err
    assert "Traceback" not in err
    return lines[0]


def run_args(model, data, out, *extra):
    return [
        "run",
        "--model",
        model,
        "--device",
        "cpu",
        "--forget",
        data / "forget.json",
        "--retain",
        data / "retain.json",
        "--out",
        out,
        "--max-steps",
        "1",
        "--batch-size",
        "2",
        "--grad-accum",
        "1",
        "--lora-r",
        "4",
        "--save-steps",
        "0",
        *extra,
    ]


# ----------------------------------------------------------------------------- options: declared, listed, checked


def test_options_are_listed_with_types_defaults_and_help(plugin):
    plain = plugin.get("unlearning_objective", "plain").to_json()
    assert plain == {
        "name": "plain",
        "module": "contracts_plugin:PlainObjective",
        "options": [{"name": "scale", "type": "float", "help": "multiplies the forget NLL", "default": 1.0}],
    }
    faulty = plugin.get("unlearning_objective", "faulty_objective").to_json()
    assert faulty["options"] == [{"name": "returns", "type": "str", "help": "what loss() returns", "default": "float"}]
    npo = {o["name"]: o for o in plugin.get("unlearning_objective", "npo").to_json()["options"]}
    assert npo["beta"]["default"] == 0.1 and npo["alpha"]["help"].startswith("weight of the retain term")
    rila = {o["name"]: o for o in plugin.get("adapter_initializer", "rila").to_json()["options"]}
    assert rila["batch_size"] == {
        "name": "batch_size",
        "type": "int",
        "help": "examples per forward pass while measuring",
        "default": 8,
    }


#: options each rejected by a component, and what the one error line says
BAD_OPTIONS = [
    (["--initializer", "rila", "--initializer-option", "batch_size=x"], "initializer 'rila' (plugin 'builtin-initializers') rejected its options {'batch_size': 'x'}: rila option batch_size must be an integer >= 1, got 'x'"),
    (["--initializer", "rila", "--initializer-option", "beta=2"], "initializer 'rila' (plugin 'builtin-initializers') rejected its options {'beta': 2}: rila option beta must be in [0, 1], got 2"),
    (["--objective", "npo", "--objective-option", "beta=-1"], "objective 'npo' (plugin 'builtin-objectives') rejected its options {'beta': -1}: option 'beta' must be a number > 0, got -1"),
    (["--objective", "npo", "--objective-option", "colour=1"], "objective 'npo' (plugin 'builtin-objectives') rejected its options {'colour': 1}: unknown option 'colour' (its options: beta, gamma, alpha, retain_loss)"),
    (["--objective", "plain", "--objective-option", "scale=big"], "objective 'plain' (plugin 'contracts') rejected its options {'scale': 'big'}: option 'scale' must be float, got 'big'"),
    (["--objective", "picky", "--objective-option", "cap=-1"], "objective 'picky' (plugin 'contracts') rejected its options {'cap': -1}: ValueError: cap must be > 0, got -1"),
    (["--objective", "npo", "--initializer", "fila", "--initializer-option", "svd=fast"], "initializer 'fila' (plugin 'builtin-initializers') rejected its options {'svd': 'fast'}: initializer 'fila': option 'svd' must be 'randomized' or 'exact', got 'fast'"),
]  # fmt: skip


@pytest.mark.parametrize("extra,message", BAD_OPTIONS)
def test_every_bad_option_fails_the_same_way(plugin, data, tiny_model_dir, tmp_path, capsys, extra, message):
    before = snapshot(tmp_path)
    assert one_error(capsys, *run_args(tiny_model_dir, data, tmp_path / "out", *extra)) == f"error: {message}"
    assert snapshot(tmp_path) == before


# ----------------------------------------------------------------------------- --retain-loss, --no-retain, run.json


def test_retain_loss_reaches_only_objectives_that_take_it(plugin):
    from unlearn_plugins.training.config import UnlearnConfig

    assert UnlearnConfig(objective="npo", retain_loss="kl").objective_kwargs() == {"retain_loss": "kl"}
    with pytest.warns(
        RuntimeWarning,
        match=r"^--retain-loss kl: objective 'plain' \(plugin 'contracts'\) has no "
        r"option 'retain_loss', so it is not passed on",
    ):
        kwargs = UnlearnConfig(objective="plain", retain_loss="kl", objective_options={"scale": 2.0}).objective_kwargs()
    assert kwargs == {"scale": 2.0}


def test_plugin_objective_trains_readably_recorded_with_retain_loss_given(
    plugin, data, tiny_model_dir, tmp_path, capsys
):
    out = tmp_path / "out"
    with pytest.warns(RuntimeWarning, match="has no option 'retain_loss'"):
        code = main(
            [
                str(a)
                for a in run_args(
                    tiny_model_dir,
                    data,
                    out,
                    "--objective",
                    "plain",
                    "--objective-option",
                    "scale=2",
                    "--retain-loss",
                    "kl",
                )
            ]
        )
    assert code == 0, capsys.readouterr().err
    text = (out / "run.json").read_text()
    record = json.loads(text)
    assert "object at 0x" not in text
    assert record["objective"] == "plain(scale=2)"
    assert record["components"]["objective"] == {
        "name": "plain",
        "plugin": "contracts",
        "object": "contracts_plugin:PlainObjective",
        "options": {"scale": 2},
    }
    assert record["components"]["initializer"]["name"] == "kaiming"


def test_no_retain_error_fits_the_objective(plugin, data, tiny_model_dir, tmp_path, capsys):
    line = one_error(
        capsys, *run_args(tiny_model_dir, data, tmp_path / "a", "--objective", "retain_hungry", "--no-retain")
    )
    assert line == (
        "error: objective 'retain_hungry' (plugin 'contracts') needs retain data (its needs_retain_data "
        "is true): give --retain"
    )
    line = one_error(capsys, *run_args(tiny_model_dir, data, tmp_path / "b", "--objective", "grad_diff", "--no-retain"))
    assert line == (
        "error: objective 'grad_diff' (plugin 'builtin-objectives') has a retain term (alpha=1.0; "
        "--objective-option alpha=0 drops it): give --retain"
    )


# ----------------------------------------------------------------------------- run-time errors name the plugin


@pytest.mark.parametrize(
    "mode,message",
    [
        ("raise", "scorer 'faulty' (plugin 'contracts') raised RuntimeError: scorer exploded"),
        ("none", "scorer 'faulty' (plugin 'contracts') returned None; score() must return one number per sample"),
        ("short", "scorer 'faulty' (plugin 'contracts') returned 3 scores for 4 samples"),
        ("inf", "scorer 'faulty' (plugin 'contracts') returned inf for sample 0 ("),
        ("text", "scorer 'faulty' (plugin 'contracts') returned a non-number '0.5' for sample 0 ("),
        ("bool", "scorer 'faulty' (plugin 'contracts') returned a non-number True for sample 0 ("),
        (
            "index",
            "scorer 'faulty' (plugin 'contracts') returned field 'index' for sample 0; the host writes index "
            "and question itself",
        ),
        ("question", "scorer 'faulty' (plugin 'contracts') returned field 'question' for sample 0"),
    ],
)
def test_scorer_faults_name_the_plugin_and_write_nothing(plugin, data, tiny_model_dir, tmp_path, capsys, mode, message):
    out = tmp_path / "scores"
    out.mkdir()
    line = one_error(
        capsys,
        "score",
        "--scorer",
        "faulty",
        "--option",
        f"mode={mode}",
        "--model",
        tiny_model_dir,
        "--device",
        "cpu",
        "--data",
        data / "forget.json",
        "--out",
        out / "scores.jsonl",
    )
    assert line.startswith(f"error: {message}")
    assert list(out.iterdir()) == []  # no scores, no partial file, no lock file


def test_score_rows_keep_the_host_fields():
    from unlearn_plugins.scoring import score_samples

    class Extra:
        def score(self, samples, *, model, tokenizer):
            return [{"score": 2, "detail": "x"} for _ in samples]

    rows = score_samples(Extra(), [QASample("q", "a", 7)], model=None, tokenizer=None, scorer_name="extra")
    assert rows == [{"index": 7, "question": "q", "score": 2.0, "detail": "x"}]


@pytest.mark.parametrize(
    "extra,message",
    [
        (
            ["--objective", "faulty_objective", "--objective-option", "returns=float"],
            "objective 'faulty_objective' (plugin 'contracts'): loss() returned a Python float (",
        ),
        (
            ["--objective", "faulty_objective", "--objective-option", "returns=vector"],
            "objective 'faulty_objective' (plugin 'contracts'): loss() returned a tensor of shape (3,), not a scalar",
        ),
        (
            ["--objective", "faulty_objective", "--objective-option", "returns=detached"],
            "objective 'faulty_objective' (plugin 'contracts'): loss() returned a tensor without a gradient",
        ),
        (
            ["--objective", "faulty_objective", "--objective-option", "returns=raise"],
            "objective 'faulty_objective' (plugin 'contracts'): loss() raised ValueError: objective exploded",
        ),
        (
            ["--objective", "npo", "--initializer", "faulty_init"],
            "initializer 'faulty_init' (plugin 'contracts'): initialize() raised RuntimeError: initializer exploded",
        ),
        (
            ["--objective", "npo", "--initializer", "faulty_init", "--initializer-option", "returns=dict"],
            "initializer 'faulty_init' (plugin 'contracts'): initialize() returned a dict; return an "
            "unlearn_plugins.InitResult or None",
        ),
    ],
)
def test_training_faults_name_the_plugin_and_leave_out_as_it_was(
    plugin, data, tiny_model_dir, tmp_path, capsys, extra, message
):
    """An earlier run in --out survives --overwrite: the objective is called on the first batch
    (and the initializer run) before anything is written."""
    out = tmp_path / "out"
    out.mkdir()
    (out / "run.json").write_text('{"status": "completed"}\n')
    before = snapshot(tmp_path)
    line = one_error(capsys, *run_args(tiny_model_dir, data, out, "--overwrite", *extra))
    assert line.startswith(f"error: {message}")
    assert snapshot(tmp_path) == before


def test_objective_contract_is_checked_at_every_step():
    """The same check guards later steps (CombinedObjective), not only the first batch."""
    import torch

    from unlearn_plugins.objectives.base import CombinedObjective

    class Sometimes:
        needs_reference_model = False

        def __init__(self):
            self.calls = 0

        def loss(self, model, batch, reference_model=None):
            self.calls += 1
            value = (model * 2).sum()
            return value if self.calls == 1 else value.item()

    combined = CombinedObjective(Sometimes(), labels=["objective 'sometimes' (plugin 'p')"])
    weight = torch.ones(2, requires_grad=True)
    assert combined.loss(weight, {}).requires_grad
    with pytest.raises(PluginError, match=r"^objective 'sometimes' \(plugin 'p'\): loss\(\) returned a Python float"):
        combined.loss(weight, {})
    with pytest.raises(UnlearnError):  # PluginError is an UnlearnError: the CLI prints it on one line
        combined.loss(weight, {})
