"""The options of an evaluation, defined once: `unlearn eval`'s flags are generated from
:class:`EvaluationConfig` (:func:`..options.add_config_arguments`), a study's ``[evaluation]``
table takes the defaults and checks of the fields it shares with it, and
:func:`.model_eval.evaluate` runs one."""

from __future__ import annotations

from dataclasses import dataclass, fields

from ..options import config_field as option
from ..training.config import DTYPES

#: the option group of membership inference
MIA = "membership inference"


def _file(help: str, group: str | None = None):
    """A file option (``--x FILE``), not set by default."""
    return option(None, help, **({"group": group} if group else {}), metavar="FILE")


#: the lm-eval model classes an evaluation can score with (:func:`.lm_eval_runner.lm_class_for`)
SCORINGS = ("prefix", "hf")


@dataclass
class EvaluationConfig:
    """What to evaluate and how: every option of `unlearn eval` (less --model_args, lm_eval's
    spelling of the model options, and the commands --dry-run, --print-tasks-dir,
    --print-model-dir). Fields marked ``cli="common"`` are the model options every command that
    loads a model shares (commands/common.py adds them)."""

    model: str = option(
        "smollm2-135m",
        "local Hugging Face folder, hub id, or alias 'smollm2-135m' (the embedded model) or 'tiny-llama'",
        cli="common",
    )
    device: str | None = option(None, "cpu, cuda, cuda:1 ... (default: cuda if available)", cli="common")
    dtype: str | None = option(
        None, "float32, bfloat16 or float16 (default: fp32 on CPU, bf16 on CUDA)", cli="common", choices=DTYPES
    )
    trust_remote_code: bool = option(False, "allow custom model code from the hub", cli="common")
    adapter: str | None = option(None, "PEFT adapter folder to apply to --model")
    allow_other_base: bool = option(False, "load --adapter even if it was trained on another base model")
    tasks: list[str] = option(
        list,
        "comma-separated lm-eval tasks, groups or tags, e.g. tofu_forget01 (all TOFU forget01 "
        "and Model Utility tasks), tofu_forget01_nogen (no generation), mmlu_local, wmdp_local, mmlu",
        parse="csv",
    )
    retain_reference: list[str] = option(
        list,
        "retain model's reference: its per-sample truth ratios for Forget Quality (repeatable: one per forget "
        "split), or its MUSE metrics for the six-way table and PrivLeak",
        parse="append",
        metavar="FILE",
    )
    save_reference: str | None = _file(
        "write this model's forget-split truth ratios (or, without a TOFU forget task, its MUSE metrics) as a retain reference"
    )
    open_unlearning_log: bool = option(
        False, "also write open-unlearning's TOFU_EVAL.json / MUSE_EVAL.json (and _SUMMARY.json) into --out"
    )
    limit: float | None = option(None, "first N documents per task (N < 1: a fraction)")
    batch_size: int = option(8, "lm-eval batch size (default: %(default)s)", flags=("--batch_size",), minimum=1)
    max_gen_toks: int | None = option(
        None, "cap on new tokens in generation tasks (TOFU's ROUGE tasks: 200 unless capped)", minimum=1
    )
    num_fewshot: int | None = option(
        None, "few-shot examples (MMLU/WMDP; TOFU tasks are 0-shot)", flags=("--num_fewshot",), minimum=0
    )
    use_cache: str | None = option(
        None,
        "lm-eval's cache of model responses (SQLite, PATH-<digest>_rank0.db, the digest of the model's and "
        "adapter's weights and the dtype): a rerun of the same model reuses them, another model gets its own",
        flags=("--use_cache",),
        metavar="PATH",
    )
    scoring: str = option(
        "prefix",
        "prefix (default): each prompt scored once, finished generations leave their batch "
        "(lm-eval model hf-prefix); hf: lm-eval's HFLM as it is (slower; the same numbers with fp32 "
        "weights, differing by rounding in bf16)",
        choices=SCORINGS,
    )
    tofu_dir: str | None = option(None, "local TOFU folder (default: $UNLEARN_TOFU_DIR, else the hub)")
    forget_split: str | None = option(
        None, "split for the generic tofu_forget_* tasks: a TOFU name or a JSON-lines file in TOFU's format"
    )
    mmlu_dir: str | None = option(None, "MMLU CSV folder for mmlu_local (default: $UNLEARN_MMLU_DIR)")
    wmdp_dir: str | None = option(None, "WMDP JSON folder for wmdp_local (default: $UNLEARN_WMDP_DIR)")
    system_prompt: str | None = option(None, "system turn for the TOFU chat prompts")
    mia: bool = option(
        False,
        "add the MIA tasks (tofu_mia: LOSS, zlib, Min-K%%, reference attack, privleak; "
        "tofu_forget_exact_memorization) and compute Min-K%%++ and gradient-norm on the model; "
        "needs --forget-split and --holdout-split",
        group=MIA,
    )
    holdout_split: str | None = option(
        None,
        "QA the model never trained on, for tofu_mia: a TOFU split name or a JSON-lines file",
        group=MIA,
    )
    mia_reference: str | None = _file(
        "the retain model's MIA reference (--save-mia-reference): reference attack and privleak", MIA
    )
    save_mia_reference: str | None = _file(
        "write this model's tofu_mia losses and AUCs as an MIA reference (run it on the retain model)", MIA
    )
    robustness: bool = option(
        False,
        "measure forget probability and ROUGE-L plain, under the paraphrase and format probes and "
        "after each attack (attack-aware worst case); needs --forget-split",
        group="robustness",
    )
    robustness_attacks: list[str] | None = option(
        None,
        "the attacks --robustness runs (default: every installed attack, see `unlearn plugins`)",
        group="robustness",
        parse="csv",
        metavar="A,B",
    )
    attack_option: list[str] = option(
        list,
        "an option of one of those attacks (repeatable), e.g. quantize.bits=8, relearn.steps=20",
        group="robustness",
        parse="append",
        metavar="NAME.KEY=VALUE",
    )
    keep_attacked_models: bool = option(
        False,
        "keep the attacked models' weights in OUT/attacks/<attack>/model (default: removed once measured)",
        group="robustness",
    )
    out: str | None = option(
        None,
        "output folder, in lm_eval's layout: OUT/<model>/results_<date>.json (with Forget Quality "
        "and Model Utility) and samples_<task>_<date>.jsonl",
        flags=("--output_path",),
    )

    def runner_options(self, function, *, given: tuple[str, ...] = ()) -> dict:
        """The fields that ``function`` (an :mod:`.lm_eval_runner` entry point) takes as keyword
        parameters of the same names, less those the caller ``given`` itself: passed on without
        spelling each one out again."""
        import inspect

        taken = set(inspect.signature(function).parameters) - set(given)
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name in taken}


__all__ = ["EvaluationConfig", "SCORINGS"]
