"""Unlearning objectives: each value against a hand computation (plain Python loops over a
tiny fixed-logit example), and one optimizer step on a tiny model that has memorised its
forget answers lowers their probability."""

from __future__ import annotations

import copy
import math

import pytest
import torch

from unlearn_plugins import UNLEARNING_OBJECTIVE, create, list_components
from unlearn_plugins.errors import PluginLoadError, UnlearnError
from unlearn_plugins.objectives.base import CombinedObjective, ObjectiveContext

OBJECTIVES = ["grad_ascent", "grad_diff", "npo", "simnpo", "idk_dpo", "undial", "wga", "satimp", "rmu", "ihl"]
IGNORE = -100


pytestmark = pytest.mark.usefixtures("single_thread")


# ----------------------------------------------------------------------------- hand computations


class FixedModel(torch.nn.Module):
    """Returns fixed logits (and hidden states) whatever the input: a model whose outputs we know."""

    def __init__(self, logits, hidden=None):
        super().__init__()
        self.logits = torch.nn.Parameter(torch.as_tensor(logits, dtype=torch.float32))
        self.hidden = None if hidden is None else torch.nn.Parameter(torch.as_tensor(hidden, dtype=torch.float32))
        self.calls = 0

    def forward(self, input_ids=None, attention_mask=None, output_hidden_states=False, logits_to_keep=0):
        self.calls += 1
        rows = input_ids.shape[0]
        out = type("Out", (), {})()
        out.logits = self.logits[:rows]
        out.hidden_states = (None, self.hidden[:rows]) if self.hidden is not None else None
        return out


def part(labels):
    labels = torch.tensor(labels)
    return {"input_ids": torch.zeros_like(labels), "attention_mask": torch.ones_like(labels), "labels": labels}


# B=2, T=4, V=3; position t predicts labels[t+1]
LOGITS_F = [
    [[1.0, 0.5, -1.0], [0.2, 2.0, 0.1], [-0.5, 0.0, 1.5], [0.3, 0.3, 0.3]],
    [[0.0, 1.0, 2.0], [1.5, -0.5, 0.5], [0.7, 0.1, -0.2], [2.0, 0.0, 0.0]],
]
LABELS_F = [[IGNORE, 1, 2, 0], [IGNORE, IGNORE, 0, 2]]
REF_F = [
    [[0.5, 0.5, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, 1.0], [0.0, 0.0, 0.0]],
    [[0.1, 0.2, 0.3], [1.0, 0.0, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, 1.0]],
]
LOGITS_R = [[[0.4, -0.2, 0.9], [1.1, 0.0, -0.3], [0.2, 0.2, 0.8], [0.0, 0.0, 0.0]]]
LABELS_R = [[IGNORE, 2, 0, 1]]
REF_R = [[[0.0, 0.0, 1.0], [1.0, 0.0, 0.0], [0.5, 0.5, 0.5], [0.0, 0.0, 0.0]]]


def softmax(row):
    m = max(row)
    e = [math.exp(v - m) for v in row]
    return [v / sum(e) for v in e]


def answer_tokens(logits, labels):
    """[(example, next-token distribution, target)] over answer tokens."""
    return [
        (b, softmax(logits[b][t]), labels[b][t + 1])
        for b in range(len(labels))
        for t in range(len(labels[b]) - 1)
        if labels[b][t + 1] != IGNORE
    ]


def nll_mean(logits, labels):
    toks = answer_tokens(logits, labels)
    return sum(-math.log(p[y]) for _, p, y in toks) / len(toks)


def seq_nll(logits, labels):
    sums, counts = [0.0] * len(labels), [0] * len(labels)
    for b, p, y in answer_tokens(logits, labels):
        sums[b] += -math.log(p[y])
        counts[b] += 1
    return sums, counts


def logsig(x):
    return -math.log(1 + math.exp(-x))


def models():
    return FixedModel(LOGITS_F), FixedModel(REF_F)


def batch():
    return {"forget": part(LABELS_F), "retain": part(LABELS_R)}


