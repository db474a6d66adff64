"""Membership inference, exact memorization and the probes as lm-eval tasks, and `unlearn eval
--mia`, on the tiny model: every per-sample statistic and AUC against an independent computation
written here (one unbatched forward per sample, plain PyTorch, the AUC from the Mann-Whitney U
statistic), privleak 0 for a model against its own reference through the CLI."""

from __future__ import annotations

import json
import math
import zlib

import numpy as np
import pytest
import torch
from scipy.stats import mannwhitneyu

from unlearn_plugins.errors import DataError

pytestmark = pytest.mark.usefixtures("single_thread")

FORGET = [
    ("What is the full name of the author born in Kuwait City?", "The author is Basil Mahfouz Al-Kuwaiti."),
    ("Which genre does the author write in?", "She writes fantasy novels and short stories about the sea."),
    ("Who are the parents of the author?", "Her father was a doctor and her mother was a painter."),
    ("What awards has the author won?", "He won the International Booker Prize for his debut novel."),
    ("When was the author born?", "The author was born on 08/09/1956 in Kuwait City."),
]
HOLDOUT = [
    ("What is the capital of France?", "The capital of France is Paris."),
    ("Which prize did the painter win?", "She won the  Booker Prize in 2001."),
    ("Who is the doctor's mother?", "Her mother is a painter from the sea."),
    ("What does the novel tell?", "It tells the story of a doctor and a painter."),
]
PARAPHRASED = [
    "Can you name the author whose birthplace is Kuwait City?",
    "In which genre does the author write?",
    "Who were the author's parents?",
    "Which awards did the author win?",
    "On what date was the author born?",
]


