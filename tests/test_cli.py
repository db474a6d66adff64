"""The `unlearn` CLI boundary: thin commands, clear errors without tracebacks."""

from __future__ import annotations

import json

import pytest

from unlearn_plugins.cli import main


def test_probs_prints_each_sample(tiny_model_dir, tofu_dir, capsys):
    assert (
        main(["probs", "--model", str(tiny_model_dir), "--data", "tofu:forget01[0:3]", "--tofu-dir", str(tofu_dir)])
        == 0
    )
    out = capsys.readouterr().out.splitlines()
    rows = [line for line in out if line[:5].strip().isdigit()]
    assert len(rows) == 3
    probs = [float(r.split()[1]) for r in rows]
    assert all(0 < p < 1 for p in probs)
    assert out[-1].startswith("mean answer probability over 3 samples:")


def test_score_writes_jsonl_atomically(tiny_model_dir, tofu_dir, tmp_path):
    out = tmp_path / "scores.jsonl"
    out.write_text("previous results\n")
    args = ["score", "--scorer", "length", "--model", str(tiny_model_dir), "--tofu-dir", str(tofu_dir)]
    assert main(args + ["--data", "tofu:forget01[0:4]", "--out", str(out)]) == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["index"] for r in rows] == [0, 1, 2, 3] and all(r["score"] > 1 for r in rows)
    # a failing run leaves the previous file untouched and no temporary behind
    assert main(args + ["--data", "tofu:nosuchsplit", "--out", str(out)]) == 1
    assert len(out.read_text().splitlines()) == 4
    assert sorted(p.name for p in tmp_path.iterdir()) == ["scores.jsonl", "scores.jsonl.meta.json"]


def test_errors_are_one_line(tmp_path, capsys):
    assert (
        main(["probs", "--model", str(tmp_path / "missing"), "--data", "tofu:forget01", "--tofu-dir", str(tmp_path)])
        == 1
    )
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "Traceback" not in err
    with pytest.raises(SystemExit):
        main(["score"])  # argparse: --scorer is required
