"""LMCleaner and the trajectory it replays (`unlearn finetune --record-trajectory`).

The correction is compared with a transcription of the reference, locuslab/open-unlearning
``src/trainer/unlearn/lmcleaner_core.py`` at commit f08ef4cbde8142716c02e98ca05ec85ed9ccc882:
``hvp_ggn`` (``grads = torch.autograd.grad(loss, params, create_graph=True)``; ``gv = sum((g *
v_part).sum() ...)``; ``hvp = torch.autograd.grad(gv, params)``), ``hvp_fisher`` (``return g *
g_dot_v``), ``HistoricalParamContext`` (``theta_current = theta_tau - sum u[t]``, ``advance(s)``
adds ``u[s]``) and ``compute_correction`` (``v = -rec.u.clone()``; ``end = min(tz + K, tau -
1)``; ``v = v - eta * hvp``; ``if cfg.damping > 0: v = v - eta * cfg.damping * v``), applied as
``lmcleaner_batch.py`` does (``apply_correction(v, params)`` after each forget step,
"sequential") or as the reference config's ``apply_mode: sum_then_apply`` (summed, applied once).
The reference's loss is the model's own ``outputs.loss`` on one batch of all the step's samples
(its BatchReconstructor), in float64 here; ours sums micro-batches token-weighted.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
import torch
from support_training import small_config, small_finetune_config

from unlearn_plugins.errors import UnlearnError

pytestmark = pytest.mark.usefixtures("single_thread")

DATA = "tofu:forget01[0:10]"
FORGET = "tofu:forget01[0:3]"


class Theta0:
    """A Trainer callback keeping the trainable parameters as training starts."""

    def __init__(self):
        from transformers.trainer_callback import TrainerCallback

        self.values: dict[str, torch.Tensor] = {}
        outer = self

        class _Callback(TrainerCallback):
            def on_train_begin(self, args, state, control, model=None, **kwargs):
                outer.values = {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}

        self.callback = _Callback()


def finetune(out, model_dir, tofu_dir, *, full: bool, callbacks=(), **extra):
    from unlearn_plugins.training import run_finetune

    values = {"data": DATA, "grad_accum": 2, "epochs": 2, "save_steps": 0, "record_trajectory": True}
    values.update(full_finetune=full, merge=not full, **extra)
    return run_finetune(small_finetune_config(out, model_dir, tofu_dir, **values), callbacks=list(callbacks))


@pytest.fixture(scope="module")
def recorded(tiny_model_dir, tofu_dir, tmp_path_factory):
    """A full and a LoRA fine-tune of the tiny model, recorded, with their starting weights."""
    root = tmp_path_factory.mktemp("lmcleaner")
    runs = {}
    for kind in ("full", "lora"):
        start = Theta0()
        result = finetune(root / kind, tiny_model_dir, tofu_dir, full=kind == "full", callbacks=[start.callback])
        runs[kind] = {"out": root / kind, "theta0": start.values, "record": result.record}
    return runs


# ----------------------------------------------------------------------------- recording


@pytest.mark.parametrize("kind", ["full", "lora"])
def test_recorded_updates_sum_to_final_minus_initial_weights(kind, recorded, tofu_dir):
    from safetensors.torch import load_file

    from unlearn_plugins.data.qa import load_split
    from unlearn_plugins.training.trajectory import FORMAT, UPDATE, Trajectory, example_key, step_file

    run = recorded[kind]
    folder = run["out"] / "trajectory"
    meta = json.loads((folder / "trajectory.json").read_text())
    assert set(meta) == {"format", "steps", "lora", "update", "parameters", "bytes_per_step", "records"}
    assert meta["format"] == FORMAT and meta["update"] == UPDATE and meta["lora"] is (kind == "lora")
    assert meta["steps"] == run["record"]["steps"] == 6  # 10 examples, batches of 2, 2 per step, 2 epochs
    assert list(meta["parameters"]) == list(run["theta0"])
    assert meta["bytes_per_step"] == 4 * sum(t.numel() for t in run["theta0"].values())
    seen = sorted(i for r in meta["records"] for b in r["batches"] for i in b)
    assert seen == sorted(list(range(10)) * 2)  # every example once per epoch
    assert all(r["lr"] == 1e-3 for r in meta["records"])

    trajectory = Trajectory(folder)
    total = {n: torch.zeros_like(t) for n, t in run["theta0"].items()}
    for t in range(trajectory.steps):
        u = trajectory.update(t)
        for n in total:
            total[n] += u[n]
        from safetensors import safe_open

        with safe_open(str(step_file(folder, t)), "pt") as f:
            assert json.loads(f.metadata()["batches"]) == meta["records"][t]["batches"]
    final = trajectory.final()
    moved = max(float((final[n] - run["theta0"][n]).abs().max()) for n in total)
    assert moved > 1e-4
    for n in total:
        torch.testing.assert_close(run["theta0"][n] + total[n], final[n], atol=1e-6, rtol=0, msg=n)
    # final.safetensors = the saved weights
    saved = load_file(str(run["out"] / ("model.safetensors" if kind == "full" else "adapter_model.safetensors")))
    for n, value in final.items():
        key = n.replace(".default.", ".") if kind == "lora" else n
        if key in saved:
            torch.testing.assert_close(saved[key], value, atol=0, rtol=0, msg=n)
    # the examples, keyed by question and answer
    samples = load_split(DATA, str(tofu_dir))
    examples = trajectory.examples
    assert [e["key"] for e in examples] == [example_key(s) for s in samples]
    expected = hashlib.sha256(f"{samples[0].question}\x00{samples[0].answer}".encode()).hexdigest()[:32]
    assert examples[0]["key"] == expected
    assert (folder / "adapter_config.json").is_file() is (kind == "lora")


def test_reads_the_trajectory_an_earlier_version_recorded():
    """The SmolLM2 study target cached by the lost first version (read only, when present)."""
    from unlearn_plugins.training.trajectory import Trajectory, example_key

    folder = Path.home() / ".cache/unlearn-plugins/studies/target-full-570024295cb5/run/trajectory"
    full = Path.home() / ".cache/unlearn-plugins/studies/bench-auto-de56339dac17/full.json"
    if not (folder / "trajectory.json").is_file() or not full.is_file():
        pytest.skip("the cached SmolLM2 study target is not on this machine")
    trajectory = Trajectory(folder)
    assert trajectory.lora and trajectory.steps == 24 and len(trajectory.examples) == 60

    class QA:
        def __init__(self, row):
            self.question, self.answer = row["question"], row["answer"]

    rows = [json.loads(line) for line in full.read_text().splitlines() if line.strip()]
    assert [e["key"] for e in trajectory.examples] == [example_key(QA(r)) for r in rows]


# ----------------------------------------------------------------------------- the reference, transcribed


def _flat(tensors):
    return torch.cat([t.reshape(-1) for t in tensors])


def _unflatten_like(flat, target):
    out, offset = [], 0
    for t in target:
        out.append(flat[offset : offset + t.numel()].view_as(t))
        offset += t.numel()
    return out


def _set_flat(params, flat):
    with torch.no_grad():
        for p, part in zip(params, _unflatten_like(flat, params)):
            p.copy_(part)


def _ref_hvp(model, batch, v, params, mode):
    """lmcleaner_core.py ``hvp_ggn`` / ``hvp_fisher`` (loss = outputs.loss)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    model.zero_grad()
    with sdpa_kernel(SDPBackend.MATH):
        outputs = model(**batch)
    loss = outputs.loss
    if mode == "fisher":
        grads = torch.autograd.grad(loss, params)
        g = _flat([grad.detach() for grad in grads])
        return g * torch.dot(g, v)
    grads = torch.autograd.grad(loss, params, create_graph=True)
    gv = sum((g * v_part).sum() for g, v_part in zip(grads, _unflatten_like(v, params)))
    return _flat(torch.autograd.grad(gv, params))


