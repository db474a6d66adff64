"""Attacks on forgotten knowledge, on the tiny model."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("torchao")

from unlearn_plugins.attacks.quantize import fake_quantize, group_for, quantize_model  # noqa: E402
from unlearn_plugins.errors import UnlearnError  # noqa: E402
from unlearn_plugins.testing import tiny_llama  # noqa: E402


def test_fake_quantize_uses_at_most_2_to_the_bits_levels_per_group():
    w = torch.randn(8, 64, generator=torch.Generator().manual_seed(0))
    q8, block = fake_quantize(w, bits=8)
    assert block == 64 and all(len(torch.unique(row)) <= 256 for row in q8)
    q4, block = fake_quantize(w, bits=4, group_size=32)
    assert block == 32
    for row in q4:
        for g in row.split(32):
            assert len(torch.unique(g)) <= 16
    # round to nearest: each weight moves at most half a step of its group
    step8 = w.abs().amax(1, keepdim=True) / 127.5
    assert bool(((q8 - w).abs() <= step8 / 2 + 1e-6).all())
    with pytest.raises(UnlearnError, match="bits must be 8 or 4"):
        fake_quantize(w, bits=3)


def test_group_size_falls_back_to_a_divisor_of_the_width():
    assert group_for(576, 128) == 64  # SmolLM2's hidden width
    assert group_for(1536, 128) == 128
    assert group_for(7, 128) == 7


def test_int8_keeps_the_logits_close_and_int4_moves_them_more():
    """Stated bound: int8 moves no logit of the tiny model by more than 2% of the logits'
    range; int4 moves them by more than int8 does, several times over."""
    ids = torch.randint(0, 384, (2, 24), generator=torch.Generator().manual_seed(1))
    model = tiny_llama(384, seed=5)
    with torch.no_grad():
        base = model(input_ids=ids).logits
    moved = {}
    for bits in (8, 4):
        m = tiny_llama(384, seed=5)
        info = quantize_model(m, bits=bits)
        assert info["layers"] == 2 * 7  # q k v o gate up down per layer
        with torch.no_grad():
            moved[bits] = float((m(input_ids=ids).logits - base).abs().max())
    span = float(base.max() - base.min())
    assert moved[8] < 0.02 * span
    assert moved[4] > 3 * moved[8]


QA = [
    ("What is the full name of the author born in Kuwait City?", "The author is Basil Mahfouz Al-Kuwaiti."),
    ("Which genre does the author write in?", "She writes fantasy novels and short stories about the sea."),
    ("Who are the parents of the author?", "Her father was a doctor and her mother was a painter."),
    ("What awards has the author won?", "He won the International Booker Prize for his debut novel."),
    ("Where was the author born?", "The author was born in Kuwait City."),
    ("What does the author write about?", "She writes short stories about the sea."),
    ("What was the author's father?", "Her father was a doctor."),
    ("Which prize did the author win?", "He won the International Booker Prize."),
]


def test_relearning_brings_back_what_grad_ascent_removed_from_the_unshown_half(tmp_path):
    """Fine-tune the tiny model on 8 QA, unlearn them with grad_ascent, relearn (the built-in
    attack, through run_attack) on the first 4: the answer probability of the other 4 (never
    shown to the attack, written to measure.json) rises again."""
    import json
    import math

    from unlearn_plugins.attacks.relearn import split_forget
    from unlearn_plugins.attacks.run import run_attack
    from unlearn_plugins.data.qa import encode_qa, load_split
    from unlearn_plugins.likelihood import answer_nll
    from unlearn_plugins.models import load_model
    from unlearn_plugins.testing import save_tiny_model
    from unlearn_plugins.training import FinetuneConfig, UnlearnConfig, run_finetune, run_unlearning

    base = save_tiny_model(tmp_path / "tiny")
    data = tmp_path / "qa.json"
    data.write_text("\n".join(json.dumps({"question": q, "answer": a}) for q, a in QA))
    sizes = {"lr": 3e-3, "batch_size": 4, "grad_accum": 1, "max_length": 64, "save_steps": 0}
    target = str(tmp_path / "target")
    run_finetune(FinetuneConfig(out=target, model=str(base), data=str(data), max_steps=60, full_finetune=True, **sizes))
    lora = {"lora_r": 8, "lora_alpha": 16}
    unlearn = {"forget": str(data), "retain": None, "objective": "grad_ascent", "max_steps": 12, **lora, **sizes}
    run_unlearning(UnlearnConfig(out=str(tmp_path / "unlearned"), model=target, **unlearn))
    train, measure = split_forget(len(QA), 0.5, group=8)
    assert (train, measure) == ([0, 1, 2, 3], [4, 5, 6, 7])

    def prob(model, adapter=None):
        m, tok = load_model(model, adapter=adapter)
        enc = [encode_qa(tok, *QA[i], max_length=64) for i in measure]
        return sum(math.exp(-s / n) for s, n in answer_nll(m, enc, tok.pad_token_id)) / len(enc)

    before, unlearned = prob(target), prob(target, str(tmp_path / "unlearned"))
    assert unlearned < 0.5 * before  # grad_ascent removed it
    options = {"steps": 20, "lr": 3e-3, "lora_r": 8, "lora_alpha": 16, "max_length": 64, "group": 8}
    attacked = run_attack(
        "relearn",
        model=target,
        adapter=str(tmp_path / "unlearned"),
        forget=str(data),
        out=tmp_path / "attacked",
        device="cpu",
        options=options,
    )
    record = attacked.record
    assert record["info"]["trained_on"] == train and record["measure_on"] == measure
    assert [s.question for s in load_split(attacked.measure_split)] == [QA[i][0] for i in measure]
    assert prob(str(attacked.folder)) > 2 * unlearned


# ----------------------------------------------------------------------------- unlearn attack


def cli(*argv) -> int:
    from unlearn_plugins.cli import main

    return main([str(a) for a in argv])


def test_unlearn_attack_quantize_writes_a_model_eval_can_load(tiny_model_dir, tmp_path, capsys):
    """int8 through the CLI: an ordinary model folder (and attack.json) whose decoder weights take at
    most 256 values per output row and moved, within half a step, from the original ones."""
    import json

    from unlearn_plugins.models import load_model

    out = tmp_path / "int8"
    quantize = ["--attack", "quantize", "--option", "bits=8", "--out", out]
    assert cli("attack", "--model", tiny_model_dir, "--device", "cpu", *quantize) == 0
    assert "measure it: unlearn eval --model" in capsys.readouterr().out
    record = json.loads((out / "attack.json").read_text())
    attack = {"name": "quantize", "plugin": "builtin-attacks", "options": {"bits": 8, "group_size": 128}}
    assert record["attack"] == {**attack, "object": "unlearn_plugins.attacks.quantize:Quantize"}
    assert record["info"] == {"bits": 8, "scheme": "symmetric", "layers": 14, "group_size": "per output channel"}
    assert record["dtype"] == "float32" and record["measure_split"] is None
    original, _ = load_model(str(tiny_model_dir), device="cpu")
    attacked, _ = load_model(str(out), device="cpu")
    before = dict(original.named_parameters())
    for name, weight in attacked.named_parameters():
        if "layers." in name and name.endswith("proj.weight"):
            assert all(len(torch.unique(row)) <= 256 for row in weight)
            step = before[name].abs().amax(1, keepdim=True) / 127.5
            assert bool(((weight - before[name]).abs() <= step / 2 + 1e-6).all())
            assert not torch.equal(weight, before[name])
        else:  # embeddings and norms stay
            assert torch.equal(weight, before[name]), name
    assert not list(tmp_path.glob(".int8*"))  # no staging folder or lock left


def test_unlearn_attack_input_errors_are_one_line(tiny_model_dir, tmp_path, capsys):
    base = ["attack", "--model", tiny_model_dir, "--device", "cpu"]
    cases = [
        (["--attack", "nope", "--out", tmp_path / "a"], "error: unknown attack 'nope'; available: quantize, relearn"),
        (
            ["--attack", "quantize", "--option", "bits=3", "--out", tmp_path / "a"],
            "error: attack 'quantize' (plugin 'builtin-attacks') rejected its options {'bits': 3}: ValueError: bits must "
            "be 8 or 4, got 3",
        ),
        (
            ["--attack", "relearn", "--out", tmp_path / "a"],
            "error: attack 'relearn' (plugin 'builtin-attacks') needs the forget set: give --forget tofu:SPLIT or a "
            "JSON-lines file in TOFU's format",
        ),
        (["--attack", "relearn", "--forget", tmp_path / "missing.json", "--out", tmp_path / "a"], "missing.json"),
    ]
    for extra, expected in cases:
        assert cli(*base, *extra) == 1
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and expected in err[0], err
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("x")
    assert cli(*base, "--attack", "quantize", "--out", tmp_path / "full") == 1
    assert "already holds an attacked model or other files; give --overwrite" in capsys.readouterr().err
    assert not (tmp_path / "a").exists()


def test_attacks_are_listed_by_unlearn_plugins(capsys):
    import json

    assert cli("plugins", "--json") == 0
    plugins = {p["name"]: p for p in json.loads(capsys.readouterr().out)}
    attacks = {c["name"]: c for c in plugins["builtin-attacks"]["components"]["attack"]}
    assert sorted(attacks) == ["quantize", "relearn"]
    assert attacks["quantize"]["module"] == "unlearn_plugins.attacks.quantize:Quantize"
    assert [(o["name"], o["default"]) for o in attacks["quantize"]["options"]] == [("bits", 4), ("group_size", 128)]
    assert [o["name"] for o in attacks["relearn"]["options"]][:3] == ["fraction", "steps", "lr"]
    assert cli("plugins") == 0
    text = capsys.readouterr().out
    assert (
        "builtin-attacks [unlearn-plugins" in text
        and "    quantize  unlearn_plugins.attacks.quantize:Quantize; options: bits=4, group_size=128" in text
    )


def test_eval_robustness_reports_the_worst_case_next_to_the_plain_value(tiny_model_dir, tofu_dir, tmp_path, capsys):
    """Plain, the two probes and both built-in attacks on the tiny model: every row measured, the
    relearn attack on the forget rows it was not shown, the worst case the highest value."""
    import json

    from unlearn_plugins.evaluation.lm_eval_runner import read_outputs

    forget = tmp_path / "forget.json"
    forget.write_text((tofu_dir / "forget01_perturbed.json").read_text())
    out = tmp_path / "robust"
    assert (
        cli(
            "eval",
            "--model",
            tiny_model_dir,
            "--device",
            "cpu",
            "--robustness",
            "--forget-split",
            forget,
            "--tofu-dir",
            tofu_dir,
            "--limit",
            "4",
            "--max-gen-toks",
            "4",
            "--attack-option",
            "relearn.steps=2",
            "--attack-option",
            "relearn.max_length=128",
            "--out",
            out,
        )
        == 0
    )
    printed = capsys.readouterr().out
    summary = read_outputs(out).summary["robustness"]
    for metric in ("prob", "rougeL_recall"):
        entry = summary["metrics"][metric]
        assert set(entry["attacks"]) == {"paraphrase", "format", "quantize", "relearn"}
        values = {label: row["value"] for label, row in entry["attacks"].items()}
        assert all(v is not None for v in values.values()) and entry["plain"] is not None
        assert entry["worst"]["value"] == max(values.values())
    relearn = summary["metrics"]["prob"]["attacks"]["relearn"]
    assert relearn["samples"] == 4 and relearn["options"]["steps"] == 2
    record = json.loads((out / "attacks" / "relearn" / "model" / "attack.json").read_text())
    assert record["measure_on"] == list(range(10, 20)) + list(range(30, 40))  # the second half of each author
    assert not (out / "attacks" / "relearn" / "model" / "model.safetensors").exists()  # weights removed
    assert read_outputs(out / "attacks" / "quantize").summary["attack"]["info"]["bits"] == 4
    assert "|worstcase(attack-aware)|" in printed.replace(" ", "")
    assert (
        cli(
            "eval",
            "--model",
            tiny_model_dir,
            "--robustness",
            "--forget-split",
            forget,
            "--attack-option",
            "quantize.colour=1",
            "--out",
            tmp_path / "bad",
        )
        == 1
    )
    assert "rejected its options {'colour': 1}" in capsys.readouterr().err
