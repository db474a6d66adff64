"""Fidelity to the references: the ReGLU preset's schedule, the
scheduler / warmup options, RILA's statistics and retain basis, PEFT's default LoRA init.

Every expected value is computed here from the reference's formula, not with library code."""

from __future__ import annotations

import argparse
import math

import pytest
import torch
from support_training import AUTHOR_QA, small_config, small_finetune_config

from unlearn_plugins.data.qa import encode_qa
from unlearn_plugins.training.lora import lora_layers

pytestmark = pytest.mark.usefixtures("single_thread")

QA = AUTHOR_QA
EPS = 1e-4  # the reference adds 1e-4 I to Cf and Cr


def parse(*argv):
    from unlearn_plugins.commands import run as run_cmd
    from unlearn_plugins.training import UnlearnConfig

    parser = argparse.ArgumentParser()
    run_cmd.add_parser(parser.add_subparsers())
    return run_cmd.resolve_config(UnlearnConfig, parser.parse_args(["run", *argv]))


# ----------------------------------------------------------------------------- schedule


@pytest.mark.parametrize(
    "n_forget, one_epoch",
    [
        (40, 2),  # forget01: ceil(40 / 4) = 10 batches, ceil(10 / 8) = 2 optimizer steps
        (200, 7),  # forget05: 50 batches -> 7 steps (the last one a partial accumulation)
        (400, 13),  # forget10: 100 batches -> 13 steps
    ],
)
def test_reglu_preset_has_the_reference_schedule(tmp_path, n_forget, one_epoch):
    from transformers.trainer_utils import SchedulerType

    from unlearn_plugins.training.run import training_arguments

    config = parse("--preset", "reglu", "--out", str(tmp_path / "x"), "--device", "cpu")
    args = training_arguments(config, train_size=n_forget)
    # reference configs/tofu_forget.yaml + methods/reglu/core.py build_training_arguments
    assert args.per_device_train_batch_size * args.gradient_accumulation_steps * args.world_size == 32
    assert (args.per_device_train_batch_size, args.gradient_accumulation_steps) == (4, 8)
    assert args.lr_scheduler_type == SchedulerType.LINEAR  # TrainingArguments' default there
    assert (args.learning_rate, args.num_train_epochs, args.weight_decay) == (1e-4, 5.0, 0.01)
    assert config.lora_dropout == 0.0
    total = 5 * one_epoch
    assert args.get_warmup_steps(total) == one_epoch


def test_warmup_options_one_at_a_time_and_flags_beat_the_preset(tmp_path):
    from unlearn_plugins.training import UnlearnConfig
    from unlearn_plugins.training.config import ConfigError, load_toml

    config = parse("--preset", "reglu", "--out", "x", "--warmup-steps", "5")
    assert (config.warmup_steps, config.warmup_epochs) == (5, None)
    config = parse("--preset", "reglu", "--out", "x", "--warmup-ratio", "0.1")
    assert (config.warmup_ratio, config.warmup_epochs) == (0.1, None)
    with pytest.raises(SystemExit):  # argparse: not allowed together
        parse("--out", "x", "--warmup-steps", "5", "--warmup-epochs", "1")
    toml = tmp_path / "run.toml"
    toml.write_text("out = 'x'\nwarmup_steps = 3\nwarmup_ratio = 0.2\n")
    with pytest.raises(ConfigError, match="run.toml: options 'warmup_steps' and 'warmup_ratio' both set the warmup"):
        parse("--config", str(toml))
    assert load_toml(toml, UnlearnConfig)["warmup_ratio"] == 0.2
    with pytest.raises(
        ConfigError, match=r"'lr_scheduler' must be a transformers scheduler: linear, cosine, .*'nope'"
    ) as e:
        parse("--out", "x", "--lr-scheduler", "nope")
    assert "\n" not in str(e.value)
    with pytest.raises(ConfigError, match=r"'warmup_ratio' must be in \[0, 1\)"):
        parse("--out", "x", "--warmup-ratio", "1.5")
    with pytest.raises(ConfigError, match="option 'warmup_steps': lr_scheduler 'constant' has no warmup"):
        parse("--out", "x", "--warmup-steps", "3")  # transformers would drop it silently
    assert parse("--out", "x", "--warmup-steps", "3", "--lr-scheduler", "constant_with_warmup").warmup_steps == 3