def _ref_correction(tz, tau, K, U, etas, batch_of, model, params, mode, damping, historical):
    """lmcleaner_core.py ``compute_correction`` with ``HistoricalParamContext``."""
    v = -U[tz].clone()
    start, end = tz + 1, min(tz + K, tau - 1)
    active = historical and max(0, end - start + 1) > 0
    if active:
        theta_tau = _flat([p.detach() for p in params]).clone()
        current = theta_tau.clone()
        for t in range(start, end + 1):
            current -= U[t]
        for t in range(end + 1, tau):
            current -= U[t]
        _set_flat(params, current)
    for s in range(start, end + 1):
        with torch.enable_grad():
            hvp = _ref_hvp(model, batch_of(s), v, params, mode)
        eta = etas[s]
        v = v - eta * hvp
        if damping > 0:
            v = v - eta * damping * v
        if active:
            current += U[s]
            _set_flat(params, current)
    if active:
        _set_flat(params, theta_tau)
    return v


def _reference_unlearning(model, params, names, trajectory, steps, *, K, mode, damping, apply_mode, historical):
    from unlearn_plugins.data.qa import pad_batch

    tau = trajectory.steps
    U = {t: _flat([trajectory.update(t)[n].double() for n in names]) for t in range(tau)}
    etas = {t: trajectory.lr(t) for t in range(tau)}
    examples = trajectory.examples

    def batch_of(s):
        rows = [examples[i] for b in trajectory.batches(s) for i in b]
        return pad_batch(rows, 0)

    total = None
    for tz in steps:
        v = _ref_correction(tz, tau, K, U, etas, batch_of, model, params, mode, damping, historical)
        if apply_mode == "sequential":
            _set_flat(params, _flat([p.detach() for p in params]) + v)  # apply_correction
        else:
            total = v if total is None else total + v
    if total is not None:
        _set_flat(params, _flat([p.detach() for p in params]) + total)


