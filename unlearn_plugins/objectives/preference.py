"""Preference-style objectives: NPO, SimNPO and IdkDPO (DPO with an "I don't know" answer)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Sequence

from ..errors import UnlearnError
from .base import ForgetRetainObjective, ObjectiveContext, check_option, reference_sequence_nll, sequence_nll

#: TOFU's refusal list: one sentence per line (plain text despite the extension).
IDK_FILE = "idontknow.jsonl"
#: The refusals this project ships (its own sentences), used when no TOFU list is found.
SHIPPED_IDK_FILE = Path(__file__).with_name("idk_answers.txt")


def read_refusals(path: str | os.PathLike) -> list[str]:
    """One refusal per non-blank line, stripped (as the reference strips each line)."""
    path = Path(path)
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise UnlearnError(
            f"objective 'idk_dpo': cannot read the refusal list {path} ({exc.strerror or exc})"
        ) from None
    answers = [line.strip() for line in lines if line.strip()]
    if not answers:
        raise UnlearnError(f"objective 'idk_dpo': the refusal list {path} has no non-blank line")
    return answers


def find_refusal_file(forget_samples: Sequence[Any] = ()) -> Path:
    """TOFU's ``idontknow.jsonl`` beside the forget split's file (its TOFU folder), else in
    $UNLEARN_TOFU_DIR; else the list this project ships."""
    folders = [Path(s.source).parent for s in forget_samples[:1] if getattr(s, "source", "<memory>") != "<memory>"]
    if os.environ.get("UNLEARN_TOFU_DIR"):
        folders.append(Path(os.environ["UNLEARN_TOFU_DIR"]).expanduser())
    for folder in folders:
        if (folder / IDK_FILE).is_file():
            return folder / IDK_FILE
    return SHIPPED_IDK_FILE


def npo_loss(s_theta, s_ref, beta: float):
    """-(2/beta) mean log sigmoid(beta (S_theta - S_ref)) over examples."""
    import torch.nn.functional as F

    return -(2.0 / beta) * F.logsigmoid(beta * (s_theta - s_ref)).mean()


def dpo_forget_loss(name: str, model, batch, reference_model, *, win_part: str, beta: float):
    """open-unlearning's ``compute_dpo_loss`` with win = the batch's ``win_part`` (added by the
    objective's ``prepare``; the error names the objective ``name``) and lose = the forget answer:
    -(2/beta) mean log sigmoid(beta (log-ratio of win - log-ratio of lose)) against the reference."""
    import torch.nn.functional as F

    if win_part not in batch:
        raise UnlearnError(f"{name}: the batch has no '{win_part}' part (call prepare() before training)")
    win, lose = batch[win_part], batch["forget"]
    s_win, _ = sequence_nll(model, win)
    s_lose, _ = sequence_nll(model, lose)
    r_win, _ = reference_sequence_nll(reference_model, win)
    r_lose, _ = reference_sequence_nll(reference_model, lose)
    win_ratio = -(s_win - r_win)
    lose_ratio = -(s_lose - r_lose)
    return -(2.0 / beta) * F.logsigmoid(beta * (win_ratio - lose_ratio)).mean()


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


class AnswerView:
    """Item i: forget question i with one of its candidate answers (:meth:`choices`), drawn
    afresh each epoch as a pure function of (seed, epoch, i) (salted by :attr:`draw`), so a
    resumed run draws the same answers. Encoded like any answer (chat template, end token), on
    first use."""

    #: the salt of the draw
    draw = "answer"

    def __init__(self, samples: Sequence[Any], tokenizer, *, seed=0, max_length=512, system_prompt=None):
        self.samples, self.tokenizer = list(samples), tokenizer
        self.seed, self.max_length, self.system_prompt = seed, max_length, system_prompt
        self.epoch = 0
        self._encoded: dict[tuple[int, int], dict] = {}

    @classmethod
    def of(cls, context: ObjectiveContext, choices):
        """The view of the forget set of a run's ``context``."""
        options = {"seed": context.seed, "max_length": context.max_length, "system_prompt": context.system_prompt}
        return cls(context.forget_samples, choices, context.tokenizer, **options)

    def choices(self, i: int) -> Sequence[str]:
        raise NotImplementedError

    def set_epoch(self, epoch: int) -> None:
        self.epoch = int(epoch)

    def answer_index(self, i: int, epoch: int | None = None) -> int:
        from ..data.qa import draw_index

        return draw_index(len(self.choices(i)), self.draw, self.seed, self.epoch if epoch is None else epoch, i)

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, i: int) -> dict:
        return self.encoded(i, self.answer_index(i))

    def encoded(self, i: int, k: int) -> dict:
        """Answer ``k`` of forget question ``i``, encoded."""
        from ..data.qa import encode_qa

        if (i, k) not in self._encoded:
            s = self.samples[i]
            self._encoded[(i, k)] = encode_qa(
                self.tokenizer,
                s.question,
                self.choices(i)[k],
                max_length=self.max_length,
                system_prompt=self.system_prompt,
                where=getattr(s, "where", "<memory>"),
            )
        return self._encoded[(i, k)]


