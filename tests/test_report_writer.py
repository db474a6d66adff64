"""The one report writer: every file of a report written together, or none of them."""

from __future__ import annotations

import json

import pytest

from unlearn_plugins.errors import UnlearnError
from unlearn_plugins.study.report_writer import Report, Section, text_file, write


def _report(plot) -> Report:
    return Report({"n": 1}, [Section(["# Study", ""]), Section(["![plot](plot.png)"], {"plot.png": plot})])


def test_a_report_is_its_record_summary_and_section_files(tmp_path):
    files = write(tmp_path, _report(text_file("png")))
    assert sorted(files) == ["plot.png", "study.json", "summary.md"]
    assert json.loads((tmp_path / "study.json").read_text()) == {"n": 1}
    assert (tmp_path / "summary.md").read_text() == "# Study\n\n![plot](plot.png)"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["plot.png", "study.json", "summary.md"]


@pytest.mark.parametrize("fault", [OSError(28, "No space left on device"), KeyboardInterrupt()])
def test_a_failed_write_leaves_the_previous_report_and_no_temporary(tmp_path, fault):
    write(tmp_path, _report(text_file("old")))
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}

    def failing(path):
        path.write_text("half")
        raise fault

    kind = UnlearnError if isinstance(fault, OSError) else KeyboardInterrupt
    with pytest.raises(kind):
        write(tmp_path, Report({"n": 2}, [Section(["new"], {"plot.png": failing})]))
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before
