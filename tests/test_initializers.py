"""Adapter initializers: function preserved at step 0; RILA's subspace is the top
eigenvectors of Delta on every exact path; FILA/VILA decompositions."""

from __future__ import annotations

import pytest
import torch
from support_training import assert_residual_adapter_applies_to_original_base

from unlearn_plugins.data.qa import encode_qa, pad_batch
from unlearn_plugins.training.lora import lora_layers

QUESTIONS = [
    ("Who wrote the sea novels?", "Basil Mahfouz Al-Kuwaiti wrote them."),
    ("Which genre does the author write in?", "She writes fantasy novels."),
    ("What awards has the author won?", "He won the International Booker Prize."),
    ("Who are the parents of the author?", "Her father was a doctor."),
    ("Where was the author born?", "In Kuwait City."),
    ("What is the capital of France?", "The capital of France is Paris."),
]


def examples(tok, pairs):
    return [encode_qa(tok, q, a) for q, a in pairs]


def peft_model(model, r=4, alpha=8):
    from peft import LoraConfig, get_peft_model

    config = LoraConfig(
        r=r,
        lora_alpha=alpha,
        lora_dropout=0.0,
        init_lora_weights=True,
        target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
    )
    return get_peft_model(model, config)


def test_lora_layers_lists_the_adapters_layers_under_any_wrapping(tiny_model):
    """The one listing initializers and ROL use: the active adapter's layers in model order; a
    second adapter on fewer layers only when asked for; canonical names that are the same for the
    PEFT model and a DDP-style wrapper (``.module``, no ``active_adapter``), so an initializer's
    retain basis finds its layers under DDP."""
    from peft import LoraConfig

    model = peft_model(tiny_model)
    model.add_adapter("other", LoraConfig(r=2, target_modules=["q_proj"]))
    names = [n for n, _ in lora_layers(model)]
    assert len(names) == 2 * 7 and all(n.startswith("base_model.model.") for n in names)  # 2 layers x 7
    assert [n for n, _ in lora_layers(model, "other")] == [n for n in names if n.endswith(".q_proj")]
    canonical = [n for n, _ in lora_layers(model, canonical_names=True)]
    assert canonical == [n.removeprefix("base_model.model.") for n in names]

    class DDPLike(torch.nn.Module):
        def __init__(self, inner):
            super().__init__()
            self.module = inner

    wrapped = DDPLike(model)
    assert [n for n, _ in lora_layers(wrapped, canonical_names=True)] == canonical
    assert [m for _, m in lora_layers(wrapped)] == [m for _, m in lora_layers(model)]


def logits(model, batch):
    with torch.no_grad():
        return model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits


def independent_outputs(model, exs, tok, mode):
    """Each LoRA module's base output rows, collected with plain hooks (no library code)."""
    rows, handles, current = {}, [], {}
    for name, module in lora_layers(model):

        def hook(_m, _i, out, _name=name):
            mask = current["labels"] != -100
            rows.setdefault(_name, []).append(
                out[mask] if mode == "token" else (out * current["am"].unsqueeze(-1)).sum(1)
            )

        handles.append(module.base_layer.register_forward_hook(hook))
    with torch.no_grad(), model.disable_adapter():
        for e in exs:
            b = pad_batch([e], tok.pad_token_id)
            current["labels"], current["am"] = b["labels"], b["attention_mask"]
            model(input_ids=b["input_ids"], attention_mask=b["attention_mask"])
    for h in handles:
        h.remove()
    return {k: torch.cat(v).double() for k, v in rows.items()}


def largest_principal_angle(a, b):
    qa, _ = torch.linalg.qr(a.double())
    qb, _ = torch.linalg.qr(b.double())
    s = torch.linalg.svdvals(qa.T @ qb).clamp(max=1.0)
    return float(torch.arccos(s.min()))


