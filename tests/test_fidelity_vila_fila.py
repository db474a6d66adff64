"""VILA and FILA against their reference formulas, written out here independently.

The reference (VILA's TOFU/vila.py + TOFU/forget.py, FILA's TOFU/measure_importance.py +
TOFU/forget.py) takes each batch's Hugging Face loss (mean over the batch's answer tokens),
weights its gradient by cnt = #(labels != -100), and divides by the token totals f_cnt / r_cnt.
Here the loss is the model's own ``labels=`` loss and the gradients come from
torch.autograd.grad, not from our accumulation code. The batch plan (which examples form each
batch) is taken from the initializer, so both sides see the same batches.
"""

from __future__ import annotations

import copy

import pytest
import torch

from unlearn_plugins.data.qa import encode_qa, pad_batch
from unlearn_plugins.errors import UnlearnError
from unlearn_plugins.initializers.fila import FILAInit, sample_batches
from unlearn_plugins.initializers.vila import VILAInit
from unlearn_plugins.training.lora import lora_layers

FORGET = [
    ("Who wrote the sea novels?", "Basil Mahfouz Al-Kuwaiti wrote them."),
    ("Which genre does the author write in?", "She writes fantasy novels."),
    ("What awards has the author won?", "He won the International Booker Prize."),
    ("Who are the parents of the author?", "Her father was a doctor."),
    ("Where was the author born?", "In Kuwait City."),
]
RETAIN = [
    ("What is the capital of France?", "The capital of France is Paris."),
    ("What did her mother do?", "Her mother was a painter."),
    ("What does the author write about?", "Short stories about the sea."),
    ("Which prize did the debut novel win?", "The Booker Prize."),
    ("Do you know the answer?", "I don't know the answer to that question."),
    ("What is the full name of the author?", "The author is Basil Mahfouz Al-Kuwaiti."),
]
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


@pytest.fixture(scope="module", autouse=True)
def _one_thread(single_thread):
    yield


def encoded(tok):
    return [encode_qa(tok, q, a) for q, a in FORGET], [encode_qa(tok, q, a) for q, a in RETAIN]


def lora(model, r=4, alpha=8, dropout=0.0):
    from peft import LoraConfig, get_peft_model

    return get_peft_model(model, LoraConfig(r=r, lora_alpha=alpha, lora_dropout=dropout, target_modules=TARGETS))


def rel_err(ours, ref):
    return float((ours.detach().double() - ref.detach().double()).abs().max() / ref.detach().double().abs().max())


def reference_moments(model, examples, index_batches, pad_token_id, params):
    """sum cnt g, sum cnt g^2 (g = grad of the HF mean-token loss) and sum cnt, per the reference."""
    s1 = [torch.zeros_like(p, dtype=torch.float64) for p in params]
    s2 = [torch.zeros_like(p, dtype=torch.float64) for p in params]
    total = 0
    for idx in index_batches:
        batch = pad_batch([examples[i] for i in idx], pad_token_id)
        loss = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], labels=batch["labels"]).loss
        grads = torch.autograd.grad(loss, params)
        cnt = int((batch["labels"] != -100).sum())
        for a, b, g in zip(s1, s2, grads):
            a += g.double() * cnt
            b += g.double().pow(2) * cnt
        total += cnt
    return s1, s2, total


def only_grads(model, params):
    for p in model.parameters():
        p.requires_grad_(False)
    for p in params:
        p.requires_grad_(True)


def test_vila_importance_matches_reference(tiny_model, tiny_tokenizer):
    tok = tiny_tokenizer
    forget, retain = encoded(tok)
    model = lora(tiny_model)
    init = VILAInit(dropout=0.0, passes=3, batch_size=2, seed=1)
    ours = init.importance(model, forget, retain, tok.pad_token_id)
    f_batches, r_batches = init.plan(forget, retain)
    assert len(f_batches) == 9 and len(r_batches) == 9  # 3 passes x ceil(5 / 2)

    # the LoRA weights importance() drew stay in place: the reference measures at them
    modules = lora_layers(model)
    params = [p for _, m in modules for p in (m.lora_A["default"].weight, m.lora_B["default"].weight)]
    assert all(abs(float(p.detach().std()) - 0.05) < 0.02 for p in params)  # N(0, 0.05^2), B not zero
    only_grads(model, params)
    f1, f2, f_cnt = reference_moments(model, forget, f_batches, tok.pad_token_id, params)
    r1, r2, r_cnt = reference_moments(model, retain, r_batches, tok.pad_token_id, params)
    var_f = [(b / f_cnt - (a / f_cnt).pow(2)).clamp(min=0) for a, b in zip(f1, f2)]
    var_r = [(b / r_cnt - (a / r_cnt).pow(2)).clamp(min=0) for a, b in zip(r1, r2)]
    assert f_cnt != r_cnt  # the double count normalisation is visible
    for k, (name, _) in enumerate(modules):
        vf_a, vf_b, vr_a, vr_b = var_f[2 * k], var_f[2 * k + 1], var_r[2 * k], var_r[2 * k + 1]
        ref = (vf_b @ vf_a / f_cnt) / (1e-5 + vr_b @ vr_a / r_cnt)
        assert rel_err(ours[name], ref) <= 1e-5, name
        old = (vf_b @ vf_a) / (1e-5 + 1.3 * (vr_b @ vr_a))  # the former formula
        assert rel_err(old, ref) > 1e-2


