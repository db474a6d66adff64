"""The TOFU-style benchmark of the demo and the studies: N authors (20 QA each), the last ``n_forget`` of them
to forget and the rest to retain, written as a folder in TOFU's format that every other
part of the project reads (``unlearn finetune --data``, ``unlearn run --forget``, the
``tofu_*`` lm-eval tasks with ``tofu_dir`` = this folder).

Files: ``full.json`` (all N authors, to train the "full" model), ``retain.json`` (the
retain authors: the "retain" model and the unlearning retain set), ``forget.json`` (with
the paraphrased/perturbed answers the truth ratio needs), and for Model Utility
``retain_perturbed.json`` (``eval_size`` retain QA, spread over the retain authors),
``real_authors_perturbed.json`` and ``world_facts_perturbed.json`` (the first
``eval_size`` rows).

Source: TOFU's ``forget10_perturbed`` split (authors 180-199, the only authors with every
field), taking the last N: from a configured TOFU folder (``--tofu-dir``, ``UNLEARN_TOFU_DIR``),
else from the subset shipped in the package (``tofu_subset/``: authors 197-199 and the first
20 real-authors / world-facts QA, TOFU's MIT licence beside them), else (more authors than it
has) from the hub copy; without TOFU, the generated fictitious authors of
:mod:`unlearn_plugins.data.synthetic`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from unlearn_plugins.data.qa import QA_PER_AUTHOR, configured_tofu_dir, read_jsonl, resolve_tofu_dir
from unlearn_plugins.errors import DataError, UnlearnError
from unlearn_plugins.files import file_digest, write_json, write_jsonl

SOURCE_AUTHORS_SPLIT = "forget10_perturbed"
FORMAT = 1
#: real TOFU shipped in the package: the demo's authors need no set-up (README.md and LICENSE there)
SHIPPED_TOFU = Path(__file__).resolve().parent / "tofu_subset"
#: where it was before it moved here (the demo's package, then unlearn_plugins/data/): benchmark
#: folders built then name it
FORMER_SHIPPED_TOFU = (("unlearn_plugins", "demo", "tofu_subset"), ("unlearn_plugins", "data", "tofu_subset"))
#: its authors file: the last lines of TOFU's forget10_perturbed.json (authors 197-199)
SHIPPED_AUTHORS_FILE = "authors_197-199_perturbed.json"
#: and the author before them (196): the holdout of `unlearn demo --robustness`
SHIPPED_HOLDOUT_FILE = "author_196_perturbed.json"
#: TOFU file -> the shipped subset's file holding its first lines (Model Utility's options sets)
SHIPPED_OPTIONS_FILES = {
    "real_authors_perturbed": "real_authors_1-20_perturbed.json",
    "world_facts_perturbed": "world_facts_1-20_perturbed.json",
}


@dataclass
class Benchmark:
    folder: Path
    source: str  # "tofu" or "generated"
    source_dir: str | None
    authors: list[int]  # author numbers in the source
    forget_authors: list[int]
    retain_authors: list[int]
    sizes: dict[str, int]

    @property
    def forget(self) -> Path:
        return self.folder / "forget.json"

    @property
    def retain(self) -> Path:
        return self.folder / "retain.json"

    @property
    def full(self) -> Path:
        return self.folder / "full.json"

    def describe(self) -> dict:
        if self.source != "tofu":
            where = "generated fictitious authors"
        elif self.source_dir and (
            Path(self.source_dir) == SHIPPED_TOFU or Path(self.source_dir).parts[-3:] in FORMER_SHIPPED_TOFU
        ):
            where = "TOFU (the subset shipped with unlearn-plugins: authors 197-199, real authors, world facts)"
        else:
            where = f"TOFU ({self.source_dir})"
        return {
            "source": self.source,
            "source_dir": self.source_dir,
            "description": where,
            "authors": self.authors,
            "forget_authors": self.forget_authors,
            "retain_authors": self.retain_authors,
            "sizes": self.sizes,
        }


def authors_file(tofu: Path) -> Path:
    """The file a TOFU folder's demo authors come from: TOFU's forget10_perturbed.json
    (authors 180-199), or in the shipped subset its last three authors."""
    full = tofu / f"{SOURCE_AUTHORS_SPLIT}.json"
    shipped = tofu / SHIPPED_AUTHORS_FILE
    return shipped if not full.is_file() and shipped.is_file() else full


def options_file(tofu: Path, split: str) -> Path:
    """A TOFU folder's ``real_authors_perturbed`` / ``world_facts_perturbed`` file, or in the
    shipped subset the file with its first lines."""
    full = tofu / f"{split}.json"
    shipped = tofu / SHIPPED_OPTIONS_FILES[split]
    return shipped if not full.is_file() and shipped.is_file() else full


def shipped_authors() -> int:
    """How many authors the shipped subset has."""
    return len(read_jsonl(SHIPPED_TOFU / SHIPPED_AUTHORS_FILE)) // QA_PER_AUTHOR


def find_tofu(data: str, tofu_dir: str | None, authors: int | None = None) -> Path | None:
    """The TOFU folder to use, or None for the generated data. ``data``: auto | tofu | generated.

    A configured folder (``tofu_dir``, else UNLEARN_TOFU_DIR) wins; with none, the subset shipped
    in the package when it has the ``authors`` asked for, else the hub copy (``authors`` None:
    the hub copy, and offline the shipped subset)."""
    if data == "generated":
        return None
    try:
        folder = configured_tofu_dir(tofu_dir)
        if folder is None:
            if authors is not None and authors <= shipped_authors():
                return SHIPPED_TOFU
            try:
                folder = resolve_tofu_dir(None)  # the hub copy
            except DataError as exc:
                if authors is None:
                    return SHIPPED_TOFU
                raise DataError(
                    f"--authors {authors}: the TOFU subset shipped with the package has "
                    f"{shipped_authors()} authors; for more, {exc}"
                ) from None
    except DataError:
        if data == "tofu":
            raise
        return None
    if not authors_file(folder).is_file():
        if data == "tofu":
            raise DataError(
                f"{folder}: TOFU's {SOURCE_AUTHORS_SPLIT}.json is missing (the demo takes its authors from it)"
            )
        return None
    return folder


def source_fingerprint(tofu: Path | None) -> str:
    """Changes when the source data changes (another TOFU copy, a new generator version)."""
    if tofu is None:
        from unlearn_plugins.data import synthetic

        return f"generated-{file_digest(Path(synthetic.__file__))}"
    parts = [
        file_digest(path)
        for path in (authors_file(tofu), *(options_file(tofu, split) for split in SHIPPED_OPTIONS_FILES))
    ]
    return "tofu-" + "-".join(parts)


def _rows(path: Path, require=("question", "answer")) -> list[dict]:
    return [s.to_record() for s in read_jsonl(path, require=require)]


def build_benchmark(
    folder: str | Path,
    *,
    tofu: Path | None,
    n_authors: int,
    n_forget: int,
    eval_size: int,
    forget_ids: list[int] | None = None,
) -> Benchmark:
    """Write the benchmark folder (atomic files) and return its description. ``forget_ids``: the
    authors to forget by their number in the source (TOFU's author id; ``n_forget`` of them), in
    place of the last ``n_forget`` (an author-unit study forgets each of its authors alone)."""
    if n_authors < 2:
        raise UnlearnError(f"the demo needs at least 2 authors (1 to forget, 1 to retain), got --authors {n_authors}")
    if not 1 <= n_forget < n_authors:
        raise UnlearnError(f"forget authors must be between 1 and --authors - 1 ({n_authors - 1}), got {n_forget}")
    if eval_size < 2:
        raise UnlearnError(f"eval_size must be >= 2, got {eval_size}")
    folder = Path(folder)
    if tofu is not None:
        rows = _rows(authors_file(tofu), require=("question", "answer", "paraphrased_answer", "perturbed_answer"))
        available = len(rows) // QA_PER_AUTHOR
        first_author = 200 - available  # both files end with TOFU's last author (199)
        real, world = (
            _rows(options_file(tofu, split), require=("question", "answer", "perturbed_answer"))
            for split in SHIPPED_OPTIONS_FILES
        )
        for split, items in zip(SHIPPED_OPTIONS_FILES, (real, world)):
            # a full TOFU file is capped at what it has (100 real-author, 117 world-fact QA); the
            # shipped subset is not TOFU's whole file, so asking it for more is an error
            path = options_file(tofu, split)
            if len(items) < eval_size and path.name == SHIPPED_OPTIONS_FILES[split]:
                raise DataError(
                    f"{path}: {len(items)} QA, fewer than the {eval_size} Model "
                    "Utility needs (eval_size); point UNLEARN_TOFU_DIR at a full TOFU folder"
                )
        source, source_dir = "tofu", str(tofu)
    else:
        from unlearn_plugins.data import synthetic

        rows = synthetic.generate_authors(synthetic.N_AUTHORS)
        available, first_author = len(rows) // QA_PER_AUTHOR, 0
        real, world = synthetic.options_rows(synthetic.REAL_AUTHORS), synthetic.options_rows(synthetic.WORLD_FACTS)
        source, source_dir = "generated", None
    if n_authors > available:
        raise UnlearnError(f"--authors {n_authors}: the {source} source has {available} authors with every field")
    chosen = list(range(available - n_authors, available))  # the last N
    by_author = {a: rows[a * QA_PER_AUTHOR : (a + 1) * QA_PER_AUTHOR] for a in chosen}
    if forget_ids is None:
        forget_ids, retain_ids = chosen[-n_forget:], chosen[:-n_forget]
    else:
        wanted = [a - first_author for a in forget_ids]
        if len(set(wanted)) != n_forget or not set(wanted) <= set(chosen):
            raise UnlearnError(
                f"forget authors {forget_ids}: must be {n_forget} distinct authors of the benchmark's "
                f"{first_author + chosen[0]}-{first_author + chosen[-1]}"
            )
        forget_ids, retain_ids = wanted, [a for a in chosen if a not in wanted]
    forget = [r for a in forget_ids for r in by_author[a]]
    retain = [r for a in retain_ids for r in by_author[a]]
    # Model Utility's retain part: eval_size QA spread evenly over the retain authors
    step = max(1, len(retain) // eval_size)
    retain_eval = retain[::step][:eval_size]
    files = {
        "full.json": [r for a in chosen for r in by_author[a]],
        "retain.json": retain,
        "forget.json": forget,
        "retain_perturbed.json": retain_eval,
        "real_authors_perturbed.json": real[:eval_size],
        "world_facts_perturbed.json": world[:eval_size],
    }
    for name, items in files.items():
        write_jsonl(folder / name, items)
    bench = Benchmark(
        folder,
        source,
        source_dir,
        [first_author + a for a in chosen],
        [first_author + a for a in forget_ids],
        [first_author + a for a in retain_ids],
        {name.removesuffix(".json"): len(items) for name, items in files.items()},
    )
    write_json(folder / "benchmark.json", {"format": FORMAT, **bench.describe()})
    return bench


def build_holdout(path: str | Path, *, tofu: Path | None, n_authors: int) -> dict:
    """Write ``path``: the 20 QA of the author just before the benchmark's N (in no model's
    training data), the holdout split membership inference compares the forget split with; when
    a TOFU folder's 20 forget10 authors are all in the benchmark, TOFU's author 179 (retain90's
    last). Returns {"author": its number in the source, "size": QA}."""
    if tofu is not None and authors_file(tofu).name == SHIPPED_AUTHORS_FILE:
        if n_authors > shipped_authors():
            raise UnlearnError(f"--authors {n_authors}: the shipped TOFU subset has {shipped_authors()} authors")
        if n_authors < shipped_authors():  # an unused shipped author comes first
            rows = _rows(tofu / SHIPPED_AUTHORS_FILE)
            start = (shipped_authors() - n_authors - 1) * QA_PER_AUTHOR
            rows, author = rows[start : start + QA_PER_AUTHOR], 200 - n_authors - 1
        else:
            rows, author = _rows(tofu / SHIPPED_HOLDOUT_FILE), 196
    else:
        if tofu is not None:
            rows = _rows(authors_file(tofu))
            available = len(rows) // QA_PER_AUTHOR
            first_author = 200 - available  # the file ends with TOFU's last author (199)
        else:
            from unlearn_plugins.data import synthetic

            rows = synthetic.generate_authors(synthetic.N_AUTHORS)
            available, first_author = len(rows) // QA_PER_AUTHOR, 0
        index = available - n_authors - 1
        retain90 = tofu / "retain90.json" if tofu is not None else None
        if index < 0 and retain90 is not None and retain90.is_file():  # every forget10 author is used:
            rows, first_author = _rows(retain90), 0  # TOFU's authors 0-179, in order
            index += len(rows) // QA_PER_AUTHOR
        if index < 0:
            raise UnlearnError(
                f"--robustness: the benchmark uses all {available} authors of its source; membership inference "
                f"needs one more as the holdout (use --authors {available - 1} or fewer)"
            )
        rows, author = rows[index * QA_PER_AUTHOR : (index + 1) * QA_PER_AUTHOR], first_author + index
    write_jsonl(Path(path), rows)
    return {"author": author, "size": len(rows)}


def generation_cap(tokenizer, bench: Benchmark, margin: int) -> int:
    """max_gen_toks for the ROUGE tasks: the longest reference answer they score, plus ``margin``."""
    longest = 0
    for name in ("forget", "retain_perturbed", "real_authors_perturbed", "world_facts_perturbed"):
        for sample in read_jsonl(bench.folder / f"{name}.json"):
            longest = max(longest, len(tokenizer(sample.answer, add_special_tokens=False)["input_ids"]))
    return longest + 1 + margin  # + the end token


def load_benchmark(folder: str | Path) -> Benchmark | None:
    """A benchmark folder written earlier, or None if it is missing or incomplete."""
    folder = Path(folder)
    try:
        info = json.loads((folder / "benchmark.json").read_text())
    except (OSError, ValueError):
        return None
    if info.get("format") != FORMAT or not all((folder / f"{n}.json").is_file() for n in info.get("sizes", {})):
        return None
    return Benchmark(
        folder,
        info["source"],
        info["source_dir"],
        info["authors"],
        info["forget_authors"],
        info["retain_authors"],
        info["sizes"],
    )
