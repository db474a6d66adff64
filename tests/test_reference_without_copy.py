"""The reference model of a LoRA run costs no copy of the model: the same weights with the adapter
switched off, or through a frozen copy of the initial adapter after a residual init. Its
outputs equal a real frozen copy's for every initializer, before and after training steps; it
leaves trainability, gradients and the optimizer alone; runs give the losses a copy gives."""

from __future__ import annotations

import copy
import json
import shutil

import pytest
import torch
from support_training import AUTHOR_QA, small_config

from unlearn_plugins.data.qa import encode_qa, pad_batch
from unlearn_plugins.training import lora

pytestmark = pytest.mark.usefixtures("single_thread")

FORGET, RETAIN = AUTHOR_QA[:4], AUTHOR_QA[4:8]
#: (initializer, options, how the reference is computed)
INITIALIZERS = [
    ("kaiming", {}, "adapter_disabled"),
    ("gaussian", {}, "adapter_disabled"),
    ("eva", {"batch_size": 2}, "adapter_disabled"),
    ("pissa", {}, "initial_adapter"),
    ("olora", {}, "initial_adapter"),
    ("corda", {}, "initial_adapter"),
    ("rila", {"n_samples": "all"}, "initial_adapter"),
    ("fila", {}, "initial_adapter"),
    ("vila", {"passes": 2}, "initial_adapter"),
]


def log_probs(model, batch):
    with torch.no_grad():
        return model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits.log_softmax(-1)


def answer_nll(model, batch):
    """Mean answer-token NLL (the model's own loss, with gradient)."""
    from unlearn_plugins.likelihood import token_nll

    nll, mask = token_nll(
        model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits, batch["labels"]
    )
    return nll.sum() / mask.sum()


def initialized(name, options, tok, base, *, dropout=0.1):
    """The LoRA model after ``name``'s init, with the data it was given."""
    from unlearn_plugins import ADAPTER_INITIALIZER, create

    forget = [encode_qa(tok, q, a) for q, a in FORGET]
    retain = [encode_qa(tok, q, a) for q, a in RETAIN]
    torch.manual_seed(0)
    model = lora.build_lora_model(base, r=4, alpha=8, dropout=dropout, target_modules=None)
    create(ADAPTER_INITIALIZER, name, **options).initialize(model, forget=forget, retain=retain, tokenizer=tok)
    return model, pad_batch(forget + retain, tok.pad_token_id)


@pytest.mark.parametrize("name, options, how", INITIALIZERS, ids=[i[0] for i in INITIALIZERS])
def test_reference_equals_a_frozen_copy_before_and_after_training(name, options, how, tiny_tokenizer):
    from unlearn_plugins.testing import tiny_llama

    base = tiny_llama(len(tiny_tokenizer))
    frozen = copy.deepcopy(base).eval().requires_grad_(False)  # what a run held before: the model as loaded
    model, batch = initialized(name, options, tiny_tokenizer, base)
    start = copy.deepcopy(model).merge_and_unload().eval()  # the starting model, adapter folded in
    reference = lora.SharedWeightsReference(model)
    assert reference.how == how
    model.train()  # as the Trainer holds it: LoRA dropout 0.1 active
    expected = log_probs(frozen, batch)
    assert (log_probs(reference, batch) - expected).abs().max() <= 1e-5
    assert (log_probs(reference, batch) - log_probs(start, batch)).abs().max() <= 1e-5
    assert model.training and all(m.training for m in model.modules())  # the call restored train mode

    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    for _ in range(3):
        loss = answer_nll(model, batch) - 0.1 * reference(input_ids=batch["input_ids"]).logits.mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    model.eval()
    assert (log_probs(model, batch) - expected).abs().max() > 1e-3  # training moved the model ...
    assert (log_probs(reference, batch) - expected).abs().max() <= 1e-5  # ... not the reference


def test_reference_leaves_trainability_gradients_and_optimizer_alone(tiny_tokenizer):
    """A reference call between forward and backward (as NPO makes it) changes no requires_grad
    flag, no gradient, and the optimizer holds the trained adapter only, before and after."""
    from unlearn_plugins.testing import tiny_llama

    model, batch = initialized("pissa", {}, tiny_tokenizer, tiny_llama(len(tiny_tokenizer)), dropout=0.0)
    trained = [p for p in model.parameters() if p.requires_grad]
    frozen_part = model.base_model.model.model.layers[0].self_attn.q_proj.lora_A["default"].weight
    frozen_part.requires_grad_(False)  # an initializer may freeze part of the adapter
    flags = {n: p.requires_grad for n, p in model.named_parameters()}
    reference = lora.SharedWeightsReference(model)
    assert {n: p.requires_grad for n, p in model.named_parameters() if n in flags} == flags
    added = [n for n, p in model.named_parameters() if n not in flags]
    assert added and all(".reference." in n and not dict(model.named_parameters())[n].requires_grad for n in added)

    def gradients(call_reference):
        model.zero_grad()
        loss = answer_nll(model, batch)
        if call_reference:
            reference(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"])
        loss.backward()
        return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}

    model.train()
    plain, with_reference = gradients(False), gradients(True)
    assert plain.keys() == with_reference.keys() and plain
    assert all(torch.equal(plain[n], with_reference[n]) for n in plain)
    assert {n: p.requires_grad for n, p in model.named_parameters() if n in flags} == flags

    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    optimizer.step()
    ids = {id(p) for group in optimizer.param_groups for p in group["params"]}
    assert ids == {id(p) for p in trained} - {id(frozen_part)}
    assert set(map(id, optimizer.state)) <= ids

    reference.release()  # after training: only the trained adapter is left (saving, merging)
    assert list(model.peft_config) == ["default"] and model.active_adapter == "default"
    with pytest.raises(Exception, match="released"):
        reference(input_ids=batch["input_ids"])


