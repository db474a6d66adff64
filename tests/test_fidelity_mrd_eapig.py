"""Fidelity of MRD's precision and of EAP-IG's ``mean`` baseline in ``inputs`` mode, each
against the reference formula computed here independently (hand-written fp64 forward of
tests/eap_reference.py), not with the code under test."""

from __future__ import annotations

import copy

import pytest
import torch
from eap_reference import _rms, reference_scores
from eap_reference import forward as ref_forward

from unlearn_plugins.circuits.eap_ig import EAPIG
from unlearn_plugins.data.qa import encode_qa, encode_samples, pad_batch
from unlearn_plugins.interfaces import QASample
from unlearn_plugins.scorers.mrd import mrd_scores

pytestmark = pytest.mark.usefixtures("single_thread")

SAMPLES = [
    QASample("Who are the parents of the author?", "Her father was a doctor.", 0),
    QASample("What awards has the author won?", "He won the International Booker Prize.", 1),
    QASample("Which genre does the author write in?", "She writes fantasy novels and short stories.", 2),
    QASample("Where was the author born?", "In a small town by the sea.", 3),
]
K, SIGMA, SEED = 3, 1e-5, 42


@pytest.fixture(scope="module")
def memorised(tiny_tokenizer):
    """The tiny model trained until it memorises the answers (mean answer NLL ~0.01): log p
    near 0, where fp32 rounding swamps the effect of a 1e-5 perturbation."""
    from unlearn_plugins.testing import tiny_llama

    model = tiny_llama(len(tiny_tokenizer))
    examples = encode_samples(tiny_tokenizer, SAMPLES)
    batch = pad_batch(examples, tiny_tokenizer.pad_token_id)
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    model.train()
    for _ in range(150):
        loss = model(**batch).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.eval()
    assert loss.item() < 0.05
    return model, examples


def _token_logp(m64, example):
    """fp64 log p of each answer token, from the hand-written forward (no fp32 anywhere)."""
    ids, labels = torch.tensor(example["input_ids"]), torch.tensor(example["labels"])
    with torch.no_grad():
        _, _, srcs = ref_forward(m64, ids, labels)
        resid = srcs["input"] + sum(srcs[f"attn{l}"] + srcs[f"m{l}"] for l in range(m64.config.num_hidden_layers))
        logits = _rms(resid, m64.model.norm.weight, m64.config.rms_norm_eps) @ m64.lm_head.weight.T
    target = labels[1:]
    keep = target != -100
    return torch.log_softmax(logits[:-1][keep], -1).gather(1, target[keep][:, None])[:, 0]


def _reference_mrd(model, examples):
    """|mean over k of sum over answer tokens of (log p - log p~) / log p|, all in fp64; the
    perturbation k is sigma x fp32 N(0, 1) draws of a CPU generator seeded SEED + k, in
    parameter order."""
    m64 = copy.deepcopy(model).double()
    clean = [_token_logp(m64, e) for e in examples]
    acc = torch.zeros(len(examples), dtype=torch.float64)
    for k in range(K):
        noisy = copy.deepcopy(m64)
        gen = torch.Generator().manual_seed(SEED + k)
        with torch.no_grad():
            for p, p0 in zip(noisy.parameters(), model.parameters()):
                p.copy_(p0.double() + SIGMA * torch.randn(p.shape, generator=gen).double())
        for i, e in enumerate(examples):
            lp, lpt = clean[i], _token_logp(noisy, e)
            ok = lp != 0
            acc[i] += ((lp[ok] - lpt[ok]) / lp[ok]).sum()
    return (acc / K).abs()


