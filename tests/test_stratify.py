"""`unlearn stratify`: easy/hard TOFU splits from a score file, the circuit plot, and errors."""

from __future__ import annotations

import json

import pytest
from support_checks import stratify_args

from unlearn_plugins.cli import main
from unlearn_plugins.data.qa import load_split


def write_scores(path, samples, scores, with_circuits=True):
    rows = []
    for s, value in zip(samples, scores):
        row = {"index": s.index, "question": s.question, "score": value}
        if with_circuits:  # 3 layers + logits x 5 destination types, as the cud scorer writes
            row["circuit_by_layer"] = [
                [int(value * 10) % 3, 1, 0, 2, 0],
                [0, 0, 1, 1, 0],
                [1, 0, 0, 0, 0],
                [0, 0, 0, 0, 3],
            ]
        rows.append(row)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_stratify_writes_tofu_splits_with_perturbed_fields(tofu_dir, tmp_path, capsys):
    samples = load_split("tofu:forget01[0:6]", tofu_dir)
    scores = write_scores(tmp_path / "s.jsonl", samples, [0.5, 0.1, 0.9, 0.3, 0.95, 0.1])
    out = tmp_path / "strata"
    assert main(stratify_args(scores, tofu_dir, out, "--plot", easy=2, hard=2, data="tofu:forget01[0:6]")) == 0
    easy = load_split(str(out / "easy.json"), require=("question", "answer", "perturbed_answer"))
    hard = load_split(str(out / "hard.json"), require=("question", "answer", "perturbed_answer"))
    assert [s.question for s in easy] == [samples[1].question, samples[5].question]  # ties: lower index
    assert [s.question for s in hard] == [samples[4].question, samples[2].question]
    assert all("paraphrased_answer" in s.extra for s in easy + hard)
    meta = json.loads((out / "stratify.json").read_text())
    assert [e["index"] for e in meta["hard"]] == [4, 2] and meta["easy"][0]["score"] == 0.1
    assert (out / "circuits.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "easy: 2 samples" in capsys.readouterr().out


def test_stratify_errors_name_the_problem(tofu_dir, tmp_path, capsys):
    samples = load_split("tofu:forget01[0:4]", tofu_dir)
    scores = write_scores(tmp_path / "s.jsonl", samples, [0.1, 0.2, 0.3, 0.4], with_circuits=False)
    base = ["stratify", str(scores), "--tofu-dir", str(tofu_dir), "--out", str(tmp_path / "o")]
    assert main(base + ["--easy", "3", "--hard", "2", "--data", "tofu:forget01[0:4]"]) == 1
    assert "exceeds the 4 scored samples" in capsys.readouterr().err
    assert main(base + ["--easy", "1", "--hard", "1", "--data", "tofu:forget01[4:8]"]) == 1
    assert "s.jsonl:1: index 0" in capsys.readouterr().err
    assert main(base + ["--easy", "1", "--hard", "1", "--data", "tofu:forget01[0:4]", "--plot"]) == 1
    assert "circuit_by_layer" in capsys.readouterr().err
    (tmp_path / "bad.jsonl").write_text('{"index": 0}\n')
    assert main(stratify_args(tmp_path / "bad.jsonl", tofu_dir, tmp_path / "o", easy=1, hard=0, data=None)) == 1
    assert "bad.jsonl:1: field 'score'" in capsys.readouterr().err


@pytest.mark.parametrize("spec", ["tofu:forget01[0:4]"])
def test_questions_must_match(tofu_dir, tmp_path, capsys, spec):
    samples = load_split(spec, tofu_dir)
    scores = write_scores(tmp_path / "s.jsonl", samples, [0.1, 0.2, 0.3, 0.4], with_circuits=False)
    lines = scores.read_text().splitlines()
    row = json.loads(lines[2])
    row["question"] = "something else?"
    lines[2] = json.dumps(row)
    scores.write_text("\n".join(lines) + "\n")
    assert main(stratify_args(scores, tofu_dir, tmp_path / "o", easy=1, hard=1, data=spec)) == 1
    assert "s.jsonl:3: index 2 has another question" in capsys.readouterr().err


def test_anchor_rows_never_enter_a_split(tofu_dir, tmp_path, capsys):
    """CUD anchors were picked for how they behaved under unlearning: the old stratify put the
    lowest- and highest-scored anchors straight into easy.json / hard.json."""
    samples = load_split("tofu:forget01[0:6]", tofu_dir)
    scores = [0.5, 0.05, 0.4, 0.3, 0.99, 0.6]
    path = write_scores(tmp_path / "s.jsonl", samples, scores, with_circuits=False)
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    rows[1]["anchor"], rows[4]["anchor"] = "easy", "hard"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    by_score = sorted(range(6), key=lambda i: scores[i])
    assert {by_score[0], by_score[-1]} == {1, 4}  # what the old code would have picked
    out = tmp_path / "strata"
    assert main(stratify_args(path, tofu_dir, out, easy=2, hard=2, data="tofu:forget01[0:6]")) == 0
    easy, hard = load_split(str(out / "easy.json")), load_split(str(out / "hard.json"))
    assert [s.question for s in easy] == [samples[3].question, samples[2].question]
    assert [s.question for s in hard] == [samples[5].question, samples[0].question]
    assert "dropped 2 of 6 rows: CUD anchors" in capsys.readouterr().out
    assert json.loads((out / "stratify.json").read_text())["dropped_anchors"] == [1, 4]
    assert main(stratify_args(path, tofu_dir, out, easy=3, hard=2, data="tofu:forget01[0:6]")) == 1
    assert "exceeds the 4 scored samples left after dropping 2 CUD anchors" in capsys.readouterr().err


def test_anchors_listed_in_the_metadata_are_dropped(tofu_dir, tmp_path, capsys):
    from unlearn_plugins.stratify import read_scores, stratify

    samples = load_split("tofu:forget01[0:6]", tofu_dir)
    path = write_scores(tmp_path / "s.jsonl", samples, [0.5, 0.05, 0.4, 0.3, 0.99, 0.6], with_circuits=False)
    anchor = {"pool_index": 1, "question": samples[1].question, "answer": samples[1].answer, "runs": 5}
    meta = {
        "scorer": "cud",
        "anchors": {"all": {"easy": [], "hard": []}},
        "stable_by_objective": {"npo": {"easy": [anchor], "hard": []}},
    }
    (tmp_path / "s.jsonl.meta.json").write_text(json.dumps(meta))
    easy, hard = stratify(read_scores(path), samples, 1, 1, meta=meta)
    assert easy == [samples[3]] and hard == [samples[4]]
    assert main(stratify_args(path, tofu_dir, tmp_path / "o", easy=1, hard=1, data="tofu:forget01[0:6]")) == 0
    assert "dropped 1 of 6 rows" in capsys.readouterr().out
    assert load_split(str(tmp_path / "o" / "easy.json"))[0].question == samples[3].question


def test_stratify_by_one_objective(tofu_dir, tmp_path, capsys):
    samples = load_split("tofu:forget01[0:4]", tofu_dir)
    path = write_scores(tmp_path / "s.jsonl", samples, [0.5, 0.5, 0.5, 0.5], with_circuits=False)
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    for row, npo in zip(rows, [0.9, 0.1, 0.2, 0.8]):
        row["score_by_objective"] = {"npo": npo, "grad_diff": 1 - npo}
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    base = stratify_args(path, tofu_dir, tmp_path / "o")
    assert main(base + ["--objective", "npo"]) == 0
    assert load_split(str(tmp_path / "o" / "easy.json"))[0].question == samples[1].question
    assert load_split(str(tmp_path / "o" / "hard.json"))[0].question == samples[0].question
    assert main(base + ["--objective", "rmu"]) == 1
    assert "s.jsonl:1: no score for objective 'rmu' (score_by_objective has: npo, grad_diff)" in capsys.readouterr().err


def test_stratify_a_cud_score_file_with_in_sample_anchors(tiny_model_dir, tofu_dir, tmp_path, capsys):
    """End to end: `unlearn score --scorer cud --anchor-data self` marks its anchors; stratify drops them."""
    scores = tmp_path / "cud.jsonl"
    anchors = json.dumps({"easy": [0, 1], "hard": [2, 3]})
    assert (
        main(
            [
                "score",
                "--scorer",
                "cud",
                "--model",
                str(tiny_model_dir),
                "--tofu-dir",
                str(tofu_dir),
                "--data",
                "tofu:forget01[0:6]",
                "--anchor-data",
                "self",
                "--option",
                f"anchors={anchors}",
                "--option",
                "steps=1",
                "--option",
                f"cache_dir={tmp_path / 'cache'}",
                "--out",
                str(scores),
            ]
        )
        == 0
    )
    assert (tmp_path / "cud.jsonl.meta.json").is_file()
    capsys.readouterr()
    assert main(stratify_args(scores, tofu_dir, tmp_path / "o", easy=1, hard=1, data="tofu:forget01[0:6]")) == 0
    assert "dropped 4 of 6 rows" in capsys.readouterr().out
    picked = load_split(str(tmp_path / "o" / "easy.json")) + load_split(str(tmp_path / "o" / "hard.json"))
    samples = load_split("tofu:forget01[0:6]", tofu_dir)
    assert sorted(s.question for s in picked) == sorted([samples[4].question, samples[5].question])
