"""`unlearn records`: pack a study's records (`unlearn study --records DIR`) for a repository,
or unpack them. `pack` stores DIR's loose files in one compressed file,
DIR/records-<digest>.tar.xz, about 17 times smaller than the files and one file instead of
thousands, and removes them; `unlearn study --records DIR` reads packed and loose records alike,
and writes new ones loose beside the packs (pack again after the run). `unpack` puts the files
back in the loose layout and removes the packs (to remove one record, say). The format is in
docs/records.md."""

from __future__ import annotations

from .common import add_command

EXAMPLE = """examples:
  unlearn study reglu_tofu --records bench/results/reglu_tofu   # writes each finished cell loose
  unlearn records pack bench/results/reglu_tofu                 # then commit the pack
  unlearn records unpack bench/results/reglu_tofu               # the loose layout again
"""


def add_parser(sub) -> None:
    p = add_command(
        sub, "records", "pack a study's records into one compressed file (or unpack them)", __doc__, EXAMPLE
    )
    p.add_argument("action", choices=("pack", "unpack"), help="pack: the loose files into a new pack; unpack: back")
    p.add_argument("folders", nargs="+", metavar="DIR", help="a records folder (unlearn study --records DIR)")
    p.set_defaults(func=run)


def _size(n: int) -> str:
    return f"{n / 1e6:.1f} MB" if n >= 100_000 else f"{n / 1e3:.1f} kB"


def run(args) -> int:
    from pathlib import Path

    from ..study import records as ledger

    for folder in map(Path, args.folders):
        if args.action == "pack":
            files = ledger.loose_files(folder) if folder.is_dir() else []
            size = sum((folder / name).stat().st_size for name in files)
            made = ledger.pack(folder)
            if made is None:
                print(f"{folder}: nothing loose to pack (its packs: {len(ledger.packs(folder))})")
            else:
                print(f"{folder}: {len(files)} files ({_size(size)}) packed into {made} ({_size(made.stat().st_size)})")
        else:
            written = ledger.unpack(folder)
            print(f"{folder}: {len(written)} files unpacked, its packs removed")
    return 0