def test_vila_defaults_are_the_references_and_retain_weight_is_refused():
    init = VILAInit()
    assert (init.std, init.dropout, init.passes, init.batch_size, init.retain) == (0.05, 0.05, 10, 4, "paired")
    with pytest.raises(UnlearnError, match="retain_weight.*alpha=1.3"):
        VILAInit(retain_weight=1.3)
    with pytest.raises(UnlearnError, match="'dropout' must be"):
        VILAInit(dropout=1.5)
    with pytest.raises(UnlearnError, match="'svd' must be"):
        FILAInit(svd="lowrank")


def test_vila_measures_with_lora_dropout_and_restores_the_model(tiny_model, tiny_tokenizer):
    tok = tiny_tokenizer
    forget, retain = encoded(tok)
    model = lora(tiny_model)
    model.eval()
    kept = {n: m.lora_dropout["default"] for n, m in lora_layers(model)}
    rng = torch.get_rng_state()

    def imp(**kw):
        return VILAInit(passes=2, batch_size=2, seed=0, **kw).importance(model, forget, retain, tok.pad_token_id)

    with_dropout, again, without = imp(dropout=0.3), imp(dropout=0.3), imp(dropout=0.0)
    name = next(iter(with_dropout))
    assert torch.equal(with_dropout[name], again[name])  # seeded: reproducible
    assert rel_err(with_dropout[name], without[name]) > 1e-3  # dropout was active while measuring
    assert not model.training and not any(m.training for m in model.modules())
    assert all(m.lora_dropout["default"] is kept[n] for n, m in lora_layers(model))
    assert torch.equal(torch.get_rng_state(), rng)  # the caller's RNG is untouched


def test_fila_reference_settings_match_reference(tiny_model, tiny_tokenizer):
    """FILA with svd settings niter=2, oversample=0 is the reference's svd_lowrank(q=r) pipeline."""
    tok = tiny_tokenizer
    forget, retain = encoded(tok)
    model = lora(tiny_model, r=4, alpha=8)
    original = copy.deepcopy(model)
    init = FILAInit(niter=2, oversample=0, seed=3)
    f_batches, r_batches = init.plan(forget, retain)
    importance = init.importance(copy.deepcopy(model), forget, retain, tok.pad_token_id)
    init.initialize(model, forget=forget, retain=retain, tokenizer=tok)

    modules = lora_layers(original)
    weights = [m.get_base_layer().weight for _, m in modules]
    only_grads(original, weights)
    with original.disable_adapter():
        _, f2, f_cnt = reference_moments(original, forget, f_batches, tok.pad_token_id, weights)
        _, r2, r_cnt = reference_moments(original, retain, r_batches, tok.pad_token_id, weights)
    trained = dict(lora_layers(model))
    for (name, module), W, i_f, i_r in zip(modules, weights, f2, r2):
        imp = ((i_f / f_cnt) / (1e-5 + i_r / r_cnt)).float()
        assert rel_err(importance[name], imp) <= 1e-5, name
        # the decomposition from the (matching) importance: SVD would amplify its 1e-6 rounding
        imp = importance[name]
        scaling = module.scaling["default"]
        row = imp.sum(dim=1).sqrt()
        torch.manual_seed(3)
        U, S, V = torch.svd_lowrank(row[:, None] * W.detach().float(), q=4)  # the reference's call
        S = S / scaling
        A = (V * torch.sqrt(S)).t()
        B = (1 / (row + 1e-5))[:, None] * (U * torch.sqrt(S))
        residual = W.detach() - scaling * B @ A
        ours = trained[name]
        assert rel_err(ours.lora_A["default"].weight, A) <= 1e-5, name
        assert rel_err(ours.lora_B["default"].weight, B) <= 1e-5, name
        assert rel_err(ours.get_base_layer().weight, residual) <= 1e-5, name

    # our default (oversample 8, niter 4) is a different, more accurate factorisation
    best = torch.linalg.svd(row[:, None] * W.detach().float())
    target = (best.U[:, :4] * best.S[:4]) @ best.Vh[:4]
    from unlearn_plugins.initializers.fila import weighted_lowrank

    a_ref, b_ref = weighted_lowrank(W.detach(), imp, 4, scaling, niter=2, oversample=0, seed=3)
    a_def, b_def = weighted_lowrank(W.detach(), imp, 4, scaling, seed=3)
    err_ref = rel_err(row[:, None] * (scaling * b_ref @ a_ref), target)
    err_def = rel_err(row[:, None] * (scaling * b_def @ a_def), target)
    assert err_def < err_ref


def test_sample_batches_follow_the_reference_loader():
    f, r = sample_batches(7, 3, batch_size=3, passes=2, retain="paired", seed=0)
    assert [len(b) for b in f] == [3, 3, 1, 3, 3, 1] and [len(b) for b in r] == [len(b) for b in f]
    for p in range(2):  # each pass a permutation of the forget set
        assert sorted(i for b in f[3 * p : 3 * p + 3] for i in b) == list(range(7))
    assert f[:3] != f[3:]  # reshuffled each pass
    assert all(0 <= i < 3 for b in r for i in b)
    _, r_all = sample_batches(7, 5, batch_size=3, passes=1, retain="all", seed=0)
    assert sorted(i for b in r_all for i in b) == list(range(5))
