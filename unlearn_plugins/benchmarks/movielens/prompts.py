"""The recommender's question: TALLRec's prompt over the user's last K rated movies.

TALLRec (Bao et al., 2023) asks, after an instruction, ``User Preference: "A (1995)", ...``
(movies rated above 3 stars), ``User Unpreference: ...`` (3 stars or fewer) and ``Whether the
user will like the target movie "T (1996)"?``; the answer is "Yes." or "No.". Here the
answers are "Yes" and "No" (one token each for SmolLM2, so P(Yes) / (P(Yes) + P(No)) is read at
one position) and both lists keep the order in which the user rated the movies, oldest first.
The chat template is applied where prompts are tokenised (training, evaluation, scoring),
exactly as for TOFU questions.
"""

from __future__ import annotations

from typing import Sequence

from .data import Movie

#: liked = rating above this many stars (TALLRec, E2URec)
LIKE_THRESHOLD = 3.0
#: K, the number of most recent rated movies shown (E2URec's "_10_" prompts)
DEFAULT_HISTORY = 10
YES, NO = "Yes", "No"
INSTRUCTION = (
    "Given the user's preference and unpreference, identify whether the user will like the target "
    f'movie by answering "{YES}" or "{NO}".'
)


def liked(rating: float) -> bool:
    """A rating counts as liked above 3 stars."""
    return rating > LIKE_THRESHOLD


def answer_for(rating: float) -> str:
    """The target answer of a rating: "Yes" when liked."""
    return YES if liked(rating) else NO


def _quoted(movies: Sequence[Movie]) -> str:
    return ", ".join(f'"{m.label}"' for m in movies) if movies else "none"


def build_prompt(history: Sequence[tuple[Movie, float]], target: Movie) -> str:
    """The question for ``target`` given (movie, rating) pairs, oldest first (the caller keeps
    the last K)."""
    preferred = [m for m, r in history if liked(r)]
    unpreferred = [m for m, r in history if not liked(r)]
    return (
        f"{INSTRUCTION}\n"
        f"User Preference: {_quoted(preferred)}\n"
        f"User Unpreference: {_quoted(unpreferred)}\n"
        f'Whether the user will like the target movie "{target.label}"?'
    )
