"""Membership-inference statistics against independent computations on a tiny model: each
attack's per-sample score recomputed one sample at a time from the plain forward pass (positions
from the encoding, not from the label mask), the AUC from the Mann-Whitney U statistic, and
privleak's fixed points."""

from __future__ import annotations

import math
import zlib

import numpy as np
import pytest
import torch

from unlearn_plugins.data.qa import encode_qa, prompt_ids
from unlearn_plugins.errors import UnlearnError
from unlearn_plugins.evaluation import mia
from unlearn_plugins.testing import tiny_llama, tiny_tokenizer

QA = [
    ("What is the full name of the author born in Kuwait City?", "The author is Basil Mahfouz Al-Kuwaiti."),
    ("Which genre does the author write in?", "She writes fantasy novels."),
    ("Who are the parents of the author?", "Her father was a doctor and her mother was a painter."),
    ("What awards has the author won?", "He won the International Booker Prize."),
    ("What is the capital of France?", "The capital of France is Paris."),
]


@pytest.fixture(scope="module")
def setup():
    tok = tiny_tokenizer()
    model = tiny_llama(len(tok), seed=3)
    examples = [encode_qa(tok, q, a, max_length=128) for q, a in QA]
    return tok, model, examples


def per_token_logprobs(model, tok, question, answer):
    """Log-probability of each answer token (the end token included last) and the full
    distribution before it, from one unpadded forward pass."""
    prompt = prompt_ids(tok, question)
    ex = encode_qa(tok, question, answer, max_length=128)
    ids = torch.tensor([ex["input_ids"]])
    with torch.no_grad():
        logp = torch.log_softmax(model(input_ids=ids).logits[0].double(), -1)
    start = len(prompt)
    rows = [logp[t - 1] for t in range(start, len(ex["input_ids"]))]
    tokens = [float(r[ex["input_ids"][t]]) for r, t in zip(rows, range(start, len(ex["input_ids"])))]
    return tokens, rows


def test_loss_zlib_min_k_and_min_k_plus_plus_match_a_per_sample_computation(setup):
    tok, model, examples = setup
    got = mia.sample_statistics(
        model,
        examples,
        tok.pad_token_id,
        attacks=["loss", "zlib", "min_k", "min_k++"],
        texts=[a for _, a in QA],
        k=0.4,
        batch_size=3,
    )
    for i, (q, a) in enumerate(QA):
        tokens, rows = per_token_logprobs(model, tok, q, a)
        loss = -sum(tokens) / len(tokens)  # every answer token, the end token too
        assert got["loss"][i] == pytest.approx(loss, rel=1e-5)
        assert got["zlib"][i] == pytest.approx(loss / len(zlib.compress(a.encode())), rel=1e-5)
        body = tokens[:-1]  # the end token left out
        n = max(1, int(len(body) * 0.4))
        assert got["min_k"][i] == pytest.approx(-np.mean(sorted(body)[:n]), rel=1e-5)
        z = []
        for lp, row in zip(body, rows[:-1]):
            p = row.exp()
            mu = float((p * row).sum())
            var = max(float((p * row * row).sum()) - mu * mu, 1e-6)
            z.append((lp - mu) / math.sqrt(var))
        assert got["min_k++"][i] == pytest.approx(-np.mean(sorted(z)[:n]), rel=1e-4)
    # HF's own loss agrees with the "loss" attack
    ex = examples[0]
    with torch.no_grad():
        hf = model(input_ids=torch.tensor([ex["input_ids"]]), labels=torch.tensor([ex["labels"]])).loss
    assert got["loss"][0] == pytest.approx(float(hf), rel=1e-5)