class RefusalView(AnswerView):
    """Every forget question with a refusal as its answer, drawn afresh each epoch (the
    reference draws one on every access)."""

    draw = "idk"

    def __init__(self, samples: Sequence[Any], answers: Sequence[str], tokenizer, **options):
        super().__init__(samples, tokenizer, **options)
        self.answers = list(answers)

    def choices(self, i: int) -> Sequence[str]:
        return self.answers


class IdkDPO(ForgetRetainObjective):
    """DPO with win = an "I don't know" answer, lose = the true forget answer; beta 0.1.

    ``prepare`` adds to batches, as ``forget_idk``, each forget question with a refusal
    redrawn every epoch from ``idk_answers`` (a list), else the lines of ``idk_file``, else
    TOFU's ``idontknow.jsonl`` when found (:func:`find_refusal_file`), else the shipped list.
    """

    name = "idk_dpo"
    forget_needs_reference = True
    needs_qa_data = True  # questions and answer spans: refuses text corpora (data/text.py)

    def __init__(
        self, *, beta: float = 0.1, idk_answers: list[str] | None = None, idk_file: str | None = None, **kwargs
    ):
        super().__init__(**kwargs)
        check_option(self.name, "beta", beta, beta > 0, "a number > 0")
        if idk_answers is not None:
            check_option(
                self.name,
                "idk_answers",
                idk_answers,
                isinstance(idk_answers, (list, tuple))
                and bool(idk_answers)
                and all(isinstance(a, str) and a.strip() for a in idk_answers),
                "a non-empty list of non-empty strings",
            )
        check_option(
            self.name,
            "idk_file",
            idk_file,
            idk_file is None or isinstance(idk_file, (str, os.PathLike)),
            "a path to a file with one refusal per line",
        )
        if idk_answers is not None and idk_file is not None:
            raise UnlearnError("objective 'idk_dpo': give either option 'idk_answers' or option 'idk_file', not both")
        self.beta = float(beta)
        self.idk_answers = None if idk_answers is None else list(idk_answers)
        self.idk_file = None if idk_file is None else str(idk_file)
        # read now, so a bad file fails before the model is loaded; None: found in prepare
        self._answers = self.idk_answers or (read_refusals(idk_file) if idk_file is not None else None)

    def prepare(self, context: ObjectiveContext) -> dict[str, RefusalView]:
        answers, source = self._answers, self.idk_file or "option idk_answers"
        if answers is None:
            path = find_refusal_file(context.forget_samples)
            answers, source = read_refusals(path), str(path)
        context.info["idk_refusals"] = {"source": source, "count": len(answers)}
        return {"forget_idk": RefusalView.of(context, answers)}

    def forget_loss(self, model, batch, reference_model=None):
        return dpo_forget_loss(self.name, model, batch, reference_model, win_part="forget_idk", beta=self.beta)