def _correct(model, trajectory, steps, setting):
    """Our correction of ``model``, in place, with a setting of SETTINGS (the reference's names); its audit."""
    from unlearn_plugins.objectives.lmcleaner import correct, trajectory_space

    options = {"K": setting["K"], "hessian_mode": setting["mode"], "damping": setting["damping"]}
    options.update(apply_mode=setting["apply_mode"], use_historical_params=setting["historical"])
    space = trajectory_space(model, trajectory)
    try:
        return correct(space, trajectory, steps, **options)
    finally:
        space.close()


def _load64(folder):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(folder), torch_dtype=torch.float64).eval()


SETTINGS = [
    dict(K=800, mode="ggn", damping=1e-4, apply_mode="sum_then_apply", historical=True),  # the defaults
    dict(K=2, mode="ggn", damping=0.5, apply_mode="sequential", historical=True),
    dict(K=3, mode="fisher", damping=0.0, apply_mode="sum_then_apply", historical=False),
    dict(K=5, mode="fisher", damping=0.5, apply_mode="sum_then_apply", historical=False),
]


@pytest.mark.parametrize("setting", SETTINGS, ids=lambda s: f"{s['mode']}-K{s['K']}-{s['apply_mode']}")
def test_full_correction_equals_the_reference_formula(setting, recorded):
    from unlearn_plugins.objectives.lmcleaner import forget_steps
    from unlearn_plugins.training.trajectory import Trajectory

    folder = recorded["full"]["out"]
    trajectory = Trajectory(folder / "trajectory")
    steps = forget_steps(trajectory, {0, 1, 2})
    assert steps and len(steps) < trajectory.steps + 1

    reference = _load64(folder)
    names = list(trajectory.parameters)
    named = dict(reference.named_parameters())
    params = [named[n] for n in names]
    _reference_unlearning(reference, params, names, trajectory, steps, **setting)

    ours = _load64(folder)
    before = {n: p.detach().clone() for n, p in ours.named_parameters()}
    audit = _correct(ours, trajectory, steps, setting)
    assert audit["hvp_calls"] > 0
    # no window truncated (K >= tau-1-tz for every forget step), summed: the sum propagated once
    fused = setting["apply_mode"] == "sum_then_apply" and all(tz + setting["K"] >= trajectory.steps - 1 for tz in steps)
    assert audit["fused"] is fused
    assert fused or setting["apply_mode"] == "sequential" or setting["K"] == 3
    expected = dict(reference.named_parameters())
    moved = max(float((p.detach() - before[n]).abs().max()) for n, p in ours.named_parameters())
    assert moved > 1e-5
    for n, p in ours.named_parameters():
        torch.testing.assert_close(p.detach(), expected[n].detach(), atol=1e-6, rtol=0, msg=n)
        assert p.requires_grad  # the space gave the model back as it found it


