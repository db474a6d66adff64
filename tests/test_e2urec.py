"""E2URec's loss and the bad-teacher baseline against hand computations (plain loops over
answer positions, no shared helper)."""

from __future__ import annotations

import math

import pytest
import torch

from unlearn_plugins.benchmarks.movielens.bad_teacher import BadTeacher, FlippedView
from unlearn_plugins.benchmarks.movielens.e2urec import E2URec
from unlearn_plugins.data.qa import PaddingCollator, encode_qa
from unlearn_plugins.interfaces import QASample
from unlearn_plugins.testing import tiny_llama

pytestmark = pytest.mark.usefixtures("single_thread")

FORGET = [("Will the user like the target movie A?", "Yes"), ("Will the user like the target movie B (1995)?", "No")]
RETAIN = [("Will the user like C?", "No"), ("Given the preference, will the user like D?", "Yes")]


def batch_of(tok, pairs):
    return PaddingCollator(tok.pad_token_id)([encode_qa(tok, q, a) for q, a in pairs])


def hand_ce(student, teacher, labels) -> tuple[float, int]:
    """Sum over answer positions of -sum_v softmax(teacher)_v log_softmax(student)_v, and the count."""
    total, count = 0.0, 0
    for b in range(labels.shape[0]):
        for t in range(1, labels.shape[1]):
            if labels[b, t] == -100:
                continue
            q = torch.softmax(teacher[b, t - 1].double(), -1)
            log_p = torch.log_softmax(student[b, t - 1].double(), -1)
            total += float(-(q * log_p).sum())
            count += 1
    return total, count


def hand_nll(student, labels) -> float:
    total, count = 0.0, 0
    for b in range(labels.shape[0]):
        for t in range(1, labels.shape[1]):
            if labels[b, t] != -100:
                total -= float(torch.log_softmax(student[b, t - 1].double(), -1)[labels[b, t]])
                count += 1
    return total / count


@pytest.fixture(scope="module")
def models(tiny_tokenizer):
    n = len(tiny_tokenizer)
    return tiny_llama(n, seed=1), tiny_llama(n, seed=2), tiny_llama(n, seed=3)  # original, augmented, student


def test_e2urec_loss_matches_a_hand_computation(tiny_tokenizer, models):
    original, augmented, student = models
    forget, retain = batch_of(tiny_tokenizer, FORGET), batch_of(tiny_tokenizer, RETAIN)
    objective = E2URec(alpha=2.0, weight=0.6)
    objective.augmented = augmented
    with torch.no_grad():
        z = {
            name: m(input_ids=part["input_ids"], attention_mask=part["attention_mask"]).logits
            for name, m, part in (
                ("o_f", original, forget),
                ("a_f", augmented, forget),
                ("s_f", student, forget),
                ("o_r", original, retain),
                ("s_r", student, retain),
            )
        }
    teacher = z["o_f"].double() - 2.0 * torch.clamp(z["a_f"].double() - z["o_f"].double(), min=0.0)
    ce_sum, n = hand_ce(z["s_f"], teacher, forget["labels"])
    forget_term = ce_sum / n
    kl_sum, m = hand_ce(z["s_r"], z["o_r"], retain["labels"])
    retain_term = hand_nll(z["s_r"], retain["labels"]) + kl_sum / m

    objective.epoch = 1  # after the forget-only epoch
    loss = objective.loss(student, {"forget": forget, "retain": retain}, reference_model=original)
    assert float(loss.detach()) == pytest.approx(0.6 * retain_term + 0.4 * forget_term, rel=1e-5)
    assert float(objective.last_terms["forget"]) == pytest.approx(forget_term, rel=1e-5)
    assert float(objective.last_terms["retain"]) == pytest.approx(retain_term, rel=1e-5)

    objective.epoch = 0  # forget_epochs = 1: the first epoch is the forget term alone
    assert float(objective.loss(student, {"forget": forget, "retain": retain}, original)) == pytest.approx(
        forget_term, rel=1e-5
    )


def test_forgetting_teacher_lowers_what_the_forget_data_raised():
    from unlearn_plugins.benchmarks.movielens.e2urec import forced_teacher_logits

    original = torch.tensor([1.0, 2.0, 0.5])
    augmented = torch.tensor([3.0, 1.0, 0.5])  # the forget data raised token 0 by 2
    assert forced_teacher_logits(original, augmented, 1.0).tolist() == [-1.0, 2.0, 0.5]
    assert forced_teacher_logits(original, augmented, 0.0).tolist() == original.tolist()


def test_e2urec_loss_has_gradient_and_equals_zero_gradient_teacher_when_alpha_zero(tiny_tokenizer, models):
    original, augmented, student = models
    forget = batch_of(tiny_tokenizer, FORGET)
    objective = E2URec(alpha=0.0, weight=0.0)
    objective.augmented = augmented
    loss = objective.loss(student, {"forget": forget}, reference_model=original)
    loss.backward()
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in student.parameters())
    student.zero_grad()
    # alpha = 0: the teacher is the original model itself, so the student equal to it is at the minimum
    same = E2URec(alpha=0.0, weight=0.0)
    same.augmented = augmented
    value = same.loss(original, {"forget": forget}, reference_model=original)
    with torch.no_grad():
        z = original(input_ids=forget["input_ids"], attention_mask=forget["attention_mask"]).logits
    s, n = hand_ce(z, z, forget["labels"])  # the entropy of the original's answer distributions
    assert float(value) == pytest.approx(s / n, rel=1e-5)


def test_e2urec_option_errors():
    from unlearn_plugins.errors import UnlearnError

    with pytest.raises(UnlearnError, match="option 'weight' must be a number in \\[0, 1\\], got 1.5"):
        E2URec(weight=1.5)
    with pytest.raises(UnlearnError, match="give option 'augmented_model' or 'augmented_adapter', not both"):
        E2URec(augmented_model="a", augmented_adapter="b")


def test_bad_teacher_loss_flips_the_forget_answers(tiny_tokenizer, models):
    _, _, student = models
    samples = [QASample(q, a, i) for i, (q, a) in enumerate(FORGET)]
    view = FlippedView(samples, tiny_tokenizer)
    flipped = PaddingCollator(tiny_tokenizer.pad_token_id)([view[i] for i in range(len(view))])
    expected_flipped = batch_of(tiny_tokenizer, [(q, {"Yes": "No", "No": "Yes"}[a]) for q, a in FORGET])
    assert torch.equal(flipped["input_ids"], expected_flipped["input_ids"])
    retain = batch_of(tiny_tokenizer, RETAIN)
    with torch.no_grad():
        zf = student(input_ids=flipped["input_ids"], attention_mask=flipped["attention_mask"]).logits
        zr = student(input_ids=retain["input_ids"], attention_mask=retain["attention_mask"]).logits
    expected = hand_nll(zr, retain["labels"]) + 0.5 * hand_nll(zf, flipped["labels"])
    loss = BadTeacher().loss(
        student, {"forget": batch_of(tiny_tokenizer, FORGET), "forget_flipped": flipped, "retain": retain}
    )
    assert float(loss.detach()) == pytest.approx(expected, rel=1e-5)
    from unlearn_plugins.errors import DataError

    with pytest.raises(DataError, match="flips Yes/No answers; answer 'Maybe' is neither"):
        FlippedView([QASample("q", "Maybe", 0)], tiny_tokenizer)
    assert not math.isnan(float(loss.detach()))
