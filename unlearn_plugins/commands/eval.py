"""`unlearn eval`: lm-eval tasks (TOFU, MMLU, WMDP, any plugin's) on a model or adapter,
with Forget Quality and Model Utility beside the task metrics. Written and printed as lm_eval
writes and prints them (its EvaluationTracker's files, its make_table), and lm_eval's flag
spellings (--batch_size, --num_fewshot, --output_path, --model_args, --use_cache) work too.

--mia adds membership inference (the tofu_mia and exact-memorization tasks, and Min-K%++ and
gradient-norm computed on the model, which no lm-eval request type can express); --robustness
measures the forgetting after every attack plugin and under the paraphrase and format probes."""

from __future__ import annotations

import argparse
from pathlib import Path

from ..errors import UnlearnError
from ..options import add_config_arguments, config_defaults, config_from_args, parse_options
from .common import (
    add_command,
    add_model_options,
    check_int,
    check_out_file,
    check_out_folder,
    device_option,
    dtype_option,
)

EXAMPLE = """examples:
  # the retain model's truth ratios, the reference of Forget Quality
  unlearn eval --model retain99 --tasks tofu_forget01_truth_ratio --save-reference ref01.json --out runs/retain
  # an unlearned adapter: forget01 metrics, the 9 Model Utility parts and Forget Quality
  unlearn eval --model smollm2-135m --adapter npo --tasks tofu_forget01 --retain-reference ref01.json --out runs/npo
  # lm_eval's spellings; a split of `unlearn stratify` for the generic tofu_forget_* tasks
  unlearn eval --model_args pretrained=smollm2-135m,peft=npo --tasks tofu_forget_prob,tofu_forget_rouge \\
      --forget-split strata/hard.json --output_path runs/npo-hard
  # the same tasks from lm_eval's own command
  lm_eval --model hf --model_args pretrained="$(unlearn eval --print-model-dir)" \\
      --include_path "$(unlearn eval --print-tasks-dir tofu)" --tasks tofu_forget01_nogen
"""

#: lm_eval's --model_args keys that unlearn eval takes, and the option each one sets
MODEL_ARGS = {
    "pretrained": "model",
    "peft": "adapter",
    "dtype": "dtype",
    "device": "device",
    "trust_remote_code": "trust_remote_code",
}
#: lm_eval's --model value for Hugging Face models, accepted beside --model_args
LM_EVAL_BACKENDS = ("hf", "huggingface")


def add_parser(sub) -> None:
    p = add_command(sub, "eval", "evaluate a model or adapter with lm-eval tasks (TOFU, MMLU, WMDP)", __doc__, EXAMPLE)
    from ..evaluation.config import EvaluationConfig
    from .plan import add_dry_run_options

    add_model_options(p, default=config_defaults(EvaluationConfig)["model"])

    add_dry_run_options(p)
    p.add_argument(
        "--model-args",
        "--model_args",
        dest="model_args",
        default=None,
        metavar="K=V,...",
        help="lm_eval's spelling of the model: pretrained=MODEL[,peft=ADAPTER][,dtype=D][,device=D]"
        "[,trust_remote_code=True] (then --model may be left out or be 'hf')",
    )
    add_config_arguments(p, EvaluationConfig)
    p.add_argument(
        "--print-tasks-dir",
        nargs="?",
        const="unlearn",
        default=None,
        metavar="NAME",
        help="print a task folder (for lm_eval --include_path) and exit: the built-in MMLU one, "
        "or a benchmark's or plugin's by name (tofu, movielens, muse, wmdp; `unlearn plugins` lists them)",
    )
    p.add_argument(
        "--print-model-dir",
        action="store_true",
        help="print the local folder of --model (the embedded smollm2-135m is converted once) for "
        "lm_eval --model_args pretrained=..., and exit",
    )
    p.set_defaults(func=run)