def test_lr_follows_hf_linear_warmup_then_decay(tiny_model_dir, tofu_dir, tmp_path):
    from transformers import TrainerCallback

    from unlearn_plugins.training import run_finetune, run_unlearning

    used = []

    class LrOfEachStep(TrainerCallback):
        def on_optimizer_step(self, args, state, control, optimizer=None, **kwargs):
            used.append(optimizer.param_groups[0]["lr"])

    lr = 1e-3
    run = {"forget": "tofu:forget01[0:10]", "retain": "tofu:retain99[0:10]", "objective": "grad_diff"}
    schedule = {"lr": lr, "lr_scheduler": "linear", "warmup_epochs": 1.0, "epochs": 2, "save_steps": 0}
    options = {"device": "cpu", "lora_alpha": 8, "grad_accum": 2, **run, **schedule}
    config = small_config(tmp_path / "run", tiny_model_dir, tofu_dir, **options)
    result = run_unlearning(config, callbacks=[LrOfEachStep()])
    # 10 examples / batch 2 = 5 batches = 3 optimizer steps per epoch (2 + 2 + 1): T = 6, warmup W = 3
    total, warmup = 6, 3
    expected = [lr * s / warmup if s < warmup else lr * max(0.0, (total - s) / (total - warmup)) for s in range(total)]
    assert result.record["steps"] == total
    assert used == pytest.approx(expected, rel=1e-12, abs=1e-15)
    assert result.record["initializer"]["init"] == "kaiming"  # the default init of `unlearn run`

    options = {"device": "cpu", "data": "tofu:forget01[0:4]", "lr": 1e-4, "max_steps": 1, "save_steps": 0}
    ft = run_finetune(small_finetune_config(tmp_path / "ft", tiny_model_dir, tofu_dir, **options))
    assert ft.record["initializer"]["init"] == "kaiming"  # and of `unlearn finetune`


# ----------------------------------------------------------------------------- RILA


def peft_model(model, r):
    from peft import LoraConfig, get_peft_model

    return get_peft_model(
        model,
        LoraConfig(
            r=r,
            lora_alpha=2 * r,
            lora_dropout=0.0,
            init_lora_weights=True,
            target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
        ),
    )


def reference_pooled_outputs(model, exs, pad_id=None, pad_to=None):
    """The reference hook: each LoRA base layer's output summed over the sequence (dim 1),
    one example per forward (no padding unless pad_to), float64."""
    rows, handles = {}, []
    for name, module in lora_layers(model):

        def hook(_m, _i, out, _name=name):
            rows.setdefault(_name, []).append(out.sum(dim=1).double())

        handles.append(module.base_layer.register_forward_hook(hook))
    with torch.no_grad(), model.disable_adapter():
        for e in exs:
            ids, mask = list(e["input_ids"]), list(e["attention_mask"])
            if pad_to:
                ids, mask = ids + [pad_id] * (pad_to - len(ids)), mask + [0] * (pad_to - len(mask))
            model(input_ids=torch.tensor([ids]), attention_mask=torch.tensor([mask]))
    for h in handles:
        h.remove()
    return {k: torch.cat(v) for k, v in rows.items()}


def top(mat, k):
    return torch.linalg.eigh(mat)[1][:, -k:]


def projector_gap(a, b):
    a, b = a.double(), b.double()
    return float(torch.linalg.matrix_norm(a @ torch.linalg.pinv(a) - b @ torch.linalg.pinv(b), ord=2))


def well_separated(mat, k):
    evals = torch.linalg.eigvalsh(mat)
    return float(evals[-k] - evals[-k - 1]) > 1e-3 * float(evals.abs().max())


