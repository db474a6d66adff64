"""Fidelity of CE-U and of the MUSE baselines' KL-on-retain variants (GA_KLR, NPO_KLR) to
open-unlearning (d3d7cf9): on a tiny random Llama and a fixed padded batch, each loss equals the
reference code's formula, transcribed here (file and lines named; the reference is not imported)."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F

from unlearn_plugins import UNLEARNING_OBJECTIVE, create, list_components
from unlearn_plugins.errors import PluginLoadError, UnlearnError

IGNORE = -100
TOL = dict(rel=1e-6, abs=1e-6)

pytestmark = pytest.mark.usefixtures("single_thread")


def fixed_part(vocab: int, seed: int, prompt_lengths=(3, 5, 2), lengths=(10, 8, 7)) -> dict:
    """Right-padded batch: question tokens and padding masked in the labels, answers kept."""
    g = torch.Generator().manual_seed(seed)
    width = max(lengths)
    ids = torch.randint(3, vocab, (len(lengths), width), generator=g)
    attention = torch.zeros_like(ids)
    labels = torch.full_like(ids, IGNORE)
    for i, (p, n) in enumerate(zip(prompt_lengths, lengths)):
        attention[i, :n] = 1
        labels[i, p:n] = ids[i, p:n]
        ids[i, n:] = 0
    return {"input_ids": ids, "attention_mask": attention, "labels": labels}


@pytest.fixture
def setup(tiny_model, tiny_tokenizer):
    torch.manual_seed(0)
    model = tiny_model.float().train(False)
    reference = copy.deepcopy(model)
    with torch.no_grad():  # a reference that differs from the model, so the KL is not zero
        for p in reference.parameters():
            p.add_(0.05 * torch.randn_like(p))
    reference.requires_grad_(False)
    vocab = len(tiny_tokenizer)
    return model, reference, {"forget": fixed_part(vocab, 1), "retain": fixed_part(vocab, 2, (4, 1, 3))}


def logits_of(model, part):
    return model(input_ids=part["input_ids"], attention_mask=part["attention_mask"]).logits


# ----------------------------------------------------------------------------- transcribed reference


def reference_ceu(model, inputs, ignore_first_n_answer_tokens=1):
    """open-unlearning src/trainer/unlearn/ceu.py, compute_batch_ceu (lines 64-81) and
    cross_entropy_unlearning_loss (lines 7-61)."""
    logits = logits_of(model, inputs)
    labels = inputs["labels"]
    valid_mask = labels != -100
    update_mask = (valid_mask.cumsum(dim=-1) <= ignore_first_n_answer_tokens) & valid_mask
    labels = labels.masked_fill(update_mask, -100)
    shifted_labels = labels[..., 1:].contiguous()
    shifted_logits = logits[..., :-1, :].contiguous()
    valid = shifted_labels != -100
    valid_logits, valid_labels = shifted_logits[valid], shifted_labels[valid]
    target = valid_logits.detach().clone()
    target.scatter_(dim=-1, index=valid_labels.unsqueeze(-1), value=float("-inf"))
    return F.cross_entropy(input=valid_logits, target=F.softmax(target, dim=-1))


def reference_nll(model, inputs):
    """model(**inputs).loss: the mean next-token cross-entropy over labelled positions, as
    open-unlearning's GradDiff reads it (src/trainer/unlearn/grad_diff.py line 45-46)."""
    logits = logits_of(model, inputs)[:, :-1, :]
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), inputs["labels"][:, 1:].reshape(-1), ignore_index=-100)


def reference_kl(model, target_model, inputs):
    """src/trainer/utils.py compute_kl_divergence (lines 17-31): kl_div(current log-probs,
    reference log-probs, batchmean, log_target). The rows are the answer positions (ours, a
    documented deviation: the reference takes every row of the padded batch)."""
    rows = inputs["labels"][:, 1:] != -100
    with torch.no_grad():
        ref = F.log_softmax(logits_of(target_model, inputs)[:, :-1, :][rows], dim=-1)
    cur = F.log_softmax(logits_of(model, inputs)[:, :-1, :][rows], dim=-1)
    return F.kl_div(cur, ref, reduction="batchmean", log_target=True)


def reference_npo(model, ref_model, inputs, beta):
    """src/trainer/utils.py compute_batch_nll (lines 34-44) and compute_dpo_loss with
    win_inputs=None (lines 47-67), as src/trainer/unlearn/npo.py calls it."""

    def batch_nll(m):
        logits = logits_of(m, inputs)[..., :-1, :]
        loss = torch.nn.CrossEntropyLoss(ignore_index=-100, reduction="none")
        return loss(logits.transpose(-1, -2), inputs["labels"][..., 1:]).sum(dim=-1)

    with torch.no_grad():
        lose_ref_loss = batch_nll(ref_model)
    lose_log_ratio = -(batch_nll(model) - lose_ref_loss)
    return -2 / beta * F.logsigmoid(beta * (0.0 - lose_log_ratio)).mean()


