"""EAP-IG engine: graph layout, per-head sources, and edge scores against an independent
slow implementation of the same definition (tests/eap_reference.py)."""

from __future__ import annotations

import pytest
import torch
from eap_reference import forward as ref_forward
from eap_reference import reference_scores

from unlearn_plugins.circuits.eap_ig import EAPIG
from unlearn_plugins.circuits.graph import Graph
from unlearn_plugins.data.qa import encode_qa
from unlearn_plugins.errors import ModelError

QA = [
    ("Who are the parents of the author?", "Her father was a doctor."),
    ("What awards has the author won?", "He won the International Booker Prize for his debut novel."),
    ("Which genre does the author write in?", "She writes fantasy novels."),
]


@pytest.fixture
def model(tiny_model):
    for p in tiny_model.parameters():
        p.requires_grad_(False)
    return tiny_model


@pytest.fixture(scope="module")
def examples(tiny_tokenizer):
    return [encode_qa(tiny_tokenizer, q, a) for q, a in QA]


def _tensors(example):
    return torch.tensor(example["input_ids"]), torch.tensor(example["labels"])


def assert_matches(engine_scores, ref, graph, rel=1e-4):
    """Max relative difference on edges with non-negligible scores; exact zeros off the mask."""
    got = engine_scores.double()
    assert torch.all(got[~graph.edge_mask] == 0)
    big = ref.abs() > 1e-3 * ref.abs().max()
    assert big.sum() >= 10, "too few non-negligible edges for a meaningful comparison"
    worst = ((got - ref).abs()[big] / ref.abs()[big]).max().item()
    assert worst < rel, f"max relative difference {worst:.3g} on {int(big.sum())} edges"


# ----------------------------------------------------------------------------- graph


def test_graph_sizes_of_smollm2_and_tiny_model():
    g = Graph(30, 9)
    assert (g.n_src, g.n_dst, g.n_edges) == (301, 841, 123211)
    t = Graph(2, 4)
    assert (t.n_src, t.n_dst) == (11, 27)
    # a head does not read its own layer's heads; the MLP does; the logits read everything
    assert not t.edge_mask[t.src_head(1, 0), t.dst_qkv(1, "q", 2)]
    assert t.edge_mask[t.src_head(0, 3), t.dst_qkv(1, "v", 1)]
    assert t.edge_mask[t.src_head(1, 0), t.dst_mlp(1)]
    assert not t.edge_mask[t.src_mlp(1), t.dst_mlp(1)]
    assert t.edge_mask[:, t.dst_logits].all()
    assert t.src_name(t.src_mlp(1)) == "m1" and t.dst_name(t.dst_qkv(0, "k", 2)) == "a0.h2<k>"
    assert t.dst_layer[t.dst_logits] == 2 and t.src_layer[0] == -1


# ----------------------------------------------------------------------------- sources


def test_head_sources_sum_to_attention_output(model, examples):
    engine = EAPIG(model)
    ids, _ = _tensors(examples[1])
    captured = {"attn": [], "mlp": [], "final": None}
    handles = []
    for layer in model.model.layers:
        handles.append(layer.self_attn.register_forward_hook(lambda m, a, o: captured["attn"].append(o[0])))
        handles.append(layer.mlp.register_forward_hook(lambda m, a, o: captured["mlp"].append(o)))
    handles.append(model.model.norm.register_forward_pre_hook(lambda m, a: captured.__setitem__("final", a[0])))
    with torch.no_grad():
        model(ids[None])
    for h in handles:
        h.remove()
    src = engine.source_activations(ids[None])[0]  # (n_src, T, D)
    g = engine.graph
    for layer in range(g.n_layers):
        heads = src[g.src_head(layer, 0) : g.src_head(layer, 0) + g.n_heads]
        torch.testing.assert_close(heads.sum(0), captured["attn"][layer][0], rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(src[g.src_mlp(layer)], captured["mlp"][layer][0], rtol=1e-5, atol=1e-6)
        assert heads.abs().amax(dim=(1, 2)).min() > 0  # every head writes something
    # the residual stream is the sum of all sources
    torch.testing.assert_close(src.sum(0), captured["final"][0], rtol=1e-5, atol=1e-5)


# ----------------------------------------------------------------------------- edge scores


@pytest.mark.parametrize("mode", ["inputs", "activations"])
def test_scores_match_slow_reference_zero_baseline(model, examples, mode):
    engine = EAPIG(model, mode=mode, steps=2)
    scores = engine.score(examples[:2])  # two lengths padded into one batch
    assert engine.alphas == [0.5, 1.0]  # the zero input is singular for RMSNorm: k = 1..m
    for i in range(2 if mode == "inputs" else 1):
        ids, labels = _tensors(examples[i])
        ref = reference_scores(model, engine.graph, ids, labels, steps=2, mode=mode, alphas=engine.alphas)
        assert_matches(scores[i], ref, engine.graph)


def test_scores_match_reference_other_sample_baseline_and_logprob(model, examples):
    engine = EAPIG(model, steps=2, baseline="other", metric="logprob")
    scores = engine.score(examples)
    corrupt = engine._other_samples(examples)
    for i in (0, 2):
        ids, labels = _tensors(examples[i])
        assert len(corrupt[i]) == len(ids) and corrupt[i] != examples[i]["input_ids"]
        ref = reference_scores(
            model, engine.graph, ids, labels, steps=2, corrupt_ids=torch.tensor(corrupt[i]), metric="logprob"
        )
        assert_matches(scores[i], ref, engine.graph)


def test_scores_match_reference_mean_baseline_activations_mode(model, examples):
    """Mean ablation: each node's corrupt output is its mean (inputs mode, where the corrupt
    activations come from the mean-embedding input's forward: tests/test_fidelity_mrd_eapig.py)."""
    mode = "activations"
    engine = EAPIG(model, mode=mode, steps=2, baseline="mean")
    scores = engine.score(examples[:1])
    # means over all tokens of the (here: scored) examples, computed with the reference forward
    sums, count = {}, 0
    with torch.no_grad():
        for e in examples[:1]:
            _, _, srcs = ref_forward(model, *_tensors(e))
            for k, v in srcs.items():
                sums[k] = sums.get(k, 0) + v.sum(0)
            count += len(e["input_ids"])
    means = {k: v / count for k, v in sums.items()}
    ids, labels = _tensors(examples[0])
    ref = reference_scores(model, engine.graph, ids, labels, steps=2, mode=mode, corrupt=means)
    assert_matches(scores[0], ref, engine.graph)


def test_scores_match_reference_on_qwen2_with_biases(tiny_tokenizer, examples):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(1)
    # the tiny Llama's sizes (unlearn_plugins.testing.tiny_llama)
    sizes = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "max_position_embeddings": 512}
    heads = {"num_attention_heads": 4, "num_key_value_heads": 2}
    config = Qwen2Config(vocab_size=len(tiny_tokenizer), tie_word_embeddings=True, **sizes, **heads)
    qwen = Qwen2ForCausalLM(config).eval()
    with torch.no_grad():
        for layer in qwen.model.layers:
            for proj in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj):
                assert proj.bias is not None
                proj.bias.normal_(0, 0.5)
    for p in qwen.parameters():
        p.requires_grad_(False)
    engine = EAPIG(qwen, steps=2)
    scores = engine.score(examples[:1])
    ids, labels = _tensors(examples[0])
    assert_matches(
        scores[0], reference_scores(qwen, engine.graph, ids, labels, steps=2, alphas=engine.alphas), engine.graph
    )