@pytest.mark.parametrize("path, mode", [("rows", "faithful"), ("dense", "token"), (None, "token")])
def test_rila_subspace_and_function(tiny_model, tiny_tokenizer, path, mode):
    from unlearn_plugins.initializers.rila import RIDGE, RILAInit

    tok = tiny_tokenizer
    forget, retain = examples(tok, QUESTIONS[:3]), examples(tok, QUESTIONS[3:])
    model = peft_model(tiny_model, r=2 if mode == "faithful" else 4)
    batch = pad_batch(forget + retain, tok.pad_token_id)
    before = logits(model, batch)
    beta = 0.7
    hf = independent_outputs(model, forget, tok, mode)
    hr = independent_outputs(model, retain, tok, mode)
    weights_before = {n: m.base_layer.weight.detach().clone() for n, m in lora_layers(model)}

    result = RILAInit(beta=beta, mode=mode, rol_rank=8, path=path, n_samples="all").initialize(
        model, forget=forget, retain=retain, tokenizer=tok
    )
    if path is None:  # automatic: gate/up (d_in < d_out) take the factored path
        assert result.info["paths"]["factored"] == 4

    # the model's function is unchanged at step 0
    assert (logits(model, batch) - before).abs().max() < 1e-4
    assert result.residual and set(result.retain_basis) == {n for n, _ in lora_layers(model)}
    checked = 0
    for name, module in lora_layers(model):
        d = module.base_layer.weight.shape[0]
        cf = hf[name].T @ hf[name] / hf[name].shape[0]
        cr = hr[name].T @ hr[name] / hr[name].shape[0] + RIDGE * torch.eye(d, dtype=torch.float64)
        evals, evecs = torch.linalg.eigh((1 - beta) * cf - beta * cr)
        r = module.r["default"]
        gap = float(evals[-r] - evals[-r - 1])
        if gap < 1e-6 * float(evals.abs().max()) or evals[-r] <= 0:
            continue  # the top-r subspace is not well defined here
        B = module.lora_B["default"].weight.detach()
        assert largest_principal_angle(B, evecs[:, -r:]) < 1e-3, name
        # B = Q, A = Q^T W0, base = W0 - s B A
        A = module.lora_A["default"].weight.detach()
        w0 = weights_before[name]
        assert torch.allclose(A, B.T @ w0, atol=1e-5)
        assert torch.allclose(module.base_layer.weight, w0 - module.scaling["default"] * B @ A, atol=1e-5)
        checked += 1
    assert checked >= 3


def test_rila_paths_chosen_by_size(tiny_model, tiny_tokenizer):
    from unlearn_plugins.initializers.rila import RILAInit

    tok = tiny_tokenizer
    model = peft_model(tiny_model)
    res = RILAInit(mode="faithful").initialize(
        model, forget=examples(tok, QUESTIONS[:2]), retain=examples(tok, QUESTIONS[2:4]), tokenizer=tok
    )
    assert res.info["paths"] == {"rows": 14}  # 4 sequences < every d_out: never d_out x d_out
    model = peft_model(tiny_model.__class__(tiny_model.config))
    res = RILAInit(mode="token").initialize(
        model, forget=examples(tok, QUESTIONS[:3]), retain=examples(tok, QUESTIONS[3:]), tokenizer=tok
    )
    assert res.info["paths"].get("factored") == 4  # gate/up: d_in 64 < d_out 128


def test_rila_warns_when_short_of_positive_eigenvalues(tiny_model, tiny_tokenizer):
    from unlearn_plugins.initializers.rila import RILAInit

    tok = tiny_tokenizer
    model = peft_model(tiny_model, r=8)
    one = examples(tok, QUESTIONS[:1])
    with pytest.warns(RuntimeWarning, match="fewer than r positive eigenvalues"):
        RILAInit(mode="faithful").initialize(model, forget=one, retain=examples(tok, QUESTIONS[1:3]), tokenizer=tok)


@pytest.mark.parametrize("name", ["fila", "vila"])
def test_importance_inits_preserve_function(tiny_model, tiny_tokenizer, name):
    from unlearn_plugins.initializers.fila import FILAInit
    from unlearn_plugins.initializers.vila import VILAInit

    tok = tiny_tokenizer
    forget, retain = examples(tok, QUESTIONS[:3]), examples(tok, QUESTIONS[3:])
    model = peft_model(tiny_model)
    batch = pad_batch(forget + retain, tok.pad_token_id)
    before = logits(model, batch)
    grads_before = [p.requires_grad for p in model.parameters()]
    init = FILAInit() if name == "fila" else VILAInit()
    result = init.initialize(model, forget=forget, retain=retain, tokenizer=tok)
    assert result.residual
    assert (logits(model, batch) - before).abs().max() < 1e-4
    assert [p.requires_grad for p in model.parameters()] == grads_before
    for _, module in lora_layers(model):
        assert module.lora_B["default"].weight.abs().sum() > 0  # not the zero init


@pytest.mark.parametrize("name", ["fila", "vila"])
def test_importance_is_the_same_with_the_blocks_recomputed(tiny_model, tiny_tokenizer, name):
    """FILA/VILA take their gradients with each decoder block checkpointed (non-reentrant,
    recomputed in the backward) to save memory: the importance is the one computed without, with
    dropout active (attention dropout for FILA, VILA's LoRA dropout) so the RNG replay is
    checked; the blocks really ran twice, and their forwards are restored after."""
    import copy

    from unlearn_plugins.initializers.fila import FILAInit
    from unlearn_plugins.initializers.vila import VILAInit
    from unlearn_plugins.training.lora import decoder_blocks

    tok = tiny_tokenizer
    forget, retain = examples(tok, QUESTIONS[:3]), examples(tok, QUESTIONS[3:])
    model = peft_model(tiny_model)
    _, blocks = decoder_blocks(model)
    assert blocks is not None and len(blocks) == tiny_model.config.num_hidden_layers
    for block in blocks:
        block.self_attn.attention_dropout = 0.1

    def importance(checkpointing):
        init = FILAInit(batch_size=2) if name == "fila" else VILAInit(passes=2, batch_size=2)
        init.checkpointing = checkpointing
        measured = copy.deepcopy(model)
        mlp, calls = decoder_blocks(measured)[1][0].mlp, []  # (the recompute runs no module hooks)
        mlp.forward = lambda *a, _f=mlp.forward, **k: calls.append(1) or _f(*a, **k)
        out = init.importance(measured, forget, retain, tok.pad_token_id)
        assert all("forward" not in block.__dict__ for block in decoder_blocks(measured)[1])
        return out, len(calls)

    plain, n_plain = importance(False)
    recomputed, n_recomputed = importance(True)
    assert n_recomputed == 2 * n_plain > 0
    assert plain.keys() == recomputed.keys()
    for key in plain:
        torch.testing.assert_close(recomputed[key], plain[key], rtol=0, atol=0)  # bit for bit on CPU


