"""`unlearn eval`: lm-eval tasks (TOFU, MMLU, WMDP, any plugin's) on a model or adapter,
with Forget Quality and Model Utility beside the task metrics."""

from __future__ import annotations

from .common import add_model_options, check_int, check_out_file, check_out_folder


def add_parser(sub) -> None:
    p = sub.add_parser("eval", help="evaluate a model or adapter with lm-eval tasks (TOFU, MMLU, WMDP)")
    add_model_options(p)
    p.add_argument("--adapter", default=None, help="PEFT adapter folder to apply to --model")
    p.add_argument("--allow-other-base", action="store_true",
                   help="load --adapter even if it was trained on another base model")
    p.add_argument("--tasks", default=None,
                   help="comma-separated lm-eval tasks, groups or tags, e.g. tofu_forget01 (all TOFU forget01 "
                        "and Model Utility tasks), tofu_forget01_nogen (no generation), mmlu_local, wmdp_local, mmlu")
    p.add_argument("--retain-reference", action="append", default=[], metavar="FILE",
                   help="retain model's per-sample truth ratios for Forget Quality (repeatable: one per forget split)")
    p.add_argument("--save-reference", default=None, metavar="FILE",
                   help="write this model's forget-split truth ratios as a retain reference")
    p.add_argument("--limit", type=float, default=None, help="first N documents per task (N < 1: a fraction)")
    p.add_argument("--batch-size", type=int, default=8, help="lm-eval batch size (default: %(default)s)")
    p.add_argument("--max-gen-toks", type=int, default=None,
                   help="cap on new tokens in generation tasks (TOFU's ROUGE tasks: 200 unless capped)")
    p.add_argument("--num-fewshot", type=int, default=None, help="few-shot examples (MMLU/WMDP; TOFU tasks are 0-shot)")
    p.add_argument("--tofu-dir", default=None, help="local TOFU folder (default: $UNLEARN_TOFU_DIR, else the hub)")
    p.add_argument("--forget-split", default=None,
                   help="split for the generic tofu_forget_* tasks: a TOFU name or a JSON-lines file in TOFU's format")
    p.add_argument("--mmlu-dir", default=None, help="MMLU CSV folder for mmlu_local (default: $UNLEARN_MMLU_DIR)")
    p.add_argument("--wmdp-dir", default=None, help="WMDP JSON folder for wmdp_local (default: $UNLEARN_WMDP_DIR)")
    p.add_argument("--system-prompt", default=None, help="system turn for the TOFU chat prompts")
    p.add_argument("--out", default=None, help="output folder: results.json, summary.json, samples/")
    p.add_argument("--print-tasks-dir", action="store_true",
                   help="print the installed TOFU/MMLU/WMDP task folder (for lm_eval --include_path) and exit; "
                        "plugins' folders are listed by `unlearn plugins`")
    p.set_defaults(func=run)


def run(args) -> int:
    import math

    from ..errors import UnlearnError
    from ..evaluation import lm_eval_runner as runner

    if args.print_tasks_dir:  # one line, for lm_eval --include_path "$(unlearn eval --print-tasks-dir)"
        print(runner.builtin_task_dir())
        return 0
    missing = [flag for flag, value in (("--tasks", args.tasks), ("--out", args.out))
               if not value]
    if missing:
        raise UnlearnError(f"unlearn eval: {', '.join(missing)} required")
    if args.max_gen_toks is not None:
        check_int("--max-gen-toks", args.max_gen_toks, 1)
    check_int("--batch-size", args.batch_size, 1)
    if args.num_fewshot is not None:
        check_int("--num-fewshot", args.num_fewshot, 0)
    limit = args.limit
    if limit is not None:
        if not (0 < limit < 1 or (limit >= 1 and math.isfinite(limit) and limit == int(limit))):
            raise UnlearnError(f"--limit must be a whole number of documents >= 1 or a fraction in (0, 1), got {limit}")
        limit = int(limit) if limit >= 1 else limit
    check_out_folder("--out", args.out)  # before any work, so nothing computed is lost
    if args.save_reference:
        check_out_file("--save-reference", args.save_reference)
    with runner.lock_out(args.out):  # the whole evaluation: a second one on --out is refused at once
        evaluation = runner.evaluate_model(
            args.model, [t.strip() for t in args.tasks.split(",")], adapter=args.adapter, device=args.device,
            dtype=args.dtype, trust_remote_code=args.trust_remote_code, batch_size=args.batch_size, limit=limit,
            retain_references=args.retain_reference, num_fewshot=args.num_fewshot, tofu_dir=args.tofu_dir,
            forget_split=args.forget_split, mmlu_dir=args.mmlu_dir, wmdp_dir=args.wmdp_dir,
            system_prompt=args.system_prompt, max_gen_toks=args.max_gen_toks, allow_other_base=args.allow_other_base,
        )
        if args.save_reference:
            task = runner.save_reference(evaluation, args.save_reference, model=args.model, adapter=args.adapter)
            evaluation.summary["saved_reference"] = {"path": args.save_reference, "task": task}
        paths = runner.write_outputs(args.out, evaluation)
    print(runner.format_table(evaluation.summary))
    if args.save_reference:
        print(f"retain reference ({task}) -> {args.save_reference}")
    print(f"results -> {paths['results']}, summary -> {paths['summary']}")
    return 0
