"""Regenerate the per-subject YAML files of mmlu_local from lm-eval's own mmlu tasks, so the
subjects, descriptions and categories stay identical to lm-eval's ``mmlu``. A test checks that
the files in the folder are this script's output.

    python tasks/mmlu_local/_generate_configs.py
"""

from __future__ import annotations

from pathlib import Path

import lm_eval
import yaml

from unlearn_plugins.evaluation.lm_eval_tasks import write_task_files

HERE = Path(__file__).resolve().parent
SOURCE = Path(lm_eval.__file__).resolve().parent / "tasks" / "mmlu" / "default"


def configs() -> dict[str, str]:
    """{file name: text} of every subject and group file."""
    files: dict[str, str] = {}
    categories: set[str] = set()
    for src in sorted(SOURCE.glob("mmlu_*.yaml")):
        cfg = yaml.safe_load(src.read_text())
        subject = cfg["dataset_name"]
        category = cfg["tag"].removeprefix("mmlu_").removesuffix("_tasks")
        categories.add(category)
        out = {
            "include": "_default_template_yaml",
            "task": f"mmlu_local_{subject}",
            "task_alias": subject,
            "tag": f"mmlu_local_{category}_tasks",
            "description": cfg["description"],
            "dataset_kwargs": {"mmlu_subject": subject},
        }
        files[f"mmlu_local_{subject}.yaml"] = yaml.safe_dump(out, sort_keys=False, width=200)
    for category in sorted(categories):
        group = {
            "group": f"mmlu_local_{category}",
            "group_alias": category,
            "task": [f"mmlu_local_{category}_tasks"],
            "aggregate_metric_list": [{"metric": "acc", "weight_by_size": True}],
            "metadata": {"version": 2},
        }
        files[f"_mmlu_local_{category}.yaml"] = yaml.safe_dump(group, sort_keys=False)
    top = {
        "group": "mmlu_local",
        "task": [f"mmlu_local_{c}" for c in ("stem", "other", "social_sciences", "humanities")],
        "aggregate_metric_list": [{"metric": "acc", "weight_by_size": True}],
        "metadata": {"version": 2},
    }
    files["_mmlu_local.yaml"] = yaml.safe_dump(top, sort_keys=False)
    return files


def main() -> None:
    write_task_files(HERE, configs())


if __name__ == "__main__":
    main()