def apply_model_args(args) -> None:
    """--model_args (lm_eval's spelling) into --model, --adapter, --dtype, --device and
    --trust-remote-code; a key given both ways with different values is refused."""
    from lm_eval.utils import simple_parse_args_string

    if not args.model_args:
        if args.model in LM_EVAL_BACKENDS:
            raise UnlearnError(
                f"--model {args.model}: lm_eval's backend name needs --model_args pretrained=MODEL "
                "(or give the model itself: --model MODEL)"
            )
        return
    pairs = [part for part in args.model_args.split(",") if part.strip()]
    try:
        parsed = simple_parse_args_string(args.model_args) if all("=" in part for part in pairs) else None
    except ValueError:
        parsed = None
    if not parsed:
        raise UnlearnError(
            f"--model_args {args.model_args!r}: expected key=value pairs separated by commas, "
            "e.g. pretrained=MODEL,peft=ADAPTER"
        )
    unknown = sorted(set(parsed) - set(MODEL_ARGS))
    if unknown:
        raise UnlearnError(
            f"--model_args: unlearn eval takes {', '.join(MODEL_ARGS)}; got {', '.join(unknown)} "
            "(run lm_eval itself for other HFLM options)"
        )
    if "pretrained" not in parsed:
        raise UnlearnError("--model_args: pretrained=MODEL is required")
    defaults = {
        "model": ("smollm2-135m", *LM_EVAL_BACKENDS),
        "adapter": (None,),
        "dtype": (None,),
        "device": (None,),
        "trust_remote_code": (False,),
    }
    for key, value in parsed.items():
        dest = MODEL_ARGS[key]
        if key == "trust_remote_code":
            value = value is True or str(value).lower() in ("true", "1")
        elif key == "dtype" and value == "auto":
            value = None  # lm_eval's "auto": our default (fp32 on CPU, bf16 on CUDA)
        else:
            value = str(value)
        try:
            if key == "dtype" and value is not None:
                dtype_option(value)
            elif key == "device":
                device_option(value)
        except argparse.ArgumentTypeError as exc:
            raise UnlearnError(f"--model_args {key}={value}: {exc}") from None
        current = getattr(args, dest)
        if current not in defaults[dest] and current != value:
            flag = "--" + dest.replace("_", "-")
            raise UnlearnError(f"--model_args {key}={value} and {flag} {current} disagree; give one of them")
        setattr(args, dest, value)


