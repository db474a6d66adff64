"""Task Vector and the objective contract's ``finish`` step: the saved weights are
W0 - alpha * (W_ft - W0), with W_ft from an identical run of plain NLL (an objective without
``finish``, trained exactly as before); ``finish`` runs once, after training, before saving."""

from __future__ import annotations

import pytest
import torch
from support_training import small_config

from unlearn_plugins.errors import PluginError
from unlearn_plugins.training.objective import NLL

pytestmark = pytest.mark.usefixtures("single_thread")


def config(out, model_dir, tofu_dir, **extra):
    """The small run of tests/support_training.py on 4 forget QA alone, 2 steps."""
    values = {"forget": "tofu:forget01[0:4]", "retain": None, "max_steps": 2, "save_steps": 0, **extra}
    return small_config(out, model_dir, tofu_dir, **values)


def weights(folder) -> dict[str, torch.Tensor]:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(folder), torch_dtype=torch.float32)
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def assert_negated_task_vector(w0, ft, tv, alpha):
    assert w0.keys() == ft.keys() == tv.keys()
    moved = max(float((ft[k] - w0[k]).abs().max()) for k in w0)
    assert moved > 1e-4  # the fine-tuning did change the weights
    for k in w0:
        expected = w0[k] - alpha * (ft[k] - w0[k])
        torch.testing.assert_close(tv[k], expected, atol=1e-6, rtol=0, msg=k)


@pytest.mark.parametrize("alpha", [1.0, 0.5])
def test_lora_task_vector_is_w0_minus_alpha_times_the_fine_tuned_delta(alpha, tiny_model_dir, tofu_dir, tmp_path):
    from unlearn_plugins.training import run_unlearning

    run_unlearning(config(tmp_path / "ft", tiny_model_dir, tofu_dir, merge=True), objective=NLL())
    options = {} if alpha == 1.0 else {"alpha_tv": alpha}  # 1.0: the default, MUSE's
    result = run_unlearning(
        config(
            tmp_path / "tv", tiny_model_dir, tofu_dir, merge=True, objective="task_vector", objective_options=options
        )
    )
    assert result.record["context"]["task_vector"]["mode"] == "lora"
    assert result.record["context"]["task_vector"]["negated_lora_layers"] > 0
    assert_negated_task_vector(
        weights(tiny_model_dir), weights(tmp_path / "ft" / "merged"), weights(tmp_path / "tv" / "merged"), alpha
    )
    # the saved adapter carries the negation too (loaded on the base, it gives the merged weights)
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir), torch_dtype=torch.float32)
    merged = PeftModel.from_pretrained(base, str(tmp_path / "tv")).merge_and_unload().state_dict()
    tv = weights(tmp_path / "tv" / "merged")
    for k in tv:
        torch.testing.assert_close(merged[k], tv[k], atol=1e-6, rtol=0, msg=k)


def test_full_finetune_task_vector_is_w0_minus_alpha_times_the_fine_tuned_delta(tiny_model_dir, tofu_dir, tmp_path):
    from unlearn_plugins.training import run_unlearning

    run_unlearning(config(tmp_path / "ft", tiny_model_dir, tofu_dir, full_finetune=True), objective=NLL())
    result = run_unlearning(
        config(
            tmp_path / "tv",
            tiny_model_dir,
            tofu_dir,
            full_finetune=True,
            objective="task_vector",
            objective_options={"alpha_tv": 0.5},
        )
    )
    assert result.record["context"]["task_vector"]["mode"] == "full"
    assert_negated_task_vector(weights(tiny_model_dir), weights(tmp_path / "ft"), weights(tmp_path / "tv"), 0.5)


class FinishRecorder(NLL):
    """A third-party objective with ``finish``: records each call and zeroes every lora_B, so
    the saved adapter shows whether ``finish`` ran before saving."""

    name = "finish_recorder"

    def __init__(self, w0):
        super().__init__()
        self.w0, self.calls = w0, []

    def finish(self, model, context):
        trained = {n: p for n, p in model.named_parameters() if "lora_B" in n}
        self.calls.append(
            {
                "trained": any(bool(p.detach().ne(0).any()) for p in trained.values()),
                "forget": len(context.forget),
            }
        )
        with torch.no_grad():
            for p in trained.values():
                p.zero_()
        context.info["finished"] = True


