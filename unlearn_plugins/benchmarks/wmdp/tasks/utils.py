"""Data of the WMDP benchmark's own lm-eval tasks.

- ``wmdp_synthetic`` / ``wmdp_synthetic_cloze``: the synthetic "hazardous topic" questions
  (:mod:`unlearn_plugins.benchmarks.wmdp.synthetic`), from ``wmdp-synthetic.jsonl`` in metadata
  ``wmdp_synthetic_dir`` or ``$UNLEARN_WMDP_SYNTHETIC_DIR``, else generated with the default settings.
- ``wmdp_mmlu``: a fixed MMLU subset for utility (metadata ``mmlu_dir`` or ``$UNLEARN_MMLU_DIR``):
  the first ``mmlu_per_subject`` test questions of each of ``mmlu_subjects``.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

#: the MMLU subset: WMDP's paper reports MMLU's college biology, virology, college computer
#: science and computer security beside full MMLU (the subjects nearest the forget topics); four
#: unrelated subjects with short questions complete it (high school US history's passages would
#: make up a third of the subset's tokens)
MMLU_SUBJECTS = (
    "college_biology",
    "virology",
    "college_computer_science",
    "computer_security",
    "high_school_geography",
    "world_religions",
    "marketing",
    "nutrition",
)
MMLU_PER_SUBJECT = 20


def synthetic_questions(folder: str | None = None) -> list[dict[str, Any]]:
    """The synthetic questions (cais/wmdp schema) of ``folder``, else generated."""
    from unlearn_plugins.benchmarks.wmdp.synthetic import QUESTIONS, generate

    chosen = folder or os.environ.get("UNLEARN_WMDP_SYNTHETIC_DIR")
    if not chosen:
        return [{k: q[k] for k in ("question", "choices", "answer")} for q in generate()["questions"]]
    from unlearn_plugins.benchmarks.wmdp.data import read_wmdp_json
    from unlearn_plugins.errors import DataError

    path = Path(chosen).expanduser() / QUESTIONS
    if not path.is_file():
        raise DataError(
            f"wmdp_synthetic: {path} not found; write the folder with "
            "unlearn_plugins.benchmarks.wmdp.synthetic.write(FOLDER) or leave wmdp_synthetic_dir unset"
        )
    return read_wmdp_json(path)


def synthetic_dataset(*, wmdp_synthetic_dir: str | None = None, **_metadata: Any):
    """lm-eval ``custom_dataset``: the synthetic questions as {"test": ...}."""
    import datasets

    return datasets.DatasetDict({"test": datasets.Dataset.from_list(synthetic_questions(wmdp_synthetic_dir))})


def mmlu_subset(
    mmlu_dir: str | None = None,
    subjects: tuple[str, ...] | list[str] = MMLU_SUBJECTS,
    per_subject: int = MMLU_PER_SUBJECT,
) -> list[dict[str, Any]]:
    """The first ``per_subject`` test questions of each subject (with ``subject_name``)."""
    from unlearn_plugins.errors import DataError
    from unlearn_plugins.evaluation.local_data import read_mmlu_csv

    chosen = mmlu_dir or os.environ.get("UNLEARN_MMLU_DIR")
    if not chosen:
        raise DataError(
            "wmdp_mmlu: no MMLU folder; set UNLEARN_MMLU_DIR (or task metadata 'mmlu_dir') to a folder with "
            "test/<subject>_test.csv (MMLU's CSVs from cais/mmlu or the original tarball: docs/data.md)"
        )
    folder = Path(chosen).expanduser()
    if not folder.is_dir():
        raise DataError(f"wmdp_mmlu: MMLU folder not found: {folder}")
    rows = []
    for subject in subjects:
        for row in read_mmlu_csv(folder / "test" / f"{subject}_test.csv", subject)[:per_subject]:
            rows.append({**row, "subject_name": subject.replace("_", " ")})
    return rows


def mmlu_dataset(
    *,
    mmlu_dir: str | None = None,
    mmlu_subjects: list[str] | None = None,
    mmlu_per_subject: int | None = None,
    **_m: Any,
):
    """lm-eval ``custom_dataset``: :func:`mmlu_subset` as {"test": ...}."""
    import datasets

    rows = mmlu_subset(mmlu_dir, tuple(mmlu_subjects or MMLU_SUBJECTS), int(mmlu_per_subject or MMLU_PER_SUBJECT))
    return datasets.DatasetDict({"test": datasets.Dataset.from_list(rows)})