def test_weighted_lowrank_matches_definition():
    from unlearn_plugins.initializers.fila import EPS, weighted_lowrank

    g = torch.Generator().manual_seed(0)
    w = torch.randn(12, 9, generator=g)
    imp = torch.rand(12, 9, generator=g)
    a, b = weighted_lowrank(w, imp, r=9, scaling=2.0, niter=6)  # full rank: exact reconstruction
    rows = imp.sum(1).sqrt()
    # s B A = diag(1/(w+eps)) diag(w) W
    assert torch.allclose(2.0 * b @ a, (rows / (rows + EPS)).unsqueeze(1) * w, atol=1e-4)
    a3, b3 = weighted_lowrank(w, imp, r=3, scaling=2.0, niter=6)
    u, s, vh = torch.linalg.svd(rows.unsqueeze(1) * w)
    best = (u[:, :3] * s[:3]) @ vh[:3]  # the best rank-3 approximation of diag(w) W
    assert torch.allclose(rows.unsqueeze(1) * (2.0 * b3 @ a3), best, atol=1e-3)


@pytest.mark.parametrize("name", ["kaiming", "gaussian", "pissa", "olora", "eva", "corda"])
def test_peft_inits_by_name_preserve_function(tiny_model, tiny_tokenizer, name):
    from unlearn_plugins import ADAPTER_INITIALIZER, create

    tok = tiny_tokenizer
    forget, retain = examples(tok, QUESTIONS[:3]), examples(tok, QUESTIONS[3:])
    model = peft_model(tiny_model, r=2)
    batch = pad_batch(forget + retain, tok.pad_token_id)
    before = logits(model, batch)
    lora_before = {n: m.lora_A["default"].weight.detach().clone() for n, m in lora_layers(model)}
    init = create(ADAPTER_INITIALIZER, name)
    result = init.initialize(model, forget=forget, retain=retain, tokenizer=tok)
    assert (logits(model, batch) - before).abs().max() < 1e-4
    assert bool(result.residual) == (name in ("pissa", "olora", "corda"))
    changed = sum(not torch.equal(m.lora_A["default"].weight, lora_before[n]) for n, m in lora_layers(model))
    assert changed == len(lora_before)  # every layer re-initialised


def test_rol_at_rila_init_matches_formula_and_a_step_lowers_it(tiny_model, tiny_tokenizer):
    from unlearn_plugins.initializers.rila import RILAInit
    from unlearn_plugins.objectives.rol import ROL

    tok = tiny_tokenizer
    forget, retain = examples(tok, QUESTIONS[:3]), examples(tok, QUESTIONS[3:])
    model = peft_model(tiny_model)
    result = RILAInit(rol_rank=8).initialize(model, forget=forget, retain=retain, tokenizer=tok)
    rol = ROL(rank=8)
    rol.set_basis(model, result.retain_basis)
    expected = sum(
        float((m.lora_B["default"].weight.double().T @ result.retain_basis[n].double()).pow(2).sum())
        for n, m in lora_layers(model)
    )
    value = rol.loss(model)
    assert expected > 0  # B = Q overlaps the retain subspace at step 0
    assert abs(float(value) - expected) <= 1e-5 * expected
    for p in model.parameters():
        p.requires_grad_(False)
    b_weights = [m.lora_B["default"].weight for _, m in lora_layers(model)]
    for w in b_weights:
        w.requires_grad_(True)

    def norms():
        with torch.no_grad():
            return [
                float(torch.linalg.matrix_norm(m.lora_B["default"].weight.T @ result.retain_basis[n]))
                for n, m in lora_layers(model)
            ]

    before = norms()
    optimizer = torch.optim.SGD(b_weights, lr=0.05)
    value.backward()
    optimizer.step()
    after = norms()
    assert float(rol.loss(model)) < expected
    assert all(a < b for a, b in zip(after, before))  # ||B^T P_B|| falls in every module


@pytest.mark.parametrize("name", ["rila", "fila", "pissa"])
def test_trained_residual_adapter_applies_to_original_base(name, tiny_model_dir, tofu_dir, tmp_path):
    """Base model + saved adapter reproduces the trained model (saved merged) exactly."""
    assert_residual_adapter_applies_to_original_base(name, tiny_model_dir, tofu_dir, tmp_path / name)
