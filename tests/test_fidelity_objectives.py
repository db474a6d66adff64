"""Fidelity to the reference implementations (open-unlearning, TOFU): retain partners and
IdkDPO refusals drawn afresh per epoch yet resumable, and RMU's activation MSE averaged per
sequence, then over the batch. Each reference quantity is computed here independently."""

from __future__ import annotations

import json
import math
import shutil

import pytest
import torch
from support_training import small_run

from unlearn_plugins import UNLEARNING_OBJECTIVE, create
from unlearn_plugins.data.qa import ForgetRetainPairs, encode_qa, encode_samples, load_split
from unlearn_plugins.objectives.base import ObjectiveContext

IGNORE = -100

pytestmark = pytest.mark.usefixtures("single_thread")


def occupancy(n_bins: int, draws: int) -> tuple[float, float]:
    """Mean and standard deviation of the number of distinct bins hit by `draws` independent
    uniform draws over `n_bins` (what a fresh draw on every access gives)."""
    q1, q2 = (1 - 1 / n_bins) ** draws, (1 - 2 / n_bins) ** draws
    mean = n_bins * (1 - q1)
    var = n_bins * q1 + n_bins * (n_bins - 1) * q2 - (n_bins * q1) ** 2
    return mean, math.sqrt(var)


# ----------------------------------------------------------------------------- retain partners


def retain_items(n: int) -> list[dict]:
    return [{"input_ids": [i], "attention_mask": [1], "labels": [i]} for i in range(n)]


def partners(pairs: ForgetRetainPairs, epoch: int, order=None) -> list[int]:
    """The retain index paired with each forget item when the trainer runs `epoch`."""
    pairs.set_epoch(epoch)
    order = list(range(len(pairs))) if order is None else order
    seen = {i: pairs[i]["retain"]["input_ids"][0] for i in order}
    return [seen[i] for i in range(len(pairs))]


def test_retain_partners_are_redrawn_each_epoch_and_a_function_of_seed_epoch_index():
    forget, retain = retain_items(40), retain_items(400)
    pairs = ForgetRetainPairs(forget, retain, seed=3)
    by_epoch = [partners(pairs, e) for e in range(4)]
    for a in range(4):
        for b in range(a + 1, 4):
            same = sum(x == y for x, y in zip(by_epoch[a], by_epoch[b]))
            assert same <= 3, (a, b, same)  # a fixed partner per seed would give 40
    # a resumed run builds a fresh dataset and is told the epoch: same pairs, whatever the access order
    resumed = ForgetRetainPairs(forget, retain, seed=3)
    assert partners(resumed, 2, order=list(range(39, -1, -1))) == by_epoch[2]
    assert [pairs.partner_index(i, 1) for i in range(40)] == by_epoch[1]
    assert partners(ForgetRetainPairs(forget, retain, seed=4), 2) != by_epoch[2]  # the seed matters
    # without a retain split the pairs carry only the forget example
    assert ForgetRetainPairs(forget, None)[0]["retain"] is None


def test_retain_partners_cover_as_many_examples_as_a_fresh_draw_per_access():
    from scipy.stats import chisquare

    n_forget, n_retain, epochs = 40, 400, 10
    forget, retain = retain_items(n_forget), retain_items(n_retain)
    mean, sd = occupancy(n_retain, n_forget * epochs)
    counts = [0] * n_retain
    for seed in range(3):
        pairs = ForgetRetainPairs(forget, retain, seed=seed)
        drawn = [r for e in range(epochs) for r in partners(pairs, e)]
        distinct = len(set(drawn))
        assert abs(distinct - mean) <= 4 * sd, (seed, distinct, mean, sd)  # ~264 of 400; a fixed partner: <= 40
        for r in drawn:
            counts[r] += 1
    assert chisquare(counts).pvalue > 1e-3  # uniform over the retain split, as torch.randint is


# ----------------------------------------------------------------------------- IdkDPO refusals


def reference_refusals(path) -> list[str]:
    """TOFU / open-unlearning: readlines() of the file, each line stripped when used."""
    with open(path) as f:
        return [line.strip() for line in f.readlines()]