def test_finish_is_called_once_after_training_and_before_saving(tiny_model_dir, tofu_dir, tmp_path):
    from unlearn_plugins.training import run_unlearning

    objective = FinishRecorder(weights(tiny_model_dir))
    result = run_unlearning(config(tmp_path / "hook", tiny_model_dir, tofu_dir, merge=True), objective=objective)
    assert objective.calls == [{"trained": True, "forget": 4}]
    assert result.record["context"]["finished"] is True
    assert_close_dicts(weights(tmp_path / "hook" / "merged"), objective.w0)  # lora_B zeroed before the save

    # the same objective without finish: the trained adapter is saved as it was trained
    run_unlearning(config(tmp_path / "plain", tiny_model_dir, tofu_dir, merge=True), objective=NLL())
    plain = weights(tmp_path / "plain" / "merged")
    assert max(float((plain[k] - objective.w0[k]).abs().max()) for k in plain) > 1e-4


def assert_close_dicts(a, b):
    assert a.keys() == b.keys()
    for k in a:
        torch.testing.assert_close(a[k], b[k], atol=1e-6, rtol=0, msg=k)


class BrokenFinish(NLL):
    def finish(self, model, context):
        raise ValueError("boom")


def test_a_finish_that_raises_is_named_and_nothing_is_saved(tiny_model_dir, tofu_dir, tmp_path):
    from unlearn_plugins.training import run_unlearning

    out = tmp_path / "broken"
    with pytest.raises(PluginError, match=r"objective 'nll': finish\(\) raised ValueError: boom"):
        run_unlearning(config(out, tiny_model_dir, tofu_dir), objective=BrokenFinish())
    assert not (out / "adapter_model.safetensors").exists()


class NonZeroB:
    """An initializer that starts every lora_B at 0.01 (the update is then not B A alone)."""

    def initialize(self, peft_model, *, forget, retain, tokenizer):
        with torch.no_grad():
            for name, p in peft_model.named_parameters():
                if "lora_B" in name:
                    p.fill_(0.01)


def test_task_vector_refuses_a_lora_start_that_is_not_zero(tiny_model_dir, tofu_dir, tmp_path):
    from unlearn_plugins.errors import UnlearnError
    from unlearn_plugins.training import run_unlearning

    out = tmp_path / "nz"
    with pytest.raises(UnlearnError, match="task_vector.*starts at zero"):
        run_unlearning(config(out, tiny_model_dir, tofu_dir, objective="task_vector"), initializer=NonZeroB())
    assert not (out / "run.json").exists()


def docs_example(name: str):
    """The class ``name`` from the Python block of docs/plugins.md that defines it."""
    import re
    from pathlib import Path

    text = (Path(__file__).resolve().parents[1] / "docs" / "plugins.md").read_text()
    block = next(b for b in re.findall(r"```python\n(.*?)```", text, re.S) if f"class {name}" in b)
    namespace: dict = {}
    exec(compile(block, "docs/plugins.md", "exec"), namespace)
    return namespace[name]


def test_the_documented_finish_example_scales_the_lora_update(tiny_model_dir, tofu_dir, tmp_path):
    from unlearn_plugins.training import run_unlearning

    shrunk_ascent = docs_example("ShrunkAscent")
    run_unlearning(config(tmp_path / "all", tiny_model_dir, tofu_dir, merge=True), objective=shrunk_ascent(keep=1.0))
    result = run_unlearning(
        config(tmp_path / "half", tiny_model_dir, tofu_dir, merge=True), objective=shrunk_ascent(keep=0.5)
    )
    assert result.record["context"]["shrunk_by"] == 0.5
    w0, full, half = (
        weights(tiny_model_dir),
        weights(tmp_path / "all" / "merged"),
        weights(tmp_path / "half" / "merged"),
    )
    assert_close_dicts(half, {k: w0[k] + 0.5 * (full[k] - w0[k]) for k in w0})
