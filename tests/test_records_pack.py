"""Packed records (`unlearn records pack DIR`): a study's records stored in one xz-compressed
tar, read as the loose files were. Packing and unpacking give back the same files, a pack of the
same files is the same bytes, a run restores a packed stage as it restores a loose one, and a
truncated or damaged pack is one `error:` line naming it, with nothing changed. The committed
studies under bench/results are packed (their reports regenerate from the packs:
tests/test_study_records.py)."""

from __future__ import annotations

import json
import lzma
import os
import shutil
from pathlib import Path

import pytest

from unlearn_plugins.cli import main
from unlearn_plugins.errors import UnlearnError
from unlearn_plugins.study import records as ledger
from unlearn_plugins.study.cells import CellPlan, Plan, Stage
from unlearn_plugins.study.spec import Cell

ROOT = Path(__file__).resolve().parents[1]
#: the committed studies' records, each packed
COMMITTED = ("reglu_tofu", "reglu_tofu_v2", "cud_stratification", "cud_stratification_v2")


def snapshot(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def make_records(root: Path) -> Path:
    """A records folder as a study leaves it: an evaluation stage, a sweep run's trace and
    resources, and a stage marker."""
    evaluation = root / "eval-grad_diff-forget1-seed0-0123456789ab"
    (evaluation / "grad_diff-forget1-seed0-evaluate").mkdir(parents=True)
    (evaluation / "grad_diff-forget1-seed0-evaluate" / "results_2026-01-01T00-00-00.json").write_text(
        json.dumps({"results": {}, "unlearn_summary": {"forget_quality": 0.25}})
    )
    (evaluation / "grad_diff-forget1-seed0-evaluate" / "samples_tofu_forget_prob_2026.jsonl").write_text(
        "".join(json.dumps({"doc_id": i, "prob": i / 10}) + "\n" for i in range(5))
    )
    (evaluation / "resources.json").write_text(json.dumps({"seconds": 12.5, "peak_rss_mb": 800.0}))
    (evaluation / "stage.json").write_text("{}")
    sweep = root / "run-ihl-author12-abcdef012345"
    (sweep / "trace").mkdir(parents=True)
    (sweep / "trace" / "trace.jsonl").write_bytes(b'{"epoch": 1, "forget_quality": 0.5}\n\xc3\xa9\n')
    (sweep / "resources.json").write_text(json.dumps({"seconds": 3.0, "device_type": "cpu", "dtype": "float32"}))
    return root


def test_packing_and_unpacking_give_back_the_same_files(tmp_path):
    records = make_records(tmp_path / "records")
    before = snapshot(records)

    made = ledger.pack(records)
    assert made is not None and made.parent == records
    assert made.name.startswith("records-") and made.name.endswith(".tar.xz") and len(made.name) == 27
    assert [p.name for p in records.iterdir()] == [made.name]  # the loose files and their folders are gone
    assert ledger.loose_files(records) == [] and ledger.packs(records) == [made]
    assert snapshot(ledger.unpacked(records)) == before
    stage = ledger.stage_record(records, "eval-grad_diff-forget1-seed0-0123456789ab")
    assert snapshot(stage) == {k.split("/", 1)[1]: v for k, v in before.items() if k.startswith("eval-")}
    assert ledger.shown(stage / "stage.json") == f"{made}:eval-grad_diff-forget1-seed0-0123456789ab/stage.json"
    assert ledger.identities(records) == {("cpu", "float32")}
    assert ledger.pack(records) is None  # nothing loose

    # a resumed run writes loose records beside the pack; packing again adds a pack
    (records / "eval-later-ffffffffffff").mkdir()
    (records / "eval-later-ffffffffffff" / "stage.json").write_text('{"later": true}')
    second = ledger.pack(records)
    assert second is not None and sorted(ledger.packs(records)) == sorted([made, second])
    everything = {**before, "eval-later-ffffffffffff/stage.json": b'{"later": true}'}
    assert snapshot(ledger.unpacked(records)) == everything

    assert sorted(ledger.unpack(records)) == sorted(everything)
    assert snapshot(records) == everything and ledger.packs(records) == []


def test_the_same_files_pack_to_the_same_bytes(tmp_path):
    one = make_records(tmp_path / "one")
    two = tmp_path / "two"
    shutil.copytree(one, two)
    for path in two.rglob("*"):
        os.utime(path, (1_000_000, 1_000_000))  # other times, same files
    a, b = ledger.pack(one), ledger.pack(two)
    assert a.name == b.name and a.read_bytes() == b.read_bytes()


def test_a_loose_copy_of_a_packed_file(tmp_path):
    """The same file loose and packed (an interrupted pack, say) is dropped when packing; a
    different one is an error naming it, and nothing changes."""
    records = make_records(tmp_path / "records")
    made = ledger.pack(records)
    ledger.unpack(records)
    ledger.pack(records)  # the same files again: the same pack
    assert ledger.packs(records) == [made] and ledger.loose_files(records) == []
    (records / "run-ihl-author12-abcdef012345").mkdir()
    (records / "run-ihl-author12-abcdef012345" / "resources.json").write_text('{"seconds": 4.0}')
    with pytest.raises(UnlearnError, match=r"resources.json: differs from its copy in .*records-.*tar.xz"):
        ledger.pack(records)
    assert ledger.packs(records) == [made] and ledger.loose_files(records) == [
        "run-ihl-author12-abcdef012345/resources.json"
    ]
    # read, the loose copy wins
    assert (ledger.stage_record(records, "run-ihl-author12-abcdef012345") / "resources.json").read_text() == (
        '{"seconds": 4.0}'
    )


def test_a_run_restores_a_packed_stage_as_a_loose_one(tmp_path):
    cache = tmp_path / "cache"
    stage = cache / "eval-grad_diff-forget1-seed0-0123456789ab"
    shutil.copytree(make_records(tmp_path / "made") / stage.name, stage)
    cell = Cell("grad_diff/forget1/seed0", "method", "grad_diff, forget 1, seed 0", forget=1)
    cp = CellPlan(cell, [Stage("evaluate", str(stage), "evaluate", {})], result=str(stage))
    records = tmp_path / "records"
    assert ledger.save(cp, records) == [stage.name]
    loose = snapshot(records)
    ledger.pack(records)
    assert ledger.save(cp, records) == []  # recorded already (in the pack)
    assert ledger.loose_files(records) == []

    other = tmp_path / "elsewhere" / stage.name
    cp.stages[0].folder = str(other)
    plan = Plan(study=None, cache=other.parent, device=None, benches={}, cells={cell.id: cp})
    assert ledger.restore(plan, records) == [stage.name]
    assert snapshot(other) == {k.split("/", 1)[1]: v for k, v in loose.items()}


def test_an_author_study_reads_its_packed_records_as_its_loose_ones(tmp_path, capsys):
    """tests/author_records.py's study (operating points, sweep traces, evaluations): `--dry-run`
    and `--report-only` from its packed records print and write what they do from the loose ones."""
    from author_records import STUDY, write_records

    path = tmp_path / "study.toml"
    path.write_text(STUDY)
    loose, packed = tmp_path / "loose", tmp_path / "packed"
    write_records(path, loose, tmp_path / "scratch")
    shutil.copytree(loose, packed)
    assert ledger.pack(packed) is not None and ledger.loose_files(packed) == []
    seen = {}
    for name, records in (("loose", loose), ("packed", packed)):
        cache, out = tmp_path / f"cache-{name}", tmp_path / f"out-{name}"
        assert main(["study", str(path), "--dry-run", "--records", str(records), "--cache-dir", str(cache)]) == 0
        dry = capsys.readouterr().out.replace(str(cache), "CACHE")
        code = main(
            ["study", str(path), "--report-only", "--records", str(records), "--cache-dir", str(cache)]
            + ["--out", str(out)]
        )
        assert code == 0, capsys.readouterr().err[-2000:]
        capsys.readouterr()
        report = {
            k: v.replace(str(cache).encode(), b"CACHE").replace(str(out).encode(), b"OUT")
            for k, v in snapshot(out).items()
        }
        seen[name] = dry, report
    assert "28 recorded" in seen["loose"][0] and seen["packed"] == seen["loose"]


def _truncated(pack: Path) -> None:
    pack.write_bytes(pack.read_bytes()[: pack.stat().st_size // 2])


def _one_byte_changed(pack: Path) -> None:
    data = bytearray(pack.read_bytes())
    data[len(data) // 2] ^= 0xFF
    pack.write_bytes(bytes(data))


def _last_bytes_cut(pack: Path) -> None:  # the tar is whole, the xz stream's end is not
    pack.write_bytes(pack.read_bytes()[:-8])


def _escaping_member(pack: Path) -> None:
    import io
    import tarfile

    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        info = tarfile.TarInfo("../outside.json")
        info.size = 2
        tar.addfile(info, io.BytesIO(b"{}"))
    pack.write_bytes(lzma.compress(buffer.getvalue()))


DAMAGE = {
    "truncated": (_truncated, "LZMAError: Compressed data ended before the end-of-stream marker was reached"),
    "its last bytes cut": (_last_bytes_cut, "LZMAError: Compressed data ended before the end-of-stream marker"),
    "one byte changed": (_one_byte_changed, "LZMAError: "),
    "empty": (lambda pack: pack.write_bytes(b""), "LZMAError: "),
    "not xz": (lambda pack: pack.write_text("version https://git-lfs.github.com/spec/v1\n"), "LZMAError: "),
    "a member outside the folder": (_escaping_member, "'../outside.json' is not a plain file under the records"),
}


@pytest.mark.parametrize("damage", list(DAMAGE))
def test_a_damaged_pack_is_one_error_naming_it(damage, tmp_path, capsys):
    records = make_records(tmp_path / "records")
    made = ledger.pack(records)
    damage_it, why = DAMAGE[damage]
    damage_it(made)
    before = snapshot(tmp_path)
    for command in (["records", "unpack", str(records)], ["records", "pack", str(records)]):
        assert main(command) == 1
        err = capsys.readouterr().err
        assert "Traceback" not in err
        (line,) = err.strip().splitlines()
        assert line.startswith(f"error: {made}: the records pack cannot be read, it is truncated or damaged (")
        assert why in line and line.endswith("or remove it to rebuild the records it held")
        assert snapshot(tmp_path) == before  # nothing written, nothing removed


def test_a_study_with_a_truncated_pack_is_one_error_naming_it(tmp_path, capsys, tofu_dir, monkeypatch):
    """`unlearn study reglu_tofu --report-only --records DIR`, DIR's pack cut short: one line."""
    monkeypatch.setenv("UNLEARN_TOFU_DIR", str(tofu_dir))
    records = tmp_path / "records"
    records.mkdir()
    (committed,) = ledger.packs(ROOT / "bench" / "results" / "reglu_tofu")
    shutil.copyfile(committed, records / committed.name)
    _truncated(records / committed.name)
    out = tmp_path / "out"
    code = main(
        ["study", "reglu_tofu", "--report-only", "--records", str(records), "--out", str(out)]
        + ["--cache-dir", str(tmp_path / "cache")]
    )
    err = capsys.readouterr().err
    assert code == 1 and "Traceback" not in err
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert errors == [err.strip().splitlines()[-1]]
    assert errors[0].startswith(f"error: {records / committed.name}: the records pack cannot be read, it is truncated")
    assert not out.exists()


def test_pack_names_a_missing_folder(tmp_path, capsys):
    assert main(["records", "pack", str(tmp_path / "missing")]) == 1
    assert capsys.readouterr().err.strip() == f"error: {tmp_path / 'missing'}: no such records folder"


@pytest.mark.parametrize("study", COMMITTED)
def test_the_committed_records_are_packed(study):
    """Each committed study's records are one pack, no loose file (`unlearn records pack` after a
    run), and the pack reads."""
    folder = ROOT / "bench" / "results" / study
    assert len(ledger.packs(folder)) == 1 and ledger.loose_files(folder) == []
    assert ledger.unpacked(folder) != folder and any(ledger.unpacked(folder).iterdir())
