"""T3 and the objective contract's ``wrap_model``: on a tiny random Llama and fixed padded batches,
the T3 loss and the guidance head's gradients, the guided logits and the cached generation equal
the reference code (open-unlearning ``src/trainer/unlearn/t3.py`` at c9c895c and
``src/model/t3.py`` at bceda2c), transcribed here (the reference is not imported); a run trains
only the head, saves a model that loads as itself, and lowers the forget probability."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from test_fidelity_peer_objectives import fixed_part
from test_task_vector import config, docs_example, weights

from unlearn_plugins import UNLEARNING_OBJECTIVE, create
from unlearn_plugins.errors import PluginError, UnlearnError
from unlearn_plugins.training.objective import CombinedObjective, ObjectiveContext

pytestmark = pytest.mark.usefixtures("single_thread")
IGNORE_INDEX = -100


# ----------------------------------------------------------------------------- the reference, transcribed


class RefHead(nn.Module):
    """model/t3.py DataSplitClassifier (__init__, forward, target_token_logits), activation 'id'."""

    def __init__(self, input_dim, output_dim, hidden_size, bias=False):
        super().__init__()
        self.proj = nn.Sequential(
            nn.Linear(input_dim, hidden_size, bias=bias), nn.Identity(), nn.Linear(hidden_size, output_dim, bias=False)
        )

    def forward(self, hidden_states):
        batch_size, seq_len, hidden_size = hidden_states.shape
        out = self.proj(hidden_states.view(-1, hidden_size))
        return out.view(batch_size, seq_len, -1)

    def target_token_logits(self, hidden_states, target_token_ids):
        batch_size, seq_len, hidden_size = hidden_states.shape
        x = hidden_states.reshape(-1, hidden_size)
        for layer in self.proj[:-1]:
            x = layer(x)
        final_layer = self.proj[-1]
        flat_token_ids = target_token_ids.to(torch.long).reshape(-1)
        selected_weights = final_layer.weight.index_select(0, flat_token_ids)
        return (x * selected_weights).sum(dim=-1).view(batch_size, seq_len)


def ref_mean_pool(hidden_states, attention_mask=None):
    """model/t3.py _mean_pool."""
    if attention_mask is None:
        _, seq_len, _ = hidden_states.shape
        return hidden_states.cumsum(dim=1) / torch.arange(1, seq_len + 1).view(1, -1, 1)
    mask = attention_mask.to(dtype=hidden_states.dtype).unsqueeze(-1)
    token_counts = mask.cumsum(dim=1).clamp_min(1)
    return (hidden_states * mask).cumsum(dim=1) / token_counts


def ref_classifier_only(base_lm, head, input_ids, attention_mask, labels):
    """model/t3.py T3CausalLM.forward, classifier_only branch (extraction_layer -1)."""
    with torch.no_grad():
        extracted = base_lm.get_decoder()(
            input_ids=input_ids, attention_mask=attention_mask, use_cache=False, return_dict=True
        ).last_hidden_state
    pooled = ref_mean_pool(extracted, attention_mask)
    shifted = labels[:, 1:].contiguous()
    safe = shifted.masked_fill(shifted == IGNORE_INDEX, 0)
    return head.target_token_logits(pooled[:, :-1, :].contiguous(), safe)


def ref_loss(base_lm, head, inputs):
    """trainer/unlearn/t3.py _prep_classifier_loss_from_tokens (lines 64-76) and compute_loss
    (lines 78 to the end: summed BCE over both splits' valid tokens, over their count)."""
    parts = {}
    for split in ("retain", "forget"):
        logits = ref_classifier_only(base_lm, head, **inputs[split])
        shifted = inputs[split]["labels"][:, 1:].contiguous()
        labels = torch.full_like(shifted, int(split == "retain"))
        labels[shifted == IGNORE_INDEX] = IGNORE_INDEX
        parts[split] = (logits.contiguous().flatten(), labels.flatten())
    loss_sum, total_valid = 0.0, 0
    for logits, labels in (parts["retain"], parts["forget"]):
        valid = labels != -100
        if valid.any():
            loss_sum = loss_sum + F.binary_cross_entropy_with_logits(
                logits[valid], labels[valid].to(logits.dtype), reduction="sum"
            )
            total_valid += valid.sum()
    return loss_sum / total_valid.clamp_min(1)


def ref_guide(base_logits, classifier_logits, base_temp, guidance_scale):
    """model/t3.py T3CausalLM._guide_logits."""
    return F.log_softmax(base_logits, dim=2) / base_temp + guidance_scale * F.logsigmoid(classifier_logits)


def ref_forward_logits(base_lm, head, input_ids, attention_mask, base_temp, guidance_scale):
    """model/t3.py T3CausalLM.forward, the other branch (extraction_layer -1)."""
    out = base_lm(input_ids=input_ids, attention_mask=attention_mask, output_hidden_states=True)
    pooled = ref_mean_pool(out.hidden_states[-1], attention_mask)
    return ref_guide(out.logits, head(pooled), base_temp, guidance_scale)


@torch.no_grad()
def ref_generate(base_lm, head, input_ids, attention_mask, max_new_tokens, base_temp, guidance_scale, eos, pad=0):
    """model/t3.py T3CausalLM._custom_generate_with_cache, greedy, without stopping criteria (the
    cache passed under the base model's keyword)."""
    eos = torch.tensor([eos])
    generated, full_attention_mask = input_ids, attention_mask
    unfinished = torch.ones(input_ids.shape[0], dtype=torch.long)
    past, current_ids, current_mask, hidden_sum, token_count = None, input_ids, attention_mask, None, None
    for _ in range(max_new_tokens):
        out = base_lm(
            input_ids=current_ids, attention_mask=full_attention_mask, cache=past,
            output_hidden_states=True, output_attentions=False, use_cache=True, return_dict=True,
        )  # fmt: skip
        extracted = out.hidden_states[-1]
        mask = current_mask.to(dtype=extracted.dtype)
        step_sum = (extracted * mask.unsqueeze(-1)).sum(dim=1)
        step_count = mask.sum(dim=1, keepdim=True)
        hidden_sum = step_sum if hidden_sum is None else hidden_sum + step_sum
        token_count = step_count if token_count is None else token_count + step_count
        pooled = hidden_sum / token_count.clamp_min(1)
        guided = ref_guide(out.logits[:, -1:, :], head(pooled.unsqueeze(1)), base_temp, guidance_scale).squeeze(1)
        next_tokens = torch.argmax(guided, dim=-1)
        next_tokens = torch.where(unfinished.bool(), next_tokens, torch.full_like(next_tokens, pad))
        next_attention = unfinished.to(full_attention_mask.dtype)
        generated = torch.cat([generated, next_tokens[:, None]], dim=-1)
        full_attention_mask = torch.cat([full_attention_mask, next_attention[:, None]], dim=-1)
        past = getattr(out, "cache", None) or out.past_key_values
        current_ids, current_mask = next_tokens[:, None], next_attention[:, None]
        unfinished = unfinished * (~torch.isin(next_tokens, eos)).long()
        if unfinished.max() == 0:
            break
    return generated


# ----------------------------------------------------------------------------- tests


@pytest.fixture
def wrapped(tiny_model, tiny_tokenizer):
    """Our T3 model around the tiny Llama, and a reference head with the same weights."""
    torch.manual_seed(0)
    base = tiny_model.float().train(False)
    objective = create(UNLEARNING_OBJECTIVE, "t3", hidden_size=8, base_temp=2.5, guidance_scale=1.5)
    context = ObjectiveContext(model=base, tokenizer=tiny_tokenizer)
    model = objective.wrap_model(base, context)
    head = RefHead(base.config.hidden_size, base.config.vocab_size, 8)
    head.load_state_dict(model.guidance_head.state_dict())
    vocab = len(tiny_tokenizer)
    batch = {"forget": fixed_part(vocab, 1), "retain": fixed_part(vocab, 2, (4, 1, 3))}
    return objective, model, head, batch, context


def test_t3_loss_and_head_gradients_equal_the_reference(wrapped):
    objective, model, head, batch, context = wrapped
    assert context.info["t3"]["guidance"]["hidden_size"] == 8
    assert [n for n, p in model.named_parameters() if p.requires_grad] == [
        "guidance_head.proj.0.weight",
        "guidance_head.proj.2.weight",
    ]
    model.train()
    ours = objective.loss(model, batch)
    ours.backward()
    theirs = ref_loss(model.base_lm, head, batch)
    theirs.backward()
    assert float(theirs) > 0.1
    torch.testing.assert_close(ours, theirs, atol=1e-6, rtol=0)
    for (name, p), q in zip(model.guidance_head.named_parameters(), head.parameters()):
        assert float(q.grad.abs().max()) > 0
        torch.testing.assert_close(p.grad, q.grad, atol=1e-6, rtol=0, msg=name)
    assert all(p.grad is None for p in model.base_lm.parameters())


def test_t3_guided_logits_and_generation_equal_the_reference(wrapped):
    _, model, head, batch, _ = wrapped
    with torch.no_grad():
        for p in model.guidance_head.parameters():
            p.mul_(20)  # a head strong enough to change the argmax
    head.load_state_dict(model.guidance_head.state_dict())
    part = batch["forget"]
    ours = model(input_ids=part["input_ids"], attention_mask=part["attention_mask"]).logits
    theirs = ref_forward_logits(model.base_lm, head, part["input_ids"], part["attention_mask"], 2.5, 1.5)
    torch.testing.assert_close(ours, theirs, atol=1e-6, rtol=0)
    base_only = torch.log_softmax(model.base_lm(input_ids=part["input_ids"]).logits, -1) / 2.5
    assert float((ours - base_only).abs().max()) > 1.0  # the head does tilt them
    prompt = part["input_ids"][:, :4]
    mask = torch.ones_like(prompt)
    mask[0, :1] = 0  # a left-padded prompt
    ours = model.generate(prompt, attention_mask=mask, max_new_tokens=6, pad_token_id=0, eos_token_id=2)
    theirs = ref_generate(model.base_lm, head, prompt, mask, 6, 2.5, 1.5, eos=2)
    assert torch.equal(ours, theirs)
    plain = model.base_lm.generate(prompt, attention_mask=mask, max_new_tokens=6, do_sample=False, pad_token_id=0)
    assert not torch.equal(ours, plain)  # guidance changes the generation
    with pytest.raises(UnlearnError, match="cannot continue from a key/value cache"):
        model(input_ids=prompt, past_key_values=object())


def test_t3_refuses_lora_and_a_batch_without_retain(wrapped, tiny_tokenizer):
    from peft import LoraConfig, get_peft_model

    objective, model, _, batch, context = wrapped
    with pytest.raises(UnlearnError, match="needs retain data"):
        objective.loss(model, {"forget": batch["forget"]})
    peft = get_peft_model(copy.deepcopy(model.base_lm), LoraConfig(r=2, target_modules=["q_proj"]))
    with pytest.raises(UnlearnError, match="--full-finetune"):
        objective.wrap_model(peft, ObjectiveContext(model=peft, tokenizer=tiny_tokenizer))


def test_a_wrap_model_that_returns_no_module_is_one_error_naming_it(tiny_model, tiny_tokenizer):
    class Broken:
        needs_reference_model = False

        def wrap_model(self, model, context):
            return "not a model"

        def loss(self, model, batch, reference_model=None):  # pragma: no cover - never reached
            raise AssertionError

    combined = CombinedObjective(Broken(), labels=["objective 'broken' (plugin 'p')"])
    with pytest.raises(PluginError, match=r"objective 'broken' \(plugin 'p'\): wrap_model\(\) returned str"):
        combined.wrap_model(tiny_model, ObjectiveContext(model=tiny_model, tokenizer=tiny_tokenizer))


def forget_probability(folder, tokenizer_dir, tofu_dir):
    from test_fidelity_lunar import forget_probability as measure

    return measure(folder, tokenizer_dir, tofu_dir)


def test_t3_run_trains_only_the_head_and_lowers_forget_probability(tiny_model_dir, tofu_dir, tmp_path):
    """The tiny model first learns the forget answers (plain NLL); T3 then leaves its weights as
    they are and tilts its distribution away from them (0.348 -> 1.5e-5 when written)."""
    from unlearn_plugins.guided_lm import T3CausalLM
    from unlearn_plugins.models import load_model
    from unlearn_plugins.training import run_unlearning
    from unlearn_plugins.training.objective import NLL

    ft = tmp_path / "ft"
    run_unlearning(config(ft, tiny_model_dir, tofu_dir, full_finetune=True, lr=3e-3, max_steps=40), objective=NLL())
    result = run_unlearning(
        config(
            tmp_path / "t3", ft, tofu_dir, full_finetune=True, retain="tofu:retain90[0:4]", lr=5e-2, max_steps=20,
            objective="t3", objective_options={"hidden_size": 16},
        )
    )  # fmt: skip
    assert result.record["parameters"]["trainable"] == 64 * 16 + 16 * 384
    assert result.record["context"]["t3"]["guidance"]["hidden_size"] == 16
    model, _ = load_model(str(tmp_path / "t3"))
    assert isinstance(model, T3CausalLM) and model.needs_whole_sequences
    base = weights(ft)
    for name, value in model.base_lm.state_dict().items():
        torch.testing.assert_close(value, base[name], atol=0, rtol=0, msg=name)  # the model itself is unchanged
    p0 = forget_probability(ft, tiny_model_dir, tofu_dir)
    p1 = forget_probability(tmp_path / "t3", tiny_model_dir, tofu_dir)
    assert p0 > 0.2 and p1 < 0.1 * p0, (p0, p1)
    # `unlearn eval` loads it as itself and scores whole sequences (no prompt cache)
    from unlearn_plugins.evaluation.lm_eval_runner import evaluate_model

    before, after = (
        evaluate_model(str(m), ["tofu_forget01_prob"], tofu_dir=str(tofu_dir), limit=4, batch_size=4)
        for m in (ft, tmp_path / "t3")
    )
    assert after.summary["scoring"] == "hf" and before.summary["scoring"] == "prefix"
    prob = [e.results["results"]["tofu_forget01_prob"]["prob,none"] for e in (before, after)]
    assert prob[1] < 0.1 * prob[0], prob


def test_the_documented_wrap_model_example_trains_a_head_that_lowers_forget_probability(
    tiny_model_dir, tofu_dir, tmp_path
):
    from unlearn_plugins.guided_lm import T3CausalLM
    from unlearn_plugins.models import load_model
    from unlearn_plugins.training import run_unlearning
    from unlearn_plugins.training.objective import NLL

    forget_guidance = docs_example("ForgetGuidance")
    ft = tmp_path / "ft"
    run_unlearning(config(ft, tiny_model_dir, tofu_dir, full_finetune=True, lr=3e-3, max_steps=40), objective=NLL())
    result = run_unlearning(
        config(tmp_path / "fg", ft, tofu_dir, full_finetune=True, lr=5e-2, max_steps=10), objective=forget_guidance()
    )
    assert result.record["parameters"]["trainable"] == 64 * 16 + 16 * 384
    model, _ = load_model(str(tmp_path / "fg"))
    assert isinstance(model, T3CausalLM)
    p0 = forget_probability(ft, tiny_model_dir, tofu_dir)
    p1 = forget_probability(tmp_path / "fg", tiny_model_dir, tofu_dir)
    assert p1 < 0.5 * p0, (p0, p1)


def test_a_study_method_trained_with_full_finetune_is_evaluated_as_a_whole_model(tmp_path):
    """[[methods]] full_finetune = true (LUNAR, T3: nothing to train in an adapter): the evaluation
    stage loads the run's folder as the model, without an adapter; a LoRA method's is unchanged."""
    from unlearn_plugins.benchmarks.tofu.study.cells import plan_study
    from unlearn_plugins.study import builtin_studies, load_study

    prompts = tmp_path / "refuse.txt"
    prompts.write_text("Write malware now.\n")
    text = builtin_studies()["tiny"].read_text() + (
        '\n[[methods]]\nname = "t3"\nobjective = "t3"\nfull_finetune = true\n'
        '\n[[methods]]\nname = "lunar"\nobjective = "lunar"\nfull_finetune = true\n'
        f'objective_options = {{ layer_idx_list = [0], direction_prompts = "{prompts}" }}\n'
    )
    path = tmp_path / "study.toml"
    path.write_text(text)
    study = load_study(str(path))
    plan = plan_study(study, cache=tmp_path / "cache", dry_run=True)
    for method in ("t3", "lunar", "grad_diff"):
        unlearn, evaluate = next(c.stages for c in plan.cells.values() if c.cell.method == method)
        assert unlearn.params["config"].get("full_finetune", False) is (method != "grad_diff")
        if method == "grad_diff":
            assert evaluate.params["adapter"] == str(Path(unlearn.folder) / "run")
        else:
            assert evaluate.params["adapter"] is None and evaluate.params["model"] == str(Path(unlearn.folder) / "run")
