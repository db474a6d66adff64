"""`unlearn probs`: each sample's answer probability under a model, TOFU's exp(-mean NLL of
the answer tokens), one line per sample and their mean: a quick look at what a model, or a
model with an unlearning adapter, still knows of a split."""

from __future__ import annotations

from .common import add_command, add_data_options, add_model_options, check_int

EXAMPLE = """examples:
  unlearn probs --model smollm2-135m --data tofu:forget01
  unlearn probs --model ft/merged --adapter gd --data 'tofu:full[0:20]'   # after `unlearn run --out gd`
  unlearn probs --model ft/merged --data strata/hard.json --batch-size 4
"""


def add_parser(sub) -> None:
    p = add_command(sub, "probs", "print each sample's answer probability under a model", __doc__, EXAMPLE)
    add_model_options(p)
    add_data_options(p)
    p.add_argument("--adapter", default=None, help="PEFT adapter folder to apply to --model")
    p.add_argument(
        "--allow-other-base", action="store_true", help="load --adapter even if it was trained on another base model"
    )
    p.add_argument("--batch-size", type=int, default=8, help="samples per forward pass (default: %(default)s)")
    p.add_argument("--max-length", type=int, default=512, help="max tokens per example (default: %(default)s)")
    p.set_defaults(func=run)


def run(args) -> int:
    from ..data.qa import MIN_MAX_LENGTH, encode_samples, load_split
    from ..likelihood import answer_nll, answer_probability
    from ..models import load_model_of

    check_int("--batch-size", args.batch_size, 1)
    check_int("--max-length", args.max_length, MIN_MAX_LENGTH)
    samples = load_split(args.data, args.tofu_dir)
    model, tok = load_model_of(args)
    encoded = encode_samples(tok, samples, max_length=args.max_length)
    stats = answer_nll(model, encoded, tok.pad_token_id, batch_size=args.batch_size, progress=True)
    probs = [answer_probability(s, n) for s, n in stats]
    width = 70
    print(f"{'index':>5}  {'p(answer)':>9}  {'tokens':>6}  question")
    for sample, p, (_, n) in zip(samples, probs, stats):
        q = sample.question if len(sample.question) <= width else sample.question[: width - 3] + "..."
        print(f"{sample.index:>5}  {p:9.4f}  {n:>6}  {q}")
    print(f"mean answer probability over {len(probs)} samples: {sum(probs) / len(probs):.4f}")
    return 0
