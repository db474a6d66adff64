"""``bad_teacher``: E2URec's "Bad-T" baseline for Yes/No recommenders.

Reference: justarter/E2URec, ``unlearning_rl.py`` (run by ``train_rl.sh``, the README's
"Bad-T"): the forget data is taught by a teacher that gives the wrong answer - each forget
answer flipped ("Yes" <-> "No") - while the retain data keeps its answers:
loss = NLL(retain) + weight * NLL(forget, flipped answers), weight = 0.5. Only Yes/No answers
can be flipped; any other answer is an error naming the sample.
"""

from __future__ import annotations

from typing import Annotated, Any, Sequence

from unlearn_plugins.errors import DataError, UnlearnError
from unlearn_plugins.objectives.base import ObjectiveContext, check_option, mean_nll

FLIP = {"Yes": "No", "No": "Yes"}


class FlippedView:
    """Item i: forget sample i with its answer flipped, encoded like any answer."""

    def __init__(self, samples: Sequence[Any], tokenizer, *, max_length: int = 512, system_prompt: str | None = None):
        from unlearn_plugins.data.qa import encode_qa

        self.items = []
        for s in samples:
            if s.answer not in FLIP:
                raise DataError(
                    f"{getattr(s, 'where', '<memory>')}: objective 'bad_teacher' flips Yes/No answers; "
                    f"answer {s.answer!r} is neither"
                )
            self.items.append(
                encode_qa(
                    tokenizer,
                    s.question,
                    FLIP[s.answer],
                    max_length=max_length,
                    system_prompt=system_prompt,
                    where=getattr(s, "where", "<memory>"),
                )
            )

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int) -> dict:
        return self.items[i]


class BadTeacher:
    """NLL on the retain answers plus ``weight`` (0.5) times NLL on the flipped forget answers."""

    name = "bad_teacher"
    regularizer = False
    needs_reference_model = False
    needs_retain_data = True
    needs_qa_data = True  # questions and answer spans: refuses text corpora (data/text.py)

    def __init__(self, *, weight: Annotated[float, "weight of the flipped forget answers' NLL"] = 0.5):
        check_option(self.name, "weight", weight, isinstance(weight, (int, float)) and weight > 0, "a number > 0")
        self.weight = float(weight)
        self.last_terms: dict[str, Any] = {}

    def __repr__(self) -> str:
        return f"{self.name}(weight={self.weight!r})"

    def prepare(self, context: ObjectiveContext) -> dict[str, FlippedView]:
        return {
            "forget_flipped": FlippedView(
                context.forget_samples,
                context.tokenizer,
                max_length=context.max_length,
                system_prompt=context.system_prompt,
            )
        }

    def loss(self, model, batch, reference_model=None):
        if "forget_flipped" not in batch:
            raise UnlearnError("bad_teacher: the batch has no 'forget_flipped' part (call prepare() before training)")
        if batch.get("retain") is None:
            raise UnlearnError("objective 'bad_teacher' needs retain data: give --retain")
        forget = mean_nll(model, batch["forget_flipped"])
        retain = mean_nll(model, batch["retain"])
        self.last_terms = {"forget_flipped": forget.detach(), "retain": retain.detach()}
        return retain + self.weight * forget
