"""The random_residual control: RILA's per-module norm ||s B A||_F, random directions,
the model unchanged at step 0, directions decided by the seed and not by the data."""

from __future__ import annotations

import pytest
import torch
from support_training import assert_residual_adapter_applies_to_original_base
from test_initializers import QUESTIONS, examples, peft_model  # the same QA and adapter

from unlearn_plugins.data.qa import pad_batch
from unlearn_plugins.errors import PluginLoadError
from unlearn_plugins.training.config import ConfigError
from unlearn_plugins.training.lora import lora_layers


def logits(model, batch):
    with torch.no_grad():
        return model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits


def fresh(tiny_model, r=2):
    """A PEFT model on a fresh copy of the tiny model's weights (initializers change the base)."""
    model = tiny_model.__class__(tiny_model.config)
    model.load_state_dict(tiny_model.state_dict())
    return peft_model(model.eval(), r=r)


def residuals(model):
    """{module: s B A} (float64) of the active adapter."""
    return {
        name: module.scaling["default"]
        * module.lora_B["default"].weight.detach().double()
        @ module.lora_A["default"].weight.detach().double()
        for name, module in lora_layers(model)
    }


def splits(tok):
    return examples(tok, QUESTIONS[:3]), examples(tok, QUESTIONS[3:])


def init(model, tok, **options):
    from unlearn_plugins.initializers.random_residual import RandomResidualInit

    forget, retain = splits(tok)
    return RandomResidualInit(**options).initialize(model, forget=forget, retain=retain, tokenizer=tok)


def test_same_norm_as_rila_module_by_module(tiny_model, tiny_tokenizer):
    from unlearn_plugins.initializers.rila import RILAInit

    tok = tiny_tokenizer
    forget, retain = splits(tok)
    rila = fresh(tiny_model)
    RILAInit(beta=0.7).initialize(rila, forget=forget, retain=retain, tokenizer=tok)
    control = fresh(tiny_model)
    result = init(control, tok, norm_from="rila", beta=0.7, seed=3)
    expected, got = residuals(rila), residuals(control)
    assert set(got) == set(expected) and len(got) == 14
    for name in expected:
        want = float(torch.linalg.matrix_norm(expected[name]))
        assert want > 0
        assert float(torch.linalg.matrix_norm(got[name])) == pytest.approx(want, rel=1e-5), name
    # factor by factor too: B orthonormal like RILA's Q, ||A||_F = ||Q^T W0||_F
    for (_, m_rila), (_, m_ctl) in zip(lora_layers(rila), lora_layers(control)):
        b = m_ctl.lora_B["default"].weight.detach().double()
        assert torch.allclose(b.T @ b, torch.eye(b.shape[1], dtype=torch.float64), atol=1e-6)
        a_rila = torch.linalg.matrix_norm(m_rila.lora_A["default"].weight.detach().double())
        assert float(torch.linalg.matrix_norm(m_ctl.lora_A["default"].weight.detach().double())) == pytest.approx(
            float(a_rila), rel=1e-5
        )
    assert result.residual and result.info["init"] == "random_residual" and result.info["seed"] == 3
    assert set(result.retain_basis) == set(expected)  # RILA's retain basis, for an optional rol


def test_model_unchanged_at_init_and_base_corrected(tiny_model, tiny_tokenizer):
    tok = tiny_tokenizer
    model = fresh(tiny_model)
    forget, retain = splits(tok)
    batch = pad_batch(forget + retain, tok.pad_token_id)
    before = logits(model, batch)
    weights_before = {n: m.base_layer.weight.detach().clone() for n, m in lora_layers(model)}
    init(model, tok, seed=0)
    assert (logits(model, batch) - before).abs().max() < 1e-4
    for name, module in lora_layers(model):
        s = module.scaling["default"]
        b, a = module.lora_B["default"].weight, module.lora_A["default"].weight
        assert b.abs().sum() > 0  # not PEFT's B = 0
        assert torch.allclose(module.base_layer.weight, weights_before[name] - s * b @ a, atol=1e-5)
        with torch.no_grad():
            module.base_layer.weight.copy_(weights_before[name])
    # with the original base the adapter does change the model: the residual correction did the work
    assert (logits(model, batch) - before).abs().max() > 1e-4


