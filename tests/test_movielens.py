"""MovieLens loading in its three layouts (made-up rows written here), its errors, and the
real MovieLens-100K from recbole's wheel when it is installed."""

from __future__ import annotations

import pytest

from unlearn_plugins.benchmarks.movielens.data import ENV_VAR, load_movielens, recbole_ml100k_dir, split_title_year
from unlearn_plugins.errors import DataError

# Made-up rows: 3 users, 4 movies (titles invented for the tests).
FLAGS = "|".join(["0"] * 19)


def flags(*on: int) -> str:
    values = ["0"] * 19
    for i in on:
        values[i] = "1"
    return "|".join(values)


def given(value: str | None, default: str) -> str:
    """``value``, or ``default`` where none is given (an empty text is a given one)."""
    return default if value is None else value


ITEM_100K = (
    f"1|Brass Lanterns (1994)|01-Jan-1994||http://x|{flags(1, 5)}\n"
    f"2|Caf\xe9 Nights (1996)|01-Jan-1996||http://x|{flags(8)}\n"
    f"3|Untitled Reel|01-Jan-1990||http://x|{flags(0)}\n"
    f"4|Paper Moons, The (1997)|01-Jan-1997||http://x|{flags(5, 14)}\n"
)
DATA_100K = "7\t1\t5\t880000003\n7\t2\t2\t880000001\n9\t3\t4\t880000002\n9\t4\t1\t880000009\n11\t1\t3\t880000005\n"
MOVIES_1M = "1::Brass Lanterns (1994)::Action|Comedy\n2::Caf\xe9 Nights (1996)::Drama\n"
RATINGS_1M = "1::2::4::978300760\n2::1::3::978302109\n"
ITEM_RECBOLE = (
    "item_id:token\tmovie_title:token_seq\trelease_year:token\tclass:token_seq\n"
    "1\tBrass Lanterns\t1994\tAction Comedy\n2\tCafé Nights\t1996\tDrama\n"
)
INTER_RECBOLE = "user_id:token\titem_id:token\trating:float\ttimestamp:float\n5\t1\t4\t881250949\n6\t2\t2\t881250950\n"


def write_100k(folder, *, data=None, item=None):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "u.item").write_bytes(given(item, ITEM_100K).encode("latin-1"))
    (folder / "u.data").write_text(given(data, DATA_100K))
    return folder


def write_1m(folder, *, ratings=None, movies=None):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "movies.dat").write_bytes(given(movies, MOVIES_1M).encode("latin-1"))
    (folder / "ratings.dat").write_text(given(ratings, RATINGS_1M))
    return folder


def write_recbole(folder, *, inter=None, item=None):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "toy.item").write_text(given(item, ITEM_RECBOLE))
    (folder / "toy.inter").write_text(given(inter, INTER_RECBOLE))
    return folder


def test_grouplens_100k_layout(tmp_path):
    ml = load_movielens(write_100k(tmp_path / "ml"))
    assert ml.layout == "grouplens-100k"
    assert len(ml.ratings) == 5 and ml.users == [7, 9, 11]
    assert ml.movies[1].title == "Brass Lanterns" and ml.movies[1].year == 1994
    assert ml.movies[1].genres == ("Action", "Comedy")
    assert ml.movies[2].title == "Café Nights"  # Latin-1 decoded
    assert ml.movies[3].year == 1990 and ml.movies[3].label == "Untitled Reel (1990)"  # year from the release date
    assert ml.movies[4].label == "Paper Moons, The (1997)"
    first = ml.ratings[0]
    assert (first.user_id, first.item_id, first.rating, first.timestamp, first.line) == (7, 1, 5.0, 880000003, 1)


def test_grouplens_1m_layout(tmp_path):
    ml = load_movielens(write_1m(tmp_path / "ml"))
    assert ml.layout == "grouplens-1m"
    assert [(r.user_id, r.item_id, r.rating) for r in ml.ratings] == [(1, 2, 4.0), (2, 1, 3.0)]
    assert ml.movies[1].genres == ("Action", "Comedy") and ml.movies[2].label == "Café Nights (1996)"


def test_recbole_atomic_layout(tmp_path):
    ml = load_movielens(write_recbole(tmp_path / "ml"))
    assert ml.layout == "recbole"
    assert ml.movies[1].label == "Brass Lanterns (1994)" and ml.movies[2].genres == ("Drama",)
    assert [(r.user_id, r.rating, r.line) for r in ml.ratings] == [(5, 4.0, 2), (6, 2.0, 3)]