def test_lora_correction_equals_the_reference_formula_on_the_adapter(recorded, tiny_model_dir):
    """A LoRA target: the reference corrects the adapter's A, B on base + adapter (PeftModel);
    ours corrects the merged model; the merged weights agree."""
    from peft import PeftModel

    from unlearn_plugins.objectives.lmcleaner import forget_steps
    from unlearn_plugins.training.trajectory import Trajectory

    folder = recorded["lora"]["out"]
    trajectory = Trajectory(folder / "trajectory")
    steps = forget_steps(trajectory, {0, 1, 2})
    setting = SETTINGS[1]

    reference = PeftModel.from_pretrained(_load64(tiny_model_dir), str(folder), is_trainable=True).eval()
    named = [(n, p) for n, p in reference.named_parameters() if p.requires_grad]
    assert [n for n, _ in named] == list(trajectory.parameters)
    _reference_unlearning(reference, [p for _, p in named], [n for n, _ in named], trajectory, steps, **setting)
    expected = reference.merge_and_unload().state_dict()

    ours = _load64(folder / "merged")
    _correct(ours, trajectory, steps, setting)
    target = _load64(folder / "merged").state_dict()
    got = ours.state_dict()
    assert max(float((got[k] - target[k]).abs().max()) for k in got) > 1e-6  # it moved
    for k in got:
        torch.testing.assert_close(got[k], expected[k], atol=1e-6, rtol=0, msg=k)


# ----------------------------------------------------------------------------- runs and bad input


def unlearn_config(out, model, tofu_dir, **extra):
    """One LMCleaner step of the small run's sizes, a full fine-tune (its LoRA rank unused)."""
    values = {"forget": FORGET, "retain": None, "max_steps": 1, "save_steps": 0, "objective": "lmcleaner"}
    return small_config(out, model, tofu_dir, **{**values, "full_finetune": True, **extra})


def _one_line_error(call, match):
    with pytest.raises(UnlearnError, match=match) as info:
        call()
    assert "\n" not in str(info.value)
    return str(info.value)


def test_bad_input_is_one_line(recorded, tiny_model_dir, tofu_dir, tmp_path):
    from unlearn_plugins.training import FinetuneConfig, run_unlearning

    full = recorded["full"]["out"]
    # a model without a trajectory next to it
    _one_line_error(
        lambda: run_unlearning(unlearn_config(tmp_path / "a", tiny_model_dir, tofu_dir)), "no recorded trajectory"
    )
    # LoRA
    _one_line_error(
        lambda: run_unlearning(unlearn_config(tmp_path / "b", full, tofu_dir, full_finetune=False)),
        "needs --full-finetune",
    )
    # a trajectory option that is not one
    _one_line_error(
        lambda: run_unlearning(
            unlearn_config(tmp_path / "c", full, tofu_dir, objective_options={"trajectory": str(tmp_path)})
        ),
        "trajectory.json is missing",
    )
    # forget samples the target never saw
    _one_line_error(
        lambda: run_unlearning(unlearn_config(tmp_path / "d", full, tofu_dir, forget="tofu:forget01[30:33]")),
        "none of the 3 forget samples",
    )
    # another model than the one recorded
    _one_line_error(
        lambda: run_unlearning(
            unlearn_config(
                tmp_path / "e", tiny_model_dir, tofu_dir, objective_options={"trajectory": str(full / "trajectory")}
            )
        ),
        "differ from the trajectory's final weights",
    )
    for option in ({"K": -1}, {"hessian_mode": "exact"}, {"apply_mode": "x"}, {"damping": -1.0}):
        _one_line_error(
            lambda option=option: run_unlearning(
                unlearn_config(tmp_path / "f", full, tofu_dir, objective_options=option)
            ),
            "must be",
        )
    # a damaged trajectory
    import shutil

    damaged = tmp_path / "damaged"
    shutil.copytree(full / "trajectory", damaged)
    step = damaged / "steps" / "000003.safetensors"
    step.write_bytes(step.read_bytes()[:100])
    options = {"trajectory": str(damaged)}
    _one_line_error(
        lambda: run_unlearning(unlearn_config(tmp_path / "h", full, tofu_dir, objective_options=options)),
        "000003.safetensors: cannot read",
    )
    (damaged / "trajectory.json").write_text('{"format": "unlearn-trajectory/1", "steps": 6}')
    _one_line_error(
        lambda: run_unlearning(unlearn_config(tmp_path / "i", full, tofu_dir, objective_options=options)),
        "malformed",
    )
    _one_line_error(
        lambda: FinetuneConfig(out=str(tmp_path / "g"), record_trajectory=True, resume=True).validate(),
        "cannot be used with --resume",
    )
    assert not any((tmp_path / x / "run.json").exists() for x in "abcdefhi")


