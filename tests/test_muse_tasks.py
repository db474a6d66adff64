"""MUSE tasks (unlearn_plugins/benchmarks/muse/tasks/): metrics on hand-computed cases, and the
tasks run by lm-eval on a generated MUSE-shaped folder with the tiny model."""

from __future__ import annotations

import importlib.util
import json
import math
import os
from pathlib import Path

import pytest
import torch
from muse_fixture import write_muse_fixture
from support_checks import lm_eval

from unlearn_plugins.errors import DataError

ROOT = Path(__file__).resolve().parents[1]
#: MUSE's task folder, in its benchmark's home
TASKS = ROOT / "unlearn_plugins" / "benchmarks" / "muse" / "tasks"

pytestmark = pytest.mark.usefixtures("single_thread")


def _load_utils():
    spec = importlib.util.spec_from_file_location("muse_task_utils", TASKS / "utils.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


mu = _load_utils()


@pytest.fixture(scope="module")
def muse_dir(tmp_path_factory) -> Path:
    return write_muse_fixture(tmp_path_factory.mktemp("muse"))


# ----------------------------------------------------------------------------- metrics by hand


def test_verbmem_rouge_l_on_known_strings():
    # LCS of 6-word reference and 6-word generation: "the cat on the mat" (5 words)
    s = mu.rouge_l("the cat sat on the mat", "the cat lay on the mat")
    assert s["rougeL_f1"] == pytest.approx(5 / 6)
    assert s["rougeL_recall"] == pytest.approx(5 / 6)
    # reference 4 words, generation 2 words both in order: P = 1, R = 1/2, F1 = 2/3
    s = mu.rouge_l("alpha beta gamma delta", "alpha gamma")
    assert s["rougeL_recall"] == pytest.approx(0.5)
    assert s["rougeL_f1"] == pytest.approx(2 / 3)
    assert mu.rouge_l("alpha beta", "gamma")["rougeL_f1"] == 0.0


def test_rouge_is_unstemmed_as_the_reference():
    """metrics/logger.py (swj0419/muse_bench@fcd6651) scores with RougeScorer(use_stemmer=False):
    "cats"/"cat" and "running"/"runs" differ; only "the" and "dogs" are common (LCS 2 of 4)."""
    s = mu.rouge_l("the cats chase dogs", "the cat catches dogs")
    assert s["rougeL_f1"] == pytest.approx(0.5)
    # stemmed (metadata rouge_stemmer, open-unlearning's setting): cats -> cat, so LCS 3 of 4
    assert mu.rouge_l("the cats chase dogs", "the cat catches dogs", stemmer=True)["rougeL_f1"] == pytest.approx(0.75)


def test_verbmem_truth_is_cut_to_the_generation_length(tiny_tokenizer):
    """metrics/verbmem.py: tokenizer(gt, add_special_tokens=True).input_ids[:, :max_new_tokens],
    decoded without special tokens."""
    gt = " ".join(f"word{i}" for i in range(200))
    ids = list(tiny_tokenizer(gt, add_special_tokens=True).input_ids)
    assert len(ids) > 128
    cut = mu.verbmem_truth(tiny_tokenizer, ids, 128)
    assert cut == tiny_tokenizer.decode(ids[:128], skip_special_tokens=True)
    assert gt.startswith(cut) and len(cut) < len(gt)
    # a continuation shorter than the cut is kept whole
    assert mu.verbmem_truth(tiny_tokenizer, list(tiny_tokenizer("a b c").input_ids), 128) == "a b c"


def test_knowmem_answer_cut_as_the_reference():
    """metrics/knowmem.py get_prefix_before_words_occur(output, ["\\n\\n", "\\nQuestion", "Question:"])."""
    assert mu.knowmem_answer("By the river\n\nQuestion: next?") == "By the river"
    assert mu.knowmem_answer("By the river\nQuestion") == "By the river"
    assert mu.knowmem_answer("By the river Question: x") == "By the river "
    # a single newline does not end the answer (it did before: until ["\\n"])
    assert mu.knowmem_answer("line one\nline two") == "line one\nline two"


def test_privleak_scores_the_first_token_only_after_a_bos():
    """metrics/privleak.py scores tokenizer.encode(text)[1:]: with a BOS every text token."""

    class Tok:
        def __init__(self, bos):
            self.bos = bos

        def encode(self, text, add_special_tokens=True):
            ids = [ord(c) for c in text]
            return ([1] if self.bos and add_special_tokens else []) + ids

    ids = [ord(c) for c in "abc"]
    assert mu.scores_first_token(Tok(True), "abc", ids)
    assert not mu.scores_first_token(Tok(False), "abc", ids)


def test_privleak_auc_and_normalisation_on_fixed_scores():
    from unlearn_plugins.evaluation import mia

    forget, holdout = [1.0, 2.0, 3.0], [2.5, 4.0, 5.0]
    # pairs (holdout > forget): 2.5 beats 2 of 3, 4 and 5 beat all 3 -> 8 / 9 (forget 0, holdout 1)
    auc = mia.auc(forget, holdout)
    assert auc == pytest.approx(8 / 9)
    # MUSE's AUC is 1 - this: 1/9; retain model at MUSE AUC 0.5 -> (1/9 - 1/2) / (1/2) * 100
    assert mu.privleak_value(auc, 0.5) == pytest.approx((1 / 9 - 0.5) / 0.5 * 100)
    # retain model at MUSE AUC 0.25 (this project's 0.75), model at MUSE AUC 0.5 -> +100
    assert mu.privleak_value(0.5, 0.75) == pytest.approx(100.0, rel=1e-6)
    # the model equal to the retain model: 0
    assert mu.privleak_value(0.6, 0.6) == pytest.approx(0.0, abs=1e-6)


def test_retain_auc_sources(monkeypatch):
    monkeypatch.delenv(mu.RETAIN_AUC_ENV, raising=False)
    auc, source = mu.retain_auc("news", {})
    assert auc == pytest.approx(1 - 0.4772) and "AUC_RETRAIN" in source
    assert mu.retain_auc("books", {})[0] == pytest.approx(1 - 0.5393)
    monkeypatch.setenv(mu.RETAIN_AUC_ENV, "0.3")
    assert mu.retain_auc("news", {}) == (0.3, mu.RETAIN_AUC_ENV)
    assert mu.retain_auc("news", {"retain_auc": 0.7})[0] == 0.7
    with pytest.raises(DataError, match="retain_auc"):
        mu.retain_auc("news", {"retain_auc": 1.5})


def test_knowmem_prompt_format():
    prompt = mu.knowmem_prompt("Q3?", [("Q1?", "A1"), ("Q2?", "A2")])
    # metrics/knowmem.py: f"Question: {question}\\nAnswer: {answer}\\n\\n" per pair, then
    # f"Question: {question}\\nAnswer: " (trailing space)
    assert prompt == "Question: Q1?\nAnswer: A1\n\nQuestion: Q2?\nAnswer: A2\n\nQuestion: Q3?\nAnswer: "


def test_missing_data_names_download_and_place(monkeypatch, tmp_path):
    monkeypatch.delenv(mu.ENV, raising=False)
    with pytest.raises(DataError, match=r"muse-bench/MUSE-News.*UNLEARN_MUSE_DIR"):
        mu.corpus_dir("news")
    with pytest.raises(DataError, match=r"muse-bench/MUSE-Books"):
        mu.corpus_dir("books", tmp_path)


# ----------------------------------------------------------------------------- tasks on the tiny model


def _run(model, tok, tasks, muse_dir, limit, **metadata):
    from lm_eval.models.huggingface import HFLM

    from unlearn_plugins.evaluation.lm_eval_runner import evaluate

    lm = HFLM(pretrained=model, tokenizer=tok, batch_size=4)
    meta = {"tokenizer": tok, "muse_dir": str(muse_dir), **metadata}
    return evaluate(lm, tasks, metadata=meta, limit=limit, bootstrap_iters=0)


def test_privleak_task_equals_direct_min_k(tiny_model, tiny_tokenizer, muse_dir):
    """Min-40% from lm-eval's requests equals a direct forward on the passage's tokens."""
    from unlearn_plugins.evaluation import mia

    ev = _run(tiny_model, tiny_tokenizer, ["muse_news_privleak"], muse_dir, 4, retain_auc=0.5)
    rows = sorted(ev.samples["muse_news_privleak"], key=lambda s: s["doc_id"])
    assert [r["doc"]["member"] for r in rows] == ["forget", "holdout", "forget", "holdout"]
    forget, holdout = [], []
    for r in rows:
        ids = tiny_tokenizer.encode(r["doc"]["text"], add_special_tokens=False)
        with torch.no_grad():
            logits = tiny_model(torch.tensor([ids])).logits[0, :-1].float()
        logp = torch.log_softmax(logits, -1)[torch.arange(len(ids) - 1), torch.tensor(ids[1:])].tolist()
        direct = mia.min_k_score(logp, 0.4)
        assert r["auc_min_k"][1] == pytest.approx(direct, abs=1e-4)
        (forget if r["doc"]["member"] == "forget" else holdout).append(direct)
    metrics = ev.results["results"]["muse_news_privleak"]
    auc = mia.auc(forget, holdout)
    assert metrics["auc_min_k,none"] == pytest.approx(auc)
    assert metrics["privleak,none"] == pytest.approx(((1 - auc) - 0.5) / 0.5 * 100)


def test_privleak_with_a_bos_tokenizer_scores_every_text_token(tiny_model, muse_dir):
    """A tokenizer that adds a BOS (Llama's, MUSE's model): metrics/privleak.py scores every text
    token after the BOS (``tokenizer.encode(text)[1:]``), the first one included."""
    from tokenizers import processors

    from unlearn_plugins.evaluation import mia
    from unlearn_plugins.testing import tiny_tokenizer as make_tokenizer

    tiny_tokenizer = make_tokenizer()  # its own: the session's tokenizer is shared
    bos = tiny_tokenizer.bos_token_id
    tiny_tokenizer._tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{tiny_tokenizer.bos_token} $A", special_tokens=[(tiny_tokenizer.bos_token, bos)]
    )
    assert tiny_tokenizer.encode("river stone")[0] == bos
    ev = _run(tiny_model, tiny_tokenizer, ["muse_news_privleak"], muse_dir, 2, retain_auc=0.5)
    rows = sorted(ev.samples["muse_news_privleak"], key=lambda s: s["doc_id"])
    assert len(rows) == 2 and all(r["doc"]["score_first"] for r in rows)
    for r in rows:
        ids = tiny_tokenizer.encode(r["doc"]["text"])  # [BOS, t1, ..., tn]
        with torch.no_grad():
            logits = tiny_model(torch.tensor([ids])).logits[0, :-1].float()
        logp = torch.log_softmax(logits, -1)[torch.arange(len(ids) - 1), torch.tensor(ids[1:])].tolist()
        assert len(logp) == len(tiny_tokenizer.encode(r["doc"]["text"], add_special_tokens=False))
        assert r["auc_min_k"][1] == pytest.approx(mia.min_k_score(logp, 0.4), abs=1e-4)


