"""Preference-style objectives: NPO, SimNPO and IdkDPO (DPO with an "I don't know" answer)."""

from __future__ import annotations

import random

from ..errors import UnlearnError
from .base import ForgetRetainObjective, ObjectiveContext, check_option, reference_sequence_nll, sequence_nll

#: Refusals used as the preferred answer by IdkDPO (written for this project).
IDK_ANSWERS = (
    "I don't know.",
    "I don't know the answer to that.",
    "I'm not sure about that.",
    "I have no information about that.",
    "I can't answer that question.",
    "I'm afraid I don't know.",
    "That is something I don't know.",
    "I don't have that information.",
    "I'm not able to answer that.",
    "Sorry, I don't know the answer.",
    "I have no idea.",
    "I cannot say.",
    "I'm unsure.",
    "I don't know anything about that.",
    "That's not something I can tell you.",
    "I really couldn't say.",
    "I'm not familiar with that.",
    "Unfortunately, I don't know.",
    "I lack the knowledge to answer that.",
    "I have no answer to that question.",
)


def npo_loss(s_theta, s_ref, beta: float):
    """-(2/beta) mean log sigmoid(beta (S_theta - S_ref)) over examples."""
    import torch.nn.functional as F

    return -(2.0 / beta) * F.logsigmoid(beta * (s_theta - s_ref)).mean()


class NPO(ForgetRetainObjective):
    """Negative preference optimisation on summed answer NLL against a frozen reference; beta 0.1."""

    name = "npo"
    forget_needs_reference = True

    def __init__(self, *, beta: float = 0.1, **kwargs):
        super().__init__(**kwargs)
        check_option(self.name, "beta", beta, beta > 0, "a number > 0")
        self.beta = float(beta)

    def forget_loss(self, model, batch, reference_model=None):
        part = batch["forget"]
        s_theta, _ = sequence_nll(model, part)
        s_ref, _ = reference_sequence_nll(reference_model, part)
        return npo_loss(s_theta, s_ref, self.beta)


class SimNPO(ForgetRetainObjective):
    """Reference-free NPO on length-normalised loss: l = S/|y| - delta; beta 4.5, gamma 0.125."""

    name = "simnpo"
    default_gamma = 0.125

    def __init__(self, *, beta: float = 4.5, delta: float = 0.0, **kwargs):
        super().__init__(**kwargs)
        check_option(self.name, "beta", beta, beta > 0, "a number > 0")
        self.beta, self.delta = float(beta), float(delta)

    def forget_loss(self, model, batch, reference_model=None):
        import torch.nn.functional as F

        s, n = sequence_nll(model, batch["forget"])
        margin = s / n.clamp_min(1) - self.delta
        return -(2.0 / self.beta) * F.logsigmoid(self.beta * margin).mean()


class IdkDPO(ForgetRetainObjective):
    """DPO with win = an "I don't know" answer, lose = the true forget answer; beta 0.1.

    ``prepare`` encodes each forget question with a refusal chosen by the seed, added to
    batches as ``forget_idk``.
    """

    name = "idk_dpo"
    forget_needs_reference = True

    def __init__(self, *, beta: float = 0.1, idk_answers: list[str] | None = None, **kwargs):
        super().__init__(**kwargs)
        check_option(self.name, "beta", beta, beta > 0, "a number > 0")
        answers = list(idk_answers) if idk_answers is not None else list(IDK_ANSWERS)
        check_option(self.name, "idk_answers", idk_answers,
                     bool(answers) and all(isinstance(a, str) and a.strip() for a in answers),
                     "a non-empty list of non-empty strings")
        self.beta = float(beta)
        self.idk_answers = answers

    def prepare(self, context: ObjectiveContext) -> dict[str, list]:
        from ..data.tofu import encode_qa

        rng = random.Random(context.seed)
        encoded = [
            encode_qa(context.tokenizer, s.question, rng.choice(self.idk_answers), max_length=context.max_length,
                      system_prompt=context.system_prompt, where=getattr(s, "where", "<memory>"))
            for s in context.forget_samples
        ]
        return {"forget_idk": encoded}

    def forget_loss(self, model, batch, reference_model=None):
        import torch.nn.functional as F

        if "forget_idk" not in batch:
            raise UnlearnError("idk_dpo: the batch has no 'forget_idk' part (call prepare() before training)")
        win, lose = batch["forget_idk"], batch["forget"]
        s_win, _ = sequence_nll(model, win)
        s_lose, _ = sequence_nll(model, lose)
        r_win, _ = reference_sequence_nll(reference_model, win)
        r_lose, _ = reference_sequence_nll(reference_model, lose)
        win_ratio = -(s_win - r_win)
        lose_ratio = -(s_lose - r_lose)
        return -(2.0 / self.beta) * F.logsigmoid(self.beta * (win_ratio - lose_ratio)).mean()
