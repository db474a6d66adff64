"""MRD scorer: the definition recomputed independently, the model left untouched, bf16 input,
clipping, options (precision: tests/test_fidelity_mrd_eapig.py)."""

from __future__ import annotations

import copy

import pytest
import torch

from unlearn_plugins.data.qa import encode_samples
from unlearn_plugins.errors import UnlearnError
from unlearn_plugins.interfaces import QASample
from unlearn_plugins.scorers.mrd import MRDScorer, mrd_scores

SAMPLES = [
    QASample("Who are the parents of the author?", "Her father was a doctor.", 0),
    QASample("What awards has the author won?", "He won the International Booker Prize.", 1),
    QASample("Which genre does the author write in?", "She writes fantasy novels and short stories.", 2),
]


def per_token_logp(model, example):
    ids = torch.tensor([example["input_ids"]])
    labels = torch.tensor(example["labels"])
    with torch.no_grad():
        logp = torch.log_softmax(model(ids).logits[0, :-1].double(), -1)
    target = labels[1:]
    keep = target != -100
    return logp[keep].gather(1, target[keep][:, None])[:, 0]


def perturbed(model, sigma, seed):
    """A copy of ``model`` plus sigma x N(0, 1) noise drawn from a CPU generator seeded ``seed``,
    in parameter order (as the scorer draws it)."""
    noisy = copy.deepcopy(model)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in noisy.parameters():
            p.add_(sigma * torch.randn(p.shape, generator=gen))
    return noisy


def test_mrd_matches_the_definition(tiny_model, tiny_tokenizer):
    examples = encode_samples(tiny_tokenizer, SAMPLES)
    K, sigma, seed = 3, 1e-3, 7
    got = mrd_scores(
        tiny_model, examples, tiny_tokenizer.pad_token_id, perturbations=K, sigma=sigma, seed=seed, batch_size=2
    )
    # independently: perturbed copies with the same seeded noise, one sample at a time
    clean = [per_token_logp(tiny_model, e) for e in examples]
    acc = torch.zeros(len(examples), dtype=torch.float64)
    for k in range(K):
        noisy = perturbed(tiny_model, sigma, seed + k)
        for i, e in enumerate(examples):
            lp, lpt = clean[i], per_token_logp(noisy, e)
            acc[i] += ((lp - lpt) / lp).sum()
    want = (acc / K).abs()
    assert torch.allclose(torch.tensor(got, dtype=torch.float64), want, rtol=1e-3, atol=1e-9)
    assert len(set(got)) == 3 and min(got) > 0


def test_model_is_untouched_and_zero_noise_gives_zero(tiny_model, tiny_tokenizer):
    before = {n: p.detach().clone() for n, p in tiny_model.named_parameters()}
    examples = encode_samples(tiny_tokenizer, SAMPLES)
    for precision in ("fp64", "fp32"):
        mrd_scores(tiny_model, examples, tiny_tokenizer.pad_token_id, perturbations=4, sigma=1e-5, precision=precision)
    for n, p in tiny_model.named_parameters():
        assert torch.equal(p, before[n]), n  # the scorer perturbs a copy
    assert mrd_scores(tiny_model, examples, tiny_tokenizer.pad_token_id, perturbations=2, sigma=0.0) == [0.0] * 3


def test_bf16_model_is_scored_on_an_upcast_copy_and_left_untouched(tiny_model, tiny_tokenizer):
    examples = encode_samples(tiny_tokenizer, SAMPLES[:2])
    bf16 = copy.deepcopy(tiny_model).to(torch.bfloat16)
    want = mrd_scores(copy.deepcopy(bf16).float(), examples, tiny_tokenizer.pad_token_id, perturbations=2)
    got = mrd_scores(bf16, examples, tiny_tokenizer.pad_token_id, perturbations=2)
    assert got == pytest.approx(want, rel=1e-9)
    assert all(p.dtype == torch.bfloat16 for p in bf16.parameters())
    assert all(v > 0 for v in got)  # sigma = 1e-5 is visible in the upcast copy


def test_layer_by_layer_equals_the_whole_copy(tiny_model, tiny_tokenizer):
    """chunk="layer" (one decoder block in the scoring precision at a time, the default) gives
    the scores of a whole copy to the bit, in both precisions and for a bf16 model, and leaves
    the model as it was (weights, dtype, norms, mode)."""
    examples = encode_samples(tiny_tokenizer, SAMPLES)
    pad = tiny_tokenizer.pad_token_id
    bf16 = copy.deepcopy(tiny_model).to(torch.bfloat16)
    for model in (tiny_model, bf16):
        before = {n: p.detach().clone() for n, p in model.named_parameters()}
        forwards = {n: type(m).forward for n, m in model.named_modules()}
        model.train()
        for precision in ("fp64", "fp32"):
            whole = mrd_scores(model, examples, pad, perturbations=3, precision=precision, chunk="model", batch_size=2)
            layer = mrd_scores(model, examples, pad, perturbations=3, precision=precision, chunk="layer", batch_size=2)
            assert layer == whole, precision
        assert model.training
        for n, p in model.named_parameters():
            assert torch.equal(p, before[n]) and p.dtype == before[n].dtype, n
        assert all("forward" not in vars(m) for m in model.modules())  # the fp64 norms undone
        assert {n: type(m).forward for n, m in model.named_modules()} == forwards
        model.eval()
    with pytest.raises(UnlearnError, match="chunk"):
        MRDScorer(chunk="rows")


def test_clip_and_registered_scorer(tiny_model, tiny_tokenizer):
    from unlearn_plugins.host import create
    from unlearn_plugins.interfaces import DIFFICULTY_SCORER
    from unlearn_plugins.scoring import score_samples

    scorer = create(DIFFICULTY_SCORER, "mrd", perturbations=2, clip=1e-12)
    assert isinstance(scorer, MRDScorer)
    rows = score_samples(scorer, SAMPLES, model=tiny_model, tokenizer=tiny_tokenizer, scorer_name="mrd")
    assert [r["index"] for r in rows] == [0, 1, 2] and all(0 < r["score"] <= 1e-12 for r in rows)
    with pytest.raises(UnlearnError, match="perturbation"):
        mrd_scores(tiny_model, [], 0, perturbations=0)
    with pytest.raises(UnlearnError, match="precision: 'bf16'"):
        create(DIFFICULTY_SCORER, "mrd", precision="bf16")
