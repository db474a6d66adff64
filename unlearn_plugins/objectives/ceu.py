"""CE-U, cross-entropy unlearning (arXiv 2503.01224): per answer token, the target is the
model's own (detached) next-token distribution with the true token removed, and the loss is the
cross-entropy of the model to it; no retain term by default."""

from __future__ import annotations

from typing import Annotated

from .base import ForgetRetainObjective, check_option, forward


def skip_first_answer_tokens(labels, n: int):
    """``labels`` with each sequence's first ``n`` answer tokens masked (the paper's footnote:
    the first answer token is the one a question most constrains)."""
    from ..data.qa import IGNORE_INDEX

    answer = labels != IGNORE_INDEX
    return labels.masked_fill(answer & (answer.cumsum(-1) <= n), IGNORE_INDEX)


def ce_unlearning(logits, labels):
    """Mean over answer tokens of H(q, p): ``p = softmax(logits)``, ``q`` = softmax of the
    detached logits with the true token's logit set to -inf."""
    import torch.nn.functional as F

    from ..data.qa import IGNORE_INDEX

    shift_labels = labels[:, 1:]
    mask = shift_labels != IGNORE_INDEX
    cur, target = logits[:, :-1, :][mask].float(), shift_labels[mask]
    if target.numel() == 0:
        return cur.sum() * 0.0
    suppressed = cur.detach().scatter(-1, target[:, None], float("-inf"))
    return F.cross_entropy(cur, F.softmax(suppressed, dim=-1))


class CEU(ForgetRetainObjective):
    """CE-U on the forget answers after their first ``ignore_first_n_answer_tokens`` (1);
    gamma 1, alpha 0 (the reference trains on the forget set only)."""

    name = "ceu"
    default_alpha = 0.0

    def __init__(
        self,
        *,
        ignore_first_n_answer_tokens: Annotated[int, "answer tokens left out at the start of each answer"] = 1,
        **kwargs,
    ):
        super().__init__(**kwargs)
        n = ignore_first_n_answer_tokens
        check_option(
            self.name,
            "ignore_first_n_answer_tokens",
            n,
            isinstance(n, int) and not isinstance(n, bool) and n >= 0,
            "an integer >= 0",
        )
        self.ignore_first_n_answer_tokens = n

    def forget_loss(self, model, batch, reference_model=None):
        part = batch["forget"]
        labels = skip_first_answer_tokens(part["labels"], self.ignore_first_n_answer_tokens)
        return ce_unlearning(forward(model, part).logits, labels)
