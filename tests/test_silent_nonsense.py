"""Inputs that gave a result with exit 0 where there is none to give. `unlearn
stratify` with NaN scores put the same samples in easy and hard and wrote NaN into
stratify.json; a duplicate index put one sample twice in a split; ``"anchor": "no"`` counted as
an anchor. `finetune --authors 0,0` trained on author 0 twice. A MovieLens ratings file cut
mid-line was read (its last rating dated 1970). Each is now one `error:` line naming the file
and line (or the option), exit 1, and nothing written. (The study report's checks are in
test_study_corrupt_records.py.)"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from support_checks import stratify_args
from test_demo_movielens import write_grouplens

from unlearn_plugins.cli import main
from unlearn_plugins.data.qa import load_split


def snapshot(root: Path) -> dict[str, bytes | None]:
    return {str(p.relative_to(root)): (p.read_bytes() if p.is_file() else None) for p in sorted(root.rglob("*"))}


def refused(capsys, root: Path, *args) -> str:
    """Run the CLI: exit 1, one `error:` line on stderr, nothing under ``root`` written or changed."""
    before = snapshot(root)
    code = main([str(a) for a in args])
    err = capsys.readouterr().err
    assert code == 1, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    assert snapshot(root) == before, "files were written, changed or removed"
    return lines[0]


# ----------------------------------------------------------------------------- stratify


def score_file(path: Path, rows: list[dict]) -> Path:
    """A score file; each row's values as given (NaN and Infinity written as Python's json does)."""
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.mark.parametrize(
    "rows,extra,message",
    [
        (
            [{"index": 0, "score": 0.3}, {"index": 1, "score": float("nan")}, {"index": 2, "score": 0.9}],
            (),
            "s.jsonl:2: field 'score' is NaN; scores must be finite numbers",
        ),
        (
            [{"index": 0, "score": float("-inf")}, {"index": 1, "score": 0.2}],
            (),
            "s.jsonl:1: field 'score' is -Infinity; scores must be finite numbers",
        ),
        (
            [
                {"index": 0, "score": 0.1, "score_by_objective": {"npo": 0.1}},
                {"index": 1, "score": 0.2, "score_by_objective": {"npo": float("nan")}},
            ],
            ("--objective", "npo"),
            "s.jsonl:2: score_by_objective['npo'] is NaN; scores must be finite numbers",
        ),
        (
            [{"index": 0, "score": 0.1, "score_by_objective": [0.1]}, {"index": 1, "score": 0.2}],
            ("--objective", "npo"),
            "s.jsonl:1: field 'score_by_objective' must be an object of scores by objective, got list",
        ),
        (
            [
                {"index": 0, "score": 0.1},
                {"index": 1, "score": 0.2},
                {"index": 3, "score": 0.5},
                {"index": 1, "score": 0.9},
            ],
            (),
            "s.jsonl:4: index 1 is scored twice (lines 2 and 4)",
        ),
        (
            [{"index": 0, "score": 0.1, "anchor": "no"}, {"index": 1, "score": 0.2}, {"index": 2, "score": 0.9}],
            (),
            "s.jsonl:1: field 'anchor' must be true, false, null or the anchor's role ('easy', 'hard', 'mixed', "
            'as the cud scorer writes), got "no"',
        ),
        (
            [{"index": 0, "score": 0.1}, {"index": 1, "score": 0.2, "anchor": 0}, {"index": 2, "score": 0.9}],
            (),
            "s.jsonl:2: field 'anchor' must be true, false, null or the anchor's role ('easy', 'hard', 'mixed', "
            "as the cud scorer writes), got 0",
        ),
    ],
    ids=["nan", "-inf", "nan-objective", "objective-list", "duplicate-index", "anchor-no", "anchor-0"],
)
def test_stratify_refuses_scores_that_would_give_nonsense(rows, extra, message, tofu_dir, tmp_path, capsys):
    """NaN sorts anywhere: the same samples were easy and hard, and stratify.json held NaN. A
    duplicate index put one sample twice in a split. "no" is a true value in Python."""
    scores = score_file(tmp_path / "s.jsonl", rows)
    line = refused(capsys, tmp_path, *stratify_args(scores, tofu_dir, tmp_path / "strata", *extra))
    assert line == f"error: {scores.parent}/{message}"


def test_stratify_keeps_the_anchor_values_the_scorer_writes(tofu_dir, tmp_path, capsys):
    """true / false / null and the cud scorer's roles are still read: the anchors are dropped."""
    samples = load_split("tofu:forget01[0:4]", tofu_dir)
    rows = [
        {"index": 0, "score": 0.1, "anchor": "easy"},
        {"index": 1, "score": 0.2, "anchor": False},
        {"index": 2, "score": 0.9, "anchor": True},
        {"index": 3, "score": 0.5, "anchor": None},
    ]
    scores = score_file(tmp_path / "s.jsonl", rows)
    assert main(stratify_args(scores, tofu_dir, tmp_path / "strata")) == 0
    data = json.loads((tmp_path / "strata" / "stratify.json").read_text())
    assert data["dropped_anchors"] == [0, 2]
    assert data["easy"] == [{"index": 1, "score": 0.2}] and data["hard"] == [{"index": 3, "score": 0.5}]
    assert load_split(str(tmp_path / "strata" / "hard.json"))[0].question == samples[3].question
    assert "dropped 2 of 4 rows" in capsys.readouterr().out


