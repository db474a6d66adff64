"""P(Yes) / (P(Yes) + P(No)) at the answer position, straight from a model (no lm-eval).

The same number as the lm-eval tasks (:mod:`.tasks`) compute from lm-eval's two
log-likelihoods: each answer's probability is the product over its tokens (no end token),
so with one-token answers (SmolLM2: "Yes" and "No") it is the two-way softmax of the two
logits at the answer position. Prompts are formatted and tokenised as in training
(:func:`unlearn_plugins.data.qa.encode_qa`). Used for prediction reference files,
RecEraser's shard features and anywhere a model must be scored without lm-eval.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

from unlearn_plugins.errors import DataError, UnlearnError

from .prompts import NO, YES


@dataclass
class Predictions:
    """Per sample: P(Yes) normalised over Yes/No, the log-odds log P(Yes) - log P(No), and (when
    asked for) the last hidden state at the answer position."""

    p_yes: list[float]
    log_odds: list[float]
    hidden: Any = None  # (n, d) fp32 tensor, or None


def answer_token_ids(tokenizer) -> tuple[list[int], list[int]]:
    """Token ids of "Yes" and "No" as answers are tokenised (without the end token)."""
    from unlearn_plugins.data.qa import text_ids

    yes, no = text_ids(tokenizer, YES), text_ids(tokenizer, NO)
    if not yes or not no:
        raise DataError(f"tokenizer {type(tokenizer).__name__}: {YES!r} or {NO!r} tokenises to nothing")
    if yes == no:
        raise DataError(f"tokenizer {type(tokenizer).__name__}: {YES!r} and {NO!r} tokenise alike")
    return yes, no


def _with_answer(prompt: Sequence[int], answer: Sequence[int], max_length: int) -> dict:
    """Prompt tokens (cut from the left to fit) + answer tokens; labels on the answer only."""
    from unlearn_plugins.data.qa import IGNORE_INDEX

    prompt = list(prompt)[-max(1, max_length - len(answer)) :]
    ids = prompt + list(answer)
    return {"input_ids": ids, "attention_mask": [1] * len(ids), "labels": [IGNORE_INDEX] * len(prompt) + list(answer)}


def prompt_token_ids(tokenizer, samples: Sequence[Any], system_prompt: str | None = None) -> list[list[int]]:
    """Each sample's question in the model's chat template, tokenised as in training
    (:func:`unlearn_plugins.data.qa.prompt_ids`, and the bos token encode_qa adds without a template)."""
    from unlearn_plugins.data.qa import control_tokens, has_chat_template, prompt_ids

    specials = control_tokens(tokenizer)
    prompts = [
        prompt_ids(tokenizer, s.question, system_prompt, where=getattr(s, "where", "<memory>"), specials=specials)
        for s in samples
    ]
    if (
        tokenizer.bos_token_id is not None
        and not has_chat_template(tokenizer)
        and getattr(tokenizer, "add_bos_token", False)
    ):
        prompts = [[tokenizer.bos_token_id] + p for p in prompts]
    return prompts


def predict(
    model,
    tokenizer,
    samples: Sequence[Any],
    *,
    batch_size: int = 8,
    max_length: int = 512,
    system_prompt: str | None = None,
    hidden: bool = False,
    progress: bool = False,
) -> Predictions:
    """P(Yes) of each sample (anything with ``.question``), in order (:func:`predict_prompts`)."""
    return predict_prompts(
        model,
        tokenizer,
        prompt_token_ids(tokenizer, samples, system_prompt),
        batch_size=batch_size,
        max_length=max_length,
        hidden=hidden,
        progress=progress,
    )


def predict_prompts(
    model,
    tokenizer,
    prompts: Sequence[Sequence[int]],
    *,
    batch_size: int = 8,
    max_length: int = 512,
    hidden: bool = False,
    progress: bool = False,
) -> Predictions:
    """P(Yes) after each tokenised prompt (chat template applied).

    One forward per prompt when both answers are single tokens (both logits are read at the
    answer position); otherwise one per answer. ``hidden``: also return the final hidden
    state at the answer position (RecEraser's shard representation).
    """
    import torch

    from unlearn_plugins.data.qa import IGNORE_INDEX, pad_batch

    yes_ids, no_ids = answer_token_ids(tokenizer)
    single = len(yes_ids) == 1 and len(no_ids) == 1
    answers = {YES: yes_ids} if single else {YES: yes_ids, NO: no_ids}
    device = next(model.parameters()).device
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    n = len(prompts)
    log_p = {a: [0.0] * n for a in (YES, NO)}
    feats = [None] * n
    encoded = {a: [_with_answer(p, ids, max_length) for p in prompts] for a, ids in answers.items()}
    order = sorted(range(n), key=lambda i: len(encoded[YES][i]["input_ids"]))
    batches = [order[i : i + batch_size] for i in range(0, len(order), batch_size)]
    if progress:
        from tqdm.auto import tqdm

        batches = tqdm(batches, desc="P(Yes)", unit="batch")
    was_training = model.training
    model.eval()
    try:
        with torch.inference_mode():
            for idx in batches:
                for a in answers:
                    batch = {k: v.to(device) for k, v in pad_batch([encoded[a][i] for i in idx], pad).items()}
                    out = model(
                        input_ids=batch["input_ids"],
                        attention_mask=batch["attention_mask"],
                        output_hidden_states=hidden and a == YES,
                    )
                    logits = out.logits[:, :-1, :].float().log_softmax(-1)
                    target = batch["labels"][:, 1:]
                    mask = target != IGNORE_INDEX
                    first = mask.float().argmax(1)  # the answer position predicts the first answer token
                    rows = torch.arange(len(idx), device=device)
                    if single:
                        pair = logits[rows, first][:, [yes_ids[0], no_ids[0]]]
                        values = {YES: pair[:, 0], NO: pair[:, 1]}
                    else:
                        tok_lp = logits.gather(2, target.clamp_min(0)[..., None])[..., 0]
                        values = {a: (tok_lp * mask).sum(1)}
                    if hidden and a == YES:
                        h = out.hidden_states[-1][rows, first].float().cpu()
                        for j, i in enumerate(idx):
                            feats[i] = h[j]
                    for name, v in values.items():
                        if not bool(torch.isfinite(v).all()):
                            from unlearn_plugins.likelihood import non_finite_message

                            raise UnlearnError(non_finite_message(idx, n, model))
                        for j, i in enumerate(idx):
                            log_p[name][i] = float(v[j])
    finally:
        model.train(was_training)
    odds = [y - n_ for y, n_ in zip(log_p[YES], log_p[NO])]
    p_yes = [float(torch.sigmoid(torch.tensor(o, dtype=torch.float64))) for o in odds]
    return Predictions(p_yes, odds, torch.stack(feats) if hidden and n else None)


def labels_of(samples: Sequence[Any]) -> list[int]:
    """1 for a "Yes" answer, 0 for "No"; any other answer is an error naming the sample."""
    out = []
    for s in samples:
        if s.answer not in (YES, NO):
            raise DataError(f"{getattr(s, 'where', '<memory>')}: answer {s.answer!r} is neither {YES!r} nor {NO!r}")
        out.append(int(s.answer == YES))
    return out