def idk_view(tokenizer, samples, seed=0, **options):
    obj = create(UNLEARNING_OBJECTIVE, "idk_dpo", **options)
    ctx = ObjectiveContext(model=None, tokenizer=tokenizer, forget_samples=samples, max_length=64, seed=seed)
    return obj.prepare(ctx)["forget_idk"], ctx.info["idk_refusals"]


def refusal_of(item, tokenizer, question, refusals) -> str:
    """Which refusal an encoded item carries (checked to be encoded exactly like an answer)."""
    for text in refusals:
        if item == encode_qa(tokenizer, question, text, max_length=64):
            return text
    raise AssertionError(f"not a refusal from the list: {tokenizer.decode(item['input_ids'])!r}")


def test_refusals_come_from_tofu_idontknow_and_are_redrawn_per_epoch(tofu_dir, tiny_tokenizer, monkeypatch):
    monkeypatch.delenv("UNLEARN_TOFU_DIR", raising=False)
    samples = load_split("tofu:forget01[0:5]", tofu_dir)
    refusals = reference_refusals(tofu_dir / "idontknow.jsonl")
    assert len(refusals) == 100
    view, info = idk_view(tiny_tokenizer, samples)
    assert info == {"source": str(tofu_dir / "idontknow.jsonl"), "count": 100}
    epochs = 30
    drawn = []
    for e in range(epochs):
        view.set_epoch(e)
        drawn.append([refusal_of(view[i], tiny_tokenizer, s.question, refusals) for i, s in enumerate(samples)])
    mean, sd = occupancy(100, epochs)  # ~26 distinct refusals per question; one fixed per question before
    for i in range(len(samples)):
        assert abs(len({row[i] for row in drawn}) - mean) <= 4 * sd
    again, _ = idk_view(tiny_tokenizer, samples)  # a resumed run: same refusal for the same (seed, epoch, i)
    again.set_epoch(7)
    assert [refusal_of(again[i], tiny_tokenizer, s.question, refusals) for i, s in enumerate(samples)] == drawn[7]


def test_refusals_fall_back_to_tofu_dir_then_to_the_shipped_list(tofu_dir, tiny_tokenizer, tmp_path, monkeypatch):
    from unlearn_plugins.objectives.preference import SHIPPED_IDK_FILE

    split = tmp_path / "hard.json"  # a split outside the TOFU folder (e.g. from `unlearn stratify`)
    split.write_text(json.dumps({"question": "Who wrote it?", "answer": "Someone."}) + "\n")
    samples = load_split(str(split))
    monkeypatch.setenv("UNLEARN_TOFU_DIR", str(tofu_dir))
    assert idk_view(tiny_tokenizer, samples)[1]["source"] == str(tofu_dir / "idontknow.jsonl")

    monkeypatch.delenv("UNLEARN_TOFU_DIR")
    shipped = reference_refusals(SHIPPED_IDK_FILE)
    assert len(shipped) == 100 and all(shipped) and len(set(shipped)) == 100
    assert not set(shipped) & set(reference_refusals(tofu_dir / "idontknow.jsonl"))  # our own sentences
    view, info = idk_view(tiny_tokenizer, samples)
    assert info == {"source": str(SHIPPED_IDK_FILE), "count": 100}
    seen = set()
    for e in range(20):
        view.set_epoch(e)
        seen.add(refusal_of(view[0], tiny_tokenizer, "Who wrote it?", shipped))
    assert len(seen) > 10

    # the options choose the list; bad ones fail with one line before any model work
    own = tmp_path / "refusals.txt"
    own.write_text("Nope.\n\n  No idea at all.  \n")
    view, info = idk_view(tiny_tokenizer, samples, idk_file=str(own))
    assert info == {"source": str(own), "count": 2}
    view, info = idk_view(tiny_tokenizer, samples, idk_answers=["Beats me."])
    assert refusal_of(view[0], tiny_tokenizer, "Who wrote it?", ["Beats me."]) == "Beats me."
    from unlearn_plugins.errors import UnlearnError

    with pytest.raises(UnlearnError, match="cannot read the refusal list .*missing.txt"):
        create(UNLEARNING_OBJECTIVE, "idk_dpo", idk_file=str(tmp_path / "missing.txt"))
    (tmp_path / "blank.txt").write_text("\n  \n")
    with pytest.raises(UnlearnError, match="no non-blank line"):
        create(UNLEARNING_OBJECTIVE, "idk_dpo", idk_file=str(tmp_path / "blank.txt"))
    with pytest.raises(UnlearnError, match="not both"):
        create(UNLEARNING_OBJECTIVE, "idk_dpo", idk_file=str(own), idk_answers=["x"])