@pytest.mark.parametrize("name", ["kaiming", "pissa"])
def test_frozen_copy_for_sharded_training_is_the_starting_model(name, tiny_tokenizer):
    """Under FSDP / DeepSpeed the run swaps the shared reference for a frozen copy of the
    starting model; the trained model keeps its one adapter."""
    from unlearn_plugins.testing import tiny_llama

    base = tiny_llama(len(tiny_tokenizer))
    frozen = copy.deepcopy(base).eval()
    model, batch = initialized(name, {}, tiny_tokenizer, base)
    clone = lora.SharedWeightsReference(model).frozen_copy()
    assert list(model.peft_config) == ["default"]
    assert not any(p.requires_grad for p in clone.parameters()) and not hasattr(clone, "peft_config")
    assert (log_probs(clone, batch) - log_probs(frozen, batch)).abs().max() <= 1e-5


class FrozenCopy(torch.nn.Module):
    """What runs held before: a frozen copy of the starting model (replaces SharedWeightsReference)."""

    def __init__(self, peft_model):
        super().__init__()
        self.inner = copy.deepcopy(peft_model).merge_and_unload().eval().requires_grad_(False)

    def forward(self, *args, **kwargs):
        return self.inner(*args, **kwargs)

    def release(self):
        pass

    def record(self):
        return {"how": "copy"}


@pytest.mark.parametrize(
    "objective, initializer, how",
    [
        ("npo", "kaiming", "adapter_disabled"),
        ("npo", "pissa", "initial_adapter"),
        ("rmu", "rila", "initial_adapter"),
    ],
)
def test_run_gives_the_losses_of_a_frozen_copy(
    objective, initializer, how, tiny_model_dir, tofu_dir, tmp_path, monkeypatch
):
    from unlearn_plugins.training import run_unlearning

    def run(out):
        method = {"objective": objective, "initializer": initializer, "merge": True}
        config = small_config(
            tmp_path / out, tiny_model_dir, tofu_dir, lora_dropout=0.1, max_steps=4, save_steps=0, **method
        )
        return run_unlearning(config).record

    shared = run("shared")
    assert shared["reference_model"]["how"] == how
    assert not (tmp_path / "shared" / lora.REFERENCE_ADAPTER).exists()  # the frozen copy is not saved
    with monkeypatch.context() as patch:
        patch.setattr(lora, "SharedWeightsReference", FrozenCopy)
        copied = run("copied")
    assert copied["reference_model"]["how"] == "copy"
    assert [e["loss"] for e in shared["losses"]] == pytest.approx([e["loss"] for e in copied["losses"]], rel=1e-5)


def test_resumed_residual_run_matches_an_uninterrupted_one(tiny_model_dir, tofu_dir, tmp_path):
    """NPO after PiSSA, resumed from its step-2 checkpoint: the frozen initial adapter in the
    checkpoint and the one rebuilt at resume are the same, so the run ends as it would have."""
    from safetensors.torch import load_file

    from unlearn_plugins.training import run_unlearning

    def config(out, **extra):
        method = {"objective": "npo", "initializer": "pissa"}
        return small_config(out, tiny_model_dir, tofu_dir, max_steps=4, save_steps=2, **method, **extra)

    straight = run_unlearning(config(tmp_path / "straight", keep_checkpoints=True)).record
    resumed_dir = tmp_path / "resumed"
    shutil.copytree(tmp_path / "straight" / "checkpoints", resumed_dir / "checkpoints")
    shutil.rmtree(resumed_dir / "checkpoints" / "checkpoint-4")
    resumed = run_unlearning(config(resumed_dir, resume=True)).record
    assert resumed["resumed_from"].endswith("checkpoint-2")
    assert [e["loss"] for e in resumed["losses"]][-2:] == pytest.approx(
        [e["loss"] for e in straight["losses"]][-2:], rel=1e-5
    )
    a, b = (load_file(str(d / "adapter_model.safetensors")) for d in (tmp_path / "straight", resumed_dir))
    assert a.keys() == b.keys() and max((a[k] - b[k]).abs().max().item() for k in a) <= 1e-6
    assert json.loads((resumed_dir / "adapter_config.json").read_text())["r"] == 8  # converted against the base