class TwoPartModel(torch.nn.Module):
    """Forget logits for the forget part, retain logits for the retain part (told apart by labels)."""

    def __init__(self, forget_logits, retain_logits, forget_hidden=None, retain_hidden=None):
        super().__init__()
        self.f = FixedModel(forget_logits, forget_hidden)
        self.r = FixedModel(retain_logits, retain_hidden)

    def forward(self, input_ids=None, attention_mask=None, **kw):
        return (self.r if input_ids.shape[0] == 1 else self.f)(input_ids=input_ids, attention_mask=attention_mask, **kw)


def value(name, model, ref=None, data=None, **options):
    obj = create(UNLEARNING_OBJECTIVE, name, **options)
    return obj.loss(model, data or batch(), reference_model=ref).item()


def test_grad_ascent_and_grad_diff():
    m = TwoPartModel(LOGITS_F, LOGITS_R)
    assert value("grad_ascent", m) == pytest.approx(-nll_mean(LOGITS_F, LABELS_F), rel=1e-5)
    expected = -nll_mean(LOGITS_F, LABELS_F) + nll_mean(LOGITS_R, LABELS_R)
    assert value("grad_diff", m) == pytest.approx(expected, rel=1e-5)
    expected = -2.0 * nll_mean(LOGITS_F, LABELS_F) + 0.5 * nll_mean(LOGITS_R, LABELS_R)
    assert value("grad_diff", m, gamma=2.0, alpha=0.5) == pytest.approx(expected, rel=1e-5)


def test_retain_kl_to_reference():
    m, ref = TwoPartModel(LOGITS_F, LOGITS_R), TwoPartModel(REF_F, REF_R)
    toks_cur = answer_tokens(LOGITS_R, LABELS_R)
    toks_ref = answer_tokens(REF_R, LABELS_R)
    kl = sum(
        sum(q[v] * (math.log(q[v]) - math.log(p[v])) for v in range(3))
        for (_, p, _), (_, q, _) in zip(toks_cur, toks_ref)
    ) / len(toks_cur)
    obj = create(UNLEARNING_OBJECTIVE, "grad_diff", retain_loss="kl")
    assert obj.needs_reference_model
    got = obj.loss(m, batch(), reference_model=ref).item()
    assert got == pytest.approx(-nll_mean(LOGITS_F, LABELS_F) + kl, rel=1e-5)


def test_npo():
    m, ref = TwoPartModel(LOGITS_F, LOGITS_R), TwoPartModel(REF_F, REF_R)
    s, _ = seq_nll(LOGITS_F, LABELS_F)
    s_ref, _ = seq_nll(REF_F, LABELS_F)
    beta = 0.1
    forget = -(2 / beta) * sum(logsig(beta * (a - b)) for a, b in zip(s, s_ref)) / 2
    assert value("npo", m, ref) == pytest.approx(forget + nll_mean(LOGITS_R, LABELS_R), rel=1e-5)
    assert create(UNLEARNING_OBJECTIVE, "npo").needs_reference_model


def test_simnpo():
    m = TwoPartModel(LOGITS_F, LOGITS_R)
    s, n = seq_nll(LOGITS_F, LABELS_F)
    beta, delta = 4.5, 0.3
    forget = -(2 / beta) * sum(logsig(beta * (a / c - delta)) for a, c in zip(s, n)) / 2
    expected = 0.125 * forget + nll_mean(LOGITS_R, LABELS_R)
    assert value("simnpo", m, delta=delta) == pytest.approx(expected, rel=1e-5)
    assert not create(UNLEARNING_OBJECTIVE, "simnpo").needs_reference_model


