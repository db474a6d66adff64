"""`unlearn attack`: attack a (usually unlearned) model with an attack plugin (relearn, quantize,
a third party's) and write the attacked model, with attack.json, for `unlearn eval` to measure.
The model is loaded, attacked and saved in float32 unless --dtype says otherwise, so attacked
weights (e.g. quantized values) are stored exactly."""

from __future__ import annotations

from ..options import parse_options
from .common import add_command, add_model_options, add_tofu_dir_option, check_out_folder

EXAMPLE = """examples:
  unlearn attack --adapter npo --attack quantize --option bits=4 --out npo-int4
  unlearn attack --adapter npo --attack relearn --forget tofu:forget01 --option steps=20 --out npo-relearn
  unlearn eval --model npo-relearn --tasks tofu_forget_prob,tofu_forget_rouge --forget-split npo-relearn/measure.json \\
      --out npo-relearn/eval
"""


def add_parser(sub) -> None:
    p = add_command(
        sub, "attack", "attack a model (relearn, quantize, ...) and save the attacked model", __doc__, EXAMPLE
    )
    add_model_options(p)
    p.add_argument("--adapter", default=None, help="PEFT adapter folder to apply to --model (merged before the attack)")
    p.add_argument(
        "--allow-other-base", action="store_true", help="load --adapter even if it was trained on another base model"
    )
    p.add_argument("--attack", required=True, help="attack name (see `unlearn plugins`): relearn, quantize, ...")
    p.add_argument(
        "--option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="attack option (repeatable), e.g. bits=8, steps=20",
    )
    p.add_argument(
        "--forget",
        default=None,
        help="forget split for attacks that use data (relearn): tofu:SPLIT, tofu:SPLIT[a:b] or a JSON-lines "
        "file in TOFU's format",
    )
    add_tofu_dir_option(p)
    p.add_argument("--out", required=True, help="folder for the attacked model (a Hugging Face folder + attack.json)")
    p.add_argument("--overwrite", action="store_true", help="replace an attacked model already in --out")
    p.set_defaults(func=run)


def run(args) -> int:
    from ..attacks.run import run_attack

    check_out_folder("--out", args.out)
    attacked = run_attack(
        args.attack,
        model=args.model,
        out=args.out,
        options=parse_options(args.option),
        adapter=args.adapter,
        forget=args.forget,
        tofu_dir=args.tofu_dir,
        device=args.device,
        dtype=args.dtype,
        trust_remote_code=args.trust_remote_code,
        allow_other_base=args.allow_other_base,
        overwrite=args.overwrite,
    )
    record = attacked.record
    print(
        f"{args.attack}: attacked model -> {attacked.folder} ({record['wall_time_s']:.1f} s; "
        f"{attacked.folder / 'attack.json'})"
    )
    split = attacked.measure_split or "SPLIT"
    print(
        f"measure it: unlearn eval --model {attacked.folder} --tasks tofu_forget_prob,tofu_forget_rouge "
        f"--forget-split {split} --out {attacked.folder}/eval"
    )
    return 0