# ----------------------------------------------------------------------------- through the Trainer, with resume


class Recorder:
    """idk_dpo that records, per optimizer step, which forget / retain / refusal rows it got."""

    needs_retain_data = True

    def __init__(self):
        self.inner = create(UNLEARNING_OBJECTIVE, "idk_dpo")
        self.steps: list[dict[str, list[tuple[int, ...]]]] = []

    @property
    def needs_reference_model(self):
        return self.inner.needs_reference_model

    def prepare(self, context):
        return self.inner.prepare(context)

    def loss(self, model, batch, reference_model=None):
        self.steps.append(
            {
                part: [
                    tuple(ids[m.bool()].tolist())
                    for ids, m in zip(batch[part]["input_ids"], batch[part]["attention_mask"])
                ]
                for part in ("forget", "retain", "forget_idk")
            }
        )
        return self.inner.loss(model, batch, reference_model)


def test_trainer_redraws_per_epoch_and_a_resumed_run_draws_the_same(tiny_model_dir, tofu_dir, tmp_path, monkeypatch):
    """4 forget QA, batch 2: 2 steps per epoch, 6 steps = 3 epochs. Every step's pairs and
    refusals are those of its epoch; resumed from the mid-epoch checkpoint 3, the run sees
    exactly the batches of steps 4-6 of the uninterrupted run."""
    from unlearn_plugins.data.qa import ForgetRetainPairs as Pairs
    from unlearn_plugins.models import load_tokenizer
    from unlearn_plugins.objectives.preference import RefusalView
    from unlearn_plugins.training import UnlearnConfig, run_unlearning

    monkeypatch.delenv("UNLEARN_TOFU_DIR", raising=False)
    data = {"forget": "tofu:forget01[0:4]", "retain": "tofu:retain99[0:12]"}
    settings = small_run(tiny_model_dir, tofu_dir, **data, objective="idk_dpo", max_steps=6, save_steps=3, seed=5)
    straight = Recorder()
    run_unlearning(UnlearnConfig(out=str(tmp_path / "a"), keep_checkpoints=True, **settings), objective=straight)
    assert len(straight.steps) == 6

    tok = load_tokenizer(str(tiny_model_dir))
    forget_qa = load_split(settings["forget"], tofu_dir)
    forget_enc = encode_samples(tok, forget_qa, max_length=64)
    forget = [tuple(e["input_ids"]) for e in forget_enc]
    retain_enc = encode_samples(tok, load_split(settings["retain"], tofu_dir), max_length=64)
    refusals = reference_refusals(tofu_dir / "idontknow.jsonl")
    pairs = Pairs(forget_enc, retain_enc, seed=5)
    view = RefusalView(forget_qa, refusals, tok, seed=5, max_length=64)
    for e in (1, 2):  # the draws of each epoch differ from epoch 0's, so the checks below see the epoch
        assert [pairs.partner_index(i, e) for i in range(4)] != [pairs.partner_index(i, 0) for i in range(4)]
        assert [view.answer_index(i, e) for i in range(4)] != [view.answer_index(i, 0) for i in range(4)]
    for step, got in enumerate(straight.steps):
        epoch = step // 2
        for f, r, idk in zip(got["forget"], got["retain"], got["forget_idk"]):
            i = forget.index(f)
            assert r == tuple(retain_enc[pairs.partner_index(i, epoch)]["input_ids"])
            k = view.answer_index(i, epoch)
            assert idk == tuple(encode_qa(tok, forget_qa[i].question, refusals[k], max_length=64)["input_ids"])

    resumed_out = tmp_path / "b" / "checkpoints"
    resumed_out.mkdir(parents=True)
    shutil.copytree(tmp_path / "a" / "checkpoints" / "checkpoint-3", resumed_out / "checkpoint-3")
    shutil.copy(tmp_path / "a" / "checkpoints" / "run_config.json", resumed_out / "run_config.json")
    resumed = Recorder()
    result = run_unlearning(UnlearnConfig(out=str(tmp_path / "b"), resume=True, **settings), objective=resumed)
    assert result.record["resumed_from"].endswith("checkpoint-3")
    assert resumed.steps == straight.steps[3:]