def grads(model, loss):
    model.zero_grad()
    loss.backward()
    return [p.grad.clone() for p in model.parameters() if p.grad is not None]


# ----------------------------------------------------------------------------- CE-U


@pytest.mark.parametrize("n", [1, 0, 2])
def test_ceu_equals_the_reference_loss_and_gradient(setup, n):
    model, _, batch = setup
    options = {} if n == 1 else {"ignore_first_n_answer_tokens": n}  # 1 is the default (configs/trainer/CEU.yaml)
    objective = create(UNLEARNING_OBJECTIVE, "ceu", **options)
    ours = objective.loss(model, {"forget": batch["forget"], "retain": None})
    expected = reference_ceu(model, batch["forget"], n)
    assert ours.item() == pytest.approx(expected.item(), **TOL)
    for a, b in zip(grads(model, ours), grads(model, expected), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)  # float32: a few ulps of ~1e-2 gradients


def test_ceu_needs_only_forget_data_and_checks_its_option():
    objective = create(UNLEARNING_OBJECTIVE, "ceu")
    assert objective.ignore_first_n_answer_tokens == 1 and objective.gamma == 1.0 and objective.alpha == 0.0
    assert not objective.needs_retain_data and not objective.needs_reference_model
    assert "ceu" in {c.name for c in list_components(UNLEARNING_OBJECTIVE)}
    for bad in (-1, 1.5, True):
        with pytest.raises((UnlearnError, PluginLoadError), match="ignore_first_n_answer_tokens"):
            create(UNLEARNING_OBJECTIVE, "ceu", ignore_first_n_answer_tokens=bad)


def test_ceu_on_a_batch_without_answer_tokens_is_zero_with_a_gradient(setup):
    model, _, batch = setup
    part = dict(batch["forget"], labels=torch.full_like(batch["forget"]["labels"], IGNORE))
    loss = create(UNLEARNING_OBJECTIVE, "ceu").loss(model, {"forget": part})
    assert loss.item() == 0.0 and loss.requires_grad


# ----------------------------------------------------------------------------- GA_KLR, NPO_KLR


def test_ga_klr_is_graddiff_with_a_kl_retain_term(setup):
    """MUSE's GA_KLR = open-unlearning GradDiff with retain_loss_type KL (grad_diff.py lines
    22-35 and 55-57): gamma * -NLL(forget) + alpha * KL(retain)."""
    model, reference, batch = setup
    expected = -reference_nll(model, batch["forget"]) + reference_kl(model, reference, batch["retain"])
    for name, options in (("grad_diff", {}), ("grad_ascent", {"alpha": 1.0})):
        objective = create(UNLEARNING_OBJECTIVE, name, retain_loss="kl", **options)
        assert objective.needs_reference_model and objective.needs_retain_data
        ours = objective.loss(model, batch, reference_model=reference)
        assert ours.item() == pytest.approx(expected.item(), **TOL), name
    for a, b in zip(grads(model, ours), grads(model, expected), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)  # float32: a few ulps of ~1e-2 gradients


def test_npo_klr_is_npo_with_a_kl_retain_term(setup):
    """MUSE's NPO_KLR = open-unlearning NPO (npo.py lines 12-32, beta 0.1 from
    configs/trainer/NPO.yaml) with retain_loss_type KL."""
    model, reference, batch = setup
    expected = reference_npo(model, reference, batch["forget"], 0.1) + reference_kl(model, reference, batch["retain"])
    objective = create(UNLEARNING_OBJECTIVE, "npo", retain_loss="kl")
    ours = objective.loss(model, batch, reference_model=reference)
    assert ours.item() == pytest.approx(expected.item(), **TOL)
    assert abs(objective.last_terms["retain"].item()) > 1e-4  # the KL term is really there
    for a, b in zip(grads(model, ours), grads(model, expected), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)  # float32: a few ulps of ~1e-2 gradients


def test_one_ceu_step_lowers_the_forget_answers_probability(setup):
    model, _, batch = setup
    part = batch["forget"]

    def answer_logprob():
        with torch.no_grad():
            logp = F.log_softmax(logits_of(model, part)[:, :-1, :], dim=-1)
        labels = part["labels"][:, 1:]
        mask = labels != IGNORE
        return logp[mask].gather(-1, labels[mask][:, None]).mean().item()

    before = answer_logprob()
    optimiser = torch.optim.SGD(model.parameters(), lr=0.5)
    create(UNLEARNING_OBJECTIVE, "ceu", ignore_first_n_answer_tokens=0).loss(model, {"forget": part}).backward()
    optimiser.step()
    assert answer_logprob() < before - 1e-3