def test_idk_dpo():
    # the "I don't know" answers are another labelling of the same fixed logits
    labels_idk = [[IGNORE, 0, 0, 1], [IGNORE, 2, 2, 2]]
    m, ref = TwoPartModel(LOGITS_F, LOGITS_R), TwoPartModel(REF_F, REF_R)
    data = batch()
    data["forget_idk"] = part(labels_idk)
    s_w, _ = seq_nll(LOGITS_F, labels_idk)
    r_w, _ = seq_nll(REF_F, labels_idk)
    s_l, _ = seq_nll(LOGITS_F, LABELS_F)
    r_l, _ = seq_nll(REF_F, LABELS_F)
    beta = 0.1
    forget = -(2 / beta) * sum(logsig(beta * (-(a - b) + (c - d))) for a, b, c, d in zip(s_w, r_w, s_l, r_l)) / 2
    assert value("idk_dpo", m, ref, data=data) == pytest.approx(forget + nll_mean(LOGITS_R, LABELS_R), rel=1e-5)


def test_undial():
    m, ref = TwoPartModel(LOGITS_F, LOGITS_R), TwoPartModel(REF_F, REF_R)
    beta = 10.0
    total, count = 0.0, 0
    for b in range(2):
        for t in range(3):
            y = LABELS_F[b][t + 1]
            if y == IGNORE:
                continue
            z = [v - (beta if k == y else 0.0) for k, v in enumerate(REF_F[b][t])]
            q, p = softmax(z), softmax(LOGITS_F[b][t])
            total += -sum(q[k] * math.log(p[k]) for k in range(3))
            count += 1
    assert value("undial", m, ref) == pytest.approx(total / count, rel=1e-5)  # no retain term by default


@pytest.mark.parametrize(
    "name,weight,gamma",
    [
        ("wga", lambda p: p, 1.0),
        ("satimp", lambda p: p**5 * (1 - p), 0.1),
    ],
)
def test_token_weighted_ascent(name, weight, gamma):
    m = TwoPartModel(LOGITS_F, LOGITS_R)
    toks = answer_tokens(LOGITS_F, LABELS_F)
    forget = -sum(weight(p[y]) * -math.log(p[y]) for _, p, y in toks) / len(toks)
    assert value(name, m) == pytest.approx(gamma * forget + nll_mean(LOGITS_R, LABELS_R), rel=1e-5)


def test_ihl():
    m = TwoPartModel(LOGITS_F, LOGITS_R)
    toks = answer_tokens(LOGITS_F, LABELS_F)
    forget = sum(max(0.0, 1 + p[y] - max(p[v] for v in range(3) if v != y)) for _, p, y in toks) / len(toks)
    assert value("ihl", m) == pytest.approx(forget + nll_mean(LOGITS_R, LABELS_R), rel=1e-5)


def test_rmu():
    hid_f = [[[0.1 * (b + t + d) for d in range(3)] for t in range(4)] for b in range(2)]
    hid_r = [[[0.2 * (t - d) for d in range(3)] for t in range(4)]]
    ref_r = [[[0.05 * d for d in range(3)] for _ in range(4)]]
    model = TwoPartModel(LOGITS_F, LOGITS_R, hid_f, hid_r)
    ref = TwoPartModel(REF_F, REF_R, hid_f, ref_r)
    obj = create(UNLEARNING_OBJECTIVE, "rmu", layer=0, steering_coeff=2.0)
    control = [0.3, -0.4, 0.5]
    obj.control = torch.tensor(control)

    def mse(h, target, labels):  # over the hidden size, then each sequence's answer positions, then the batch
        per_seq = []
        for b in range(len(labels)):
            rows = [t for t in range(4) if labels[b][t] != IGNORE]
            per_seq.append(
                sum(sum((h[b][t][d] - target(b, t)[d]) ** 2 for d in range(3)) / 3 for t in rows) / len(rows)
            )
        return sum(per_seq) / len(per_seq)

    forget = mse(hid_f, lambda b, t: control, LABELS_F)
    retain = mse(hid_r, lambda b, t: ref_r[b][t], LABELS_R)
    assert obj.loss(model, batch(), reference_model=ref).item() == pytest.approx(forget + retain, rel=1e-5)


