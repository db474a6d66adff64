"""Regenerate the TOFU task files (``_tofu_template_yaml`` and the 23 ``tofu_*.yaml``) from the
tables below: every forget split gets the same four tasks, every Model Utility task the same
tags, so the files differ only where the tables say. A test checks that the files in the
folder are this script's output.

    python unlearn_plugins/benchmarks/tofu/tasks/tofu/_generate_configs.py
"""

from __future__ import annotations

from pathlib import Path

import yaml

from unlearn_plugins.evaluation.lm_eval_tasks import write_task_files

HERE = Path(__file__).resolve().parent
MODULE = "unlearn_plugins.benchmarks.tofu.tasks.tofu.utils"
TEMPLATE = "_tofu_template_yaml"

#: forget splits: (name in task names, dataset tofu_split of the QA tasks, of the truth-ratio task, what)
FORGET_SPLITS = (
    ("forget01", "forget01", "forget01_perturbed", "TOFU forget01"),
    ("forget05", "forget05", "forget05_perturbed", "TOFU forget05"),
    ("forget10", "forget10", "forget10_perturbed", "TOFU forget10"),
    ("forget", "@forget", "@forget", "the split named by metadata forget_split"),
)
#: the four tasks of a forget split: metric -> (task class, tofu_role, generation?, what it measures)
FORGET_TASKS = {
    "prob": ("TofuProbTask", "qa", False, "Forget answer probability exp(-mean answer-token NLL)"),
    "truth_ratio": (
        "TofuForgetTruthRatioTask",
        "perturbed",
        False,
        "Forget truth ratio mean(min(tr, 1/tr)) and Forget Quality (KS vs metadata retain_reference)",
    ),
    "rouge": ("TofuRougeTask", "qa", True, "Forget ROUGE recall of greedy generations (200 new tokens at most)"),
    "extraction_strength": ("TofuExtractionStrengthTask", "es", False, "Forget extraction strength 1 - k/n"),
}
#: Model Utility's tasks: name -> (task class, tofu_split, tofu_role, generation?, comment)
UTILITY_TASKS = {
    "tofu_retain_prob": (
        "TofuProbTask",
        "retain_perturbed",
        "qa",
        False,
        "Retain answer probability (Model Utility part).",
    ),
    "tofu_retain_truth_ratio": (
        "TofuTruthRatioTask",
        "retain_perturbed",
        "perturbed",
        False,
        "Retain truth ratio mean(max(0, 1 - tr)) (Model Utility part).",
    ),
    "tofu_retain_rouge": (
        "TofuRougeTask",
        "retain_perturbed",
        "qa",
        True,
        "Retain ROUGE-L recall (Model Utility part).",
    ),
    "tofu_real_authors": (
        "TofuOptionsTask",
        "real_authors_perturbed",
        "options",
        False,
        "Real authors: probability normalised over the options, truth ratio (Model Utility parts).",
    ),
    "tofu_real_authors_rouge": (
        "TofuRougeTask",
        "real_authors_perturbed",
        "qa",
        True,
        "Real authors ROUGE-L recall (Model Utility part).",
    ),
    "tofu_world_facts": (
        "TofuOptionsTask",
        "world_facts_perturbed",
        "options",
        False,
        "World facts: probability normalised over the options, truth ratio (Model Utility parts).",
    ),
    "tofu_world_facts_rouge": (
        "TofuRougeTask",
        "world_facts_perturbed",
        "qa",
        True,
        "World facts ROUGE-L recall (Model Utility part).",
    ),
}
GENERATION = {"until": [], "max_gen_toks": 200, "do_sample": False, "temperature": 0.0}


class Function(str):
    """A ``!function module.name`` reference (lm-eval resolves it when it loads the file)."""


class _Dumper(yaml.SafeDumper):
    """Block lists indented under their key; ``!function`` references unquoted."""

    def increase_indent(self, flow=False, indentless=False):
        return super().increase_indent(flow, False)

    def choose_scalar_style(self):
        if self.event.tag == "!function":
            return ""
        return super().choose_scalar_style()


_Dumper.add_representer(Function, lambda dumper, value: dumper.represent_scalar("!function", str(value)))


def _render(comment: str, body: dict) -> str:
    return "".join(f"# {line}\n" for line in comment.splitlines()) + yaml.dump(
        body, Dumper=_Dumper, sort_keys=False, width=200
    )


def _task(name: str, tags: list[str], cls: str, split: str, role: str, generation: bool) -> dict:
    body = {
        "include": TEMPLATE,
        "task": name,
        "tag": tags,
        "class": Function(f"{MODULE}.{cls}"),
        "dataset_kwargs": {"tofu_split": split, "tofu_role": role},
    }
    if generation:
        body.update(output_type="generate_until", generation_kwargs=dict(GENERATION))
    return body


def configs() -> dict[str, str]:
    """{file name: text} of every TOFU task file."""
    files = {
        TEMPLATE: _render(
            f"Shared settings of the TOFU tasks (documents and scoring: {MODULE}).\n"
            "The prompt is the model's chat prompt: target_delimiter is empty, as for lm-eval's own chat prompts.",
            {
                "custom_dataset": Function(f"{MODULE}.tofu_dataset"),
                "test_split": "test",
                "output_type": "loglikelihood",
                "num_fewshot": 0,
                "target_delimiter": "",
                "metadata": {"version": 1.0},
            },
        )
    }
    for split, qa_split, perturbed_split, what in FORGET_SPLITS:
        for metric, (cls, role, generation, measures) in FORGET_TASKS.items():
            tags = [f"tofu_{split}"] + ([] if generation else [f"tofu_{split}_nogen"])
            data = perturbed_split if role == "perturbed" else qa_split
            name = f"tofu_{split}_{metric}"
            files[f"{name}.yaml"] = _render(f"{measures} on {what}.", _task(name, tags, cls, data, role, generation))
    for name, (cls, data, role, generation, comment) in UTILITY_TASKS.items():
        tags = ["tofu_model_utility"] + [f"tofu_{s}" for s, *_ in FORGET_SPLITS]
        if not generation:
            tags += [f"tofu_{s}_nogen" for s, *_ in FORGET_SPLITS]
        files[f"{name}.yaml"] = _render(comment, _task(name, tags, cls, data, role, generation))
    return files


def main() -> None:
    write_task_files(HERE, configs())


if __name__ == "__main__":
    main()