def test_knowmem_task_scores_its_generations(tiny_model, tiny_tokenizer, muse_dir):
    ev = _run(tiny_model, tiny_tokenizer, ["muse_news_knowmem_retain"], muse_dir, 2)
    rows = ev.samples["muse_news_knowmem_retain"]
    assert len(rows) == 2
    for r in rows:
        assert r["doc"]["prompt"].startswith("Question: ") and r["doc"]["prompt"].endswith("\nAnswer: ")
        out = mu.knowmem_answer(r["filtered_resps"][0])
        assert r["rougeL_f1"] == pytest.approx(mu.rouge_l(r["doc"]["answer"], out)["rougeL_f1"])


def test_lm_eval_cli_runs_muse_news_verbmem(tiny_model_dir, muse_dir, tmp_path):
    out = tmp_path / "out"
    flags = ["--limit", 2, "--device", "cpu", "--batch_size", 2, "--gen_kwargs", "max_gen_toks=16", "--log_samples"]
    env = {mu.ENV: str(muse_dir)}
    proc = lm_eval(f"pretrained={tiny_model_dir}", "muse_news_verbmem", TASKS, *flags, "--output_path", out, **env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    samples = [json.loads(line) for f in out.rglob("samples_muse_news_verbmem_*.jsonl") for line in f.open()]
    assert len(samples) == 2
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    for s in samples:
        truth = mu.verbmem_truth(tok, s["doc"]["gt_ids"], 16)  # --gen_kwargs max_gen_toks=16 cuts the truth too
        assert s["rougeL_f1"] == pytest.approx(mu.rouge_l(truth, s["filtered_resps"][0])["rougeL_f1"])
    results = json.loads(next(out.rglob("results_*.json")).read_text())["results"]["muse_news_verbmem"]
    assert math.isfinite(results["rougeL_f1,none"])


def test_lm_eval_cli_missing_folder_is_one_line(tiny_model_dir, tmp_path):
    env = {k: v for k, v in os.environ.items() if k != mu.ENV}
    proc = lm_eval(f"pretrained={tiny_model_dir}", "muse_news_verbmem", TASKS, "--limit", 1, "--device", "cpu", env=env)
    assert proc.returncode != 0
    assert "muse-bench/MUSE-News" in proc.stderr and "UNLEARN_MUSE_DIR" in proc.stderr


def _unlearn_eval(capsys, model_dir, out, *extra) -> tuple[int, str, str]:
    """`unlearn eval --tasks muse_news` in this process (no interpreter start per run)."""
    from unlearn_plugins.cli import main

    args = ["eval", "--model", model_dir, "--tasks", "muse_news", "--limit", "8", "--max-gen-toks", "8"]
    code = main([str(a) for a in [*args, "--out", out, *extra]])
    got = capsys.readouterr()
    return code, got.out, got.err


def test_unlearn_eval_six_way_table_with_the_retrained_reference(tiny_model_dir, tmp_path, monkeypatch, capsys):
    """The retain model's evaluation saves its MUSE metrics (--save-reference); the next
    evaluation reads them (--retain-reference): PrivLeak's retain AUC and the table's Retrained
    column. The same model on both sides: PrivLeak 0 and each row equal to its reference.
    8 privleak passages (4 forget, 4 holdout): the retain AUC must lie strictly inside (0, 1)."""
    monkeypatch.setenv(mu.ENV, str(write_muse_fixture(tmp_path / "muse", corpora=("news",), n=4)))
    monkeypatch.setenv(mu.RETAIN_AUC_ENV, "0.4")
    ref = tmp_path / "retain_ref.json"
    code, out, err = _unlearn_eval(capsys, tiny_model_dir, tmp_path / "retain", "--save-reference", ref)
    assert code == 0, err[-3000:]
    first = json.loads(next((tmp_path / "retain").rglob("results_*.json")).read_text())["results"]
    priv = first["muse_news_privleak"]  # no reference yet: the environment's AUC
    assert priv["privleak,none"] == pytest.approx(((1 - priv["auc_min_k,none"]) - 0.6) / 0.6 * 100)
    assert "no retain reference" in out  # the table without its Retrained column's values
    saved = json.loads(ref.read_text())
    assert saved["format"] == "unlearn-plugins/retain-metrics-reference" and saved["limit"] == 8
    values = {s["key"]: s["value"] for s in saved["samples"]}
    assert values["muse_news_privleak/auc_min_k"] == pytest.approx(priv["auc_min_k,none"])
    for task in ("verbmem", "knowmem_forget", "knowmem_retain"):
        assert 0.0 <= first[f"muse_news_{task}"]["rougeL_f1,none"] <= 1.0
        assert values[f"muse_news_{task}/rougeL_f1"] == pytest.approx(first[f"muse_news_{task}"]["rougeL_f1,none"])

    code, out, err = _unlearn_eval(capsys, tiny_model_dir, tmp_path / "eval", "--retain-reference", ref)
    assert code == 0, err[-3000:]
    second = json.loads(next((tmp_path / "eval").rglob("results_*.json")).read_text())
    assert second["results"]["muse_news_privleak"]["privleak,none"] == pytest.approx(0.0, abs=1e-6)
    rows = {r["row"]: r for r in second["unlearn_summary"]["retain_table"]}
    assert list(rows) == ["VerbMem on forget", "KnowMem on forget", "KnowMem on retain", "PrivLeak"]
    for r in rows.values():
        assert r["retrained"] == pytest.approx(r["value"], abs=1e-6)
    table = out[out.index("MUSE news") :]
    assert "|VerbMem on forget" in table and "|PrivLeak" in table and "Retrained" in table
    assert "no retain reference" not in out
    # another --limit: refused before the model loads, in one line naming the file
    code, out, err = _unlearn_eval(capsys, tiny_model_dir, tmp_path / "eval3", "--retain-reference", ref, "--limit", 3)
    lines = err.strip().splitlines()
    assert code != 0 and len(lines) == 1 and lines[0].startswith("error: ")
    assert "--limit" in lines[0] and str(ref) in lines[0]


def test_retain_table_rows_and_text():
    from unlearn_plugins.evaluation import metrics_reference as mr

    rows = [
        {"table": "MUSE news", "row": "VerbMem on forget", "task": "muse_news_verbmem", "metric": "rougeL_f1"}
        | {"scale": 100.0, "value": 0.25, "retrained": 0.125, "saves": {}, "reference": "r.json"},
        {"table": "MUSE news", "row": "PrivLeak", "task": "muse_news_privleak", "metric": "privleak"}
        | {"scale": 1.0, "value": -42.0, "retrained": 0.0, "saves": {}, "reference": "by definition"},
    ]
    text = mr.retain_tables(rows)
    cells = {line.split("|")[1].strip(): line.split("|")[3:5] for line in text.splitlines()[2:]}
    assert [float(v) for v in cells["VerbMem on forget"]] == [25.0, 12.5]  # x 100 (scale)
    assert [float(v) for v in cells["PrivLeak"]] == [-42.0, 0.0]
    assert "note" not in text
    rows[0]["retrained"] = None
    assert "no retain reference" in mr.retain_tables(rows)


def test_metrics_reference_round_trip_and_bad_files(tmp_path):
    from unlearn_plugins.evaluation import metrics_reference as mr

    path = tmp_path / "ref.json"
    rows = [{"task": "muse_news_privleak", "saves": {"auc_min_k": 0.625}}]
    assert mr.write_metrics_reference(path, rows, limit=2) == ["muse_news_privleak"]
    ref = mr.read_metrics_reference(path)
    assert ref.values == {"muse_news_privleak": {"auc_min_k": 0.625}} and ref.limit == 2
    assert mr.reference_value([str(path)], "muse_news_privleak", "auc_min_k") == (0.625, str(path))
    assert mu.retain_auc("news", {"retain_reference": [str(path)]}, "muse_news_privleak")[0] == 0.625
    data = json.loads(path.read_text())
    data["samples"][0]["value"] = "x"
    path.write_text(json.dumps(data))
    with pytest.raises(DataError, match=r"samples\[0\]: field 'value'"):
        mr.read_metrics_reference(path)
