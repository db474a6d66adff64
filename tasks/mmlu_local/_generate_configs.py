"""Regenerate the per-subject YAML files of mmlu_local from lm-eval's own mmlu tasks, so the
subjects, descriptions and categories stay identical to lm-eval's ``mmlu``.

    python tasks/mmlu_local/_generate_configs.py
"""

from __future__ import annotations

from pathlib import Path

import lm_eval
import yaml

HERE = Path(__file__).resolve().parent
SOURCE = Path(lm_eval.__file__).resolve().parent / "tasks" / "mmlu" / "default"


def main() -> None:
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
        (HERE / f"mmlu_local_{subject}.yaml").write_text(yaml.safe_dump(out, sort_keys=False, width=200))
    for category in sorted(categories):
        group = {
            "group": f"mmlu_local_{category}",
            "group_alias": category,
            "task": [f"mmlu_local_{category}_tasks"],
            "aggregate_metric_list": [{"metric": "acc", "weight_by_size": True}],
            "metadata": {"version": 2},
        }
        (HERE / f"_mmlu_local_{category}.yaml").write_text(yaml.safe_dump(group, sort_keys=False))
    top = {
        "group": "mmlu_local",
        "task": [f"mmlu_local_{c}" for c in ("stem", "other", "social_sciences", "humanities")],
        "aggregate_metric_list": [{"metric": "acc", "weight_by_size": True}],
        "metadata": {"version": 2},
    }
    (HERE / "_mmlu_local.yaml").write_text(yaml.safe_dump(top, sort_keys=False))


if __name__ == "__main__":
    main()