# ----------------------------------------------------------------------------- finetune --authors


def finetune_args(model_dir: Path, tofu_dir: Path, out: Path, *extra) -> list:
    """`unlearn finetune` on TOFU's forget01 authors."""
    return ["finetune", "--model", model_dir, "--data", "tofu:forget01", "--tofu-dir", tofu_dir, "--out", out, *extra]


@pytest.mark.parametrize(
    "authors,message",
    [
        ("0,0", "option 'authors' lists author 0 more than once ([0, 0])"),
        ("1,0,1,0", "option 'authors' lists authors 0, 1 more than once ([1, 0, 1, 0])"),
    ],
)
def test_finetune_refuses_an_author_given_twice(authors, message, tiny_model_dir, tofu_dir, tmp_path, capsys):
    """`--authors 0,0` trained on author 0's 20 QA twice (40 samples, exit 0)."""
    line = refused(capsys, tmp_path, *finetune_args(tiny_model_dir, tofu_dir, tmp_path / "ft", "--authors", authors))
    assert line == f"error: {message}: their samples would be trained on repeatedly; give each author once"


def test_finetune_refuses_an_author_given_twice_in_a_config_file(tiny_model_dir, tofu_dir, tmp_path, capsys):
    config = tmp_path / "ft.toml"
    config.write_text("authors = [1, 1]\n")
    line = refused(capsys, tmp_path, *finetune_args(tiny_model_dir, tofu_dir, tmp_path / "ft", "--config", config))
    assert line == (
        "error: option 'authors' lists author 1 more than once ([1, 1]): their samples would be trained on "
        "repeatedly; give each author once"
    )


# ----------------------------------------------------------------------------- MovieLens cut mid-line


def grouplens(folder: Path) -> str:
    """u.item, and the text of a u.data of made-up ratings (returned; u.data is written again by
    each test)."""
    return (write_grouplens(folder) / "u.data").read_text()


@pytest.mark.parametrize("kept", [1, 9], ids=["timestamp-cut", "line-end-missing"])
def test_a_ratings_file_cut_mid_line_is_refused(kept, tmp_path, capsys):
    """The last line of a cut u.data still parsed: ``10\\t14\\t5\\t8`` is a rating of 1970.
    MovieLens' files end every line, so a last line without its line end is refused, naming the
    file and line (also when only the line end is missing: it cannot be told apart)."""
    folder = tmp_path / "ml"
    ratings = grouplens(folder)
    last = ratings.splitlines()[-1]
    stamp = last.split("\t")[-1]
    assert len(stamp) == 9
    (folder / "u.data").write_text(ratings[: len(ratings) - 1 - len(stamp)] + stamp[:kept])
    n = len(ratings.splitlines())
    line = refused(capsys, tmp_path, "movielens", "--movielens-dir", folder, "--out", tmp_path / "bench")
    assert line == (
        f"error: {folder / 'u.data'}:{n}: the last line has no line end: the file looks cut off mid-line (an "
        "interrupted download or copy), so the line may be a fragment; get the whole file again, or end the "
        "line with a newline if it is complete"
    )


def test_a_whole_ratings_file_is_read(tmp_path, capsys):
    folder = tmp_path / "ml"
    ratings = grouplens(folder)
    (folder / "u.data").write_text(ratings)
    assert main(["movielens", "--movielens-dir", str(folder), "--out", str(tmp_path / "bench")]) == 0
    assert "MovieLens benchmark (grouplens-100k, 10 users" in capsys.readouterr().out
