"""GRU and PDU, and the objective contract's ``training_step``: on a tiny random Llama and fixed
padded batches, GRU's rectified gradient and PDU's loss, gradient and dual update equal the
reference code's formulas (open-unlearning: gru.py at 911e52a, pdu.py at d3d7cf9), transcribed
here with file and lines named (the reference is not imported); one `unlearn run` step of each."""

from __future__ import annotations

import copy

import pytest
import torch
from test_fidelity_peer_objectives import fixed_part
from test_task_vector import config, docs_example, weights

from unlearn_plugins import UNLEARNING_OBJECTIVE, create
from unlearn_plugins.training.objective import TrainingStep

pytestmark = pytest.mark.usefixtures("single_thread")


@pytest.fixture
def model_and_vocab(tiny_model, tiny_tokenizer):
    torch.manual_seed(0)
    return tiny_model.float().train(False), len(tiny_tokenizer)


def step_info(accumulation_steps=1, last=True, epoch=0.0):
    return TrainingStep(
        epoch=epoch,
        global_step=0,
        accumulation_steps=accumulation_steps,
        last_micro_batch=last,
        backward=lambda value: (value / accumulation_steps).backward(),
    )


def hf_loss(model, part):
    return model(**part).loss


# ----------------------------------------------------------------------------- GRU


class ReferenceGRU:
    """open-unlearning src/trainer/unlearn/gru.py at 911e52a, transcribed: store_grads (lines
    43-82: loss / GA, backward, accumulate, zero_grad), orthogonal_component (32-38), pipeline
    (176-178), training_step (209-221: flatten, EMA with gamma_gru, dot, project, restore) and
    compute_loss's GradAscent branch (237-252)."""

    def __init__(self, gamma_gru, ga):
        self.gamma_gru, self.ga, self.steps = gamma_gru, ga, 0
        self.gradient_accum, self.retain_grad = {}, {}
        self.flattened_retain_prev = 0.0

    def store_grads(self, model, loss, target_dict):
        (loss / self.ga).backward()
        for name, param in model.named_parameters():
            if param.requires_grad:
                if param.grad is None:
                    param.grad = torch.zeros_like(param)
                if name not in target_dict:
                    target_dict[name] = torch.zeros_like(param.grad)
                target_dict[name] += param.grad.detach()
        model.zero_grad()

    @staticmethod
    def dot(a, b, structure):
        total, index = 0.0, 0
        for _, shape in structure:
            size = int(torch.Size(shape).numel())
            total += (a[index : index + size].view(shape) * b[index : index + size].view(shape)).sum().item()
            index += size
        return total

    def training_step(self, model, batch):
        self.store_grads(model, -hf_loss(model, batch["forget"]), self.gradient_accum)
        self.store_grads(model, hf_loss(model, batch["retain"]), self.retain_grad)
        self.steps += 1
        if self.steps % self.ga == 0:
            structure = [(n, g.shape) for n, g in self.gradient_accum.items()]
            g = torch.cat([v.view(-1) for v in self.gradient_accum.values()])
            r_acc = torch.cat([v.view(-1) for v in self.retain_grad.values()])
            self.gradient_accum, self.retain_grad = {}, {}
            r = self.gamma_gru * r_acc + (1 - self.gamma_gru) * self.flattened_retain_prev
            self.flattened_retain_prev = r
            dotp = self.dot(g, r, structure)
            if dotp < 0:
                g = g - dotp / self.dot(r, r, structure) * r
            index, params = 0, dict(model.named_parameters())
            for name, shape in structure:
                size = int(torch.Size(shape).numel())
                params[name].grad = g[index : index + size].view(shape)
                index += size
            return dotp
        return None