def test_mrd_equals_fp64_reference_where_fp32_is_off(memorised, tiny_tokenizer):
    model, examples = memorised
    want = _reference_mrd(model, examples)
    got = torch.tensor(
        mrd_scores(model, examples, tiny_tokenizer.pad_token_id, perturbations=K, sigma=SIGMA, seed=SEED, batch_size=4),
        dtype=torch.float64,
    )
    rel = ((got - want).abs() / want).max().item()
    assert rel < 1e-3, f"MRD vs fp64 reference: max relative difference {rel:.3g}"
    # the setting is one where precision matters: fp32 (the old arithmetic) is far off
    fp32 = torch.tensor(
        mrd_scores(
            model,
            examples,
            tiny_tokenizer.pad_token_id,
            perturbations=K,
            sigma=SIGMA,
            seed=SEED,
            batch_size=4,
            precision="fp32",
        ),
        dtype=torch.float64,
    )
    assert ((fp32 - want).abs() / want).max().item() > 1e-2


def test_mrd_is_independent_of_batch_size_and_threads(memorised, tiny_tokenizer):
    model, examples = memorised
    runs = {}
    for bs, threads in ((1, 1), (4, 1), (4, 2)):
        torch.set_num_threads(threads)
        runs[bs, threads] = torch.tensor(
            mrd_scores(
                model, examples, tiny_tokenizer.pad_token_id, perturbations=K, sigma=SIGMA, seed=SEED, batch_size=bs
            ),
            dtype=torch.float64,
        )
    torch.set_num_threads(1)
    base = runs[1, 1]
    assert (base > 0).all()
    for key, scores in runs.items():
        rel = ((scores - base).abs() / base).max().item()
        assert rel < 1e-3, f"batch size / threads {key}: max relative difference {rel:.3g}"


def test_mrd_leaves_the_model_untouched(memorised, tiny_tokenizer):
    model, examples = memorised
    before = [p.detach().clone() for p in model.parameters()]
    mrd_scores(model, examples, tiny_tokenizer.pad_token_id, perturbations=2, sigma=1e-3)
    assert all(torch.equal(p, b) for p, b in zip(model.parameters(), before))


# ----------------------------------------------------------------------------- EAP-IG mean baseline

QA = [
    ("Who are the parents of the author?", "Her father was a doctor."),
    ("What awards has the author won?", "He won the International Booker Prize for his debut novel."),
    ("Which genre does the author write in?", "She writes fantasy novels."),
]


@pytest.mark.parametrize("max_rows", [64, 1])  # corrupt sources captured in the IG pass / a separate forward
def test_eap_ig_mean_baseline_inputs_mode_equals_reference(tiny_model, tiny_tokenizer, max_rows):
    """Reference: IG over inputs from the corrupt input x' = the mean input embedding over the
    data set's tokens at every position (k/m, k = 0..m-1); a_u(corrupt) = the sources of the
    forward of x' itself (hannamw/EAP-IG: corrupt activations come from the corrupt input's
    forward)."""
    for p in tiny_model.parameters():
        p.requires_grad_(False)
    examples = [encode_qa(tiny_tokenizer, q, a) for q, a in QA]
    engine = EAPIG(tiny_model, steps=2, baseline="mean", max_rows=max_rows)
    assert engine.alphas == [0.0, 0.5]
    scores = engine.score(examples)
    table = tiny_model.model.embed_tokens.weight
    mean_emb = torch.cat([table[torch.tensor(e["input_ids"])] for e in examples]).mean(0)
    for i in range(len(examples)):
        ids, labels = torch.tensor(examples[i]["input_ids"]), torch.tensor(examples[i]["labels"])
        with torch.no_grad():
            _, _, corrupt = ref_forward(tiny_model, ids, labels, emb=mean_emb.expand(len(ids), -1).clone())
        ref = reference_scores(tiny_model, engine.graph, ids, labels, steps=2, corrupt=corrupt)
        got = scores[i].double()
        assert torch.all(got[~engine.graph.edge_mask] == 0)
        big = ref.abs() > 1e-3 * ref.abs().max()
        assert big.sum() >= 10
        worst = ((got - ref).abs()[big] / ref.abs()[big]).max().item()
        assert worst < 1e-4, f"sample {i}: max relative difference {worst:.3g} on {int(big.sum())} edges"