@pytest.mark.parametrize("path", [None, "dense", "factored"])
def test_rila_faithful_statistics_match_the_reference(tiny_model, tiny_tokenizer, path):
    from unlearn_plugins.initializers.rila import RILAInit, collect_stats, select_examples

    tok = tiny_tokenizer
    forget = [encode_qa(tok, q, a) for q, a in QA[:5]]
    retain = [encode_qa(tok, q, a) for q, a in QA[5:]]
    assert (RILAInit().mode, RILAInit().n_samples) == ("faithful", 256)  # the reference's defaults
    n, beta, r, k = 3, 0.7, 2, 3
    # the reference: the first n forget examples, each with a uniformly drawn retain partner
    picks = torch.randint(len(retain), (n,), generator=torch.Generator().manual_seed(0)).tolist()
    ref_forget, ref_retain = forget[:n], [retain[i] for i in picks]
    assert select_examples(forget, retain, n) == (ref_forget, ref_retain)

    model = peft_model(tiny_model, r)
    hf = reference_pooled_outputs(model, ref_forget)
    hr = reference_pooled_outputs(model, ref_retain)
    weights = {name: m.base_layer.weight.detach().double().clone() for name, m in lora_layers(model)}

    # our pooled second moments (module outputs, or W Cin W^T on the factored path)
    stats = collect_stats(model, ref_forget, ref_retain, tok.pad_token_id, path=path)
    for name, (fs, rs) in stats.items():
        for ours, h in ((fs, hf[name]), (rs, hr[name])):
            if ours.path == "rows":
                m = ours.matrix().double()
                c = m.T @ m / ours.count
            elif ours.path == "dense":
                c = ours.gram.double() / ours.count
            else:
                c = weights[name] @ (ours.gram.double() / ours.count) @ weights[name].T
            expected = h.T @ h / h.shape[0]
            assert float(torch.linalg.matrix_norm(c - expected) / torch.linalg.matrix_norm(expected)) < 1e-5, name

    result = RILAInit(beta=beta, n_samples=n, rol_rank=k, path=path).initialize(
        model, forget=forget, retain=retain, tokenizer=tok
    )
    checked = 0
    for name, module in lora_layers(model):
        d = weights[name].shape[0]
        eye = torch.eye(d, dtype=torch.float64)
        cf = hf[name].T @ hf[name] / n + EPS * eye
        cr = hr[name].T @ hr[name] / n + EPS * eye
        delta = (1 - beta) * cf - beta * cr
        B = module.lora_B["default"].weight.detach().double()
        if well_separated(delta, r):
            q = top(delta, r)
            assert projector_gap(B, q) < 1e-5, name
            A = module.lora_A["default"].weight.detach().double()
            assert torch.allclose(A, B.T @ weights[name], atol=1e-5)
            checked += 1
        if well_separated(cr, k):
            assert projector_gap(result.retain_basis[name], top(cr, k)) < 1e-5, name
    assert checked >= 10


@pytest.mark.filterwarnings("ignore:rila. fewer than r positive eigenvalues")  # beta = 1: Delta <= 0
@pytest.mark.parametrize("path", ["rows", "dense", "factored"])
@pytest.mark.parametrize("beta", [0.0, 1.0])
def test_rila_retain_basis_is_top_eigenvectors_of_cr_whatever_beta(tiny_model, tiny_tokenizer, path, beta):
    """P_B = top-k eigenvectors of Cr on every path; at beta = 0 the rows path used to span
    only the forget rows (projector error 0.29)."""
    from unlearn_plugins.initializers.rila import RILAInit

    tok = tiny_tokenizer
    forget = [encode_qa(tok, q, a) for q, a in QA[:3]]
    retain = [encode_qa(tok, q, a) for q, a in QA[3:7]]
    model = peft_model(tiny_model, 2)
    hr = reference_pooled_outputs(model, retain)
    k = 3  # < 4 retain rows: the top-3 subspace of Cr is well defined
    result = RILAInit(beta=beta, n_samples="all", rol_rank=k, path=path).initialize(
        model, forget=forget, retain=retain, tokenizer=tok
    )
    assert result.info["paths"] == {path: 14}
    for name, _module in lora_layers(model):
        cr = hr[name].T @ hr[name] / hr[name].shape[0]
        cr = cr + EPS * torch.eye(cr.shape[0], dtype=torch.float64)
        assert well_separated(cr, k), name
        assert projector_gap(result.retain_basis[name], top(cr, k)) < 1e-5, name