def test_batching_does_not_change_scores(model, examples):
    together = EAPIG(model, steps=2, max_rows=64).score(examples)
    alone = EAPIG(model, steps=2, batch_size=1).score(examples)
    torch.testing.assert_close(together, alone, rtol=1e-4, atol=1e-7)


def test_bf16_model_runs_and_agrees_with_fp32(model, examples):
    fp32 = EAPIG(model, steps=2).score(examples[:1])[0]
    bf16 = EAPIG(model.to(torch.bfloat16), steps=2).score(examples[:1])[0]
    assert bf16.dtype == torch.float32 and torch.isfinite(bf16).all()
    mask = Graph(2, 4).edge_mask
    a, b = fp32[mask], bf16[mask]
    assert torch.corrcoef(torch.stack([a, b]))[0, 1] > 0.9


def test_engine_restores_model_state(model, examples):
    for p in model.parameters():
        p.requires_grad_(True)
    model.train()
    EAPIG(model, steps=1).score(examples[:1])
    assert model.training and all(p.requires_grad for p in model.parameters())
    assert model.model.layers[0].self_attn.num_key_value_groups == 2


def test_bad_options_and_inputs_are_reported(model, examples):
    with pytest.raises(ValueError, match="mode"):
        EAPIG(model, mode="nodes")
    with pytest.raises(ValueError, match="baseline"):
        EAPIG(model, baseline="random")
    no_answer = dict(examples[0], labels=[-100] * len(examples[0]["labels"]))
    with pytest.raises(ValueError, match="no answer tokens"):
        EAPIG(model).score([no_answer])
    with pytest.raises(ValueError, match="two samples"):
        EAPIG(model, baseline="other").score(examples[:1])


def test_unsupported_architecture_is_named():
    from transformers import GPT2Config, GPT2LMHeadModel

    gpt2 = GPT2LMHeadModel(GPT2Config(n_layer=1, n_head=2, n_embd=16, vocab_size=50, n_positions=32))
    with pytest.raises(ModelError, match="GPT2LMHeadModel"):
        EAPIG(gpt2)


@pytest.mark.slow
def test_embedded_model_scores_one_sample(embedded_model_dir, tofu_dir):
    from unlearn_plugins.data.qa import encode_samples, load_split
    from unlearn_plugins.models import load_model

    model, tok = load_model(str(embedded_model_dir), device="cpu")
    engine = EAPIG(model, steps=2)
    assert (engine.graph.n_src, engine.graph.n_dst, engine.graph.n_edges) == (301, 841, 123211)
    assert engine.alphas == [0.5, 1.0]
    examples = encode_samples(tok, load_split("tofu:forget01[0:1]", tofu_dir))
    scores = engine.score(examples)[0]
    assert torch.isfinite(scores).all() and (scores[engine.graph.edge_mask] != 0).float().mean() > 0.9
