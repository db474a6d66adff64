"""The lm-eval tasks (TOFU, mmlu_local, wmdp_local) and `unlearn eval`.

TOFU numbers are checked against an independent computation written here with plain
PyTorch: the chat prompt from the tokenizer, answer tokens + end token, one forward per
sequence, no batching, no lm-eval.
"""

from __future__ import annotations

import glob
import json
import math
import sys
from pathlib import Path

import pytest
import torch
from scipy.stats import ks_2samp
from support_checks import lm_eval

from unlearn_plugins.benchmarks.tofu import metrics as tm
from unlearn_plugins.errors import DataError, UnlearnError

ROOT = Path(__file__).resolve().parents[1]
#: the TOFU benchmark's task folder (task folder ``tofu``: `unlearn eval --print-tasks-dir tofu`)
TOFU_TASKS = ROOT / "unlearn_plugins" / "benchmarks" / "tofu" / "tasks"
#: the WMDP benchmark's task folder (``wmdp_local/`` and the synthetic stand-in's tasks)
WMDP_TASKS = ROOT / "unlearn_plugins" / "benchmarks" / "wmdp" / "tasks"
FIXTURES = Path(__file__).resolve().parent / "fixtures"
TOL = 1e-4


# ----------------------------------------------------------------------------- helpers


pytestmark = pytest.mark.usefixtures("single_thread")


