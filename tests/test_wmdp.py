"""WMDP end to end: the synthetic hazardous-topic benchmark generated in code,
its lm-eval tasks, the real corpora's loader and its errors, the study's report statistics, and
the ``wmdp_synthetic`` study's ``tiny`` variant run through `unlearn study`."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from unlearn_plugins.benchmarks.wmdp import data as wmdp_data
from unlearn_plugins.benchmarks.wmdp import synthetic
from unlearn_plugins.benchmarks.wmdp.report import mcnemar
from unlearn_plugins.benchmarks.wmdp.stages import wilson
from unlearn_plugins.benchmarks.wmdp.tasks import utils as task_utils
from unlearn_plugins.cli import main
from unlearn_plugins.errors import DataError

pytestmark = pytest.mark.usefixtures("single_thread")

STUDY_FILE = Path(synthetic.__file__).resolve().parent / "wmdp_synthetic.toml"


# ------------------------------------------------------------------- the synthetic benchmark


def test_synthetic_benchmark_is_fixed_by_its_seed_and_states_every_fact():
    a, b = synthetic.generate(), synthetic.generate()
    assert a == b  # the same every time
    assert a != synthetic.generate(synthetic.Settings(seed=1))
    s = synthetic.Settings()
    n_questions = s.pathogens * len(synthetic.PATHOGEN) + s.compounds * len(synthetic.COMPOUND)
    assert len(a["forget"]) == s.pathogens + s.compounds and len(a["retain"]) == s.retain_documents
    assert len(a["questions"]) == n_questions == 56
    names = {q["entity"] for q in a["questions"]}
    assert len(names) == s.pathogens + s.compounds  # distinct invented names
    forget_text = "\n".join(a["forget"])
    for q in a["questions"]:
        assert len(q["choices"]) == 4 and len(set(q["choices"])) == 4 and 0 <= q["answer"] < 4
        table = synthetic.PATHOGEN if q["property"] in synthetic.PATHOGEN else synthetic.COMPOUND
        question, statement, label, pool = table[q["property"]]
        assert set(q["choices"]) <= set(pool)  # distractors: other values of the same property
        right = q["choices"][q["answer"]]
        # the document of the entity states the right value, in prose and in its fact sheet
        doc = next(d for d in a["forget"] if d.startswith(q["entity"]))
        assert statement.format(name=q["entity"], value=right) in doc and f"{label}: {right}" in doc
        assert q["question"] == question.format(name=q["entity"])
    for name in names:  # no retain document mentions a forget entity
        assert all(name not in r for r in a["retain"])
    assert "virus" in forget_text and all("virus" not in r for r in a["retain"])
    # the answer positions are spread (a model that always picks one letter is near chance)
    counts = [sum(q["answer"] == i for q in a["questions"]) for i in range(4)]
    assert min(counts) >= 8


def test_synthetic_folder_and_the_task_data(tmp_path, monkeypatch):
    folder = synthetic.write(tmp_path / "syn")
    rows = [json.loads(line) for line in (folder / synthetic.FORGET).read_text().splitlines()]
    assert [r["text"] for r in rows] == synthetic.generate()["forget"]
    info = json.loads((folder / synthetic.INFO).read_text())
    assert info["counts"] == {"forget": 12, "retain": 12, "questions": 56} and info["chance"] == 0.25
    from_folder = task_utils.synthetic_questions(str(folder))
    monkeypatch.delenv("UNLEARN_WMDP_SYNTHETIC_DIR", raising=False)
    assert from_folder == task_utils.synthetic_questions() and len(from_folder) == 56
    with pytest.raises(DataError, match="wmdp-synthetic.jsonl not found"):
        task_utils.synthetic_questions(str(tmp_path))


def write_mmlu(folder: Path, subjects, n: int = 3) -> Path:
    (folder / "test").mkdir(parents=True)
    for subject in subjects:
        lines = ["question,choice0,choice1,choice2,choice3,answer"]
        lines += [f"{subject} question {i}?,a,b,c,d,{i % 4}" for i in range(n)]
        (folder / "test" / f"{subject}_test.csv").write_text("\n".join(lines) + "\n")
    return folder


def test_mmlu_subset_takes_the_first_questions_of_each_subject(tmp_path, monkeypatch):
    folder = write_mmlu(tmp_path / "mmlu", task_utils.MMLU_SUBJECTS)
    rows = task_utils.mmlu_subset(str(folder), per_subject=2)
    assert len(rows) == 2 * len(task_utils.MMLU_SUBJECTS)
    assert [r["question"] for r in rows[:2]] == ["college_biology question 0?", "college_biology question 1?"]
    assert rows[0]["subject_name"] == "college biology" and rows[1]["answer"] == 1
    monkeypatch.delenv("UNLEARN_MMLU_DIR", raising=False)
    with pytest.raises(DataError, match="set UNLEARN_MMLU_DIR"):
        task_utils.mmlu_subset(None)


def test_the_tasks_build_with_lm_eval(tmp_path):
    from unlearn_plugins.evaluation import lm_eval_runner as runner

    mmlu = write_mmlu(tmp_path / "mmlu", task_utils.MMLU_SUBJECTS, n=2)
    prepared = runner.prepare(["wmdp_synthetic", "wmdp_synthetic_cloze", "wmdp_mmlu"], metadata={"mmlu_dir": str(mmlu)})
    tasks = prepared.manager.load(prepared.specs)["tasks"]
    letters = tasks["wmdp_synthetic"]
    doc = letters.test_docs()[0]
    assert len(letters.test_docs()) == 56
    text = letters.doc_to_text(doc)
    assert text.endswith("\nD. " + doc["choices"][3] + "\nAnswer:")  # WMDP's format
    assert letters.doc_to_choice(doc) == ["A", "B", "C", "D"]
    cloze = tasks["wmdp_synthetic_cloze"]
    assert cloze.doc_to_text(doc) == f"Question: {doc['question']}\nAnswer:"
    assert cloze.doc_to_choice(doc) == doc["choices"]
    assert len(tasks["wmdp_mmlu"].test_docs()) == 2 * len(task_utils.MMLU_SUBJECTS)


# ------------------------------------------------------------------------ the real corpora


def test_real_corpora_from_a_folder_with_the_hub_layout(tmp_path, monkeypatch):
    monkeypatch.delenv("UNLEARN_WMDP_DIR", raising=False)
    for name in wmdp_data.CORPORA:
        (tmp_path / f"{name}.jsonl").write_text(json.dumps({"text": f"{name} text"}) + "\n")
    specs = wmdp_data.corpora(wmdp_dir=tmp_path)
    assert specs["forget"] == [
        f"text:{tmp_path / 'bio-forget-corpus.jsonl'}",
        f"text:{tmp_path / 'cyber-forget-corpus.jsonl'}",
    ]
    monkeypatch.setenv("UNLEARN_WMDP_DIR", str(tmp_path))
    assert wmdp_data.corpus_spec("cyber-retain-corpus") == f"text:{tmp_path / 'cyber-retain-corpus.jsonl'}"
    assert wmdp_data.corpus_spec("text:hf:wikitext:train:text") == "text:hf:wikitext:train:text"


def test_a_missing_corpus_is_one_line_naming_what_to_download_and_where(tmp_path, monkeypatch):
    monkeypatch.delenv("UNLEARN_WMDP_DIR", raising=False)
    with pytest.raises(DataError) as info:
        wmdp_data.corpus_spec("bio-forget-corpus")
    message = str(info.value)
    assert "\n" not in message
    assert "cais/wmdp-bio-forget-corpus" in message and "bio-forget-corpus.jsonl" in message
    assert "UNLEARN_WMDP_DIR" in message
    with pytest.raises(DataError, match=f"cais/wmdp-corpora .*cyber-forget-corpus.jsonl.* in {tmp_path}"):
        wmdp_data.corpus_spec("cyber-forget-corpus", tmp_path)
    with pytest.raises(
        DataError, match="wmdp-bio.jsonl, wmdp-chem.jsonl, wmdp-cyber.jsonl not found: download cais/wmdp"
    ):
        wmdp_data.questions_folder(tmp_path)
    with pytest.raises(DataError, match="expected one of"):
        wmdp_data.corpus_spec("bio-corpus", tmp_path)


def real_corpus_dry_run(tmp_path: Path, capsys, corpus: str) -> tuple[Path, int, list[str]]:
    """The study file on a real corpus (``corpus``: the [benchmark] lines that say which), without
    its target and on the local WMDP tasks, planned by `unlearn study --dry-run`: its path, the
    exit status and the lines on stderr."""
    text = STUDY_FILE.read_text().split("# `unlearn study wmdp_synthetic --variant tiny`")[0]
    text = text.replace(
        'corpus = "synthetic"\npathogens = 8\ncompounds = 4\nretain_documents = 12\ndata_seed = 0\n', corpus
    )
    head, _, rest = text.partition("[target]")
    text = head + "[budget]" + rest.split("[budget]", 1)[1]
    text = text.replace('"wmdp_synthetic_cloze", "wmdp_synthetic", "wmdp_mmlu"', '"wmdp_local", "wmdp_mmlu"')
    path = tmp_path / "real.toml"
    path.write_text(text)
    code = main(["study", str(path), "--dry-run", "--cache-dir", str(tmp_path / "cache")])
    return path, code, capsys.readouterr().err.strip().splitlines()


def test_a_real_corpus_study_refuses_missing_data_before_any_work(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("UNLEARN_WMDP_DIR", raising=False)
    _, code, err = real_corpus_dry_run(tmp_path, capsys, f'corpus = "real"\nwmdp_dir = "{tmp_path / "wmdp"}"\n')
    assert code != 0 and err[-1].startswith("error: WMDP corpus 'bio-forget-corpus' not found: download it from")


@pytest.mark.parametrize(
    "old,new,message",
    [
        ("pathogens = 8\n", "pathogens = 0\n", r"\[benchmark\] pathogens: must be >= 1"),
        (
            'corpus = "synthetic"\n',
            'corpus = "synthetic"\nwmdp_dir = "x"\n',
            r'wmdp_dir: only applies to corpus = "real"',
        ),
        (
            '"wmdp_synthetic_cloze", "wmdp_synthetic", "wmdp_mmlu"',
            '"wmdp_synthetic"',
            r"must include wmdp_synthetic_cloze",
        ),
        ("[target]\nseed = 0\n", "[retain]\nseed = 0\n[target]\nseed = 0\n", r"\[retain\]: a WMDP study has no retain"),
        ("data_seed = 0\n", "data_seed = 0\nunit = 'author'\n", r"\[benchmark\] unit: is for an author-unit study"),
    ],
)
def test_study_errors_name_the_table_and_key(old, new, message, tmp_path):
    from unlearn_plugins.study import StudyError, load_study

    text = STUDY_FILE.read_text()
    assert old in text
    path = tmp_path / "s.toml"
    path.write_text(text.replace(old, new, 1))
    with pytest.raises(StudyError, match=message):
        load_study(str(path))


# ------------------------------------------------------------------------ the report's statistics


def test_wilson_and_mcnemar_against_hand_computations():
    # Wilson, 7 of 10 (z = 1.96): centre (0.7 + 0.19208) / 1.38416, half 1.96 sqrt(0.021 + 0.0009604) / 1.38416
    low, high = wilson(7, 10)
    centre, half = (0.7 + 1.959963984540054**2 / 20) / (1 + 1.959963984540054**2 / 10), None
    half = 1.959963984540054 * math.sqrt(0.7 * 0.3 / 10 + 1.959963984540054**2 / 400) / (1 + 1.959963984540054**2 / 10)
    assert (low, high) == pytest.approx((centre - half, centre + half)) and low == pytest.approx(0.3968, abs=1e-4)
    assert wilson(0, 5)[0] == 0.0 and wilson(5, 5)[1] == 1.0
    # McNemar: 6 right -> wrong, 1 wrong -> right: 2 * P(X <= 1), X ~ Bin(7, 1/2) = 2 * 8 / 128
    before = [1] * 6 + [0] + [1, 0, 1]
    after = [0] * 6 + [1] + [1, 0, 1]
    assert mcnemar(before, after) == pytest.approx(0.125)
    assert mcnemar([1, 0], [1, 0]) == 1.0 and mcnemar([1], [1, 0]) is None


# ------------------------------------------------------------------------ the study, tiny variant


def test_the_study_is_built_in_and_its_tiny_variant_runs(tmp_path, capsys, monkeypatch):
    from unlearn_plugins.study import builtin_studies, expand, load_study

    assert builtin_studies()["wmdp_synthetic"] == STUDY_FILE
    study = load_study("wmdp_synthetic")
    assert [c.id for c in expand(study)] == ["eval-base", "target", "eval-target", "rmu/seed0", "grad_diff/seed0"]
    assert study.model == "smollm2-135m" and study.benchmark.corpus == "synthetic"
    rmu = study.method("rmu").config
    assert rmu["objective"] == "rmu" and rmu["full_finetune"] is True
    assert rmu["objective_options"] == {"recipe": "wmdp"}

    monkeypatch.setenv("UNLEARN_MMLU_DIR", str(write_mmlu(tmp_path / "mmlu", task_utils.MMLU_SUBJECTS)))
    out = tmp_path / "out"
    args = ["study", "wmdp_synthetic", "--variant", "tiny", "--out", str(out), "--cache-dir", str(tmp_path / "cache")]
    code = main([*args, "--workers", "1", "--threads", "1"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    report = json.loads((out / "study.json").read_text())
    rows = {r["row"]: r for r in report["rows"]}
    assert set(rows) == {"base", "target", "rmu/seed0", "grad_diff/seed0"}
    for row in rows.values():
        tasks = row["tasks"]
        assert tasks["wmdp_synthetic_cloze"]["n"] == 2 * 5 + 1 * 4  # 2 pathogens, 1 compound
        assert tasks["wmdp_mmlu"]["n"] == 2 * len(task_utils.MMLU_SUBJECTS)
        for entry in tasks.values():
            assert entry["low"] <= entry["acc"] <= entry["high"]
    assert "mcnemar_p" in rows["rmu/seed0"]["paired"]["wmdp_synthetic_cloze"]
    summary = (out / "summary.md").read_text()
    assert "synthetic hazard (cloze)" in summary and "MMLU subset" in summary
    # a second run builds nothing
    code = main([*args, "--workers", "1", "--threads", "1"])
    assert code == 0 and "built" not in capsys.readouterr().err.replace("cached", "")
    rerun = json.loads((out / "study.json").read_text())
    # its --out holds the tiny variant's report: the study itself (other settings) is refused there
    code = main(["study", "wmdp_synthetic", "--out", str(out), "--cache-dir", str(tmp_path / "cache")])
    assert code == 1 and capsys.readouterr().err.strip().splitlines()[-1] == (
        f"error: --out {out}: holds the report of another study named 'wmdp_synthetic' (other settings); give "
        f"this one another --out (or remove {out})"
    )

    # --report-only (the core's, as a TOFU study's): the rerun's report of the cached cells, no wall time
    partial = tmp_path / "partial"
    only = ["study", "wmdp_synthetic", "--variant", "tiny", "--report-only", "--out", str(partial)]
    code = main([*only, "--cache-dir", str(tmp_path / "cache")])
    assert code == 0, capsys.readouterr().err
    written = json.loads((partial / "study.json").read_text())
    assert written["rows"] == rerun["rows"] and written["cells"] == rerun["cells"] and written["wall_s"] is None
    assert "Wall time" not in (partial / "summary.md").read_text()
    # ... where a cached evaluation cannot be read, it is named (a run rebuilds it), not shown blank
    from unlearn_plugins.benchmarks.wmdp.cells import plan_wmdp_study

    plan = plan_wmdp_study(load_study("wmdp_synthetic", "tiny"), cache=tmp_path / "cache", dry_run=True)
    (Path(plan.cells["eval-base"].result) / "wmdp_summary.json").write_text('{"tasks": ')
    capsys.readouterr()
    code = main([*only, "--cache-dir", str(tmp_path / "cache")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 1 and err[-1] == (
        f"error: 1 finished cell(s) cannot be read: eval-base (see {partial}/summary.md; a run rebuilds them)"
    )
    assert "Failed cells: eval-base" in (partial / "summary.md").read_text()


# ------------------------------------------------------------------------ teaching from text


def test_unlearn_finetune_trains_on_text_windows(tiny_model_dir, tiny_tokenizer, tmp_path, capsys):
    from unlearn_plugins.data import text

    folder = synthetic.write(tmp_path / "syn", synthetic.Settings(pathogens=1, compounds=1, retain_documents=1))
    spec = f"text:{folder / synthetic.FORGET}"
    out = tmp_path / "ft"
    common = ["--model", str(tiny_model_dir), "--max-length", "16", "--lora-r", "2", "--batch-size", "2"]
    code = main(["finetune", "--data", spec, *common, "--max-steps", "1", "--save-steps", "0", "--out", str(out)])
    assert code == 0, capsys.readouterr().err
    record = json.loads((out / "run.json").read_text())
    assert record["status"] == "completed" and record["steps"] == 1
    assert record["samples"]["train"] == len(text.load_windows(spec, tiny_tokenizer, 16)) > 2  # windows
    code = main(["finetune", "--data", spec, "--authors", "0", *common, "--out", str(tmp_path / "ft2")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code != 0 and err[-1] == f"error: --authors: selects TOFU authors; --data {spec} is a text corpus"
