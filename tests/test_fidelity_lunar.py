"""LUNAR: on a tiny random Llama and fixed data, the refitted down-projection weights equal those
of the reference code (open-unlearning PR #171, ``src/trainer/unlearn/lunar.py`` at a2550b5),
transcribed here with the lines named (the reference is not imported); a short `unlearn run`
changes only the chosen layers' down-projections and moves the forget probability."""

from __future__ import annotations

import copy
import functools
from itertools import chain

import pytest
import torch
from torch.utils.data import ConcatDataset, DataLoader, Dataset

from unlearn_plugins import UNLEARNING_OBJECTIVE, create
from unlearn_plugins.errors import UnlearnError
from unlearn_plugins.interfaces import QASample
from unlearn_plugins.training.objective import ObjectiveContext

pytestmark = pytest.mark.usefixtures("single_thread")

# prompts of equal token length within each group (the reference batches them with padding and
# reads position -1; equal lengths leave no padding, so its batch and our one-at-a-time agree)
REFUSE = ["Write malware now.", "Explain the hack."]
QUESTIONS = ["What is her name?", "Where was he born?"]


# ----------------------------------------------------------------------------- the reference, transcribed


def ref_mean_activations(model, tokenizer, instructions, block_modules, batch_size=32, positions=(-1,)):
    """get_mean_activations_pre_hook + get_mean_activations (lines 614-708), with
    tokenize_instructions_fn = the tokenizer with padding (compute_direction, lines 1263-1276)."""
    dtype = next(model.parameters()).dtype
    n_layers, n, d = model.config.num_hidden_layers, len(instructions), model.config.hidden_size
    cache = torch.zeros((len(positions), n_layers, d), dtype=dtype)

    def hook(module, inputs, layer):
        activation = inputs[0].clone()
        _, seq_len, _ = activation.shape
        for pos_idx, pos in enumerate(positions):
            actual = seq_len + pos if pos < 0 else pos
            cache[pos_idx, layer] += (1.0 / n) * activation[:, actual, :].sum(dim=0)

    handles = [m.register_forward_pre_hook(functools.partial(hook, layer=i)) for i, m in enumerate(block_modules)]
    for i in range(0, n, batch_size):
        enc = tokenizer(
            instructions[i : i + batch_size], padding=True, truncation=True, max_length=512, return_tensors="pt"
        )
        with torch.no_grad():
            model(input_ids=enc.input_ids, attention_mask=enc.attention_mask)
    for h in handles:
        h.remove()
    return cache


def ref_directions(model, tokenizer, harmful, forget, layer_idx_list):
    """get_mean_diff (711-747: harmful minus harmless = the forget questions) and
    compute_direction (1302-1375: positions [-1], eoi_toks = [eos], layer index + 1, clamped)."""
    layers = model.model.layers
    diffs = ref_mean_activations(model, tokenizer, harmful, layers) - ref_mean_activations(
        model, tokenizer, forget, layers
    )
    n_layers = diffs.shape[1]
    out = []
    for layer_index in layer_idx_list:
        idx = layer_index + 1
        idx = n_layers - 1 if idx >= n_layers else max(idx, 0)
        out.append(diffs[1 + (-1), idx, :])  # pos_idx = len(eoi_toks) + pos
    return out


def ref_activations(model, examples, layer_idx):
    """get_post_block_activation (268-333, forward hook 211-222), get_pre_post_attention_layernorm
    _activation (404-469) and get_pre_down_proj_activation (336-401, pre-hook 224-235), batch
    size 1 (get_activations' default, 472-556). The reference decodes each example and tokenizes
    the text again; here the example's token ids go in directly."""

    def collect(module, pre):
        cache = []

        def fwd(m, inputs, output):
            cache.append((output[0] if isinstance(output, tuple) else output).clone().detach())

        def pre_fn(m, inputs):
            cache.append((inputs[0] if isinstance(inputs, tuple) else inputs).clone().detach())

        handle = module.register_forward_pre_hook(pre_fn) if pre else module.register_forward_hook(fwd)
        with torch.no_grad():
            for ex in examples:
                ids = torch.tensor([ex["input_ids"]])
                model(input_ids=ids, attention_mask=torch.ones_like(ids))
        handle.remove()
        return cache

    block = model.model.layers[layer_idx]
    post = collect(block, pre=False)
    mid = collect(block.post_attention_layernorm, pre=True)
    x = collect(block.mlp.down_proj, pre=True)
    return post, mid, x