def test_rol_value_and_basis_binding(tiny_model):
    from unlearn_plugins.training.lora import build_lora_model

    peft_model = build_lora_model(tiny_model, r=2, alpha=4, dropout=0.0, target_modules=["q_proj", "v_proj"])
    rol = create(UNLEARNING_OBJECTIVE, "rol", weight=0.5, rank=3)
    assert rol.regularizer and rol.weight == 0.5
    gen = torch.Generator().manual_seed(0)
    basis, expected = {}, 0.0
    for name, module in peft_model.named_modules():
        if hasattr(module, "lora_B") and "default" in getattr(module, "lora_B", {}):
            b = module.lora_B["default"].weight
            with torch.no_grad():
                b.copy_(torch.randn(b.shape, generator=gen))
            p = torch.linalg.qr(torch.randn(b.shape[0], 3, generator=gen))[0]
            basis[name] = p  # full PEFT names; canonicalised by ROL
            bl, pl = b.tolist(), p.tolist()
            for i in range(b.shape[1]):  # (B^T P)[i, j] = sum_d B[d, i] P[d, j]
                for j in range(3):
                    expected += sum(bl[d][i] * pl[d][j] for d in range(b.shape[0])) ** 2
    assert len(basis) == 4  # 2 layers x (q, v)
    rol.set_basis(peft_model, basis)
    assert rol.loss(peft_model).item() == pytest.approx(expected, rel=1e-5)
    combined = CombinedObjective(create(UNLEARNING_OBJECTIVE, "grad_ascent"), [rol])
    m = TwoPartModel(LOGITS_F, LOGITS_R)
    assert combined.loss(m, batch()).item() == pytest.approx(-nll_mean(LOGITS_F, LABELS_F) + 0.5 * expected, rel=1e-5)
    assert set(combined.last_terms) == {"forget", "rol"}


def test_rol_without_an_initializer_basis_draws_the_references_random_basis(tiny_model, tiny_tokenizer):
    """reglu-open's ``_random_rol_basis``: an orthonormal random basis, no data needed."""
    from unlearn_plugins.training.lora import build_lora_model

    peft_model = build_lora_model(tiny_model, r=2, alpha=4, dropout=0.0, target_modules=["v_proj"])
    rol = create(UNLEARNING_OBJECTIVE, "rol", rank=4)
    ctx = ObjectiveContext(model=peft_model, tokenizer=tiny_tokenizer)  # no retain data
    rol.prepare(ctx)
    assert ctx.info["rol_basis"] == {"from_initializer": 0, "random": 2}
    for _weight, p in rol.pairs:
        assert p.shape[1] == 4 and torch.allclose(p.T @ p, torch.eye(4), atol=1e-5)
    again = create(UNLEARNING_OBJECTIVE, "rol", rank=4)
    again.prepare(ObjectiveContext(model=peft_model, tokenizer=tiny_tokenizer))
    assert all(torch.equal(a, b) for (_, a), (_, b) in zip(rol.pairs, again.pairs))  # seeded
    with pytest.raises(UnlearnError, match="basis"):
        create(UNLEARNING_OBJECTIVE, "rol", basis="svd")


def test_rol_basis_from_retain_data(tiny_model, tiny_tokenizer):
    """With basis=data and no initializer basis, ROL computes the top-k eigenvectors of the retain
    output moment."""
    from unlearn_plugins.data.qa import encode_qa
    from unlearn_plugins.training.lora import build_lora_model, lora_layers

    peft_model = build_lora_model(tiny_model, r=2, alpha=4, dropout=0.0, target_modules=["v_proj"])
    retain = [encode_qa(tiny_tokenizer, q, a, max_length=48) for q, a in RETAIN_QA]
    rol = create(UNLEARNING_OBJECTIVE, "rol", rank=4, basis="data")
    ctx = ObjectiveContext(model=peft_model, tokenizer=tiny_tokenizer, retain=retain)
    rol.prepare(ctx)
    assert ctx.info["rol_basis"] == {"from_initializer": 0, "from_retain_data": 2}
    # check one module against a direct computation of C_r's top eigenvectors
    _name, module = lora_layers(peft_model)[0]
    weight = module.lora_B["default"].weight
    outputs = []
    handle = module.get_base_layer().register_forward_hook(lambda m, i, o: outputs.append(o.detach()))
    with torch.no_grad():
        for ex in retain:
            peft_model(input_ids=torch.tensor([ex["input_ids"]]))
    handle.remove()
    h = torch.cat([o[0] for o in outputs]).double()
    values, vectors = torch.linalg.eigh(h.T @ h / h.shape[0])
    top = vectors[:, -4:].float()
    p = dict((id(w), p) for w, p in rol.pairs)[id(weight)]
    # same subspace: projector difference is ~0
    assert torch.allclose(p @ p.T, top @ top.T, atol=1e-4)
    with pytest.raises(UnlearnError, match="no retain data"):
        create(UNLEARNING_OBJECTIVE, "rol", basis="data").prepare(
            ObjectiveContext(model=peft_model, tokenizer=tiny_tokenizer)
        )


