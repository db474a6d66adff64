"""Every table the package prints or writes: aligned text for the terminal, Markdown pipe tables
for reports, and the padded Markdown that lm-eval's ``make_table`` prints (pytablewriter), used
for the tables shown right under lm-eval's own."""

from __future__ import annotations

from typing import Sequence


def text_table(header: Sequence[str], rows: Sequence[Sequence[str]], *, numbers_right: bool = True) -> str:
    """Columns padded to their widest cell under a dashed rule; with ``numbers_right`` every
    column but the first is right-aligned (columns of numbers). Trailing spaces are cut."""
    cells = [list(map(str, header)), *(list(map(str, r)) for r in rows)]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]

    def line(row: list[str]) -> str:
        return "  ".join(
            c.rjust(w) if numbers_right and i else c.ljust(w) for i, (c, w) in enumerate(zip(row, widths))
        ).rstrip()

    return "\n".join([line(cells[0]), "  ".join("-" * w for w in widths), *map(line, cells[1:])])


def markdown_cell(text: str) -> str:
    """Text for a cell of a Markdown pipe table: ``|`` escaped (it would start another column)
    and line breaks as spaces (they would end the row)."""
    return " ".join(str(text).replace("|", "\\|").splitlines())


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[str]], *, align: str = "") -> str:
    """A Markdown pipe table, cells as given (no padding); ``align``: a letter per column, ``r``
    for a right-aligned one (``---:``, columns of numbers), anything else or none for left."""
    rule = "".join("---:|" if align[i : i + 1] == "r" else "---|" for i in range(len(header)))
    lines = ["| " + " | ".join(map(str, header)) + " |", "|" + rule]
    lines += ["| " + " | ".join(map(str, r)) + " |" for r in rows]
    return "\n".join(lines)


def lm_eval_table(header: Sequence[str], rows: Sequence[Sequence]) -> str:
    """Markdown padded the way lm-eval's ``make_table`` pads it (pytablewriter, an lm-eval
    dependency), for tables printed beside lm-eval's."""
    from pytablewriter import MarkdownTableWriter

    writer = MarkdownTableWriter()
    writer.headers = list(header)
    writer.value_matrix = [list(r) for r in rows]
    return writer.dumps().rstrip("\n")


__all__ = ["text_table", "markdown_cell", "markdown_table", "lm_eval_table"]