def test_cli_finetune_record_trajectory_then_lmcleaner_run(tiny_model_dir, tofu_dir, tmp_path, capsys):
    from unlearn_plugins.cli import main
    from unlearn_plugins.likelihood import answer_nll
    from unlearn_plugins.objectives.lmcleaner import correct, forget_indices, forget_steps, trajectory_space
    from unlearn_plugins.training.trajectory import Trajectory

    ft, un = tmp_path / "ft", tmp_path / "un"
    common = ["--tofu-dir", str(tofu_dir), "--max-length", "64", "--save-steps", "0", "--full-finetune"]
    assert (
        main(
            ["finetune", "--model", str(tiny_model_dir), "--data", DATA, "--record-trajectory", "--batch-size", "2"]
            + ["--grad-accum", "2", "--epochs", "3", "--lr", "3e-3", "--out", str(ft)]
            + common
        )
        == 0
    )
    assert (ft / "trajectory" / "trajectory.json").is_file()
    assert json.loads((ft / "run.json").read_text())["config"]["record_trajectory"] is True
    assert (
        main(
            ["run", "--model", str(ft), "--no-retain", "--forget", FORGET, "--objective", "lmcleaner"]
            + ["--max-steps", "2", "--out", str(un)]
            + common
        )
        == 0
    )
    record = json.loads((un / "run.json").read_text())
    info = record["context"]["lmcleaner"]
    assert info["forget_examples_found"] == 3 and info["forget_steps"] and info["hvp_calls"] > 0
    assert record["status"] == "completed"

    # the saved model is the target with the correction, unchanged by the (gradient-free) steps
    from unlearn_plugins.data.qa import encode_samples, load_split
    from unlearn_plugins.models import load_tokenizer

    trajectory = Trajectory(ft / "trajectory")
    tokenizer = load_tokenizer(str(ft))
    samples = load_split(FORGET, str(tofu_dir))
    encoded = encode_samples(tokenizer, samples, max_length=64)
    from transformers import AutoModelForCausalLM

    expected = AutoModelForCausalLM.from_pretrained(str(ft), torch_dtype=torch.float32)
    space = trajectory_space(expected, trajectory)
    try:
        correct(
            space,
            trajectory,
            forget_steps(trajectory, forget_indices(trajectory, samples, encoded)),
            K=800,
            hessian_mode="ggn",
            damping=1e-4,
            apply_mode="sum_then_apply",
            use_historical_params=True,
            pad_token_id=tokenizer.pad_token_id,
        )
    finally:
        space.close()
    saved = AutoModelForCausalLM.from_pretrained(str(un), torch_dtype=torch.float32)
    want = expected.state_dict()
    for k, v in saved.state_dict().items():
        torch.testing.assert_close(v, want[k], atol=1e-6, rtol=0, msg=k)

    # it moved the forget probability: the forget answers' NLL rose above the target's
    target = AutoModelForCausalLM.from_pretrained(str(ft), torch_dtype=torch.float32)
    nll_target = sum(s for s, _ in answer_nll(target, encoded, tokenizer.pad_token_id))
    nll_unlearned = sum(s for s, _ in answer_nll(saved, encoded, tokenizer.pad_token_id))
    assert nll_unlearned > nll_target