# ----------------------------------------------------------------------------- RMU averaging


def reference_activation_loss(a, b, mask):
    """open-unlearning RMU: squared error, mean over the hidden size, sum over each sequence's
    answer positions divided by its answer-token count, mean over the batch."""
    per_seq = []
    for i in range(a.shape[0]):
        rows = [t for t in range(a.shape[1]) if mask[i][t]]
        total = sum(((a[i, t] - b[i, t]) ** 2).mean().item() for t in rows)
        per_seq.append(total / len(rows))
    return sum(per_seq) / len(per_seq)


class HiddenModel(torch.nn.Module):
    """Returns fixed hidden states (one per call, in order) whatever the input."""

    def __init__(self, *hidden):
        super().__init__()
        self.hidden = [torch.nn.Parameter(h.clone()) for h in hidden]
        self.config = type("Config", (), {"num_hidden_layers": 2, "hidden_size": hidden[0].shape[-1]})()
        self.calls = 0

    def forward(self, input_ids=None, attention_mask=None, output_hidden_states=False, logits_to_keep=0):
        h = self.hidden[self.calls % len(self.hidden)]
        self.calls += 1
        out = type("Out", (), {})()
        out.hidden_states = (None, h, h)
        return out


def test_rmu_averages_per_sequence_then_over_the_batch():
    from unlearn_plugins.objectives.rmu import masked_mse

    gen = torch.Generator().manual_seed(0)
    # answers of 1, 5 and 3 tokens, prompts and right padding of different lengths
    labels = torch.tensor(
        [
            [IGNORE, IGNORE, IGNORE, 7, IGNORE, IGNORE, IGNORE],
            [IGNORE, 3, 4, 5, 6, 7, IGNORE],
            [IGNORE, IGNORE, 9, 9, 9, IGNORE, IGNORE],
        ]
    )
    mask = labels != IGNORE
    h_f, h_r, h_ref = (torch.randn(3, 7, 5, generator=gen) * s for s in (1.0, 2.0, 0.5))
    control = torch.rand(5, generator=gen)
    control = 2.0 * control / control.norm()

    forget = reference_activation_loss(h_f, control.expand_as(h_f), mask)
    pooled = ((h_f - control) ** 2).mean(-1)[mask].mean().item()  # the former token-pooled average
    assert abs(forget - pooled) > 0.05 * forget  # the data tell the two averages apart
    assert masked_mse(h_f, control.expand_as(h_f), labels).item() == pytest.approx(forget, rel=1e-5)

    obj = create(UNLEARNING_OBJECTIVE, "rmu", layer=0)
    obj.control = control
    part = {"input_ids": torch.zeros_like(labels), "attention_mask": torch.ones_like(labels), "labels": labels}
    model, reference = HiddenModel(h_f, h_r), HiddenModel(h_ref)
    got = obj.loss(model, {"forget": part, "retain": part}, reference_model=reference).item()
    retain = reference_activation_loss(h_r, h_ref, mask)
    assert got == pytest.approx(forget + retain, rel=1e-5)


@pytest.mark.parametrize("layer", [0, 1])
def test_rmu_reads_the_raw_output_of_every_layer_even_the_last(layer):
    """The reference hooks the decoder layer's output; transformers' hidden_states[L] is the
    final norm's output, so layer L-1 used to read normalised activations."""
    from unlearn_plugins.objectives.rmu import layer_activations
    from unlearn_plugins.testing import tiny_llama

    model = tiny_llama(64, layers=2).eval()
    ids = torch.randint(3, 64, (2, 6), generator=torch.Generator().manual_seed(0))
    part = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids}
    seen = {}
    handle = model.model.layers[layer].register_forward_hook(
        lambda _m, _a, out: seen.setdefault("h", out[0] if isinstance(out, tuple) else out)
    )
    with torch.no_grad():
        states = model(input_ids=ids, output_hidden_states=True).hidden_states
    handle.remove()
    got = layer_activations(model, part, layer, no_grad=True)
    assert torch.allclose(got, seen["h"], atol=1e-6)
    if layer == 1:  # the last layer: hidden_states holds the final norm's output instead
        assert not torch.allclose(states[2], seen["h"], atol=1e-3)