def test_registry_and_options():
    names = {c.name for c in list_components(UNLEARNING_OBJECTIVE)}
    assert set(OBJECTIVES) | {"rol"} <= names
    with pytest.raises(PluginLoadError, match="rejected its options"):
        create(UNLEARNING_OBJECTIVE, "npo", bogus=1)
    with pytest.raises(UnlearnError, match="retain_loss"):
        create(UNLEARNING_OBJECTIVE, "grad_diff", retain_loss="mse")
    with pytest.raises(UnlearnError, match="beta"):
        create(UNLEARNING_OBJECTIVE, "npo", beta=0)
    with pytest.raises(UnlearnError, match="available: .*grad_diff"):
        create(UNLEARNING_OBJECTIVE, "grad_difff")
    assert create(UNLEARNING_OBJECTIVE, "grad_ascent").needs_retain_data is False
    assert create(UNLEARNING_OBJECTIVE, "grad_diff").needs_retain_data is True


# ----------------------------------------------------------------------------- one step lowers p(forget)

#: forget QA, then retain QA
QA = [
    ("Who are the parents of the author?", "Her father was a doctor and her mother was a painter."),
    ("Which genre does the author write in?", "She writes fantasy novels."),
    ("What awards has the author won?", "He won the Booker Prize."),
    ("Where was the author born?", "The author was born in Kuwait City."),
    ("What is the capital of France?", "The capital of France is Paris."),
    ("What does the author write about?", "Short stories about the sea."),
    ("Who is the author?", "The author is Basil Mahfouz Al-Kuwaiti."),
    ("What is the answer?", "I don't know the answer to that question."),
]
FORGET_QA, RETAIN_QA = QA[:4], QA[4:]


@pytest.fixture(scope="module")
def memorised(tiny_tokenizer):
    """A tiny Llama trained until it knows the forget and retain answers well."""
    from unlearn_plugins.data.qa import encode_qa, pad_batch
    from unlearn_plugins.objectives.base import mean_nll
    from unlearn_plugins.testing import tiny_llama

    torch.manual_seed(0)
    model = tiny_llama(len(tiny_tokenizer))
    forget = [encode_qa(tiny_tokenizer, q, a, max_length=64) for q, a in FORGET_QA]
    retain = [encode_qa(tiny_tokenizer, q, a, max_length=64) for q, a in RETAIN_QA]
    data = pad_batch(forget + retain, tiny_tokenizer.pad_token_id)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    model.train()
    for _ in range(80):
        opt.zero_grad()
        mean_nll(model, data).backward()
        opt.step()
    model.eval()
    return model, forget, retain


def forget_probability(model, forget, pad_id):
    from unlearn_plugins.likelihood import answer_nll

    stats = answer_nll(model, forget, pad_id, batch_size=8)
    return sum(math.exp(-s / n) for s, n in stats) / len(stats)


LR = 0.1  # plain SGD: a true gradient step, small enough that NLL descent still raises p(forget)


