"""RMU with the WMDP recipe against the WMDP reference's formula, transcribed here from
centerforaisafety/wmdp ``rmu/unlearn.py`` and ``rmu/utils.py`` at commit
f2d346f287e3e4d2853e71176dfbff76ed8fd0bc (read in the fork sheepjun0330/wmdp-main, whose history
holds it): the control vector (unlearn.py lines 36-37), the forget MSE (lines 68-70), the retain
MSE times alpha (lines 83-86), their sum (line 89), the layer output read by a forward hook
(utils.py ``forward_with_cache``, lines 12-32) and the trained weights (utils.py ``get_params``,
lines 39-45, with ``layer_ids=5,6,7``, ``param_ids=6``: unlearn.py lines 162-164)."""

from __future__ import annotations

import copy
import json

import pytest
import torch

from unlearn_plugins import UNLEARNING_OBJECTIVE, create
from unlearn_plugins.cli import main
from unlearn_plugins.data import text
from unlearn_plugins.data.qa import PaddingCollator
from unlearn_plugins.objectives.base import ObjectiveContext

pytestmark = pytest.mark.usefixtures("single_thread")

FORGET = [
    "The pathogen was cultured in a growth medium and its spores were dried.",
    "Aerosolised spores remain viable for hours in still air.",
]
RETAIN = ["The river flows through the old town past the cathedral.", "Bread is baked at dawn."]


# ------------------------------------------------------------- the reference, transcribed


def forward_with_cache(model, inputs, module, no_grad=True):
    """rmu/utils.py lines 12-32: the module's output (its first element) from a forward hook."""
    cache = []

    def hook(module, input, output):
        cache.append(output[0] if isinstance(output, tuple) else output)

    handle = module.register_forward_hook(hook)
    if no_grad:
        with torch.no_grad():
            model(**inputs)
    else:
        model(**inputs)
    handle.remove()
    return cache[0]


def get_params(model, layer_ids, param_ids):
    """rmu/utils.py lines 39-45."""
    return [p for i in layer_ids for j, p in enumerate(model.model.layers[i].parameters()) if j in param_ids]


def reference_rmu_loss(updated_model, frozen_model, unlearn_inputs, retain_inputs, random_vector, layer_id=7):
    """rmu/unlearn.py lines 36-37, 64-89 (one topic: steering 6.5, alpha 1200)."""
    steering_coeff, alpha = 6.5, 1200.0
    control_vec = random_vector / torch.norm(random_vector) * steering_coeff
    updated_module = updated_model.model.layers[layer_id]
    frozen_module = frozen_model.model.layers[layer_id]
    updated_forget_activations = forward_with_cache(updated_model, unlearn_inputs, updated_module, no_grad=False)
    unlearn_loss = torch.nn.functional.mse_loss(updated_forget_activations, control_vec)
    updated_retain_activations = forward_with_cache(updated_model, retain_inputs, updated_module, no_grad=False)
    frozen_retain_activations = forward_with_cache(frozen_model, retain_inputs, frozen_module, no_grad=True)
    retain_loss = torch.nn.functional.mse_loss(updated_retain_activations, frozen_retain_activations)
    retain_loss *= alpha
    return unlearn_loss + retain_loss


# ------------------------------------------------------------------------------ the tests


def window_batch(tokenizer, docs, max_length):
    windows = text.windows(tokenizer, [text.Document(d, str(i)) for i, d in enumerate(docs)], max_length)
    return PaddingCollator(tokenizer.pad_token_id)(text.encode_windows(windows))