def direct_scores(model, tok, question: str, answer: str):
    """(mean answer NLL, teacher-forced greedy predictions, labels) by a direct forward."""
    prompt = tok.apply_chat_template(
        [{"role": "user", "content": question}], tokenize=False, add_generation_prompt=True
    )
    p = tok(prompt, add_special_tokens=False)["input_ids"]
    a = tok(answer, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    device = next(model.parameters()).device
    with torch.no_grad():
        logits = model(torch.tensor([p + a], device=device)).logits[0, len(p) - 1 : -1].float()
    logp = torch.log_softmax(logits, dim=-1)
    nll = -logp[torch.arange(len(a)), torch.tensor(a, device=device)]
    return nll.mean().item(), logits.argmax(-1).tolist(), a


def direct_truth_ratio(model, tok, rec) -> float:
    correct = direct_scores(model, tok, rec["question"], rec["paraphrased_answer"])[0]
    wrong = [direct_scores(model, tok, rec["question"], x)[0] for x in rec["perturbed_answer"]]
    return math.exp(-sum(wrong) / len(wrong)) / math.exp(-correct)


def read_records(path: Path, n: int) -> list[dict]:
    with path.open() as handle:
        return [json.loads(line) for _, line in zip(range(n), handle)]


def run_tasks(model, model_dir, tasks, *, limit, tofu_dir, batch_size=4, **kwargs):
    from lm_eval.models.huggingface import HFLM
    from transformers import AutoTokenizer

    from unlearn_plugins.evaluation.lm_eval_runner import evaluate

    tok = AutoTokenizer.from_pretrained(model_dir)
    lm = HFLM(pretrained=model, tokenizer=tok, batch_size=batch_size)
    meta = {"tokenizer": str(model_dir), "tofu_dir": str(tofu_dir), **kwargs.pop("metadata", {})}
    return evaluate(lm, tasks, metadata=meta, limit=limit, bootstrap_iters=0, **kwargs)


def per_sample(evaluation, task, metric):
    rows = sorted(evaluation.samples[task], key=lambda s: s["doc_id"])
    return [r[metric] for r in rows]


@pytest.fixture(scope="module")
def tiny(tiny_model_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    model.eval()
    return model, AutoTokenizer.from_pretrained(tiny_model_dir)


def cli(*argv) -> int:
    from unlearn_plugins.cli import main

    return main([str(a) for a in argv])


# ----------------------------------------------------------------------------- task folder


def test_every_yaml_loads_and_resolves():
    """lm-eval skips YAMLs it cannot parse without a word: each file must be in the index and
    its !function references must import."""
    from lm_eval.tasks import TaskManager
    from lm_eval.tasks._yaml_loader import load_yaml

    from unlearn_plugins.evaluation.lm_eval_runner import task_dirs
    from unlearn_plugins.host import package_file

    assert package_file("tasks").resolve() in [d.resolve() for d in task_dirs()]
    manager = TaskManager(include_path=[str(d) for d in task_dirs()], include_defaults=False)
    index = manager.task_index
    assert TOFU_TASKS.resolve() in [d.resolve() for d in task_dirs()]
    assert WMDP_TASKS.resolve() in [d.resolve() for d in task_dirs()]
    files = sorted((ROOT / "tasks").rglob("*.yaml")) + sorted(TOFU_TASKS.rglob("*.yaml"))
    files += sorted(WMDP_TASKS.rglob("*.yaml"))  # a task in two folders fails the yaml_path check below
    assert len(files) >= 23 + 62 + 4  # tofu, mmlu_local (57 subjects + 5 groups), wmdp_local
    for path in files:
        cfg = load_yaml(path, resolve_func=True)  # imports every !function / class
        name = cfg.get("task") if not isinstance(cfg.get("task"), list) else cfg["group"]
        assert name in index, f"{path} is not in lm-eval's task index"
        assert Path(index[name].yaml_path).resolve() == path.resolve()
    for name in [
        "tofu_forget01_prob",
        "tofu_forget05_truth_ratio",
        "tofu_forget10_rouge",
        "tofu_forget_extraction_strength",
        "tofu_retain_prob",
        "tofu_real_authors",
        "tofu_world_facts_rouge",
        "tofu_forget01",
        "tofu_forget01_nogen",
        "tofu_model_utility",
        "mmlu_local",
        "mmlu_local_anatomy",
        "wmdp_local",
        "wmdp_local_bio",
    ]:
        assert name in manager.all_tasks, name
    assert sum(t.startswith("mmlu_local_") and t.count("_") >= 2 for t in manager.all_subtasks) == 57


@pytest.mark.parametrize("folder, prefix", [("tofu", "tofu_"), ("mmlu_local", "mmlu_local")])
def test_task_files_are_their_generators_output(folder, prefix):
    """<folder>/_generate_configs.py writes every task file of the folder; the files in the
    repository are exactly its output (edit the generator, then run it)."""
    import importlib.util

    where = {"tofu": TOFU_TASKS / "tofu", "mmlu_local": ROOT / "tasks" / "mmlu_local"}[folder]
    script = where / "_generate_configs.py"
    spec = importlib.util.spec_from_file_location(f"_generate_{folder}", script)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    generated = module.configs()
    on_disk = {p.name for p in where.iterdir() if p.name.endswith(("yaml", "_yaml"))}
    expected_on_disk = {n for n in on_disk if n.removeprefix("_").startswith(prefix)}
    assert set(generated) == expected_on_disk, f"run python {script.relative_to(ROOT)}"
    for name, text in generated.items():
        assert (where / name).read_text() == text, f"{name}: run python {script.relative_to(ROOT)}"
    if folder == "tofu":
        assert len(generated) == 24  # the template and 23 tasks


def test_print_tasks_dir(capsys):
    assert cli("eval", "--print-tasks-dir") == 0
    assert str((ROOT / "tasks").resolve()) in capsys.readouterr().out
    assert cli("eval", "--print-tasks-dir", "tofu") == 0
    assert capsys.readouterr().out.strip() == str(TOFU_TASKS.resolve())
    assert cli("eval", "--print-tasks-dir", "movielens") == 0
    printed = Path(capsys.readouterr().out.strip())
    assert (printed / "movielens_rec.yaml").is_file()
    assert cli("eval", "--print-tasks-dir", "nope") != 0
    err = capsys.readouterr().err
    assert "--print-tasks-dir nope: no such task folder" in err and "movielens" in err


# ----------------------------------------------------------------------------- TOFU vs direct


def test_tofu_metrics_match_direct_pytorch_tiny(tiny, tiny_model_dir, tofu_dir, tmp_path):
    from unlearn_plugins.evaluation.reference import sample_key, write_reference
    from unlearn_plugins.testing import tiny_llama

    model, tok = tiny
    n = 4
    forget = read_records(tofu_dir / "forget01.json", n)
    pert = read_records(tofu_dir / "forget01_perturbed.json", n)
    real = read_records(tofu_dir / "real_authors_perturbed.json", n)

    # the "retain model": another tiny model; its truth ratios computed directly
    retain = tiny_llama(len(tok), seed=1)
    retain_tr = [direct_truth_ratio(retain, tok, r) for r in pert]
    ref = tmp_path / "ref.json"
    write_reference(
        ref,
        task="tofu_forget01_truth_ratio",
        split="forget01_perturbed",
        keys=[sample_key(r["question"], r["answer"]) for r in pert],
        truth_ratios=retain_tr,
    )

    ev = run_tasks(
        model,
        tiny_model_dir,
        ["tofu_forget01_prob", "tofu_forget01_truth_ratio", "tofu_real_authors"],
        limit=n,
        tofu_dir=tofu_dir,
        retain_references=[ref],
    )

    nll = [direct_scores(model, tok, r["question"], r["answer"])[0] for r in forget]
    got_prob = per_sample(ev, "tofu_forget01_prob", "prob")
    assert max(abs(g - math.exp(-x)) for g, x in zip(got_prob, nll)) < TOL
    assert max(abs(math.log(g) + x) for g, x in zip(got_prob, nll)) < TOL  # mean NLL itself

    tr = [direct_truth_ratio(model, tok, r) for r in pert]
    got_tr = per_sample(ev, "tofu_forget01_truth_ratio", "truth_ratio")
    assert max(abs(g - d) for g, d in zip(got_tr, tr)) < TOL
    metrics = ev.summary["metrics"]
    assert abs(metrics["tofu_forget01_truth_ratio"]["truth_ratio"] - tm.forget_truth_ratio(tr)) < TOL
    assert abs(metrics["tofu_forget01_prob"]["prob"] - sum(math.exp(-x) for x in nll) / n) < TOL
    # forget quality: the same KS p-value as scipy on the direct truth ratios
    assert ev.summary["forget_quality"]["tofu_forget01_truth_ratio"]["value"] == ks_2samp(tr, retain_tr).pvalue

    for r, p_opt, tr_ra in zip(
        real, per_sample(ev, "tofu_real_authors", "prob"), per_sample(ev, "tofu_real_authors", "truth_ratio")
    ):
        c = direct_scores(model, tok, r["question"], r["answer"])[0]
        w = [direct_scores(model, tok, r["question"], x)[0] for x in r["perturbed_answer"]]
        p = [math.exp(-c)] + [math.exp(-x) for x in w]
        assert abs(p_opt - p[0] / sum(p)) < TOL
        assert abs(tr_ra - math.exp(-sum(w) / len(w)) / math.exp(-c)) < TOL


def test_extraction_strength_matches_direct_on_a_memorised_sample(tiny_model_dir, tofu_dir, tmp_path, monkeypatch):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from unlearn_plugins.data.qa import encode_qa

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    recs = read_records(tofu_dir / "forget01.json", 2)
    enc = encode_qa(tok, recs[0]["question"], recs[0]["answer"])
    ids, labels = torch.tensor([enc["input_ids"]]), torch.tensor([enc["labels"]])
    torch.manual_seed(0)
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    model.train()
    for step in range(400):  # memorise sample 0 until every greedy prediction is right
        loss = model(input_ids=ids, labels=labels).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % 20 == 19:
            model.eval()
            _, preds, a = direct_scores(model, tok, recs[0]["question"], recs[0]["answer"])
            model.train()
            if preds == a:
                break
    model.eval()

    def extraction(model):
        ev = run_tasks(model, tiny_model_dir, ["tofu_forget01_extraction_strength"], limit=2, tofu_dir=tofu_dir)
        got = per_sample(ev, "tofu_forget01_extraction_strength", "extraction_strength")
        return got, sorted(ev.samples["tofu_forget01_extraction_strength"], key=lambda s: s["doc_id"])

    got, docs = extraction(model)
    assert got[0] == 1.0  # fully extractable
    for rec, value, row in zip(recs, got, docs):
        _, preds, labels_ = direct_scores(model, tok, rec["question"], rec["answer"])
        # open-unlearning's extraction strength ignores the end token's prediction
        k = tm.first_matching_suffix(preds[:-1], labels_[:-1])
        n = len(labels_) - 1
        assert row["doc"]["es_n_tokens"] == n
        # positions the tokenizer cannot isolate round k up to the next isolated one
        isolated = {0, n} | {s for s in row["doc"]["es_starts"] if s > 0}
        assert value == pytest.approx(1 - min(s for s in isolated if s >= k) / n)

    # the answer reproduced exactly, its end token never the greedy choice: 1.0 as in
    # open-unlearning (the end-token-inclusive version scored it 0.0), in the task and in the
    # study's direct computation (cells.extraction_strengths)
    eos = tok.eos_token_id

    def no_end_token(_module, _args, logits):
        logits[..., eos] = -1e4
        return logits

    model.get_output_embeddings().register_forward_hook(no_end_token)
    _, preds, labels_ = direct_scores(model, tok, recs[0]["question"], recs[0]["answer"])
    assert preds[:-1] == labels_[:-1] and preds[-1] != labels_[-1] == eos
    got, _ = extraction(model)
    assert got[0] == 1.0

    import unlearn_plugins.models as models
    from unlearn_plugins.benchmarks.tofu.study.cells import extraction_strengths

    data = tmp_path / "forget.json"
    data.write_text(json.dumps(recs[0]) + "\n")
    monkeypatch.setattr(models, "load_model", lambda *a, **k: (model, tok))
    assert extraction_strengths(str(tiny_model_dir), None, str(data), 256, None) == [1.0]


def test_rouge_matches_direct_greedy_generation(tiny, tiny_model_dir, tofu_dir):
    model, tok = tiny
    recs = read_records(tofu_dir / "forget01.json", 2)
    ev = run_tasks(model, tiny_model_dir, ["tofu_forget01_rouge"], limit=2, tofu_dir=tofu_dir, batch_size=1)
    rows = sorted(ev.samples["tofu_forget01_rouge"], key=lambda s: s["doc_id"])
    for rec, row in zip(recs, rows):
        prompt = tok.apply_chat_template(
            [{"role": "user", "content": rec["question"]}], tokenize=False, add_generation_prompt=True
        )
        ids = tok(prompt, add_special_tokens=False, return_tensors="pt")["input_ids"]
        with torch.no_grad():
            out = model.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                max_new_tokens=200,
                do_sample=False,
                eos_token_id=tok.eos_token_id,
                pad_token_id=tok.pad_token_id,
            )
        text = tok.decode(out[0, ids.shape[1] :], skip_special_tokens=True)
        assert row["filtered_resps"][0].strip() == text.strip()
        assert row["rougeL_recall"] == tm.rouge_recall(text.strip(), rec["answer"])["rougeL_recall"]


def test_max_gen_toks_caps_the_rouge_generations(tiny, tiny_model_dir, tofu_dir):
    model, tok = tiny
    capped = run_tasks(
        model, tiny_model_dir, ["tofu_forget01_rouge"], limit=2, tofu_dir=tofu_dir, batch_size=1, max_gen_toks=5
    )
    full = run_tasks(model, tiny_model_dir, ["tofu_forget01_rouge"], limit=2, tofu_dir=tofu_dir, batch_size=1)
    for short, long in zip(
        *(sorted(e.samples["tofu_forget01_rouge"], key=lambda s: s["doc_id"]) for e in (capped, full))
    ):
        short_text, long_text = short["filtered_resps"][0], long["filtered_resps"][0]
        # greedy decoding: the capped generation is the start of the uncapped one (the random
        # tiny model rambles on without the cap)
        assert long_text.startswith(short_text) and len(short_text) < len(long_text)
        assert len(tok(short_text, add_special_tokens=False)["input_ids"]) <= 6  # 5 tokens, re-tokenised


@pytest.mark.slow
def test_tofu_metrics_match_direct_pytorch_embedded(embedded_model_dir, tofu_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(embedded_model_dir)
    model.eval()
    tok = AutoTokenizer.from_pretrained(embedded_model_dir)
    n = 3
    ev = run_tasks(
        model, embedded_model_dir, ["tofu_forget01_prob", "tofu_forget01_truth_ratio"], limit=n, tofu_dir=tofu_dir
    )
    forget = read_records(tofu_dir / "forget01.json", n)
    pert = read_records(tofu_dir / "forget01_perturbed.json", n)
    probs = [math.exp(-direct_scores(model, tok, r["question"], r["answer"])[0]) for r in forget]
    trs = [direct_truth_ratio(model, tok, r) for r in pert]
    assert max(abs(a - b) for a, b in zip(per_sample(ev, "tofu_forget01_prob", "prob"), probs)) < TOL
    assert max(abs(a - b) for a, b in zip(per_sample(ev, "tofu_forget01_truth_ratio", "truth_ratio"), trs)) < TOL


# ----------------------------------------------------------------------------- unlearn eval


def test_unlearn_eval_reference_round_trip_and_refusals(tiny_model_dir, tofu_dir, tmp_path, capsys):
    from unlearn_plugins.evaluation.lm_eval_runner import read_outputs

    ref = tmp_path / "ref.json"
    common = ["--model", tiny_model_dir, "--tofu-dir", tofu_dir, "--limit", 3, "--batch-size", 4]
    save = ["--tasks", "tofu_forget01_truth_ratio", "--save-reference", ref]
    assert cli("eval", *common, *save, "--out", tmp_path / "retain") == 0
    saved = json.loads(ref.read_text())
    assert saved["split"] == "forget01_perturbed" and len(saved["samples"]) == 3
    no_ref = read_outputs(tmp_path / "retain").summary
    entry = no_ref["forget_quality"]["tofu_forget01_truth_ratio"]
    assert entry["value"] is None and "--save-reference" in entry["note"]
    capsys.readouterr()

    out = tmp_path / "run"
    assert (
        cli(
            "eval",
            *common,
            "--tasks",
            "tofu_forget01_prob,tofu_forget01_truth_ratio",
            "--retain-reference",
            ref,
            "--out",
            out,
        )
        == 0
    )
    table = capsys.readouterr().out
    assert "Forget Quality" in table and "Model Utility" in table and "9 parts missing" in table
    written = read_outputs(out)
    assert "tofu_forget01_prob" in written.results["results"]  # lm-eval's own results
    # same model as the reference: identical truth ratios -> p-value 1
    assert written.summary["forget_quality"]["tofu_forget01_truth_ratio"]["value"] == 1.0
    rows = [json.loads(x) for x in written.samples["tofu_forget01_truth_ratio"].read_text().splitlines()]
    assert [r["forget_quality"][1] for r in sorted(rows, key=lambda r: r["doc_id"])] == pytest.approx(
        [s["truth_ratio"] for s in saved["samples"]], abs=1e-6
    )

    # another split: refused before the model is loaded
    assert (
        cli("eval", *common, "--tasks", "tofu_forget05_truth_ratio", "--retain-reference", ref, "--out", tmp_path / "x")
        == 1
    )
    err = capsys.readouterr().err
    assert "forget05_perturbed" in err and "forget01_perturbed" in err and "--save-reference" in err
    # another size
    assert (
        cli(
            "eval",
            "--model",
            tiny_model_dir,
            "--tofu-dir",
            tofu_dir,
            "--limit",
            2,
            "--tasks",
            "tofu_forget01_truth_ratio",
            "--retain-reference",
            ref,
            "--out",
            tmp_path / "y",
        )
        == 1
    )
    assert "has 3 samples but tofu_forget01_truth_ratio will evaluate 2" in capsys.readouterr().err


def test_unlearn_eval_writes_and_prints_like_lm_eval(tiny_model_dir, tofu_dir, tmp_path, capsys):
    """lm_eval's flag spellings; its EvaluationTracker's layout, read back with lm-eval's own
    loaders (the file-name helpers and the datasets JSON reader its hub upload uses); its
    make_table, then our Forget Quality / Model Utility rows."""
    import datasets
    from lm_eval.utils import (
        get_file_task_name,
        get_latest_filename,
        get_results_filenames,
        get_sample_results_filenames,
        make_table,
        sanitize_model_name,
    )

    from unlearn_plugins.evaluation.lm_eval_runner import SUMMARY_KEY

    out, cache = tmp_path / "out", tmp_path / "cache" / "responses"
    args = [
        "eval",
        "--model",
        "hf",
        "--model_args",
        f"pretrained={tiny_model_dir}",
        "--batch_size",
        2,
        "--num_fewshot",
        0,
        "--output_path",
        out,
        "--use_cache",
        cache,
        "--tofu-dir",
        tofu_dir,
        "--tasks",
        "tofu_forget01_prob,tofu_forget01_truth_ratio",
        "--limit",
        2,
    ]
    assert cli(*args) == 0
    printed = capsys.readouterr().out
    files = [str(p) for p in out.rglob("*") if p.is_file()]
    results_file = get_latest_filename(get_results_filenames(files))
    # lm-eval's folder for the model: its sanitize_model_name of pretrained=
    assert Path(results_file).parent == out / sanitize_model_name(str(tiny_model_dir))
    assert Path(results_file).name.startswith("results_")
    samples = {get_file_task_name(Path(f).name): f for f in get_sample_results_filenames(files)}
    assert sorted(samples) == ["tofu_forget01_prob", "tofu_forget01_truth_ratio"]
    assert all(Path(f).name.endswith(Path(results_file).name.removeprefix("results_") + "l") for f in samples.values())

    results = datasets.load_dataset("json", data_files=results_file, split="train")[0]
    prob = results["results"]["tofu_forget01_prob"]["prob,none"]
    assert 0 < prob < 1 and results["config"]["model_args"] == {"pretrained": str(tiny_model_dir)}
    assert results["model_name"] == str(tiny_model_dir) and results["task_hashes"]["tofu_forget01_prob"]
    summary = results[SUMMARY_KEY]
    assert summary["metrics"]["tofu_forget01_prob"]["prob"] == prob and summary["batch_size"] == 2
    rows = datasets.load_dataset("json", data_files=samples["tofu_forget01_prob"], split="train")
    assert sorted(rows["doc_id"]) == [0, 1] and sum(rows["prob"]) / 2 == pytest.approx(prob)

    loaded = json.loads(Path(results_file).read_text())
    assert make_table(loaded) in printed  # lm-eval's table, as lm_eval prints it
    tofu = printed[printed.index(make_table(loaded)) + len(make_table(loaded)) :]
    assert "|Forget Quality|tofu_forget01_truth_ratio|unavailable" in tofu and "|Model Utility " in tofu

    # --use_cache: lm-eval's SQLite cache of the responses; a rerun answers from it, same numbers
    (db,) = cache.parent.glob(f"{cache.name}-*_rank0.db")  # keyed by the model's weights
    assert db.stat().st_size > 0
    assert cli(*args) == 0
    capsys.readouterr()
    again = get_latest_filename(get_results_filenames([str(p) for p in out.rglob("results_*.json")]))
    assert again != results_file  # lm-eval's habit: one dated file per run
    assert json.loads(Path(again).read_text())["results"]["tofu_forget01_prob"]["prob,none"] == prob
    assert list(cache.parent.glob(f"{cache.name}-*_rank0.db")) == [db]

    # another model with the same --use_cache gets its own numbers, not the first model's
    # (lm-eval's cache keys requests only: it used to answer with model A's values, exit 0)
    from unlearn_plugins.testing import save_tiny_model

    other = tmp_path / "other-model"
    save_tiny_model(other, seed=7)
    other_args = [f"pretrained={other}" if a == f"pretrained={tiny_model_dir}" else a for a in map(str, args)]
    other_args[other_args.index("--output_path") + 1] = str(tmp_path / "out-other")
    assert cli(*other_args) == 0
    capsys.readouterr()
    fresh = [*other_args]
    fresh[fresh.index("--use_cache") : fresh.index("--use_cache") + 2] = []
    fresh[fresh.index("--output_path") + 1] = str(tmp_path / "out-fresh")
    assert cli(*fresh) == 0
    capsys.readouterr()

    def value(folder):
        (path,) = (tmp_path / folder).rglob("results_*.json")
        return json.loads(path.read_text())["results"]["tofu_forget01_prob"]["prob,none"]

    assert value("out-other") == value("out-fresh") != prob
    assert len(list(cache.parent.glob(f"{cache.name}-*_rank0.db"))) == 2


def test_a_write_lm_eval_refuses_leaves_nothing_behind(tmp_path):
    """lm-eval's EvaluationTracker logs a failed write instead of raising: the failure is an
    error naming it, and no partial set of files (nor the staging folder) stays in --out."""
    from unlearn_plugins.evaluation.lm_eval_runner import Evaluation, write_outputs

    out = tmp_path / "out"
    broken = Evaluation(
        results={"results": {}}, summary={"tasks": [], "model": "m"}, samples={"tofu_forget01_prob": [{"doc_id": 0}]}
    )  # no doc_hash: the tracker fails
    with pytest.raises(UnlearnError, match=r"EvaluationTracker did not write .*KeyError\('doc_hash'\)"):
        write_outputs(out, broken)
    assert not out.exists() or not [p for p in out.rglob("*") if p.name != ".unlearn.lock"]


def test_model_args_and_model_dir_options(tiny_model_dir, tmp_path, capsys):
    assert cli("eval", "--print-model-dir", "--model", tiny_model_dir) == 0
    assert capsys.readouterr().out.strip() == str(tiny_model_dir)
    assert cli("eval", "--print-model-dir", "--model_args", f"pretrained={tiny_model_dir},dtype=auto") == 0
    assert capsys.readouterr().out.strip() == str(tiny_model_dir)
    for model_args, message in (
        (
            f"pretrained={tiny_model_dir},parallelize=True",
            "takes pretrained, peft, dtype, device, trust_remote_code; got parallelize",
        ),
        ("peft=x", "pretrained=MODEL is required"),
        (f"pretrained={tiny_model_dir},dtype=float64", "--model_args dtype=float64: 'float64': use one of"),
        ("just-a-word", "expected key=value pairs"),
    ):
        assert cli("eval", "--print-model-dir", "--model_args", model_args) == 1
        assert message in capsys.readouterr().err, model_args
    assert cli("eval", "--print-model-dir", "--model", tmp_path, "--model_args", f"pretrained={tiny_model_dir}") == 1
    assert "disagree" in capsys.readouterr().err
    assert cli("eval", "--print-model-dir", "--model", "hf") == 1
    assert "needs --model_args pretrained=MODEL" in capsys.readouterr().err


@pytest.mark.slow
def test_print_model_dir_gives_the_converted_embedded_model(embedded_model_dir, capsys):
    assert cli("eval", "--print-model-dir") == 0
    assert capsys.readouterr().out.strip() == str(embedded_model_dir)


def test_custom_forget_split_in_tofus_format(tiny, tiny_model_dir, tofu_dir, tmp_path):
    """tofu_forget_* read any split in TOFU's format (e.g. a stratified one); the truth-ratio
    task takes NAME_perturbed.json from beside it."""
    model, _ = tiny
    split = tmp_path / "hard_authors.json"
    split.write_text("".join((tofu_dir / "forget01.json").read_text().splitlines(keepends=True)[:3]))
    (tmp_path / "hard_authors_perturbed.json").write_text(
        "".join((tofu_dir / "forget01_perturbed.json").read_text().splitlines(keepends=True)[:3])
    )
    custom = run_tasks(
        model,
        tiny_model_dir,
        ["tofu_forget_prob", "tofu_forget_truth_ratio"],
        limit=None,
        tofu_dir=tofu_dir,
        metadata={"forget_split": str(split)},
    )
    named = run_tasks(
        model, tiny_model_dir, ["tofu_forget01_prob", "tofu_forget01_truth_ratio"], limit=3, tofu_dir=tofu_dir
    )
    assert per_sample(custom, "tofu_forget_prob", "prob") == pytest.approx(
        per_sample(named, "tofu_forget01_prob", "prob"), rel=1e-6
    )
    assert per_sample(custom, "tofu_forget_truth_ratio", "truth_ratio") == pytest.approx(
        per_sample(named, "tofu_forget01_truth_ratio", "truth_ratio"), rel=1e-6
    )
    assert custom.summary["forget_quality"]["tofu_forget_truth_ratio"]["split"] == str(
        tmp_path / "hard_authors_perturbed.json"
    )


def test_model_utility_is_computed_after_the_run(tiny, tiny_model_dir, tofu_dir):
    model, _ = tiny
    ev = run_tasks(model, tiny_model_dir, ["tofu_model_utility"], limit=2, tofu_dir=tofu_dir)
    metrics = ev.summary["metrics"]
    mu = ev.summary["model_utility"]
    expected = tm.harmonic_mean(metrics[t][m] for t, m in tm.MODEL_UTILITY_PARTS)
    assert mu["value"] == pytest.approx(expected) and len(mu["parts"]) == 9


def test_malformed_task_data_names_file_and_line(tiny_model_dir, tofu_dir, tmp_path, capsys, monkeypatch):
    bad = tmp_path / "split.json"
    good = (tofu_dir / "forget01.json").read_text().splitlines()[:2]
    bad.write_text("\n".join(good + ['{"question": "Who?", "answer": ']) + "\n")
    assert (
        cli(
            "eval",
            "--model",
            tiny_model_dir,
            "--tasks",
            "tofu_forget_prob",
            "--forget-split",
            bad,
            "--out",
            tmp_path / "o",
        )
        == 1
    )
    assert f"{bad}:3: malformed JSON" in capsys.readouterr().err

    from unlearn_plugins.benchmarks.wmdp.data import wmdp_dataset
    from unlearn_plugins.evaluation.local_data import mmlu_dataset

    (tmp_path / "mmlu" / "test").mkdir(parents=True)
    (tmp_path / "mmlu" / "dev").mkdir()
    (tmp_path / "mmlu" / "test" / "anatomy_test.csv").write_text(
        'question,choice0,choice1,choice2,choice3,answer\n"Q1",a,b,c,d,0\n"Q2\nspans lines",a,b,c,d,7\n'
    )
    with pytest.raises(DataError, match=r"anatomy_test\.csv:3: field 'answer' must be an index 0-3, got 7"):
        mmlu_dataset(mmlu_subject="anatomy", mmlu_dir=str(tmp_path / "mmlu"))
    (tmp_path / "wmdp").mkdir()
    (tmp_path / "wmdp" / "wmdp-bio.json").write_text(
        '[\n {"question": "q", "choices": ["a", "b", "c", "d"], "answer": 1},\n {"question": "q2", "choices": ["a"], '
        '"answer": 0}\n]\n'
    )
    with pytest.raises(DataError, match=r"wmdp-bio\.json:3: field 'choices' must be a list of 4 strings"):
        wmdp_dataset(wmdp_config="wmdp-bio", wmdp_dir=str(tmp_path / "wmdp"))
    monkeypatch.delenv("UNLEARN_MMLU_DIR", raising=False)
    with pytest.raises(DataError, match="UNLEARN_MMLU_DIR"):
        mmlu_dataset(mmlu_subject="anatomy", mmlu_dir=None)


def test_prompt_changes_by_lm_eval_options_are_refused(tiny, tiny_model_dir, tofu_dir):
    import lm_eval
    from lm_eval.models.huggingface import HFLM

    from unlearn_plugins.evaluation.lm_eval_runner import prepare

    model, tok = tiny
    prepared = prepare(
        ["tofu_forget01_prob"], metadata={"tokenizer": str(tiny_model_dir), "tofu_dir": str(tofu_dir)}, limit=1
    )
    with pytest.raises(DataError, match="--apply_chat_template"):
        lm_eval.simple_evaluate(
            model=HFLM(pretrained=model, tokenizer=tok),
            tasks=prepared.specs,
            task_manager=prepared.manager,
            limit=1,
            apply_chat_template=True,
        )


def test_unknown_task_is_reported():
    from unlearn_plugins.evaluation.lm_eval_runner import task_manager_for

    with pytest.raises(UnlearnError, match="did you mean tofu_forget01_prob"):
        task_manager_for(["tofu_forget01_prb"])


# ----------------------------------------------------------------------------- lm-eval's own CLI


def test_lm_eval_cli_with_include_path_and_peft_adapter(tiny, tiny_model_dir, tofu_dir, tmp_path):
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from unlearn_plugins.evaluation.lm_eval_runner import read_outputs

    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    lora = get_peft_model(
        base, LoraConfig(r=4, lora_alpha=16, target_modules=["q_proj", "v_proj"], init_lora_weights=False)
    )
    adapter = tmp_path / "adapter"
    lora.save_pretrained(adapter)

    out = tmp_path / "lm_eval_out"
    metadata = json.dumps({"tofu_dir": str(tofu_dir)})
    flags = ["--limit", 2, "--device", "cpu", "--batch_size", 2, "--metadata", metadata, "--output_path", out]
    proc = lm_eval(f"pretrained={tiny_model_dir},peft={adapter}", "tofu_forget01_prob", TOFU_TASKS, *flags)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (result_file,) = glob.glob(str(out / "**" / "results*.json"), recursive=True)
    cli_prob = json.loads(Path(result_file).read_text())["results"]["tofu_forget01_prob"]["prob,none"]

    model, _ = tiny
    assert (
        cli(
            "eval",
            "--model",
            tiny_model_dir,
            "--adapter",
            adapter,
            "--tasks",
            "tofu_forget01_prob",
            "--limit",
            2,
            "--tofu-dir",
            tofu_dir,
            "--out",
            tmp_path / "ours",
        )
        == 0
    )
    ours = read_outputs(tmp_path / "ours").summary["metrics"]["tofu_forget01_prob"]["prob"]
    # the same layout as lm_eval's: one folder named after the model (the adapter), the same file names
    assert [p.relative_to(tmp_path / "ours").parent for p in (tmp_path / "ours").glob("*/results_*.json")] == [
        Path(result_file).relative_to(out).parent
    ]
    plain = run_tasks(model, tiny_model_dir, ["tofu_forget01_prob"], limit=2, tofu_dir=tofu_dir)
    assert cli_prob == pytest.approx(ours, rel=1e-5)
    assert abs(cli_prob - plain.summary["metrics"]["tofu_forget01_prob"]["prob"]) > 1e-6  # the adapter was applied


# ----------------------------------------------------------------------------- MMLU and WMDP


def _lm_eval_template(name: str) -> dict:
    import lm_eval
    import yaml

    path = Path(lm_eval.__file__).parent / "tasks" / name / "_default_template_yaml"
    return yaml.safe_load(path.read_text())


def test_local_mmlu_and_wmdp_use_lm_evals_prompt_format():
    import yaml

    for ours, theirs in ((ROOT / "tasks" / "mmlu_local", "mmlu/default"), (WMDP_TASKS / "wmdp_local", "wmdp")):
        mine = yaml.load((ours / "_default_template_yaml").read_text(), Loader=yaml.BaseLoader)
        ref = _lm_eval_template(theirs)
        for key in ("doc_to_text", "output_type", "doc_to_target", "test_split"):
            assert mine[key] == ref[key], key
        assert mine["doc_to_choice"] == ref["doc_to_choice"]
    ours = yaml.safe_load((ROOT / "tasks" / "mmlu_local" / "mmlu_local_anatomy.yaml").read_text())
    import lm_eval

    theirs = yaml.safe_load((Path(lm_eval.__file__).parent / "tasks/mmlu/default/mmlu_anatomy.yaml").read_text())
    assert ours["description"] == theirs["description"]


def test_mmlu_local_runs_from_csv(tiny, tiny_model_dir, mmlu_dir):
    import csv

    model, _ = tiny
    ev = run_tasks(
        model, tiny_model_dir, ["mmlu_local_anatomy"], limit=3, tofu_dir=mmlu_dir, metadata={"mmlu_dir": str(mmlu_dir)}
    )
    acc = ev.summary["metrics"]["mmlu_local_anatomy"]["acc"]
    assert 0.0 <= acc <= 1.0
    with (mmlu_dir / "test" / "anatomy_test.csv").open() as handle:
        first = next(csv.DictReader(handle))
    row = min(ev.samples["mmlu_local_anatomy"], key=lambda s: s["doc_id"])
    expected = (
        "The following are multiple choice questions (with answers) about anatomy.\n\n"
        f"{first['question'].strip()}\nA. {first['choice0']}\nB. {first['choice1']}\nC. {first['choice2']}\n"
        f"D. {first['choice3']}\nAnswer:"
    )
    assert [a[0] for a in row["arguments"]] == [expected] * 4
    assert [a[1] for a in row["arguments"]] == [" A", " B", " C", " D"]
    chosen = max(range(4), key=lambda i: row["filtered_resps"][i][0])
    assert row["acc"] == float(chosen == int(first["answer"]))


def test_wmdp_local_runs_from_fixture(tiny, tiny_model_dir, tofu_dir):
    model, _ = tiny
    ev = run_tasks(
        model,
        tiny_model_dir,
        ["wmdp_local"],
        limit=None,
        tofu_dir=tofu_dir,
        metadata={"wmdp_dir": str(FIXTURES / "wmdp")},
    )
    metrics = ev.summary["metrics"]
    assert {"wmdp_local_bio", "wmdp_local_chem", "wmdp_local_cyber"} <= set(metrics)
    assert all(len(ev.samples[t]) == 10 for t in ("wmdp_local_bio", "wmdp_local_chem", "wmdp_local_cyber"))
    assert "acc" in metrics["wmdp_local"]


# ----------------------------------------------------------------------------- embedded model end to end


@pytest.mark.slow
def test_unlearn_eval_embedded_tofu_and_mmlu(embedded_model_dir, tofu_dir, mmlu_dir, tmp_path, capsys):
    ref = tmp_path / "ref.json"
    common = ["--model", "smollm2-135m", "--tofu-dir", tofu_dir, "--mmlu-dir", mmlu_dir, "--limit", 4]
    save = ["--tasks", "tofu_forget01_truth_ratio", "--save-reference", ref]
    assert cli("eval", *common, *save, "--out", tmp_path / "ref_run") == 0
    assert (
        cli(
            "eval",
            *common,
            "--tasks",
            "tofu_forget01_prob,tofu_forget01_truth_ratio,mmlu_local_anatomy",
            "--retain-reference",
            ref,
            "--out",
            tmp_path / "run",
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "Forget Quality" in out and "|anatomy " in out  # lm-eval's table shows the task alias
    from unlearn_plugins.evaluation.lm_eval_runner import read_outputs

    summary = read_outputs(tmp_path / "run").summary
    assert summary["forget_quality"]["tofu_forget01_truth_ratio"]["value"] == 1.0
    assert 0 < summary["metrics"]["tofu_forget01_prob"]["prob"] < 1
    assert 0 <= summary["metrics"]["mmlu_local_anatomy"]["acc"] <= 1


CAP_PLUGIN = """
from pathlib import Path

from unlearn_plugins import hookimpl


@hookimpl
def register_lm_eval_task_dirs(register):
    register("cap-tasks", Path(__file__).parent / "cap_tasks")


def docs(**_metadata):
    import datasets

    return datasets.DatasetDict({"test": datasets.Dataset.from_list([{"prompt": "Hello", "answer": "world"}])})
"""

CAP_TASK = """task: {name}
custom_dataset: !function cap_plugin.docs
test_split: test
output_type: generate_until
doc_to_text: "{{{{prompt}}}}"
doc_to_target: "{{{{answer}}}}"
generation_kwargs:
  until: []
  max_gen_toks: {limit}
  do_sample: false
metric_list:
  - metric: exact_match
metadata:
  version: 1.0
"""


def test_max_gen_toks_caps_a_tasks_limit_and_never_raises_it(tiny_model_dir, tmp_path, capsys, monkeypatch):
    """--max-gen-toks (and a study's gen_margin) set every generation task's
    max_gen_toks, raising a plugin task's 1 to 8; it is now a cap."""
    from unlearn_plugins.host import reset_host

    site = tmp_path / "site"
    (site / "cap_tasks").mkdir(parents=True)
    (site / "cap_plugin.py").write_text(CAP_PLUGIN)
    (site / "cap_tasks" / "one.yaml").write_text(CAP_TASK.format(name="cap_one_token", limit=1))
    (site / "cap_tasks" / "long.yaml").write_text(CAP_TASK.format(name="cap_long", limit=300))
    info = site / "cap-plugin-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: cap-plugin\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("[unlearn_plugins]\ncap-plugin = cap_plugin\n")
    monkeypatch.syspath_prepend(str(site))
    reset_host()
    try:
        out = tmp_path / "out"
        code = cli(
            "eval", "--model", tiny_model_dir, "--tasks", "cap_one_token,cap_long", "--max-gen-toks", 8, "--out", out
        )
        assert code == 0, capsys.readouterr().err[-2000:]
        capsys.readouterr()
        limits = {}
        for path in out.rglob("samples_*.jsonl"):
            row = json.loads(path.read_text().splitlines()[0])
            limits[path.name.split("_20")[0]] = row["arguments"]["gen_args_0"]["arg_1"]["max_gen_toks"]
        assert limits == {"samples_cap_one_token": 1, "samples_cap_long": 8}
    finally:
        sys.modules.pop("cap_plugin", None)
        monkeypatch.undo()
        reset_host()