def run(args) -> int:
    import math

    from ..evaluation import membership, robustness

    if args.print_tasks_dir:  # one line, for lm_eval --include_path "$(unlearn eval --print-tasks-dir)"
        from ..host import get_component, list_components
        from ..interfaces import LM_EVAL_TASK_DIR

        names = [c.name for c in list_components(LM_EVAL_TASK_DIR)]
        if args.print_tasks_dir not in names:
            raise UnlearnError(
                f"--print-tasks-dir {args.print_tasks_dir}: no such task folder; known: {', '.join(names)}"
            )
        print(Path(get_component(LM_EVAL_TASK_DIR, args.print_tasks_dir)).resolve())
        return 0
    apply_model_args(args)
    if args.print_model_dir:  # one line, for lm_eval --model_args pretrained="$(unlearn eval --print-model-dir)"
        from ..models import resolve_model

        print(resolve_model(args.model))
        return 0
    if args.dry_run:
        from .plan import eval_dry_run

        return eval_dry_run(args)
    missing = [
        flag
        for flag, value in (("--tasks", args.tasks or args.mia or args.robustness), ("--out", args.out))
        if not value
    ]
    if missing:
        raise UnlearnError(f"unlearn eval: {', '.join(missing)} required")
    tasks = list(args.tasks)
    if args.mia:
        tasks += [membership.MIA_TASK, membership.MEMORIZATION_TASK]
    if args.robustness:
        tasks += robustness.tasks_needed()
    tasks = list(dict.fromkeys(tasks))
    if (args.mia or args.robustness) and not args.forget_split:
        raise UnlearnError(
            f"unlearn eval {'--mia' if args.mia else '--robustness'}: --forget-split required (the "
            "forget split to measure: a TOFU split name or a JSON-lines file)"
        )
    if args.mia and not args.holdout_split:
        raise UnlearnError(
            "unlearn eval --mia: --holdout-split required (QA the model never trained on, e.g. other "
            "TOFU authors: a TOFU split name or a JSON-lines file)"
        )
    if (args.mia_reference or args.save_mia_reference) and not {membership.MIA_TASK, "tofu_forget_mia"} & set(tasks):
        raise UnlearnError(
            f"--mia-reference and --save-mia-reference need the {membership.MIA_TASK} task: add --mia "
            f"(or --tasks {membership.MIA_TASK})"
        )
    attacks, options = _robustness_attacks(args) if args.robustness else ([], {})
    if args.max_gen_toks is not None:
        check_int("--max-gen-toks", args.max_gen_toks, 1)
        _check_max_gen_toks(args.model, args.max_gen_toks)
    check_int("--batch-size", args.batch_size, 1)
    if args.num_fewshot is not None:
        check_int("--num-fewshot", args.num_fewshot, 0)
    limit = args.limit
    if limit is not None:
        if not (0 < limit < 1 or (limit >= 1 and math.isfinite(limit) and limit == int(limit))):
            raise UnlearnError(f"--limit must be a whole number of documents >= 1 or a fraction in (0, 1), got {limit}")
        limit = int(limit) if limit >= 1 else limit
    check_out_folder("--out", args.out)  # before any work, so nothing computed is lost
    for flag in ("--save-reference", "--save-mia-reference"):
        check_out_file(flag, getattr(args, flag[2:].replace("-", "_")))
    _check_not_overwriting_inputs(args)
    if args.use_cache:
        check_out_file("--use-cache", args.use_cache + "_rank0.db")
    from ..evaluation import model_eval
    from ..evaluation.config import EvaluationConfig

    config = config_from_args(EvaluationConfig, args, limit=limit)
    outcome = model_eval.evaluate(model_eval.Request(config, tasks, attacks=attacks, attack_options=options))
    print(model_eval.report(outcome))
    if args.open_unlearning_log and not outcome.failed:
        from .logs import export

        for path in export(args.out):
            print(f"open-unlearning's log: {path}")
    return 1 if outcome.failed else 0


#: config.json keys that hold a model's maximum sequence length (Llama and most: the first)
LENGTH_KEYS = ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length")


def _check_max_gen_toks(model: str, cap: int) -> None:
    """A cap over the model's maximum length can never be reached: said, not silently kept."""
    import json

    from ..models import resolve_model

    config = Path(resolve_model(model)) / "config.json"
    try:
        values = json.loads(config.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return  # a hub id, or a folder the model load names
    key = next((k for k in LENGTH_KEYS if isinstance(values, dict) and isinstance(values.get(k), int)), None)
    if key is not None and cap > values[key]:
        raise UnlearnError(
            f"--max-gen-toks {cap}: over the model's maximum length ({values[key]} tokens, {key} in {config}); "
            f"give at most {values[key]}"
        )


def _check_not_overwriting_inputs(args) -> None:
    """A reference written where one is read (--save-reference X --retain-reference X) would
    replace the retain model's reference with this model's: refused before any work."""
    from ..files import same_file

    writes = [("--save-reference", args.save_reference), ("--save-mia-reference", args.save_mia_reference)]
    reads = [("--retain-reference", path) for path in args.retain_reference]
    reads.append(("--mia-reference", args.mia_reference))
    for i, (flag, path) in enumerate(writes):
        for other, read in [*reads, *writes[i + 1 :]]:
            if path and read and same_file(path, read):
                raise UnlearnError(
                    f"{flag} {path} and {other} {read} are the same file: this evaluation would overwrite it; "
                    f"give {flag} another file"
                )


def _robustness_attacks(args) -> tuple[list[str], dict[str, dict]]:
    """The attacks --robustness runs and their options; unknown names and bad options fail here,
    before any model loads."""
    from ..attacks.run import create_attack
    from ..evaluation import robustness
    from ..host import list_components
    from ..interfaces import ATTACK

    installed = [c.name for c in list_components(ATTACK)]
    names = args.robustness_attacks or installed
    options = robustness.attack_options(parse_options(args.attack_option, "--attack-option"), names)
    for name in names:
        create_attack(name, options[name])
    return names, options