def test_gradnorm_matches_autograd_and_leaves_the_model_as_it_was(setup):
    tok, model, examples = setup
    expected = []
    for i, (q, _a) in enumerate(QA[:2]):  # every parameter, frozen or not
        ex = examples[i]
        params = list(model.parameters())
        with torch.enable_grad():
            logp = torch.log_softmax(model(input_ids=torch.tensor([ex["input_ids"]])).logits[0], -1)
            start = len(prompt_ids(tok, q))
            end = len(ex["input_ids"]) - 1  # the end token left out
            loss = -torch.stack([logp[t - 1, ex["input_ids"][t]] for t in range(start, end)]).mean()
            grads = torch.autograd.grad(loss, params)
        expected.append(float(torch.stack([g.norm(2) for g in grads]).mean()))
    frozen = [n for n, q in model.named_parameters()][:3]
    for n, q in model.named_parameters():
        q.requires_grad_(n not in frozen)
    try:
        assert mia.gradnorm_scores(model, examples[:2], tok.pad_token_id, p=2) == pytest.approx(expected, rel=1e-4)
        assert [n for n, q in model.named_parameters() if not q.requires_grad] == frozen
        assert all(q.grad is None for q in model.parameters())
    finally:
        for q in model.parameters():
            q.requires_grad_(True)
    with pytest.raises(UnlearnError, match="p must be 1, 2 or inf"):
        mia.gradnorm_scores(model, examples[:1], tok.pad_token_id, p=3)


def test_reference_attack_and_exact_memorization(setup):
    tok, model, examples = setup
    other = tiny_llama(len(tok), seed=4)
    own = mia.sample_statistics(model, examples, tok.pad_token_id, attacks=["loss"])["loss"]
    ref = mia.sample_statistics(other, examples, tok.pad_token_id, attacks=["loss"])["loss"]
    assert mia.reference_scores(model, other, examples, tok.pad_token_id) == pytest.approx(
        [a - b for a, b in zip(own, ref)]
    )
    assert mia.reference_scores(model, model, examples, tok.pad_token_id) == pytest.approx([0.0] * len(QA))
    em = mia.exact_memorization(model, examples, tok.pad_token_id, batch_size=2)
    for i, (q, _a) in enumerate(QA):
        ex = examples[i]
        ids = torch.tensor([ex["input_ids"]])
        with torch.no_grad():
            pred = model(input_ids=ids).logits[0].argmax(-1)
        start, end = len(prompt_ids(tok, q)), len(ex["input_ids"]) - 1
        hits = [int(pred[t - 1]) == ex["input_ids"][t] for t in range(start, end)]
        assert em[i] == pytest.approx(sum(hits) / len(hits))


def test_auc_follows_open_unlearnings_convention_and_equals_mann_whitney():
    from scipy.stats import mannwhitneyu

    rng = np.random.default_rng(0)
    forget, holdout = rng.normal(1.0, 1, 30).tolist(), rng.normal(1.6, 1, 40).tolist()
    u = mannwhitneyu(holdout, forget).statistic  # holdout scores above forget scores
    assert mia.auc(forget, holdout) == pytest.approx(u / (30 * 40))
    assert mia.auc([0.1, 0.2], [1.0, 2.0]) == 1.0  # forget far more "trained on": AUC 1
    assert mia.auc([1.0, 2.0], [0.1, 0.2]) == 0.0
    with pytest.raises(UnlearnError, match="NaN/inf"):
        mia.auc([float("nan")], [1.0])


def test_privleak_is_zero_for_the_retain_model_and_signed_like_muse():
    assert mia.privleak(0.62, 0.62) == 0.0
    # an unlearned model whose forget set still looks trained on (AUC 0.9 vs the retain model's 0.5)
    assert mia.privleak(0.9, 0.5) == pytest.approx((0.1 - 0.5) / 0.5 * 100)
    assert mia.privleak(0.9, 0.5) < 0 < mia.privleak(0.3, 0.5)


def test_gradnorm_of_an_adapter_is_the_merged_models(setup):
    """On a PEFT model the score is over the base weights, whose gradient is the merged weights':
    the same value as on the model with the adapter merged in."""
    import copy

    from peft import LoraConfig, get_peft_model

    tok, model, examples = setup
    config = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "up_proj"], init_lora_weights=False)
    peft_model = get_peft_model(copy.deepcopy(model), config)
    peft_model.eval()
    with_adapter = mia.gradnorm_scores(peft_model, examples[:2], tok.pad_token_id)
    merged = peft_model.merge_and_unload()
    assert with_adapter == pytest.approx(mia.gradnorm_scores(merged, examples[:2], tok.pad_token_id), rel=1e-4)
    assert with_adapter != pytest.approx(mia.gradnorm_scores(model, examples[:2], tok.pad_token_id), rel=1e-3)
