"""AltPO: on a tiny random Llama and fixed padded batches, the loss and gradient equal
open-unlearning's DPO trainer on alternate-answer data (src/trainer/unlearn/dpo.py lines 12-33 and
src/trainer/utils.py compute_batch_nll 34-44, compute_dpo_loss 47-67, at d3d7cf9), transcribed
here (the reference is not imported); alternates come from a file, from the forget rows, or are
generated with community/methods/AltPO/generate.py's recipe; `unlearn run` lowers the forget
answers' probability."""

from __future__ import annotations

import copy
import json

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from test_fidelity_peer_objectives import fixed_part
from test_task_vector import config

from unlearn_plugins import UNLEARNING_OBJECTIVE, create
from unlearn_plugins.errors import UnlearnError

pytestmark = pytest.mark.usefixtures("single_thread")


def compute_batch_nll(model, inputs):  # src/trainer/utils.py lines 34-44
    outputs = model(**inputs)
    logits = outputs.logits
    labels = inputs["labels"]
    shifted_labels = labels[..., 1:].contiguous()
    logits = logits[..., :-1, :].contiguous()
    loss = nn.CrossEntropyLoss(ignore_index=-100, reduction="none")(logits.transpose(-1, -2), shifted_labels).sum(-1)
    return loss, outputs


def reference_loss(model, ref_model, inputs, beta, gamma, alpha):
    """dpo.py compute_loss (lines 12-33) with compute_dpo_loss (utils.py 47-67) and GradDiff's
    NLL retain loss (grad_diff.py 25-29)."""
    win_inputs, lose_inputs = inputs["forget"]["alternate"], inputs["forget"]["original"]
    win_loss, _ = compute_batch_nll(model, win_inputs)
    with torch.no_grad():
        win_ref_loss, _ = compute_batch_nll(ref_model, win_inputs)
    lose_loss, _ = compute_batch_nll(model, lose_inputs)
    with torch.no_grad():
        lose_ref_loss, _ = compute_batch_nll(ref_model, lose_inputs)
    win_log_ratio, lose_log_ratio = -(win_loss - win_ref_loss), -(lose_loss - lose_ref_loss)
    forget_loss = -2 / beta * F.logsigmoid(beta * (win_log_ratio - lose_log_ratio)).mean()
    retain_loss = model(**inputs["retain"]).loss
    return gamma * forget_loss + alpha * retain_loss


@pytest.mark.parametrize(("beta", "gamma", "alpha"), [(0.1, 1.0, 1.0), (0.5, 2.0, 5.0)])
def test_loss_and_gradient_equal_the_reference(tiny_model, tiny_tokenizer, beta, gamma, alpha):
    torch.manual_seed(0)
    model = tiny_model.float().train(False)
    ref_model = copy.deepcopy(model)
    with torch.no_grad():  # a reference that differs from the model, so the log-ratios are not zero
        for p in ref_model.parameters():
            p.add_(0.02 * torch.randn_like(p))
    vocab = len(tiny_tokenizer)
    original, alternate, retain = fixed_part(vocab, 1), fixed_part(vocab, 2, (3, 4, 2)), fixed_part(vocab, 3)
    ours = create(UNLEARNING_OBJECTIVE, "altpo", beta=beta, gamma=gamma, alpha=alpha)
    theirs_model = copy.deepcopy(model)
    loss = ours.loss(model, {"forget": original, "forget_alternate": alternate, "retain": retain}, ref_model)
    expected = reference_loss(
        theirs_model,
        ref_model,
        {"forget": {"original": original, "alternate": alternate}, "retain": retain},
        beta,
        gamma,
        alpha,
    )
    torch.testing.assert_close(loss, expected, atol=1e-6, rtol=1e-6)
    loss.backward()
    expected.backward()
    for (name, p), (_, q) in zip(model.named_parameters(), theirs_model.named_parameters()):
        torch.testing.assert_close(p.grad, q.grad, atol=1e-6, rtol=1e-5, msg=name)


def test_defaults_are_the_reference_config():
    options = create(UNLEARNING_OBJECTIVE, "altpo").options()
    # configs/trainer/DPO.yaml (beta, alpha, gamma, NLL) and community/methods/AltPO/generate.yaml
    assert options == {
        "gamma": 1.0,
        "alpha": 1.0,
        "retain_loss": "nll",
        "beta": 0.1,
        "alternates_file": None,
        "repeats": 5,
        "max_new_tokens": 200,
        "temperature": 1.0,
    }