def test_rila_pad_to_pools_over_padded_positions_like_tofu_format_data(tiny_model, tiny_tokenizer):
    from unlearn_plugins.initializers.rila import RILAInit, collect_stats

    tok = tiny_tokenizer
    forget = [encode_qa(tok, q, a) for q, a in QA[:3]]
    retain = [encode_qa(tok, q, a) for q, a in QA[3:6]]
    model = peft_model(tiny_model, 2)
    pad_to = max(len(e["input_ids"]) for e in forget + retain) + 7
    hf = reference_pooled_outputs(model, forget, tok.eos_token_id, pad_to)
    stats = collect_stats(model, forget, retain, tok.eos_token_id, path="dense", pad_to=pad_to)
    for name, (fs, _rs) in stats.items():
        expected = hf[name].T @ hf[name] / 3
        assert (
            float(torch.linalg.matrix_norm(fs.gram.double() / fs.count - expected) / torch.linalg.matrix_norm(expected))
            < 1e-5
        ), name
    from unlearn_plugins.training.config import ConfigError

    with pytest.raises(ConfigError, match="pad_to=4 is shorter than an example"):
        RILAInit(pad_to=4).initialize(model, forget=forget, retain=retain, tokenizer=tok)
    with pytest.raises(ConfigError, match="rila option n_samples must be"):
        RILAInit(n_samples=0)


# ----------------------------------------------------------------------------- default init


def test_default_init_is_pefts_kaiming_uniform_with_zero_b(tiny_model):
    from peft import LoraConfig, get_peft_model

    from unlearn_plugins import ADAPTER_INITIALIZER, create
    from unlearn_plugins.testing import tiny_llama
    from unlearn_plugins.training import UnlearnConfig

    assert UnlearnConfig().initializer == "kaiming"
    targets = ["q_proj", "v_proj", "gate_proj", "down_proj"]
    model = get_peft_model(
        tiny_model, LoraConfig(r=4, lora_alpha=8, target_modules=targets, init_lora_weights="gaussian")
    )
    torch.manual_seed(123)
    result = create(ADAPTER_INITIALIZER, "kaiming").initialize(model)
    assert result.residual is False and result.info["init"] == "kaiming"

    # PEFT's init_lora_weights=True: A <- kaiming_uniform_(a=sqrt(5)), layer by layer; B <- 0
    torch.manual_seed(123)
    ours, peft_own = [], []
    for _name, module in lora_layers(model):
        a = module.lora_A["default"].weight.detach()
        expected = torch.nn.init.kaiming_uniform_(torch.empty_like(a), a=math.sqrt(5))
        assert torch.equal(a, expected)
        assert not module.lora_B["default"].weight.any()
        assert float(a.abs().max()) <= 1 / math.sqrt(a.shape[1])  # U(-1/sqrt(d_in), 1/sqrt(d_in))
        ours.append(a.flatten() * math.sqrt(a.shape[1]))
    # the same distribution as a PEFT model built with init_lora_weights=True
    peft_default = get_peft_model(tiny_llama(384, seed=1), LoraConfig(r=4, lora_alpha=8, target_modules=targets))
    for _name, module in lora_layers(peft_default):
        a = module.lora_A["default"].weight.detach()
        peft_own.append(a.flatten() * math.sqrt(a.shape[1]))
    ours, peft_own = torch.cat(ours), torch.cat(peft_own)
    assert abs(float(ours.std()) - float(peft_own.std())) < 0.05 * float(peft_own.std())
    assert abs(float(ours.std()) - 1 / math.sqrt(3)) < 0.05  # std of U(-1, 1)


@pytest.mark.parametrize("path", ["rows", "dense"])
def test_rila_retain_basis_with_fewer_rows_than_k_never_holds_forget_directions(path):
    """Fewer data rows than rol_rank (forget 1 TOFU author: 20 + 20 rows against k = 128): P_B has
    k columns, spans the retain rows, and is completed away from the forget rows, as the
    reference's dense eigendecomposition of Cr + eps I can complete it (its degenerate
    eigenspace); the step-0 ROL penalty equals the one from an independent dense computation.
    The old code kept numerically-zero eigenpairs inside the forget span (min(k, n) columns)."""
    from unlearn_plugins.initializers.rila import RIDGE, _Stats, solve

    g = torch.Generator().manual_seed(3)
    d, nf, nr, r, k, beta = 96, 10, 10, 4, 32, 0.7
    hf = torch.randn(nf, d, generator=g)
    hr = torch.randn(nr, d, generator=g)
    weight = torch.randn(d, 48, generator=g)
    fs, rs = _Stats(path), _Stats(path)
    for stats, h in ((fs, hf), (rs, hr)):
        stats.add(h)
    (solution,) = solve([(fs, rs, weight)], beta, [r], [k])
    pb = solution.retain_basis.double()
    assert pb.shape == (d, k)
    assert torch.allclose(pb.T @ pb, torch.eye(k, dtype=torch.float64), atol=1e-8)

    # independent dense computation: the retain span, and the forget directions outside it
    hf64, hr64 = hf.double(), hr.double()
    u_r = torch.linalg.svd(hr64.T, full_matrices=False)[0]  # d x nr
    forget_only = hf64.T - u_r @ (u_r.T @ hf64.T)
    assert float(torch.linalg.matrix_norm(u_r - pb @ (pb.T @ u_r))) < 1e-6  # retain span inside P_B
    assert float((pb.T @ forget_only).abs().max()) < 1e-6 * float(forget_only.abs().max())  # no forget

    eye = torch.eye(d, dtype=torch.float64)
    cf, cr = hf64.T @ hf64 / nf + RIDGE * eye, hr64.T @ hr64 / nr + RIDGE * eye
    q = torch.linalg.eigh((1 - beta) * cf - beta * cr)[1][:, -r:]
    expected = float((q.T @ u_r).pow(2).sum())  # the completion adds nothing: Q lies in the data span
    penalty = float((solution.q.double().T @ pb).pow(2).sum())
    assert penalty == pytest.approx(expected, rel=1e-6)