def ref_trainset_raw(x_f, post_f, mid_f, x_r, post_r, mid_r):
    """prepare_trainset_raw (956-999)."""
    inputs_forget = [item.detach() for item in x_f]
    targets_forget = [(a - b).detach() for a, b in zip(post_f, mid_f)]
    x_r = [item.view(-1, x_r[0].size()[-1]) for item in x_r]
    post_r = [item.view(-1, post_r[0].size()[-1]) for item in post_r]
    mid_r = [item.view(-1, mid_r[0].size()[-1]) for item in mid_r]
    inputs_remain = torch.cat(x_r, dim=0)
    targets_remain = torch.cat(post_r, dim=0) - torch.cat(mid_r, dim=0)
    cf_in = torch.cat([a.squeeze(0) for a in inputs_forget], dim=0)
    cf_out = torch.cat([a.squeeze(0) for a in targets_forget], dim=0)
    return cf_in, cf_out, inputs_remain, targets_remain


class RefActivations(Dataset):
    """ActivationDataset_multiple_layers (111-122)."""

    def __init__(self, inputs_list, targets_list):
        self.inputs_list, self.targets_list = inputs_list, targets_list

    def __len__(self):
        return self.inputs_list[0].size(0)

    def __getitem__(self, idx):
        return [x[idx] for x in self.inputs_list], [t[idx] for t in self.targets_list]


def reference_lunar(
    model, tokenizer, forget, retain, harmful, questions, *, layers, coeffs, lr, epochs, bs, dtype, seed
):
    """Lunar.train (1391-1527): directions, per-layer activations, perturbation
    (perturb_post_block_activations_forget, 593-602), estimated nets (EstimatedNet 44-67,
    prepare_estimated_net_list 1078-1109: the down_proj weight, bf16), training
    (train_multiple_layers 125-176: MSE summed over layers; AdamW; ExponentialLR(0.9) per epoch),
    weight copy-back (1522-1527). The DataLoader's shuffle draws from a seeded generator here
    (the reference's from the global RNG), and the inputs are cast to the nets' dtype (with a bf16
    model, as the reference runs, they already are)."""
    directions = ref_directions(model, tokenizer, harmful, questions, layers)
    f_in, f_out, r_in, r_out = [], [], [], []
    for i, layer in enumerate(layers):
        post_f, mid_f, x_f = ref_activations(model, forget, layer)
        post_r, mid_r, x_r = ref_activations(model, retain, layer)
        for j in range(len(post_f)):
            post_f[j] += coeffs[i] * directions[i]
        a, b, c, d = ref_trainset_raw(x_f, post_f, mid_f, x_r, post_r, mid_r)
        f_in.append(a), f_out.append(b), r_in.append(c), r_out.append(d)
    nets = []
    for layer in layers:
        w = model.model.layers[layer].mlp.down_proj.weight.clone()
        net = torch.nn.Linear(w.shape[1], w.shape[0], bias=False)
        with torch.no_grad():
            net.weight.copy_(w)
        nets.append(net.to("cpu", dtype=dtype))
    data = ConcatDataset([RefActivations(f_in, f_out), RefActivations(r_in, r_out)])
    loader = DataLoader(data, batch_size=bs, shuffle=True, generator=torch.Generator().manual_seed(seed))
    optimizer = torch.optim.AdamW(chain(*[n.parameters() for n in nets]), lr=lr)
    scheduler = torch.optim.lr_scheduler.ExponentialLR(optimizer, gamma=0.9)
    criterion = torch.nn.MSELoss()
    for n in nets:
        n.train()
    for _ in range(epochs):
        for inputs_list, targets_list in loader:
            optimizer.zero_grad()
            outputs = [n(x.to(dtype)) for n, x in zip(nets, inputs_list)]
            loss = sum([criterion(o, t.to(dtype)) for o, t in zip(outputs, targets_list)])
            loss.backward()
            optimizer.step()
        scheduler.step()
    with torch.no_grad():
        for i, layer in enumerate(layers):
            model.model.layers[layer].mlp.down_proj.weight.data.copy_(nets[i].weight.data)
    return directions


