"""A sharded recommender (RecEraser / SISA) as an lm-eval model, so the MovieLens tasks
evaluate it exactly as they evaluate a single model: a request (prompt, "Yes") or (prompt,
"No") gets log P(answer) = log sigmoid(+-s) from the ensemble's aggregated log-odds s, which
makes the tasks' P(Yes) / (P(Yes) + P(No)) equal to sigmoid(s). Other requests (generation,
other continuations) are refused: the ensemble has no token distribution."""

from __future__ import annotations

import math

from lm_eval.api.model import LM

from unlearn_plugins.errors import UnlearnError

from .prompts import NO, YES
from .sharded import ShardedRecommender


def _log_sigmoid(x: float) -> float:
    return -math.log1p(math.exp(-x)) if x >= 0 else x - math.log1p(math.exp(x))


class ShardedRecommenderLM(LM):
    """``ShardedRecommenderLM(ShardedRecommender(folder))``: base model and adapters loaded once."""

    def __init__(self, sharded: ShardedRecommender, *, device: str | None = None, batch_size: int = 8):
        super().__init__()
        self.sharded, self.batch_size = sharded, batch_size
        self.loaded = sharded.load(device)

    def loglikelihood(self, requests, disable_tqdm: bool = False):
        tok = self.loaded[1]
        for r in requests:
            if r.args[1] not in (YES, NO):
                raise UnlearnError(
                    f"the sharded recommender answers {YES!r} or {NO!r} only, not {r.args[1]!r} (task {r.task_name})"
                )
        prompts = sorted({r.args[0] for r in requests})
        ids = [tok(p, add_special_tokens=False)["input_ids"] for p in prompts]
        odds = dict(
            zip(prompts, self.sharded.predict([], loaded=self.loaded, prompts=ids, batch_size=self.batch_size).log_odds)
        )
        out = []
        for r in requests:
            s = odds[r.args[0]]
            ll = _log_sigmoid(s if r.args[1] == YES else -s)
            out.append((ll, ll >= math.log(0.5)))
        return out

    def loglikelihood_rolling(self, requests, disable_tqdm: bool = False):
        raise UnlearnError("the sharded recommender scores Yes/No answers only (no rolling log-likelihood)")

    def generate_until(self, requests, disable_tqdm: bool = False):
        raise UnlearnError("the sharded recommender scores Yes/No answers only (no generation)")