def _rows_with_spectrum(n: int, d: int, eigenvalues, generator):
    """n rows whose uncentered second moment H^T H / n has the given (at most n) eigenvalues."""
    u = torch.linalg.qr(torch.randn(n, len(eigenvalues), generator=generator, dtype=torch.float64))[0]
    v = torch.linalg.qr(torch.randn(d, len(eigenvalues), generator=generator, dtype=torch.float64))[0]
    return (u * (eigenvalues * n).sqrt()) @ v.T


@pytest.mark.parametrize("path", ["dense", "factored", "rows"])
def test_rila_retain_basis_keeps_small_real_retain_directions(path):
    """With at least k retain rows P_B is the reference's top-k of Cr (reglu-open rila.py: dense
    float64 eigh of Cr + 1e-4 I), also when Cr's top k eigenvalues span 1e6 as SmolLM2's k_proj
    outputs do. A float32 Gram and a threshold of max x m x eps32 kept 13-46 of 128 there."""
    from unlearn_plugins.initializers.rila import _Stats, solve

    g = torch.Generator().manual_seed(7)
    d_out, k, r, beta, scale = 192, 128, 8, 0.7, 1e4  # pooled sums are large: lambda_1 ~ 1e4
    n_r, n_f = (150, 32) if path == "rows" else (512, 512)  # the rows path: fewer rows than d_out
    d = 160 if path == "factored" else d_out  # factored: outputs in the column space of a taller W0
    tail = min(n_r, d) - k
    spectrum = scale * torch.cat([torch.logspace(0, -6, k), torch.logspace(-8, -10, tail)]).double()
    x_r = _rows_with_spectrum(n_r, d, spectrum, g).float()
    x_f = (torch.randn(n_f, d, generator=g) * scale**0.5).float()
    if path == "factored":
        w0 = torch.linalg.qr(torch.randn(d_out, d, generator=g, dtype=torch.float64))[0]
        h_r, weight = x_r.double() @ w0.T, w0.float()
    else:
        h_r, weight = x_r.double(), torch.randn(d_out, 64, generator=g)
    fs, rs = _Stats(path), _Stats(path)
    for stats, rows in ((fs, x_f), (rs, x_r)):
        for start in range(0, len(rows), 8):  # batch by batch, as the forward hooks add them
            stats.add(rows[start : start + 8])
    (solution,) = solve([(fs, rs, weight)], beta, [r], [k])

    cr = h_r.T @ h_r / n_r + EPS * torch.eye(d_out, dtype=torch.float64)
    evals = torch.linalg.eigvalsh(cr).flip(0)
    assert float(evals[0] / evals[k - 1]) > 0.5e6 and float(evals[k - 1] / evals[k]) > 50  # top-k well defined
    reference = top(cr, k)
    pb = solution.retain_basis.double()
    assert pb.shape == (d_out, k)
    spanned = float((pb.T @ reference).pow(2).sum()) / k
    assert spanned >= 0.99, f"P_B spans {spanned:.1%} of the reference's top-{k}"
    assert solution.retain_kept == k  # every column an eigenvector of Cr, none a completion
