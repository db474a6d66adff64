"""`unlearn stratify`: easy/hard TOFU splits from a score file, the circuit plot, and errors."""

from __future__ import annotations

import json

import pytest

from unlearn_plugins.cli import main
from unlearn_plugins.data.tofu import load_split


def write_scores(path, samples, scores, with_circuits=True):
    rows = []
    for s, value in zip(samples, scores):
        row = {"index": s.index, "question": s.question, "score": value}
        if with_circuits:  # 3 layers + logits x 5 destination types, as the cud scorer writes
            row["circuit_by_layer"] = [[int(value * 10) % 3, 1, 0, 2, 0], [0, 0, 1, 1, 0], [1, 0, 0, 0, 0],
                                       [0, 0, 0, 0, 3]]
        rows.append(row)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_stratify_writes_tofu_splits_with_perturbed_fields(tofu_dir, tmp_path, capsys):
    samples = load_split("tofu:forget01[0:6]", tofu_dir)
    scores = write_scores(tmp_path / "s.jsonl", samples, [0.5, 0.1, 0.9, 0.3, 0.95, 0.1])
    out = tmp_path / "strata"
    assert main(["stratify", str(scores), "--easy", "2", "--hard", "2", "--data", "tofu:forget01[0:6]",
                 "--tofu-dir", str(tofu_dir), "--out", str(out), "--plot"]) == 0
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
    assert main(["stratify", str(tmp_path / "bad.jsonl"), "--easy", "1", "--hard", "0", "--tofu-dir", str(tofu_dir),
                 "--out", str(tmp_path / "o")]) == 1
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
    assert main(["stratify", str(scores), "--easy", "1", "--hard", "1", "--data", spec, "--tofu-dir", str(tofu_dir),
                 "--out", str(tmp_path / "o")]) == 1
    assert "s.jsonl:3: index 2 has another question" in capsys.readouterr().err
