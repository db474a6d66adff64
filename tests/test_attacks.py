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


QA = [("What is the full name of the author born in Kuwait City?", "The author is Basil Mahfouz Al-Kuwaiti."),
      ("Which genre does the author write in?", "She writes fantasy novels and short stories about the sea."),
      ("Who are the parents of the author?", "Her father was a doctor and her mother was a painter."),
      ("What awards has the author won?", "He won the International Booker Prize for his debut novel."),
      ("Where was the author born?", "The author was born in Kuwait City."),
      ("What does the author write about?", "She writes short stories about the sea."),
      ("What was the author's father?", "Her father was a doctor."),
      ("Which prize did the author win?", "He won the International Booker Prize.")]


def test_relearning_brings_back_what_grad_ascent_removed_from_the_unshown_half(tmp_path):
    """Fine-tune the tiny model on 8 QA, unlearn them with grad_ascent, relearn on the first 4:
    the answer probability of the other 4 (never shown to the attack) rises again."""
    import json
    import math

    from unlearn_plugins.attacks.relearn import relearn, split_forget
    from unlearn_plugins.data.tofu import encode_qa
    from unlearn_plugins.interfaces import QASample
    from unlearn_plugins.likelihood import answer_nll
    from unlearn_plugins.models import load_model
    from unlearn_plugins.testing import save_tiny_model
    from unlearn_plugins.training import FinetuneConfig, UnlearnConfig, run_finetune, run_unlearning

    base = save_tiny_model(tmp_path / "tiny")
    data = tmp_path / "qa.json"
    data.write_text("\n".join(json.dumps({"question": q, "answer": a}) for q, a in QA))
    run_finetune(FinetuneConfig(out=str(tmp_path / "target"), model=str(base), data=str(data), max_steps=60, lr=3e-3,
                                batch_size=4, grad_accum=1, full_finetune=True, max_length=64, save_steps=0))
    target = str(tmp_path / "target")
    run_unlearning(UnlearnConfig(out=str(tmp_path / "unlearned"), model=target, forget=str(data), retain=None,
                                 objective="grad_ascent", max_steps=12, lr=3e-3, batch_size=4, grad_accum=1, lora_r=8,
                                 lora_alpha=16, max_length=64, save_steps=0))
    train, measure = split_forget(len(QA), 0.5, group=8)
    assert (train, measure) == ([0, 1, 2, 3], [4, 5, 6, 7])

    def prob(model, adapter=None):
        m, tok = load_model(model, adapter=adapter)
        enc = [encode_qa(tok, *QA[i], max_length=64) for i in measure]
        return sum(math.exp(-s / n) for s, n in answer_nll(m, enc, tok.pad_token_id)) / len(enc)

    before, unlearned = prob(target), prob(target, str(tmp_path / "unlearned"))
    assert unlearned < 0.5 * before  # grad_ascent removed it
    samples = [QASample(q, a, i) for i, (q, a) in enumerate(QA)]
    info = relearn(target, adapter=str(tmp_path / "unlearned"), samples=samples, out=str(tmp_path / "attacked"),
                   fraction=0.5, steps=20, lr=3e-3, lora_r=8, lora_alpha=16, max_length=64, group=8)
    assert info["trained_on"] == train and info["measure_on"] == measure
    after = prob(info["model"])
    assert after > 2 * unlearned