def test_folder_from_environment(tmp_path, monkeypatch):
    monkeypatch.setenv(ENV_VAR, str(write_1m(tmp_path / "ml")))
    assert load_movielens().layout == "grouplens-1m"


@pytest.mark.parametrize(
    "title, expected",
    [
        ("Toy Story (1995)", ("Toy Story", 1995)),
        (
            "City of Lost Children, The (Cité des enfants perdus, La) (1995)",
            ("City of Lost Children, The (Cité des enfants perdus, La)", 1995),
        ),
        ("unknown", ("unknown", None)),
    ],
)
def test_split_title_year(title, expected):
    assert split_title_year(title) == expected


@pytest.mark.parametrize(
    "writer, kwargs, expected",
    [
        (
            write_100k,
            {"data": "7\t1\t5\n"},
            "u.data:1: expected 4 tab-separated fields (user id, item id, rating, timestamp), got 3",
        ),
        (
            write_100k,
            {"data": "7\t1\t5\t880000003\n7\tone\t5\t880000003\n"},
            "u.data:2: item id 'one' is not an integer",
        ),
        (write_100k, {"data": "7\t1\t9\t880000003\n"}, "u.data:1: rating 9 is outside MovieLens' 0-5 star range"),
        (write_100k, {"data": "7\t1\t4\tyesterday\n"}, "u.data:1: timestamp 'yesterday' is not a number"),
        (write_100k, {"data": "7\t99\t4\t880000003\n"}, "u.data:1: item id 99 is not a movie of"),
        (
            write_100k,
            {"item": f"1|A (1990)|||x|{FLAGS}\n1|B (1991)|||x|{FLAGS}\n"},
            "u.item:2: movie id 1 appears twice",
        ),
        (write_100k, {"item": "1|A (1990)|||x|0|1\n"}, "u.item:1: expected 19 genre flags after the url, got 2"),
        (write_100k, {"item": "1|A (1990)\n"}, "u.item:1: expected at least 5 '|'-separated fields"),
        (
            write_1m,
            {"ratings": "1::2::4\n"},
            "ratings.dat:1: expected 4 '::'-separated fields (user id, movie id, rating, timestamp), got 3",
        ),
        (write_1m, {"movies": "x::A (1990)::Drama\n"}, "movies.dat:1: movie id 'x' is not an integer"),
        (
            write_recbole,
            {"inter": "user:token\titem_id:token\n5\t1\n"},
            "toy.inter:1: the header has no column 'user_id'",
        ),
        (
            write_recbole,
            {"inter": "user_id:token\titem_id:token\trating:float\ttimestamp:float\n5\t1\t4\n"},
            "toy.inter:2: expected 4 tab-separated fields",
        ),
    ],
)
def test_malformed_lines_name_file_and_line(tmp_path, writer, kwargs, expected):
    folder = writer(tmp_path / "ml", **kwargs)
    with pytest.raises(DataError) as info:
        load_movielens(folder)
    assert expected in str(info.value)
    assert str(folder) in str(info.value)


def test_missing_files_say_what_to_install(tmp_path, monkeypatch):
    folder = write_1m(tmp_path / "half")
    (folder / "movies.dat").unlink()
    with pytest.raises(DataError, match=r"movies.dat: file not found .*pip install --no-deps recbole"):
        load_movielens(folder)
    (tmp_path / "empty").mkdir()
    with pytest.raises(DataError, match=r"empty: no MovieLens files found; install recbole's wheel"):
        load_movielens(tmp_path / "empty")
    with pytest.raises(DataError, match=r"MovieLens folder not found: .*nowhere \(from UNLEARN_MOVIELENS_DIR\)"):
        monkeypatch.setenv(ENV_VAR, str(tmp_path / "nowhere"))
        load_movielens()
    monkeypatch.delenv(ENV_VAR)
    import importlib.util

    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None)
    with pytest.raises(
        DataError, match=r"no MovieLens data: install recbole.s wheel, .*\(pip install --no-deps recbole"
    ):
        load_movielens()


def test_real_movielens_100k_from_recbole_wheel():
    if recbole_ml100k_dir() is None:
        pytest.skip("recbole's wheel is not installed (pip install --no-deps recbole)")
    ml = load_movielens(recbole_ml100k_dir())
    assert (len(ml.users), len(ml.movies), len(ml.ratings)) == (943, 1682, 100000)
    assert ml.movies[1].label == "Toy Story (1995)"
    assert {r.rating for r in ml.ratings} == {1.0, 2.0, 3.0, 4.0, 5.0}