def test_directions_uncorrelated_with_rila(tiny_model, tiny_tokenizer):
    """The control's B spans a random subspace: its overlap with RILA's Q is what two random
    r-dimensional subspaces of R^d share (r / d on average), far from RILA's own (1)."""
    from unlearn_plugins.initializers.rila import RILAInit

    tok = tiny_tokenizer
    forget, retain = splits(tok)
    rila = fresh(tiny_model)
    RILAInit().initialize(rila, forget=forget, retain=retain, tokenizer=tok)
    overlaps, chance = [], []
    for seed in range(3):
        control = fresh(tiny_model)
        init(control, tok, seed=seed)
        for (_, m_rila), (_, m_ctl) in zip(lora_layers(rila), lora_layers(control)):
            q = m_rila.lora_B["default"].weight.double()
            b = m_ctl.lora_B["default"].weight.double()
            r, d = q.shape[1], q.shape[0]
            overlaps.append(float((q.T @ b).pow(2).sum()) / r)  # mean squared cosine of the principal angles
            chance.append(r / d)
    mean_overlap, mean_chance = sum(overlaps) / len(overlaps), sum(chance) / len(chance)
    assert mean_overlap < 3 * mean_chance < 0.5  # chance level (0.03-0.06 here), not RILA's 1
    assert max(overlaps) < 0.5


def test_directions_decided_by_the_seed(tiny_model, tiny_tokenizer):
    tok = tiny_tokenizer
    first, again, other = fresh(tiny_model), fresh(tiny_model), fresh(tiny_model)
    init(first, tok, seed=7)
    init(again, tok, seed=7)
    init(other, tok, seed=8)
    a, b, c = residuals(first), residuals(again), residuals(other)
    assert all(torch.equal(a[n], b[n]) for n in a)
    assert all(not torch.allclose(a[n], c[n]) for n in a)
    # seed None: drawn from the run's seeded RNG (--seed), so the run's seed decides
    runs = []
    for _ in range(2):
        model = fresh(tiny_model)
        torch.manual_seed(11)
        result = init(model, tok)
        runs.append((result.info["seed"], residuals(model)))
    assert runs[0][0] == runs[1][0]
    assert all(torch.equal(runs[0][1][n], runs[1][1][n]) for n in a)


def test_by_name_and_options_checked(tiny_model, tiny_tokenizer):
    from unlearn_plugins import ADAPTER_INITIALIZER, create

    init_obj = create(ADAPTER_INITIALIZER, "random_residual", beta=0.5, seed=1)
    assert init_obj.rila.beta == 0.5 and init_obj.seed == 1
    with pytest.raises(PluginLoadError, match="norm_from"):
        create(ADAPTER_INITIALIZER, "random_residual", norm_from="fila")
    with pytest.raises(PluginLoadError, match="random_residual option beta"):
        create(ADAPTER_INITIALIZER, "random_residual", beta=2.0)
    with pytest.raises(PluginLoadError, match="random_residual option rila_seed"):
        create(ADAPTER_INITIALIZER, "random_residual", rila_seed=-1)
    model = fresh(tiny_model)
    with pytest.raises(ConfigError, match="random_residual.*needs both forget and retain"):
        from unlearn_plugins.initializers.random_residual import RandomResidualInit

        RandomResidualInit().initialize(model, forget=splits(tiny_tokenizer)[0], retain=[], tokenizer=tiny_tokenizer)


def test_trained_control_adapter_applies_to_original_base(tiny_model_dir, tofu_dir, tmp_path):
    """Through `unlearn run`: the saved adapter is relative to the original base (as RILA's)."""
    out = tmp_path / "random_residual"
    assert_residual_adapter_applies_to_original_base("random_residual", tiny_model_dir, tofu_dir, out)