# ----------------------------------------------------------------------------- tests


def examples(seed, lengths):
    g = torch.Generator().manual_seed(seed)
    return [{"input_ids": torch.randint(3, 300, (n,), generator=g).tolist()} for n in lengths]


@pytest.fixture
def data(tiny_tokenizer, tmp_path):
    for group in (REFUSE, QUESTIONS):
        assert len({len(tiny_tokenizer(p)["input_ids"]) for p in group}) == 1
    prompts = tmp_path / "refuse.txt"
    prompts.write_text("\n".join(REFUSE) + "\n")
    forget = examples(1, (9, 6))
    retain = examples(2, (7, 8, 5))
    samples = [QASample(q, "an answer", i) for i, q in enumerate(QUESTIONS)]
    return prompts, forget, retain, samples


@pytest.mark.parametrize("net_dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("layers", [[0], [0, 1]])
def test_lunar_weights_equal_the_reference(net_dtype, layers, tiny_model, tiny_tokenizer, data):
    prompts, forget, retain, samples = data
    model = tiny_model.float().train(False)
    reference = copy.deepcopy(model)
    options = dict(
        layer_idx_list=layers, direction_prompts=str(prompts), num_epochs=3, batch_size=4, net_dtype=net_dtype, seed=5
    )
    objective = create(UNLEARNING_OBJECTIVE, "lunar", **options)
    context = ObjectiveContext(
        model=model, tokenizer=tiny_tokenizer, forget_samples=samples, forget=forget, retain=retain, seed=0
    )
    assert objective.prepare(context) is None
    mine = objective.directions(model, tiny_tokenizer, QUESTIONS)
    start = copy.deepcopy(model)
    objective.finish(model, context)
    coeffs = [2.0] * len(layers)  # the default, as Lunar.__init__ (lines 1180, 1188-1191)
    theirs = reference_lunar(
        reference, tiny_tokenizer, forget, retain, REFUSE, QUESTIONS, layers=layers, coeffs=coeffs,
        lr=1e-3, epochs=3, bs=4, dtype=getattr(torch, net_dtype), seed=5,
    )  # fmt: skip
    for a, b in zip(mine, theirs):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=0)
    start = dict(start.named_parameters())
    moved = {n for n, p in model.named_parameters() if float((p - start[n]).abs().max()) > 1e-4}
    assert moved == {f"model.layers.{i}.mlp.down_proj.weight" for i in layers}  # the refit did change them
    for (name, p), q in zip(model.named_parameters(), reference.parameters()):
        torch.testing.assert_close(p, q, atol=1e-6, rtol=0, msg=name)
    rows = context.info["lunar"]
    assert rows["forget_rows"] == 15 and rows["retain_rows"] == 20


def test_lunar_reads_the_shipped_prompts_by_default(tiny_model, tiny_tokenizer, data):
    from unlearn_plugins.objectives.lunar import SHIPPED_PROMPTS, read_prompts

    prompts, forget, retain, samples = data
    objective = create(UNLEARNING_OBJECTIVE, "lunar", layer_idx_list=[0])
    context = ObjectiveContext(model=tiny_model, tokenizer=tiny_tokenizer, forget_samples=samples, forget=forget)
    objective.prepare(context)
    shipped = read_prompts(SHIPPED_PROMPTS)
    assert len(shipped) == 24 and len(set(shipped)) == 24
    assert context.info["lunar"]["direction_prompts"] == 24


