"""RecEraser / SISA on the LLM recommender: users in shards, one LoRA adapter per shard
trained from the base model on its users' prompts (the target recipe), predictions
aggregated; unlearning users retrains only the shards that held them, then refits the
aggregator without them, and reports how many shards and how much time that cost.

Folder layout (``OUT``)::

    sharded.json            settings, base model, the users of each shard, every shard run, every
                            unlearning request (shards retrained, seconds)
    shards/shard-K.json     shard K's training prompts (TOFU JSON-lines format)
    shards/shard-K/         shard K's LoRA adapter (standard PEFT folder, from run_finetune)
    aggregator.pt           the fitted aggregator (attention); aggregator_data.json: its prompts

Shards are trained whole (RecEraser retrains a shard from scratch; SISA's slices within a
shard are not used). A shard left without users by an unlearning request leaves the ensemble.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from unlearn_plugins.errors import UnlearnError

from .aggregators import load_state, make_aggregator, save_state
from .partition import (
    DEFAULT_EMBEDDING_DIM,
    DEFAULT_ITERATIONS,
    PARTITIONS,
    balanced_partition,
    random_partition,
    user_embeddings,
)
from .predict import Predictions, labels_of
from .recipes import RECIPE

INFO = "sharded.json"
FORMAT = "unlearn-plugins/sharded-recommender"
#: prompts (seeded sample of the training prompts) the aggregator is fitted on
DEFAULT_AGGREGATOR_PROMPTS = 256


@dataclass
class UnlearningReport:
    """What an unlearning request cost: shards retrained (of how many) and the seconds spent."""

    users: list[int]
    shards_retrained: list[int]
    shards_removed: list[int]
    shards_total: int
    retrain_seconds: float
    aggregator_seconds: float
    seconds: float
    per_shard_seconds: dict[int, float] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return dict(vars(self))


def _shard_dir(out: Path, k: int) -> Path:
    return out / "shards" / f"shard-{k}"


def _shard_data(out: Path, k: int) -> Path:
    return out / "shards" / f"shard-{k}.json"


class ShardedRecommender:
    """A trained sharded ensemble in ``folder`` (see the module docstring)."""

    def __init__(self, folder: str | os.PathLike, info: dict | None = None):
        self.folder = Path(folder)
        path = self.folder / INFO
        try:
            self.info = info if info is not None else json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise UnlearnError(f"{path}: not found; {self.folder} holds no sharded recommender") from None
        except (OSError, ValueError) as exc:
            raise UnlearnError(f"{path}: unreadable ({exc})") from None
        if self.info.get("format") != FORMAT:
            raise UnlearnError(f"{path}: field 'format' must be {FORMAT!r}")
        self.aggregator = make_aggregator(self.info["aggregator"], self.info.get("aggregator_options"))
        if (self.folder / "aggregator.pt").is_file():
            load_state(self.aggregator, self.folder / "aggregator.pt")

    # ------------------------------------------------------------------ queries
    @property
    def shards(self) -> list[dict]:
        """The shards still in the ensemble: {"id", "users", ...}."""
        return [s for s in self.info["shards"] if not s.get("removed")]

    def shard_of(self, user: int) -> int | None:
        for s in self.info["shards"]:
            if user in s["users"] and not s.get("removed"):
                return s["id"]
        return None

    def _load(self, device: str | None):
        from peft import PeftModel

        from unlearn_plugins.models import load_model

        base, tok = load_model(self.info["model"], device=device)
        shards = self.shards
        model = PeftModel.from_pretrained(
            base, str(_shard_dir(self.folder, shards[0]["id"])), adapter_name=f"shard-{shards[0]['id']}"
        )
        for s in shards[1:]:
            model.load_adapter(str(_shard_dir(self.folder, s["id"])), adapter_name=f"shard-{s['id']}")
        model.eval()
        return model, tok

    def load(self, device: str | None = None):
        """(the base model with every shard's adapter, tokenizer): load once, pass as ``loaded``."""
        return self._load(device)

    def shard_outputs(
        self,
        samples: Sequence[Any],
        *,
        device: str | None = None,
        batch_size: int = 8,
        loaded=None,
        prompts: Sequence[Sequence[int]] | None = None,
    ):
        """(features (n, shards, d), log-odds (n, shards)) of every shard in the ensemble, for
        ``samples`` (or already tokenised chat ``prompts``)."""
        import torch

        from .predict import predict_prompts, prompt_token_ids

        model, tok = loaded or self._load(device)
        ids = list(prompts) if prompts is not None else prompt_token_ids(tok, samples)
        feats, odds = [], []
        for s in self.shards:
            model.set_adapter(f"shard-{s['id']}")
            out = predict_prompts(
                model, tok, ids, batch_size=batch_size, max_length=int(self.info["recipe"]["max_length"]), hidden=True
            )
            feats.append(out.hidden)
            odds.append(torch.tensor(out.log_odds))
        return torch.stack(feats, 1), torch.stack(odds, 1)

    def predict(self, samples: Sequence[Any], **options) -> Predictions:
        """The ensemble's P(Yes) for each sample (aggregated log-odds); ``options``: those of
        :meth:`shard_outputs` (device, batch_size, loaded, prompts)."""
        import torch

        feats, odds = self.shard_outputs(samples, **options)
        combined = self.aggregator.combine(feats, odds).double()
        return Predictions(torch.sigmoid(combined).tolist(), combined.tolist(), None)

    # ------------------------------------------------------------------ training pieces
    def _train_shard(self, k: int, samples: Sequence[Any], *, device: str | None) -> float:
        from unlearn_plugins.files import write_jsonl
        from unlearn_plugins.training.config import FinetuneConfig
        from unlearn_plugins.training.run import run_finetune

        data = _shard_data(self.folder, k)
        write_jsonl(data, [s.to_record() for s in samples])
        recipe = {**self.info["recipe"], "merge": False}
        started = time.perf_counter()
        run_finetune(
            FinetuneConfig(
                out=str(_shard_dir(self.folder, k)),
                model=self.info["model"],
                data=str(data),
                device=device,
                overwrite=True,
                **recipe,
            )
        )
        return time.perf_counter() - started

    def _fit_aggregator(self, *, device: str | None, batch_size: int = 8) -> dict:
        from unlearn_plugins.data.qa import read_jsonl

        started = time.perf_counter()
        if self.aggregator.name == "average":
            return {"seconds": 0.0}
        samples = read_jsonl(self.folder / "aggregator_data.json")
        feats, odds = self.shard_outputs(samples, device=device, batch_size=batch_size)
        info = self.aggregator.fit(feats, odds, labels_of(samples))
        save_state(self.aggregator, self.folder / "aggregator.pt")
        return {**info, "seconds": time.perf_counter() - started}

    def _write_info(self) -> None:
        from unlearn_plugins.files import write_json

        write_json(self.folder / INFO, self.info)

    # ------------------------------------------------------------------ unlearning
    def unlearn(self, users: Sequence[int], *, device: str | None = None) -> UnlearningReport:
        """Forget every training prompt of ``users``: retrain the shards that held them (without
        them), drop shards left empty, refit the aggregator without their prompts."""
        from unlearn_plugins.data.qa import read_jsonl
        from unlearn_plugins.files import write_jsonl

        started = time.perf_counter()
        forget = set(int(u) for u in users)
        unknown = sorted(u for u in forget if self.shard_of(u) is None)
        if unknown:
            raise UnlearnError(
                f"unlearn: user(s) {unknown} are in no shard of {self.folder} (trained users: "
                f"{sum(len(s['users']) for s in self.shards)})"
            )
        retrained, removed, per_shard = [], [], {}
        for s in self.shards:
            if not forget & set(s["users"]):
                continue
            s["users"] = [u for u in s["users"] if u not in forget]
            kept = [x for x in read_jsonl(_shard_data(self.folder, s["id"])) if int(x.extra["user_id"]) not in forget]
            if not s["users"] or not kept:
                s["removed"] = True
                removed.append(s["id"])
                continue
            per_shard[s["id"]] = self._train_shard(s["id"], kept, device=device)
            s["prompts"] = len(kept)
            retrained.append(s["id"])
        if not self.shards:
            raise UnlearnError("unlearn: the request removes every user of the ensemble")
        agg_rows = [
            x for x in read_jsonl(self.folder / "aggregator_data.json") if int(x.extra["user_id"]) not in forget
        ]
        if not agg_rows:
            raise UnlearnError("unlearn: no aggregator prompts left after removing the users")
        write_jsonl(self.folder / "aggregator_data.json", [x.to_record() for x in agg_rows])
        if removed and self.aggregator.name != "average":
            self.aggregator = make_aggregator(self.info["aggregator"], self.info.get("aggregator_options"))
        fit = self._fit_aggregator(device=device)
        retrain_s = sum(per_shard.values())
        report = UnlearningReport(
            sorted(forget),
            retrained,
            removed,
            len(self.info["shards"]),
            round(retrain_s, 3),
            round(fit["seconds"], 3),
            round(time.perf_counter() - started, 3),
            {k: round(v, 3) for k, v in per_shard.items()},
        )
        self.info.setdefault("unlearning", []).append(report.to_json())
        self.info["aggregator_fit"] = fit
        self._write_info()
        return report


def train_sharded(
    benchmark_dir: str | os.PathLike,
    out: str | os.PathLike,
    *,
    model: str = "smollm2-135m",
    shards: int = 4,
    partition: str = "balanced",
    aggregator: str = "attention",
    aggregator_options: dict | None = None,
    aggregator_prompts: int = DEFAULT_AGGREGATOR_PROMPTS,
    iterations: int = DEFAULT_ITERATIONS,
    embedding_dim: int = DEFAULT_EMBEDDING_DIM,
    seed: int = 0,
    device: str | None = None,
    **recipe: Any,
) -> ShardedRecommender:
    """Partition the benchmark's users (train.json), train one adapter per shard, fit the aggregator."""
    from unlearn_plugins.files import write_jsonl

    from .benchmark import load_part

    if partition not in PARTITIONS:
        raise UnlearnError(f"unknown partition {partition!r}; partitions: {', '.join(PARTITIONS)}")
    make_aggregator(aggregator, aggregator_options)  # bad names and options fail before any training
    train = load_part(benchmark_dir, "train")
    by_user: dict[int, list[Any]] = {}
    for s in train:
        by_user.setdefault(int(s.extra["user_id"]), []).append(s)
    if partition == "balanced":
        pairs = {u: [(int(s.extra["item_id"]), int(s.extra["label"])) for s in rows] for u, rows in by_user.items()}
        groups = balanced_partition(user_embeddings(pairs, embedding_dim), shards, iterations=iterations, seed=seed)
    else:
        groups = random_partition(list(by_user), shards, seed=seed)
    folder = Path(out)
    if (folder / INFO).exists():
        raise UnlearnError(f"--out {folder} already holds a sharded recommender ({INFO}); choose another folder")
    folder.mkdir(parents=True, exist_ok=True)
    picked = sorted(random.Random(f"aggregator:{seed}").sample(range(len(train)), min(aggregator_prompts, len(train))))
    write_jsonl(folder / "aggregator_data.json", [train[i].to_record() for i in picked])
    options = {**RECIPE, "seed": seed, **recipe}
    info = {
        "format": FORMAT,
        "version": 1,
        "model": model,
        "benchmark": str(Path(benchmark_dir).resolve()),
        "partition": partition,
        "iterations": iterations,
        "embedding_dim": embedding_dim,
        "seed": seed,
        "aggregator": aggregator,
        "aggregator_options": dict(aggregator_options or {}),
        "aggregator_prompts": len(picked),
        "recipe": options,
        "shards": [
            {"id": k, "users": users, "prompts": sum(len(by_user[u]) for u in users)} for k, users in enumerate(groups)
        ],
    }
    sharded = ShardedRecommender(folder, info)  # sharded.json is written once everything is trained
    for s in info["shards"]:
        s["seconds"] = round(
            sharded._train_shard(s["id"], [x for u in s["users"] for x in by_user[u]], device=device), 3
        )
    sharded.info["aggregator_fit"] = sharded._fit_aggregator(device=device)
    sharded._write_info()
    return sharded


def copy_sharded(folder: str | os.PathLike, out: str | os.PathLike) -> ShardedRecommender:
    """A copy of a sharded recommender (to unlearn from while keeping the original)."""
    if Path(out).exists():
        raise UnlearnError(f"{out} already exists; choose a new folder for the copy")
    shutil.copytree(folder, out)
    return ShardedRecommender(out)