def test_alternates_from_a_file_from_the_rows_or_generated(tiny_model, tiny_tokenizer, tmp_path):
    from unlearn_plugins.interfaces import QASample
    from unlearn_plugins.training.objective import ObjectiveContext

    samples = [QASample("Who wrote A?", "Jo Smith.", 0), QASample("Where was B born?", "In Paris.", 1)]
    path = tmp_path / "alt.jsonl"
    rows = [
        {"question": s.question, "answer": s.answer, "alternate": f"{s.question} alt {k}"}
        for s in samples
        for k in range(3)
    ]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    context = ObjectiveContext(model=tiny_model, tokenizer=tiny_tokenizer, forget_samples=samples, seed=0)

    view = create(UNLEARNING_OBJECTIVE, "altpo", alternates_file=str(path)).prepare(context)["forget_alternate"]
    assert view.alternates == [[f"{s.question} alt {k}" for k in range(3)] for s in samples]
    drawn = set()
    for epoch in range(12):
        view.set_epoch(epoch)
        drawn.add(tuple(view[0]["input_ids"]))
    assert len(drawn) > 1  # a different alternate across epochs
    assert context.info["altpo_alternates"]["source"] == str(path)

    with pytest.raises(UnlearnError, match="no alternate for 1 forget question"):
        path.write_text(json.dumps(rows[0]) + "\n")
        create(UNLEARNING_OBJECTIVE, "altpo", alternates_file=str(path)).prepare(context)

    rows = [{"question": samples[0].question, "alternate": a} for a in ("", "Ann Lee.")]
    rows.append({"question": samples[1].question, "alternate": "  "})
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    with pytest.raises(UnlearnError, match="every alternate for forget question 'Where was B born\\?'.* is empty"):
        create(UNLEARNING_OBJECTIVE, "altpo", alternates_file=str(path)).prepare(context)
    context = ObjectiveContext(model=tiny_model, tokenizer=tiny_tokenizer, forget_samples=samples[:1], seed=0)
    view = create(UNLEARNING_OBJECTIVE, "altpo", alternates_file=str(path)).prepare(context)["forget_alternate"]
    assert view.alternates == [["Ann Lee."]] and context.info["altpo_alternates"]["dropped_empty"] == 1

    own = [QASample(s.question, s.answer, s.index, extra={"alternate": "Someone else."}) for s in samples]
    context = ObjectiveContext(model=tiny_model, tokenizer=tiny_tokenizer, forget_samples=own, seed=0)
    view = create(UNLEARNING_OBJECTIVE, "altpo").prepare(context)["forget_alternate"]
    assert view.alternates == [["Someone else."], ["Someone else."]]

    context = ObjectiveContext(model=tiny_model, tokenizer=tiny_tokenizer, forget_samples=samples, seed=0)
    altpo = create(UNLEARNING_OBJECTIVE, "altpo", repeats=2, max_new_tokens=6)
    view = altpo.prepare(context)["forget_alternate"]
    assert [len(a) for a in view.alternates] == [2, 2]
    assert context.info["altpo_alternates"]["source"] == "generated by the starting model"
    again = create(UNLEARNING_OBJECTIVE, "altpo", repeats=2, max_new_tokens=6).prepare(
        ObjectiveContext(model=tiny_model, tokenizer=tiny_tokenizer, forget_samples=samples, seed=0)
    )["forget_alternate"]
    assert again.alternates == view.alternates  # seeded


def test_generation_prompt_and_cut_follow_generate_py(tiny_tokenizer):
    from unlearn_plugins.objectives.altpo import INSTRUCTION, cut_at_stop, generation_prompt

    prompt = generation_prompt(tiny_tokenizer, "Who wrote A?", "Jo Smith.")
    assert "Question: Who wrote A?\nAnswer: Jo Smith.\n" + INSTRUCTION in prompt
    assert prompt.endswith("Alternate Answer :")
    assert cut_at_stop("  Ann Lee wrote it.\n\nQuestion: next") == "Ann Lee wrote it."
    assert cut_at_stop("Ann. Q: more") == "Ann."


def test_a_run_lowers_the_forget_answers_probability(tiny_model_dir, tofu_dir, tmp_path):
    """`unlearn run --objective altpo` (alternates generated by the tiny model) raises the forget
    answers' NLL; the alternates are recorded in run.json."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from unlearn_plugins.data.qa import encode_samples, load_split
    from unlearn_plugins.likelihood import answer_nll
    from unlearn_plugins.training import run_unlearning

    out = tmp_path / "altpo"
    options = {"repeats": 2, "max_new_tokens": 8, "alpha": 0.0}
    run_unlearning(
        config(out, tiny_model_dir, tofu_dir, objective="altpo", objective_options=options, max_steps=4, merge=True)
    )
    record = json.loads((out / "run.json").read_text())
    assert "altpo_alternates" in json.dumps(record)
    tok = AutoTokenizer.from_pretrained(str(tiny_model_dir))
    examples = encode_samples(tok, load_split("forget01", tofu_dir)[:4], max_length=64)

    def nll(folder):
        m = AutoModelForCausalLM.from_pretrained(str(folder), torch_dtype=torch.float32)
        return sum(s for s, _ in answer_nll(m, examples, tok.pad_token_id))

    assert nll(out / "merged") > nll(tiny_model_dir)
