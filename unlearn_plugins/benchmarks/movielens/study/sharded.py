"""A study's sharded recommender (``[sharded]``, with a MovieLens benchmark): RecEraser, or SISA
with the average aggregator, as one more unlearning method beside the study's ``[[methods]]``.

Two stages: ``sharded_train`` partitions the benchmark's users into ``shards`` (``partition``:
balanced, RecEraser's, or random), trains one LoRA adapter per shard with the target's recipe
and fits the aggregator on ``aggregator_prompts`` training prompts
(:func:`unlearn_plugins.benchmarks.movielens.sharded.train_sharded`); ``sharded_unlearn`` copies it and
unlearns the forget users (only the shards that held them retrain, then the aggregator is
refitted), writing ``unlearning.json`` (the unlearning report and its seconds). The study's
recommendation evaluation then reads the copy through
:class:`~unlearn_plugins.benchmarks.movielens.sharded_lm.ShardedRecommenderLM`.

This module reads ``[sharded]`` (:func:`read`; no study import) and builds both stages."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path

KEYS = ("name", "label", "shards", "partition", "aggregator", "aggregator_prompts", "aggregator_options", "seed")
AGGREGATORS = ("attention", "average")
UNLEARNING = "unlearning.json"


@dataclass(frozen=True)
class Sharded:
    shards: int
    aggregator: str = "attention"
    aggregator_prompts: int = 256
    aggregator_options: dict = field(default_factory=dict)
    partition: str = "balanced"
    seed: int = 0
    name: str = "receraser"
    #: None: "RecEraser" with the attention aggregator, "SISA" with the average
    label: str | None = None

    @property
    def method(self) -> str:
        return self.label or ("RecEraser" if self.aggregator == "attention" else "SISA")

    def describe(self) -> dict:
        return dataclasses.asdict(self)


def read(reader, values: dict, *, users: int) -> Sharded:
    """``[sharded]`` (``users``: the retained users the shards share, at most one shard each)."""
    from ..aggregators import make_aggregator
    from ..partition import PARTITIONS

    reader.keys("sharded", values, KEYS)
    shards = reader.get("sharded", values, "shards", "int", required=True, minimum=1)
    if shards > users:
        raise reader.error("sharded", "shards", f"must be between 1 and the {users} retained users, got {shards}")
    aggregator = reader.get("sharded", values, "aggregator", "str", "attention", choices=AGGREGATORS)
    options = dict(reader.get("sharded", values, "aggregator_options", "table", {}))
    try:
        make_aggregator(aggregator, options)
    except Exception as exc:  # noqa: BLE001 - a bad option, named in the study file's terms
        raise reader.error("sharded", "aggregator_options", " ".join(str(exc).split())) from None
    name = reader.get("sharded", values, "name", "str", "receraser")
    return Sharded(
        shards=shards,
        aggregator=aggregator,
        aggregator_prompts=reader.get("sharded", values, "aggregator_prompts", "int", 256, minimum=1),
        aggregator_options=options,
        partition=reader.get("sharded", values, "partition", "str", "balanced", choices=PARTITIONS),
        seed=reader.get("sharded", values, "seed", "int", 0, minimum=0),
        name=name,
        label=reader.get("sharded", values, "label", "str", None),
    )


def build_train(tmp: Path, p: dict) -> None:
    """The shards and the aggregator, in ``tmp/sharded``."""
    from ..sharded import train_sharded

    s = p["sharded"]
    train_sharded(
        p["bench"],
        tmp / "sharded",
        model=p["model"],
        shards=s["shards"],
        partition=s["partition"],
        aggregator=s["aggregator"],
        aggregator_options=dict(s["aggregator_options"]),
        aggregator_prompts=s["aggregator_prompts"],
        seed=s["seed"],
        device=p["device"],
        **p["finetune"],
    )


def build_unlearn(tmp: Path, p: dict) -> None:
    """A copy of the trained shards (``p["trained"]``) with the forget users unlearned."""
    from unlearn_plugins.files import write_json
    from unlearn_plugins.study.cells import need_stage

    need_stage(p["trained"], "the trained shards")
    from ..sharded import copy_sharded

    report = copy_sharded(Path(p["trained"]) / "sharded", tmp / "sharded").unlearn(p["users"], device=p["device"])
    write_json(tmp / UNLEARNING, {"seconds": report.seconds, "report": report.to_json()})


def unlearning(folder: Path) -> dict:
    """What a ``sharded_unlearn`` stage wrote: its seconds and the unlearning report."""
    return json.loads((Path(folder) / UNLEARNING).read_text())


__all__ = ["Sharded", "read", "build_train", "build_unlearn", "unlearning"]