@pytest.mark.filterwarnings("ignore:Using a target size")  # the reference's (1, 1, D) broadcast
def test_rmu_wmdp_loss_equals_the_reference_formula(tiny_tokenizer):
    from unlearn_plugins.testing import tiny_llama

    # 8 decoder layers, so the recipe's own layer 7 (and layers 5-7 trained) apply unchanged
    frozen = tiny_llama(len(tiny_tokenizer), layers=8).eval()
    updated = copy.deepcopy(frozen)
    with torch.no_grad():  # the updated model has moved, so the retain term is not zero
        gen = torch.Generator().manual_seed(1)
        for p in get_params(updated, [5, 6, 7], [6]):
            p.add_(0.05 * torch.randn(p.shape, generator=gen))
    frozen.requires_grad_(False)

    forget = window_batch(tiny_tokenizer, FORGET, 12)
    retain = window_batch(tiny_tokenizer, RETAIN, 12)
    assert (forget["attention_mask"] == 0).any() and (retain["attention_mask"] == 0).any()  # padded last windows

    obj = create(UNLEARNING_OBJECTIVE, "rmu", recipe="wmdp", seed=42)
    assert (obj.layer, obj.steering_coeff, obj.alpha, obj.gamma) == (7, 6.5, 1200.0, 1.0)
    context = ObjectiveContext(model=updated, tokenizer=tiny_tokenizer, seed=0)
    obj.prepare(context)
    # only the reference's get_params(model, [5, 6, 7], [6]) stay trainable: mlp.down_proj.weight
    trained = [p for p in updated.parameters() if p.requires_grad]
    assert [id(p) for p in trained] == [id(p) for p in get_params(updated, [5, 6, 7], [6])]
    assert context.info["rmu_trained"] == [f"model.layers.{i}.mlp.down_proj.weight" for i in (5, 6, 7)]

    ours = obj.loss(updated, {"forget": forget, "retain": retain}, reference_model=frozen)
    our_grads = torch.autograd.grad(ours, trained)

    # the reference draws torch.rand(1, 1, D) from the global generator; the same draw here
    random_vector = torch.rand(1, 1, updated.config.hidden_size, generator=torch.Generator().manual_seed(42))
    inputs = lambda b: {"input_ids": b["input_ids"], "attention_mask": b["attention_mask"]}  # noqa: E731
    ref = reference_rmu_loss(updated, frozen, inputs(forget), inputs(retain), random_vector)
    ref_grads = torch.autograd.grad(ref, trained)

    assert obj.last_terms["retain"].item() * 1200 > 0.01 * ref.item()  # both terms count
    assert ours.item() == pytest.approx(ref.item(), rel=1e-6, abs=1e-6)
    for a, b in zip(our_grads, ref_grads):
        assert torch.allclose(a, b, rtol=1e-5, atol=1e-7)

    # the open-unlearning recipe averages per sequence over labelled positions: on padded
    # windows it is a different number, so the equality above tells the two apart
    other = create(UNLEARNING_OBJECTIVE, "rmu", layer=7, steering_coeff=6.5, alpha=1200.0, seed=42)
    other.prepare(ObjectiveContext(model=copy.deepcopy(updated), tokenizer=tiny_tokenizer, seed=0))
    other_loss = other.loss(updated, {"forget": forget, "retain": retain}, reference_model=frozen).item()
    assert abs(other_loss - ref.item()) > 1e-4 * ref.item()


def test_rmu_wmdp_layer_beyond_the_model_is_one_error(tiny_tokenizer):
    from unlearn_plugins.errors import UnlearnError
    from unlearn_plugins.testing import tiny_llama

    obj = create(UNLEARNING_OBJECTIVE, "rmu", recipe="wmdp")
    with pytest.raises(UnlearnError, match="option 'layer' is 7, but the model has 2 layers"):
        obj.prepare(ObjectiveContext(model=tiny_llama(len(tiny_tokenizer)), tokenizer=tiny_tokenizer))
    with pytest.raises(Exception, match="recipe"):
        create(UNLEARNING_OBJECTIVE, "rmu", recipe="tofu")


# layers 0 and 1 (l-2 < 0 is skipped): their down_proj only (hidden 64 x intermediate 128);
# with LoRA r 2 its A (2 x 128) and B (64 x 2) on those two modules
@pytest.mark.parametrize(
    "how,trainable", [("--full-finetune", 2 * 64 * 128), ("--lora-dropout=0", 2 * (2 * 128 + 64 * 2))]
)
def test_unlearn_run_rmu_wmdp_on_text(how, trainable, tiny_model_dir, tmp_path, capsys):
    from tests.test_text_data import cli_args

    out = tmp_path / "run"
    args = cli_args(tiny_model_dir, tmp_path, "rmu", out, how)
    args += ["--objective-option", "recipe=wmdp", "--objective-option", "layer=1"]  # the last layer
    code = main(args)
    assert code == 0, capsys.readouterr().err
    record = json.loads((out / "run.json").read_text())
    assert record["status"] == "completed" and record["steps"] == 1
    assert record["parameters"]["trainable"] == trainable