@pytest.mark.parametrize("same", [False, True], ids=["random-batches", "forget-is-retain"])
def test_gru_gradient_equals_the_reference_formula(model_and_vocab, same):
    """Two optimizer steps of two micro-batches each (the moving average and the accumulation
    both exercised); with forget = retain the gradients conflict, so the projection runs; the
    random batches' gradients agree (dot > 0), so the forget gradient passes unchanged."""
    model, vocab = model_and_vocab
    ours_model, ref_model = model, copy.deepcopy(model)
    gru = create(UNLEARNING_OBJECTIVE, "gru")
    assert (gru.gamma_gru, gru.forget_loss_type) == (0.8, "GradAscent")  # GRU.yaml
    reference = ReferenceGRU(0.8, ga=2)
    dots = []
    for k in range(4):
        forget = fixed_part(vocab, 10 + k)
        batch = {"forget": forget, "retain": forget if same else fixed_part(vocab, 20 + k, (4, 1, 3))}
        if k % 2 == 0:  # the Trainer clears the gradients after each optimizer step
            ours_model.zero_grad(set_to_none=True)
            ref_model.zero_grad(set_to_none=True)
        loss = gru.training_step(ours_model, batch, None, step_info(2, last=k % 2 == 1))
        dot = reference.training_step(ref_model, batch)
        torch.testing.assert_close(loss, -hf_loss(ref_model, batch["forget"]), atol=1e-6, rtol=0)
        if dot is not None:
            dots.append(dot)
            assert float(gru.last_terms["dot"]) == pytest.approx(dot, rel=1e-6, abs=1e-9)
            for (name, p), (_, q) in zip(ours_model.named_parameters(), ref_model.named_parameters()):
                torch.testing.assert_close(p.grad, q.grad, atol=1e-6, rtol=1e-6, msg=name)
    assert len(dots) == 2
    # both branches covered: conflicting gradients are projected, agreeing ones left alone
    assert all(d < 0 for d in dots) if same else all(d > 0 for d in dots)


def test_gru_refuses_regularizers_and_a_missing_retain_split(model_and_vocab):
    from unlearn_plugins.errors import UnlearnError
    from unlearn_plugins.training.objective import CombinedObjective, own_training_step

    gru = create(UNLEARNING_OBJECTIVE, "gru")
    combined = CombinedObjective(gru, [create(UNLEARNING_OBJECTIVE, "grad_ascent")])
    with pytest.raises(UnlearnError, match="runs its own backward"):
        own_training_step(combined)
    assert own_training_step(CombinedObjective(gru)) == gru.training_step
    model, vocab = model_and_vocab
    with pytest.raises(UnlearnError, match="needs retain data"):
        gru.training_step(model, {"forget": fixed_part(vocab, 1)}, None, step_info())


# ----------------------------------------------------------------------------- PDU


def reference_pdu_step(model, batch, preferences, eps, dual_step_size, can_update):
    """open-unlearning src/trainer/unlearn/pdu.py at d3d7cf9: compute_loss (lines 114-132, the
    logit-margin forget loss and the NLL retain loss) and final_loss_value (lines 40-62: the
    shifted retain loss, the linear scalarisation, the per-step dual update)."""
    logits = model(input_ids=batch["forget"]["input_ids"], attention_mask=batch["forget"]["attention_mask"]).logits
    logits = logits.reshape(-1, logits.size(-1))
    forget_loss = ((logits.max(dim=-1)[0] - logits.mean(dim=-1)) ** 2).mean()
    retain_loss = hf_loss(model, batch["retain"]) - eps
    loss = (torch.tensor(preferences).to(forget_loss.device) * torch.hstack([forget_loss, retain_loss])).sum()
    if can_update:
        preferences[1] = max(0, preferences[1] + dual_step_size * retain_loss.item())
    return loss