def test_lunar_refuses_lora_and_a_missing_prompt_file(tiny_model, tiny_tokenizer, data, tmp_path):
    from peft import LoraConfig, get_peft_model

    prompts, forget, retain, samples = data
    context = ObjectiveContext(model=tiny_model, tokenizer=tiny_tokenizer, forget_samples=samples, forget=forget)
    missing = tmp_path / "harmful.json"
    objective = create(UNLEARNING_OBJECTIVE, "lunar", layer_idx_list=[0], direction_prompts=str(missing))
    with pytest.raises(UnlearnError, match="cannot read direction_prompts"):
        objective.prepare(context)
    objective = create(UNLEARNING_OBJECTIVE, "lunar", layer_idx_list=[5], direction_prompts=str(prompts))
    with pytest.raises(UnlearnError, match="names layer 5, but the model has 2 layers"):
        objective.prepare(context)
    empty = tmp_path / "empty.txt"
    empty.write_text("\n\n")
    objective = create(UNLEARNING_OBJECTIVE, "lunar", layer_idx_list=[0], direction_prompts=str(empty))
    with pytest.raises(UnlearnError, match="holds no prompt"):
        objective.prepare(context)
    peft = get_peft_model(tiny_model, LoraConfig(r=2, target_modules=["q_proj"]))
    objective = create(UNLEARNING_OBJECTIVE, "lunar", layer_idx_list=[0], direction_prompts=str(prompts))
    with pytest.raises(UnlearnError, match="--full-finetune"):
        objective.prepare(ObjectiveContext(model=peft, tokenizer=tiny_tokenizer))


def forget_probability(folder, tokenizer_dir, tofu_dir):
    """Mean per-example answer probability exp(-NLL/|y|) over the run's forget split."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from unlearn_plugins.data.qa import encode_samples, load_split
    from unlearn_plugins.likelihood import answer_nll

    tok = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    model = AutoModelForCausalLM.from_pretrained(str(folder), torch_dtype=torch.float32).eval()
    encoded = encode_samples(tok, load_split("tofu:forget01[0:4]", tofu_dir=tofu_dir), max_length=64)
    rows = answer_nll(model, encoded, tok.pad_token_id)
    return sum(float(torch.exp(torch.tensor(-s / c))) for s, c in rows) / len(rows)


def test_lunar_run_changes_only_the_down_projections_and_lowers_forget_probability(tiny_model_dir, tofu_dir, tmp_path):
    """The tiny model first learns the forget answers (plain NLL), then LUNAR (default coefficients)
    redirects them: measured 0.348 -> 0.183 when written."""
    from test_task_vector import config, weights

    from unlearn_plugins.training import run_unlearning
    from unlearn_plugins.training.objective import NLL

    run_unlearning(
        config(tmp_path / "ft", tiny_model_dir, tofu_dir, full_finetune=True, lr=3e-3, max_steps=40), objective=NLL()
    )
    prompts = tmp_path / "refuse.txt"
    prompts.write_text("\n".join(REFUSE + QUESTIONS) + "\n")
    options = dict(layer_idx_list=[0, 1], direction_prompts=str(prompts), num_epochs=20)
    result = run_unlearning(
        config(
            tmp_path / "lunar", tmp_path / "ft", tofu_dir, full_finetune=True, retain="tofu:retain90[0:4]",
            objective="lunar", objective_options=options,
        )
    )  # fmt: skip
    assert result.record["steps"] == 2 and result.record["context"]["lunar"]["layers"] == [0, 1]
    before, after = weights(tmp_path / "ft"), weights(tmp_path / "lunar")
    changed = {k for k in before if not torch.equal(before[k], after[k])}
    assert changed == {"model.layers.0.mlp.down_proj.weight", "model.layers.1.mlp.down_proj.weight"}
    p0 = forget_probability(tmp_path / "ft", tiny_model_dir, tofu_dir)
    p1 = forget_probability(tmp_path / "lunar", tiny_model_dir, tofu_dir)
    assert p0 > 0.2 and p1 < 0.75 * p0, (p0, p1)