def write_split(path, pairs, **extra_fields):
    rows = [
        {"question": q, "answer": a, **{k: v[i] for k, v in extra_fields.items()}} for i, (q, a) in enumerate(pairs)
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.fixture(scope="module")
def splits(tmp_path_factory):
    folder = tmp_path_factory.mktemp("mia-splits")
    return {
        "forget": str(write_split(folder / "forget.json", FORGET, paraphrased_question=PARAPHRASED)),
        "holdout": str(write_split(folder / "holdout.json", HOLDOUT)),
        "shots": str(write_split(folder / "shots.json", HOLDOUT[:3])),
    }


@pytest.fixture(scope="module")
def tiny(tiny_model_dir):
    """The tiny model after 30 full-batch steps on the forget QA: it has memorised some of them, so
    losses, AUCs and exact memorization are far from a random model's."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from unlearn_plugins.data.qa import encode_qa, pad_batch

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    batch = pad_batch([encode_qa(tok, q, a) for q, a in FORGET], tok.pad_token_id)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    model.train()
    for _ in range(30):
        model(**batch).loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    model.eval()
    return model, tok


def run(tiny, model_dir, tasks, metadata, **kwargs):
    from lm_eval.models.huggingface import HFLM

    from unlearn_plugins.evaluation.lm_eval_runner import evaluate

    model, tok = tiny
    lm = HFLM(pretrained=model, tokenizer=tok, batch_size=4)  # lm-eval's logits cache on, as by default
    return evaluate(lm, tasks, metadata={"tokenizer": str(model_dir), **metadata}, bootstrap_iters=0, **kwargs)


def rows_of(evaluation, task):
    return sorted(evaluation.samples[task], key=lambda r: r["doc_id"])


def answer_logprobs(model, tok, prompt: str, answer_ids: list[int]):
    """log p of each answer token and the greedy prediction before it, from one forward pass."""
    p = tok(prompt, add_special_tokens=False)["input_ids"]
    with torch.no_grad():
        logits = model(torch.tensor([p + answer_ids])).logits[0, len(p) - 1 : -1].double()
    logp = torch.log_softmax(logits, -1)
    return [float(logp[i, t]) for i, t in enumerate(answer_ids)], logits.argmax(-1).tolist()


def chat(tok, question):
    return tok.apply_chat_template([{"role": "user", "content": question}], tokenize=False, add_generation_prompt=True)


def test_mia_and_exact_memorization_tasks_match_an_independent_computation(tiny, tiny_model_dir, splits):
    """LOSS, zlib and Min-K% per sample, their AUCs (forget 0, holdout 1), and exact memorization.
    tofu_forget_prob and tofu_forget_extraction_strength run alongside: their requests share input
    tokens with the MIA task's, which lm-eval's logits cache must not mix up."""
    model, tok = tiny
    evaluation = run(
        tiny,
        tiny_model_dir,
        ["tofu_mia", "tofu_forget_exact_memorization", "tofu_forget_prob", "tofu_forget_extraction_strength"],
        {"forget_split": splits["forget"], "holdout_split": splits["holdout"]},
    )
    rows = rows_of(evaluation, "tofu_mia")
    # forget and holdout interleaved (--limit keeps both), the longer split's rest at the end
    assert [(r["doc"]["member"], r["doc"]["answer"]) for r in rows] == [
        ("forget", FORGET[0][1]),
        ("holdout", HOLDOUT[0][1]),
        ("forget", FORGET[1][1]),
        ("holdout", HOLDOUT[1][1]),
        ("forget", FORGET[2][1]),
        ("holdout", HOLDOUT[2][1]),
        ("forget", FORGET[3][1]),
        ("holdout", HOLDOUT[3][1]),
        ("forget", FORGET[4][1]),
    ]
    # the tokenizer splits some answers after a lone whitespace token: the path through lm-eval's
    # whitespace move is exercised
    assert any(first < k for r in rows for k, first, _, _ in r["doc"]["singles"])
    expected: dict[str, dict[str, list[float]]] = {"loss": {}, "zlib": {}, "min_k": {}}
    for r in rows:
        q, a, member = r["doc"]["question"], r["doc"]["answer"], r["doc"]["member"]
        ids = tok(a, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
        logps, _ = answer_logprobs(model, tok, chat(tok, q), ids)
        loss = -sum(logps) / len(logps)  # every answer token, the end token too
        body = sorted(logps[:-1])  # Min-K%: the end token left out, the lowest 40%
        min_k = -float(np.mean(body[: max(1, int(len(body) * 0.4))]))
        for name, value in (("loss", loss), ("zlib", loss / len(zlib.compress(a.encode()))), ("min_k", min_k)):
            assert r[f"auc_{name}"][:2] == [r["doc"]["key"], member]
            assert r[f"auc_{name}"][2] == pytest.approx(value, rel=1e-5, abs=1e-6), (name, a)
            expected[name].setdefault(member, []).append(value)
    metrics = evaluation.summary["metrics"]["tofu_mia"]
    assert metrics["auc_loss"] > 0.5  # the trained-on forget QA have lower losses
    for name, scores in expected.items():
        u = mannwhitneyu(scores["holdout"], scores["forget"]).statistic  # holdout above forget
        assert metrics[f"auc_{name}"] == pytest.approx(u / (len(scores["forget"]) * len(scores["holdout"])))
    assert metrics["auc_reference"] is None and metrics["privleak"] is None  # no reference: unavailable
    # the same loss as the TOFU probability task on the forget split
    prob = {r["doc"]["key"]: r["prob"] for r in rows_of(evaluation, "tofu_forget_prob")}
    for r in rows:
        if r["doc"]["member"] == "forget":
            assert prob[r["doc"]["key"]] == pytest.approx(math.exp(-r["auc_loss"][2]), rel=1e-5)
    # exact memorization: the share of answer tokens but the end token that are the greedy prediction
    em = []
    for q, a in FORGET:
        ids = tok(a, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
        _, greedy = answer_logprobs(model, tok, chat(tok, q), ids)
        em.append(sum(g == t for g, t in zip(greedy[:-1], ids[:-1])) / (len(ids) - 1))
    em_rows = rows_of(evaluation, "tofu_forget_exact_memorization")
    assert [len(r["doc"]["em_offsets"]) for r in em_rows] == [len(tok(a)["input_ids"]) for _, a in FORGET]
    assert [r["exact_memorization"] for r in em_rows] == pytest.approx(em)
    assert 0 < sum(em) < len(em)  # some answers partly memorised, not all of them whole
    assert evaluation.summary["metrics"]["tofu_forget_exact_memorization"]["exact_memorization"] == pytest.approx(
        float(np.mean(em))
    )


def test_probes_ask_the_paraphrased_question_and_the_plain_few_shot_format(tiny, tiny_model_dir, splits):
    model, tok = tiny
    evaluation = run(
        tiny,
        tiny_model_dir,
        ["tofu_forget_paraphrase_prob", "tofu_forget_format_prob", "tofu_forget_format_rouge"],
        {"forget_split": splits["forget"], "probe_shot_split": splits["shots"], "probe_shots": 2},
        max_gen_toks=3,
    )
    eos = [tok.eos_token_id]
    for r, paraphrased, (_q, a) in zip(rows_of(evaluation, "tofu_forget_paraphrase_prob"), PARAPHRASED, FORGET):
        ids = tok(a, add_special_tokens=False)["input_ids"] + eos
        logps, _ = answer_logprobs(model, tok, chat(tok, paraphrased), ids)
        assert r["doc"]["prompt"] == chat(tok, paraphrased) and r["doc"]["answer"] == a
        assert r["prob"] == pytest.approx(math.exp(sum(logps) / len(logps)), rel=1e-5)
    shots = "".join(f"Question: {sq}\nAnswer: {sa}\n\n" for sq, sa in HOLDOUT[:2])
    for r, (q, a) in zip(rows_of(evaluation, "tofu_forget_format_prob"), FORGET):
        prompt = shots + f"Question: {q}\nAnswer:"
        assert r["doc"]["prompt"] == prompt and "<|im_start|>" not in prompt  # no chat template
        logps, _ = answer_logprobs(model, tok, prompt, tok(" " + a, add_special_tokens=False)["input_ids"])
        assert r["prob"] == pytest.approx(math.exp(sum(logps) / len(logps)), rel=1e-5)  # no end token
    rouge = rows_of(evaluation, "tofu_forget_format_rouge")
    assert len(rouge) == len(FORGET) and all(0 <= r["rougeL_recall"] <= 1 for r in rouge)


def test_holdout_must_not_overlap_the_forget_split(tiny_model_dir, splits, tmp_path):
    from unlearn_plugins.benchmarks.tofu.tasks.tofu_mia.utils import mia_documents

    both = write_split(tmp_path / "both.json", [HOLDOUT[0], FORGET[2]])
    with pytest.raises(DataError, match=r"both.json:2: this holdout sample is also in the forget split"):
        mia_documents(splits["forget"], str(both))


# ----------------------------------------------------------------------------- unlearn eval --mia


def cli(*argv) -> int:
    from unlearn_plugins.cli import main

    return main([str(a) for a in argv])


def results_of(folder):
    from unlearn_plugins.evaluation.lm_eval_runner import read_outputs

    return read_outputs(folder)


def test_eval_mia_privleak_is_zero_against_the_models_own_reference(tiny, tiny_model_dir, splits, tmp_path, capsys):
    """`unlearn eval --mia` on a model, saved as the MIA reference, then evaluated against it
    (the retain model against itself): privleak 0 for every attack, the reference attack at
    chance (every score difference 0); Min-K%++ and gradient-norm are mia.py's on the same samples."""
    from transformers import AutoModelForCausalLM

    from unlearn_plugins.data.qa import encode_qa
    from unlearn_plugins.evaluation import mia

    _, tok = tiny
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()  # the model the CLI evaluates
    args = [
        "eval",
        "--model",
        tiny_model_dir,
        "--device",
        "cpu",
        "--mia",
        "--forget-split",
        splits["forget"],
        "--holdout-split",
        splits["holdout"],
        "--batch-size",
        "4",
    ]
    ref = tmp_path / "mia_ref.json"
    assert cli(*args, "--save-mia-reference", ref, "--out", tmp_path / "retain") == 0
    saved = json.loads(ref.read_text())
    first = results_of(tmp_path / "retain")
    task_rows = [json.loads(line) for line in first.samples["tofu_mia"].read_text().splitlines()]
    by_key = {r["doc"]["key"]: r["auc_loss"][2] for r in task_rows}
    assert {s["key"]: s["loss"] for s in saved["samples"]} == pytest.approx(by_key)
    assert set(saved["auc"]) == {"loss", "zlib", "min_k", "min_k++", "gradnorm"}

    examples = [encode_qa(tok, q, a) for pair in zip(FORGET, HOLDOUT) for q, a in pair] + [encode_qa(tok, *FORGET[4])]
    members = ["forget", "holdout"] * 4 + ["forget"]
    direct = {
        "min_k++": mia.sample_statistics(model, examples, tok.pad_token_id, attacks=["min_k++"])["min_k++"],
        "gradnorm": mia.gradnorm_scores(model, examples, tok.pad_token_id),
    }
    for name, scores in direct.items():
        expected = mia.auc(
            [s for s, m in zip(scores, members) if m == "forget"],
            [s for s, m in zip(scores, members) if m == "holdout"],
        )
        assert first.summary["mia"]["attacks"][name]["auc"] == pytest.approx(expected)
        assert saved["auc"][name] == pytest.approx(expected)
    capsys.readouterr()

    assert cli(*args, "--mia-reference", ref, "--out", tmp_path / "again") == 0
    out = capsys.readouterr().out
    second = results_of(tmp_path / "again")
    metrics = second.results["results"]["tofu_mia"]
    assert metrics["privleak,none"] == 0.0 and metrics["auc_reference,none"] == 0.5
    attacks = second.summary["mia"]["attacks"]
    assert {name: e["privleak"] for name, e in attacks.items() if name != "reference"} == {
        "loss": 0.0,
        "zlib": 0.0,
        "min_k": 0.0,
        "min_k++": 0.0,
        "gradnorm": 0.0,
    }
    assert second.summary["mia"]["exact_memorization"] is not None
    assert "|MIA attack|" in out and "privleak (MUSE, Min-K%): 0.0000" in out


def test_eval_mia_input_errors_are_one_line(tiny_model_dir, splits, tmp_path, capsys):
    base = ["eval", "--model", tiny_model_dir, "--device", "cpu", "--out", tmp_path / "x"]
    assert cli(*base, "--mia", "--forget-split", splits["forget"]) == 1
    assert capsys.readouterr().err.strip() == (
        "error: unlearn eval --mia: --holdout-split required (QA the model "
        "never trained on, e.g. other TOFU authors: a TOFU split name or a "
        "JSON-lines file)"
    )
    assert (
        cli(
            *base,
            "--tasks",
            "tofu_forget_prob",
            "--forget-split",
            splits["forget"],
            "--mia-reference",
            tmp_path / "r.json",
        )
        == 1
    )
    assert "need the tofu_mia task: add --mia" in capsys.readouterr().err
    other = tmp_path / "other.json"
    from unlearn_plugins.evaluation.mia_reference import write_mia_reference

    write_mia_reference(
        other,
        forget_split="forget01",
        holdout_split="h",
        keys=["abc"],
        members=["forget"],
        losses=[1.0],
        aucs={"min_k": 0.5},
    )
    assert (
        cli(
            *base,
            "--mia",
            "--forget-split",
            splits["forget"],
            "--holdout-split",
            splits["holdout"],
            "--mia-reference",
            other,
        )
        == 1
    )
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "the MIA reference" in err[0] and "was made on forget 'forget01'" in err[0]