@pytest.mark.parametrize(
    ("epoch", "eps", "updates"),
    [(0.5, 0.3, False), (1.0, 0.3, True), (1.7, 50.0, True)],
    ids=["warm-up", "after-warm-up", "clamped-at-zero"],
)
def test_pdu_loss_gradient_and_dual_update_equal_the_reference(model_and_vocab, epoch, eps, updates):
    model, vocab = model_and_vocab
    ref_model = copy.deepcopy(model)
    options = {"alpha": 2.0, "dual_step_size": 5.0, "dual_warmup_epochs": 1, "retain_loss_eps": eps}
    pdu = create(UNLEARNING_OBJECTIVE, "pdu", **options)
    preferences = [1.0, 2.0]
    for k in range(2):  # two steps: the second uses the updated preference
        batch = {"forget": fixed_part(vocab, 30 + k), "retain": fixed_part(vocab, 40 + k, (4, 1, 3))}
        model.zero_grad(set_to_none=True)
        ref_model.zero_grad(set_to_none=True)
        loss = pdu.training_step(model, batch, None, step_info(epoch=epoch))
        expected = reference_pdu_step(ref_model, batch, preferences, eps, 5.0, can_update=updates)
        expected.backward()
        assert float(loss) == pytest.approx(float(expected.detach()), rel=1e-6, abs=1e-6)
        assert pdu.preference == pytest.approx(preferences[1], rel=1e-6, abs=1e-6)
        for (name, p), (_, q) in zip(model.named_parameters(), ref_model.named_parameters()):
            torch.testing.assert_close(p.grad, q.grad, atol=1e-6, rtol=1e-5, msg=name)
    assert (preferences[1] != 2.0) == updates
    if eps == 50.0:
        assert pdu.preference == 0.0


def test_pdu_defaults_are_the_reference_config():
    pdu = create(UNLEARNING_OBJECTIVE, "pdu")
    assert pdu.options() == {
        "gamma": 1.0,
        "alpha": 1.0,
        "retain_loss_eps": 0.3,  # PDU.yaml leaves it required; community/methods/PDU/run.sh's TOFU value
        "primal_dual": True,
        "dual_step_size": 1.0,
        "dual_update_upon": "step",
        "dual_warmup_epochs": 5,
    }


# ----------------------------------------------------------------------------- through `unlearn run`


@pytest.mark.parametrize("name", ["gru", "pdu"])
def test_one_training_step_through_unlearn_run(name, tiny_model_dir, tofu_dir, tmp_path):
    """By name, as `unlearn run --objective NAME` builds it; then an instance, to see its state."""
    from unlearn_plugins.training import run_unlearning

    options = {"dual_warmup_epochs": 0} if name == "pdu" else {}
    common = dict(retain="tofu:retain90[0:4]", max_steps=1, merge=True)
    run_unlearning(
        config(tmp_path / name, tiny_model_dir, tofu_dir, objective=name, objective_options=options, **common)
    )
    w0, after = weights(tiny_model_dir), weights(tmp_path / name / "merged")
    assert max(float((after[k] - w0[k]).abs().max()) for k in w0) > 1e-6  # the step changed the model

    objective = create(UNLEARNING_OBJECTIVE, name, **options)
    run_unlearning(config(tmp_path / f"{name}-2", tiny_model_dir, tofu_dir, **common), objective=objective)
    if name == "gru":
        assert "dot" in objective.last_terms and objective._retain_ema is not None  # rectified once
    else:
        assert objective.preference != 1.0  # the dual variable moved after the step


def test_the_documented_training_step_example_trains_only_the_kept_parameters(tiny_model_dir, tofu_dir, tmp_path):
    from unlearn_plugins.training import run_unlearning

    partial = docs_example("PartialAscent")(keep="layers.1.")
    run_unlearning(config(tmp_path / "p", tiny_model_dir, tofu_dir, merge=True), objective=partial)
    assert partial.steps == 2  # max_steps
    w0, after = weights(tiny_model_dir), weights(tmp_path / "p" / "merged")
    moved = {k for k in w0 if float((after[k] - w0[k]).abs().max()) > 0}
    assert moved and all("layers.1." in k for k in moved)