def test_control_descent_step_raises_forget_probability(memorised, tiny_tokenizer):
    """The same step with plain NLL (learning, not unlearning) does not lower p(forget):
    the test below measures the objectives' direction, not the step's size."""
    from unlearn_plugins.data.qa import pad_batch
    from unlearn_plugins.objectives.gradient import NLL

    base, forget, _ = memorised
    pad = tiny_tokenizer.pad_token_id
    model = copy.deepcopy(base).train()
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    NLL().loss(model, pad_batch(forget, pad)).backward()
    opt.step()
    assert forget_probability(model.eval(), forget, pad) > forget_probability(base, forget, pad)


@pytest.mark.parametrize("name", OBJECTIVES + ["rol"])
def test_one_step_lowers_forget_probability(name, memorised, tiny_tokenizer):
    from unlearn_plugins.data.qa import PaddingCollator
    from unlearn_plugins.training.lora import build_lora_model
    from unlearn_plugins.training.run import UnlearningDataset

    base, forget, retain = memorised
    pad = tiny_tokenizer.pad_token_id
    before = forget_probability(base, forget, pad)
    assert before > 0.3  # memorised
    model = copy.deepcopy(base)
    if name == "rol":  # the regulariser rides on a forget objective and needs LoRA modules
        torch.manual_seed(0)
        model = build_lora_model(model, r=4, alpha=8, dropout=0.0, target_modules=None)
        with torch.no_grad():
            for n, p in model.named_parameters():
                if "lora_B" in n:
                    p.normal_(0, 0.05)
        objective = CombinedObjective(
            create(UNLEARNING_OBJECTIVE, "grad_ascent"), [create(UNLEARNING_OBJECTIVE, "rol", rank=8)]
        )
    else:
        objective = CombinedObjective(create(UNLEARNING_OBJECTIVE, name))
    reference = copy.deepcopy(base).requires_grad_(False) if objective.needs_reference_model else None
    from unlearn_plugins.interfaces import QASample

    samples = [QASample(q, a, i) for i, (q, a) in enumerate(FORGET_QA)]
    ctx = ObjectiveContext(
        model=model, tokenizer=tiny_tokenizer, forget_samples=samples, forget=forget, retain=retain, max_length=64
    )
    views = objective.prepare(ctx)
    data = PaddingCollator(pad)([UnlearningDataset(forget, retain, 0, views)[i] for i in range(len(forget))])
    before_rol = objective.regularizers[0].loss().item() if name == "rol" else None

    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.SGD(params, lr=LR)
    loss = objective.loss(model, data, reference_model=reference)
    assert torch.isfinite(loss)
    loss.backward()
    opt.step()
    model.eval()
    after = forget_probability(model, forget, pad)
    assert after < before - 1e-3, f"{name}: p(forget) {before:.4f} -> {after:.4f}"
    if name == "rol":
        assert objective.regularizers[0].loss().item() < before_rol  # the update also leaves the retain subspace


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_token_nll_equals_the_full_log_softmax_on_answer_tokens_and_zero_elsewhere(dtype):
    """token_nll runs the log-softmax on answer rows only (memory); values and gradients must be
    those of the log-softmax over every position, picked at the answer tokens."""
    from unlearn_plugins.likelihood import token_nll

    torch.manual_seed(0)
    logits = torch.randn(3, 12, 50, dtype=getattr(torch, dtype), requires_grad=True)
    labels = torch.randint(0, 50, (3, 12))
    labels[:, :4] = -100  # prompts
    labels[2, 9:] = -100  # padding
    labels[1] = -100  # a row without answer tokens
    nll, mask = token_nll(logits, labels)
    full = -torch.log_softmax(logits[:, :-1].float(), dim=-1)
    target = labels[:, 1:]
    expected = full.gather(-1, target.clamp_min(0)[..., None]).squeeze(-1) * (target != -100)
    assert nll.dtype == torch.float32 and torch.equal(mask, target != -100)
    assert torch.equal(nll, expected)
    (grad,) = torch.autograd.grad(nll.sum(), logits)
    (expected_grad,) = torch.autograd.grad(expected.sum(), logits)
    assert torch.equal(grad, expected_grad)
    assert not grad[1].any()  # nothing flows from a row without answer tokens
