"""The ``cud`` difficulty scorer: anchors chosen by unlearning runs (:mod:`.anchors`,
:mod:`.anchor_runs`), EAP-IG matrices of the scored samples and the anchors (cached,
:mod:`.cache`), and each sample's circuit compared with the easy and hard anchor circuits."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, Sequence

from ...data.qa import IGNORE_INDEX
from ...errors import UnlearnError
from ...interfaces import QASample
from .anchor_runs import AnchorRunner, TrainerAnchorRunner, anchor_run_options
from .anchors import (
    IN_SAMPLE,
    AnchorError,
    AnchorPool,
    AnchorVote,
    as_samples,
    default_anchor_pool,
    mean_or_none,
    qa_key,
    spearman,
    vote_anchors,
)
from .cache import CUDCache, anchor_run_key, default_cache_dir, matrix_key, model_fingerprint, samples_fingerprint
from .config import PAPER_OBJECTIVES, CUDConfig  # noqa: F401 - PAPER_OBJECTIVES: read from here by the demo report

#: UnlearnConfig fields each anchor run sets itself (not options of the scorer)
RUN_SET = ("out", "model", "forget", "objective", "seed", "device")


def first_answer_tokens(encoded: list[dict], n: int | None) -> list[dict]:
    """Encoded examples with labels kept on their first ``n`` answer tokens only (None: all), so
    the EAP-IG metric measures, e.g., the Yes/No token of a recommendation prompt without the end
    token after it."""
    if n is None:
        return encoded
    out = []
    for e in encoded:
        labels, seen = [], 0
        for x in e["labels"]:
            keep = x != IGNORE_INDEX and seen < n
            seen += x != IGNORE_INDEX
            labels.append(x if keep else IGNORE_INDEX)
        out.append({**e, "labels": labels})
    return out


def _none_if_off(value):
    return None if isinstance(value, str) and value.strip().lower() in ("none", "null", "off", "") else value


class CUDScorer:
    """Difficulty scorer ``cud``: returns per sample {score, s_E, s_H, anchor, circuit...};
    with ``per_objective`` {score (mean over objectives), score_by_objective, s_E_by_objective,
    s_H_by_objective, anchor, circuit...}. ``last_metadata``: the anchors, their votes, the runs."""

    #: the scorer's options (the host lists and checks them from its fields)
    config_class = CUDConfig

    def __init__(self, **options: Any):
        config = CUDConfig(**options)  # every option's default, help and checks
        self.config = config
        self.objectives = list(config.objectives)
        self.seeds = [int(s) for s in config.seeds]
        self.anchor_data, self.tofu_dir = config.anchor_data, config.tofu_dir
        self.k, self.min_votes, self.min_objectives = config.k, config.min_votes, config.min_objectives
        self.per_objective, self.anchor_by = bool(config.per_objective), config.anchor_by
        self.stop_prob, self.check_steps = _none_if_off(config.stop_prob), _none_if_off(config.check_steps)
        self.anchors = config.anchors
        self.anchor_losses = [list(r) for r in config.anchor_losses] if config.anchor_losses is not None else None
        self.runner = config.runner
        self.model_spec = config.model_spec
        self.unlearn_options = _options("unlearn_options", config.unlearn_options)
        self.anchor_recipe = config.anchor_recipe
        self.unlearn_by_objective = _by_objective(config.unlearn_by_objective, self.objectives)
        if config.runner is None:  # check stop_prob / check_steps now, not after the model load
            TrainerAnchorRunner(
                config.model_spec, self.unlearn_options, stop_prob=self.stop_prob, check_steps=self.check_steps
            )
        self.similarity, self.circuit, self.n_edges, self.tau = (
            config.similarity,
            config.circuit,
            int(config.n_edges),
            config.tau,
        )
        self.vector = config.vector  # cosine of 0/1 edge masks (the paper's table) or of signed edge scores
        self.eap = {
            "mode": config.mode,
            "steps": int(config.steps),
            "baseline": config.baseline,
            "metric": config.metric,
        }
        self.max_rows, self.max_length = int(config.max_rows), int(config.max_length)
        self.answer_tokens = config.answer_tokens  # the EAP-IG metric on the first N answer tokens (1: Yes/No)
        self.cache = bool(config.cache)
        self.cache_dir = Path(config.cache_dir).expanduser() if config.cache_dir else None
        self.progress = config.progress
        self.last_anchors: dict[str, Any] = {}
        self.last_metadata: dict[str, Any] | None = None
        self._run_info: dict[tuple[str, int], dict] = {}
        self._vote: AnchorVote | None = None
        self._values: dict[str, list[list[float]]] | None = None
        self._k: int | None = None
        self._shards: tuple[str, int] | None = None  # (run id, processes) after prepare_shard on the main process

    # ------------------------------------------------------------------ the anchor pool
    def _cache_root(self) -> Path:
        return self.cache_dir or default_cache_dir()

    def _store(self) -> CUDCache:
        return CUDCache(self._cache_root())

    def anchor_pool(self, samples: Sequence[QASample]) -> AnchorPool:
        """The samples the anchor runs unlearn: ``anchor_data`` (a split spec or samples) less any
        that are also scored; the scored samples themselves with ``anchor_data=self``; by default
        a disjoint TOFU pool (:func:`default_anchor_pool`)."""
        from ...data.qa import load_split

        data = self.anchor_data
        if data is None:
            return default_anchor_pool(samples)
        if isinstance(data, str) and data == IN_SAMPLE:
            return AnchorPool(list(samples), IN_SAMPLE, in_sample=True)
        if isinstance(data, str):
            pool, spec = load_split(data, self.tofu_dir), data
        else:
            pool, spec = as_samples(data, "anchor_data"), f"<{len(data)} samples>"
        scored = {qa_key(s) for s in samples}
        kept = [p for p in pool if qa_key(p) not in scored]
        if len(kept) < len(pool) and self.progress:
            print(
                f"cud: left {len(pool) - len(kept)} samples of the anchor pool {spec} out: they are also scored",
                file=sys.stderr,
                flush=True,
            )
        options = {"tofu_dir": self.tofu_dir} if self.tofu_dir else {}
        return AnchorPool(kept, spec, dropped=len(pool) - len(kept), run_options=options)

    @staticmethod
    def _check_counts(samples, pool: AnchorPool) -> None:
        if pool.in_sample:
            if len(samples) < 4:
                raise UnlearnError(f"scorer cud needs at least 4 samples (2 easy + 2 hard anchors), got {len(samples)}")
            return
        if not samples:
            raise UnlearnError("scorer cud: no samples to score")
        if len(pool.samples) < 4:
            left = f" ({pool.dropped} more were left out: they are also scored)" if pool.dropped else ""
            raise UnlearnError(
                f"scorer cud: the anchor pool {pool.spec} has {len(pool.samples)} samples{left}; "
                f"it needs at least 4, disjoint from the scored ones"
            )

    def run_options(self, objective: str, pool: AnchorPool | None = None) -> dict:
        """The UnlearnConfig options of ``objective``'s anchor runs (default runner): the pool's,
        the recipe's (``anchor_recipe=paper``: the CUD code's settings of the five objectives),
        ``unlearn_options``, ``unlearn_by_objective[objective]``, in rising precedence."""
        return anchor_run_options(
            objective,
            recipe=self.anchor_recipe,
            shared=self.unlearn_options,
            by_objective=self.unlearn_by_objective,
            base=pool.run_options if pool is not None else None,
        )

    def _runner_for(self, pool: AnchorPool, objective: str | None = None) -> AnchorRunner:
        """The runner of ``objective``'s anchor runs (default: the first objective's)."""
        if self.runner is not None:
            return self.runner
        options = self.run_options(objective or self.objectives[0], pool)
        return TrainerAnchorRunner(self.model_spec, options, stop_prob=self.stop_prob, check_steps=self.check_steps)

    def deviations(self) -> list[str]:
        """How these anchor runs differ from the paper's (recorded in the metadata)."""
        out = []
        if self.anchors is not None or self.anchor_losses is not None:
            return out
        if self.stop_prob is not None:
            out.append(
                f"anchor runs stop at the first check where the pool's mean answer probability is below "
                f"{self.stop_prob} (the paper's runs train their whole budget)"
            )
        if self.runner is None:
            if self.anchor_recipe != "paper":
                out.append(f"anchor_recipe={self.anchor_recipe}: not the paper's per-objective anchor-run settings")
            for o in self.objectives:
                options = self.run_options(o)
                if options.get("max_steps") or float(options.get("epochs", 5.0)) % 1:
                    out.append(f"{o}: a budget of partial epochs: pool samples are not all seen equally often")
        else:
            out.append(f"anchor runs by {type(self.runner).__name__} (its own settings)")
        return out

    @staticmethod
    def _check_retain(pool: AnchorPool, runner) -> None:
        """The anchor runs must not retain what they unlearn (e.g. TOFU's default retain99 holds forget10)."""
        from ...data.qa import load_split
        from ...training.config import UnlearnConfig

        if not isinstance(runner, TrainerAnchorRunner):
            return
        spec = runner.options.get("retain", UnlearnConfig.retain)
        if not spec:
            return
        retain = {qa_key(s) for s in load_split(spec, runner.options.get("tofu_dir"))}
        overlap = sum(qa_key(p) in retain for p in pool.samples)
        if overlap:
            raise UnlearnError(
                f"scorer cud: the anchor runs' retain set {spec} holds {overlap} of the "
                f"{len(pool.samples)} anchor-pool samples ({pool.spec}); pass "
                f'unlearn_options={{"retain": ...}} with a split disjoint from the pool'
            )

    # ------------------------------------------------------------------ anchor runs
    def anchor_runs(self) -> list[tuple[str, int]]:
        """The (objective, seed) unlearning runs that choose the anchors, in order."""
        return [(objective, seed) for objective in self.objectives for seed in self.seeds]

    def anchor_loss_runs(
        self, pool: AnchorPool, *, model, tokenizer, model_fp: str, runner=None, only: Sequence[int] | None = None
    ) -> list[list[float]]:
        """Per (objective, seed) run, the pool's per-sample post-unlearning losses (cached).
        ``runner``: one runner for every objective (default: each objective's own).
        ``only``: positions in :meth:`anchor_runs` to do (a process's share under a launcher)."""
        runners = {o: runner or self._runner_for(pool, o) for o in self.objectives}
        return [
            self._anchor_run(
                pool, objective, seed, runners[objective], model=model, tokenizer=tokenizer, model_fp=model_fp
            )
            for j, (objective, seed) in enumerate(self.anchor_runs())
            if only is None or j in only
        ]

    def _anchor_run(
        self, pool: AnchorPool, objective: str, seed: int, runner, *, model, tokenizer, model_fp: str
    ) -> list[float]:
        describe = getattr(runner, "describe", lambda: {"runner": type(runner).__name__})()
        key = anchor_run_key(model_fp, samples_fingerprint(pool.samples), objective, seed, describe)
        store = self._store()
        cached = store.read_anchor_run(key) if self.cache else None
        if cached is not None:  # (an unreadable entry reads as None: the run is redone)
            losses, info = cached
            self._run_info[(objective, seed)] = {"cached": True, **info}
            return losses
        if self.progress:
            print(
                f"cud: anchor run {objective}/seed {seed} on {len(pool.samples)} samples of {pool.spec}",
                file=sys.stderr,
                flush=True,
            )
        losses = [
            float(x)
            for x in runner.losses(pool.samples, model=model, tokenizer=tokenizer, objective=objective, seed=seed)
        ]
        if len(losses) != len(pool.samples):
            raise UnlearnError(
                f"CUD anchor run {objective}/seed {seed} returned {len(losses)} losses for {len(pool.samples)} samples"
            )
        info = dict(getattr(runner, "last_info", None) or {})
        if self.cache:
            store.write_anchor_run(
                key, {"objective": objective, "seed": seed, "losses": losses, "runner": describe, "info": info}
            )
        self._run_info[(objective, seed)] = {"cached": False, **info}
        return losses

    def _reference_losses(self, pool: AnchorPool, runner, *, model, tokenizer) -> list[float]:
        """The pool's answer losses before unlearning (for anchor_by=increase)."""
        if hasattr(runner, "reference_losses"):
            return [float(x) for x in runner.reference_losses(pool.samples, model=model, tokenizer=tokenizer)]
        return TrainerAnchorRunner(options={"max_length": self.max_length}).reference_losses(
            pool.samples, model=model, tokenizer=tokenizer
        )

    def choose_anchors(
        self, pool: AnchorPool, *, model, tokenizer, model_fp: str
    ) -> dict[str, tuple[list[int], list[int]]]:
        """The anchor groups to score against, as pool positions: {"all": (easy, hard)}, or one
        group per objective with ``per_objective``."""
        n = len(pool.samples)
        self._vote, self._values, self._run_info = None, None, {}
        runs = None
        if self.anchors is not None:
            groups = {"all": (sorted(set(self.anchors["easy"])), sorted(set(self.anchors["hard"])))}
        else:
            runner = self._runner_for(pool)  # (the losses before unlearning, for anchor_by=increase)
            if self.anchor_losses is not None:
                runs = self.anchor_losses
                if len(runs) != len(self.anchor_runs()):
                    raise AnchorError(
                        f"CUD: anchor_losses has {len(runs)} runs; objectives x seeds = "
                        f"{len(self.anchor_runs())} (objective-major order)"
                    )
            else:
                for objective in self.objectives:
                    self._check_retain(pool, self._runner_for(pool, objective))
                if self.progress and self.stop_prob is not None:
                    print(f"cud: deviation from the paper: {self.deviations()[0]}", file=sys.stderr, flush=True)
                runs = self.anchor_loss_runs(pool, model=model, tokenizer=tokenizer, model_fp=model_fp)
            values = runs
            if self.anchor_by == "increase":
                before = self._reference_losses(pool, runner, model=model, tokenizer=tokenizer)
                values = [[after - b for after, b in zip(run, before)] for run in runs]
            self._values = {
                o: [v for (oo, _), v in zip(self.anchor_runs(), values) if oo == o] for o in self.objectives
            }
            k = self.k or max(1, round(n / 8))  # the paper code: 50 of 400
            self._vote = vote_anchors(self._values, k, self.min_votes, self.min_objectives)
            self._k = k
            groups = (
                dict(self._vote.by_objective) if self.per_objective else {"all": (self._vote.easy, self._vote.hard)}
            )
        need = 2 if pool.in_sample else 1
        for name, (easy, hard) in groups.items():
            for kind, group in (("easy", easy), ("hard", hard)):
                bad = [i for i in group if not 0 <= i < n]
                if bad:
                    raise AnchorError(f"CUD {kind} anchors {bad} are not anchor-pool positions (0..{n - 1})")
                if len(group) < need:
                    raise AnchorError(self._too_few(name, kind, len(group), need))
            if set(easy) & set(hard):
                raise AnchorError(f"CUD: samples {sorted(set(easy) & set(hard))} are both easy and hard anchors")
        vote = self._vote
        self.last_anchors = {
            "easy": vote.easy if vote else groups["all"][0],
            "hard": vote.hard if vote else groups["all"][1],
            "loss_runs": runs,
            "by_objective": {o: {"easy": e, "hard": h} for o, (e, h) in vote.by_objective.items()} if vote else None,
        }
        return groups

    def _too_few(self, group: str, kind: str, count: int, need: int) -> str:
        why = " for leave-one-out" if need == 2 else ""
        if self._vote is None:
            return f"CUD: only {count} {kind} anchor(s) given (need {need}{why})"
        each = ", ".join(f"{o} {len(sets[0 if kind == 'easy' else 1])}" for o, sets in self._vote.by_objective.items())
        where = f"objective {group} chose" if group != "all" else "the objectives agree on"
        return (
            f"CUD: {where} only {count} {kind} anchor(s) (need {need}{why}); stable {kind} anchors per "
            f"objective: {each} (k={self._k}, min_votes={self._vote.min_votes}, "
            f"min_objectives={self._vote.min_objectives}); raise k, add seeds, lower min_votes / min_objectives"
            + ("" if self.per_objective else ", or score per objective (per_objective=true)")
        )

    # ------------------------------------------------------------------ circuits
    def score_matrices(self, samples, *, model, tokenizer, model_fp: str, only: Sequence[int] | None = None):
        """(n, n_src, n_dst) EAP-IG matrices, cached per sample. ``only``: load or compute just
        these positions (the other rows stay zero); the baselines still see every sample."""
        import torch

        from ...circuits.eap_ig import EAPIG
        from ...data.qa import encode_samples

        engine = EAPIG(
            model, max_rows=self.max_rows, pad_token_id=tokenizer.pad_token_id, progress=self.progress, **self.eap
        )
        g = engine.graph
        # corrupt inputs of 'mean' / 'other' depend on the whole set: key on it too
        context = samples_fingerprint(samples) if self.eap["baseline"] != "zero" else None
        settings = dict(self.eap, max_length=self.max_length, context=context, graph=g.to_dict())
        if self.answer_tokens is not None:  # (absent otherwise: earlier cache keys stay valid)
            settings["answer_tokens"] = self.answer_tokens
        keys = [matrix_key(model_fp, s, settings) for s in samples]
        store = self._store()
        out = torch.zeros((len(samples), g.n_src, g.n_dst), dtype=torch.float32)
        missing, edges = [], g.n_edges
        for i in range(len(samples)) if only is None else only:
            cached = store.read_matrix(keys[i]) if self.cache else None
            if cached is not None and cached.shape == (edges,):  # else missing or unreadable: recompute
                out[i][g.edge_mask] = cached
                continue
            missing.append(i)
        if missing:
            if self.eap["baseline"] == "zero":
                encoded = first_answer_tokens(
                    encode_samples(tokenizer, [samples[i] for i in missing], max_length=self.max_length),
                    self.answer_tokens,
                )
                batches = engine.iter_scores(encoded)
                position = missing
            else:  # the corrupt inputs of 'mean' / 'other' need every sample
                encoded = first_answer_tokens(
                    encode_samples(tokenizer, samples, max_length=self.max_length), self.answer_tokens
                )
                batches = engine.iter_scores(encoded, indices=missing)
                position = range(len(samples))
            for idx, scores in batches:
                for j, m in zip(idx, scores):
                    i = position[j]
                    out[i] = m
                    if self.cache:
                        store.write_matrix(keys[i], m[g.edge_mask].contiguous())
        return out, g

    def _pool_matrices(self, pool: AnchorPool, positions: Sequence[int], *, model, tokenizer, model_fp: str) -> dict:
        """The anchors' matrices: per sample with the zero baseline; in the pool's context otherwise."""
        if self.eap["baseline"] == "zero":
            m, _ = self.score_matrices(
                [pool.samples[i] for i in positions], model=model, tokenizer=tokenizer, model_fp=model_fp
            )
            return {i: m[j] for j, i in enumerate(positions)}
        m, _ = self.score_matrices(pool.samples, model=model, tokenizer=tokenizer, model_fp=model_fp, only=positions)
        return {i: m[i] for i in positions}

    def _circuit(self, matrix, graph):
        from ...circuits.circuit import select

        return select(matrix, graph, method=self.circuit, n=self.n_edges, tau=self.tau)

    # ------------------------------------------------------------------ under accelerate launch
    def prepare_shard(self, samples: Sequence[QASample], shard: Sequence[int], *, model, tokenizer, group) -> None:
        """This process's share, into the disk cache: anchor run j of :meth:`anchor_runs` on
        process j mod N, and the EAP-IG matrices of ``shard``. The main process's :meth:`score`
        then finds everything there (and checks that every process wrote to the same cache
        folder with the same weights)."""
        from ...files import write_json

        pool = self.anchor_pool(samples)
        self._check_counts(samples, pool)
        if not self.cache:
            raise UnlearnError(
                "scorer cud: scoring under accelerate launch needs cache=true (the processes hand "
                "their anchor runs and score matrices to the main process through the cache)"
            )
        model_fp = model_fingerprint(model)
        write_json(
            self._store().shard_marker(group.run_id, group.index),
            {"model_fp": model_fp, "cache": str(self._cache_root())},
        )
        runs = self.anchor_runs() if self.anchors is None and self.anchor_losses is None else []
        mine = [j for j in range(len(runs)) if j % group.count == group.index]
        print(
            f"cud: process {group.index} of {group.count}: anchor runs "
            f"{[f'{runs[j][0]}/{runs[j][1]}' for j in mine]}, score matrices of samples "
            f"{f'{shard[0]}..{shard[-1]}' if shard else 'none'}",
            file=sys.stderr,
            flush=True,
        )
        if mine:
            for objective in {runs[j][0] for j in mine}:
                self._check_retain(pool, self._runner_for(pool, objective))
            self.anchor_loss_runs(pool, model=model, tokenizer=tokenizer, model_fp=model_fp, only=mine)
        if shard:
            self.score_matrices(samples, model=model, tokenizer=tokenizer, model_fp=model_fp, only=shard)
        if group.is_main:
            self._shards = (group.run_id, group.count)

    def _check_shards(self, model_fp: str) -> None:
        """On the main process after prepare_shard: every process used this cache folder and these weights."""
        run_id, count = self._shards
        self._shards = None
        markers = [self._store().shard_marker(run_id, i) for i in range(count)]
        try:
            for i, marker in enumerate(markers):
                if not marker.is_file():
                    raise UnlearnError(
                        f"scorer cud: process {i} did not write to the cache folder {self._cache_root()} of the main "
                        f"process: under accelerate launch every process needs the same cache folder (set "
                        f"UNLEARN_CACHE_DIR or the option cache_dir to a folder they all see)"
                    )
                theirs = json.loads(marker.read_text())["model_fp"]
                if theirs != model_fp:
                    raise UnlearnError(
                        f"scorer cud: process {i} loaded other weights than the main process "
                        f"(fingerprint {theirs} vs {model_fp})"
                    )
        finally:
            for marker in markers:
                marker.unlink(missing_ok=True)

    # ------------------------------------------------------------------ the protocol
    def score(self, samples: Sequence[QASample], *, model, tokenizer) -> list[dict]:
        import torch

        from ...circuits.similarity import circuit_similarity, cud

        pool = self.anchor_pool(samples)
        self._check_counts(samples, pool)
        model_fp = model_fingerprint(model)
        if self._shards is not None:
            self._check_shards(model_fp)
        groups = self.choose_anchors(pool, model=model, tokenizer=tokenizer, model_fp=model_fp)
        matrices, graph = self.score_matrices(samples, model=model, tokenizer=tokenizer, model_fp=model_fp)
        used = sorted({i for easy, hard in groups.values() for i in (*easy, *hard)})
        if pool.in_sample:
            anchor_m = {i: matrices[i] for i in used}
        else:
            anchor_m = self._pool_matrices(pool, used, model=model, tokenizer=tokenizer, model_fp=model_fp)
        prepared = {}
        for name, (easy, hard) in groups.items():
            members = {"easy": set(easy), "hard": set(hard)}
            sums = {kind: torch.stack([anchor_m[i] for i in sorted(members[kind])]).sum(0) for kind in members}
            full = {kind: self._circuit(sums[kind] / len(members[kind]), graph) for kind in members}
            prepared[name] = (members, sums, full)
        rows = []
        for i in range(len(samples)):
            query = self._circuit(matrices[i], graph)
            results = {}
            for name, (members, sums, full) in prepared.items():
                sims, role = {}, None
                for kind in ("easy", "hard"):
                    anchor = full[kind]
                    if pool.in_sample and i in members[kind]:  # leave the query out of its own anchor
                        anchor = self._circuit((sums[kind] - matrices[i]) / (len(members[kind]) - 1), graph)
                        role = kind
                    sims[kind] = circuit_similarity(query, anchor, self.similarity, self.vector)
                results[name] = (cud(sims["easy"], sims["hard"]), sims, role)
            if self.per_objective:
                roles = {o: r for o, (_, _, r) in results.items() if r}
                row = {
                    "score": sum(s for s, _, _ in results.values()) / len(results),
                    "score_by_objective": {o: s for o, (s, _, _) in results.items()},
                    "s_E_by_objective": {o: sims["easy"] for o, (_, sims, _) in results.items()},
                    "s_H_by_objective": {o: sims["hard"] for o, (_, sims, _) in results.items()},
                    "anchor": (next(iter(roles.values())) if len(set(roles.values())) == 1 else "mixed")
                    if roles
                    else None,
                }
                if roles:
                    row["anchor_by_objective"] = roles
            else:
                score, sims, role = results["all"]
                row = {"score": score, "s_E": sims["easy"], "s_H": sims["hard"], "anchor": role}
            row.update(
                {
                    "circuit_edges": query.n_edges,
                    "circuit_depth": None if query.n_edges == 0 else round(query.depth(), 4),
                    "circuit_by_layer": query.placement()["by_destination"].tolist(),
                }
            )
            rows.append(row)
        self.last_metadata = self._metadata(samples, pool, groups)
        return rows

    # ------------------------------------------------------------------ metadata
    def _metadata(self, samples, pool: AnchorPool, groups) -> dict:
        """What chose the anchors: the pool, the settings, every run, the votes, the agreement."""
        vote = self._vote

        def entries(positions, kind):
            out = []
            for i in positions:
                e = {"pool_index": i, "question": pool.samples[i].question, "answer": pool.samples[i].answer}
                if vote is not None:
                    by = (vote.easy_runs if kind == "easy" else vote.hard_runs).get(i, {})
                    e["runs"] = sum(by.values())
                    e["runs_by_objective"] = dict(by)
                out.append(e)
            return out

        runner = self._runner_for(pool)
        meta: dict[str, Any] = {
            "scorer": "cud",
            "format": 1,
            "scored_samples": len(samples),
            "anchor_pool": pool.describe(),
            "settings": {
                "objectives": self.objectives,
                "seeds": self.seeds,
                "per_objective": self.per_objective,
                "anchor_by": self.anchor_by,
                "anchor_recipe": self.anchor_recipe,
                "k": self._k if vote else None,
                "min_votes": vote.min_votes if vote else None,
                "min_objectives": vote.min_objectives if vote else None,
                "stop_prob": self.stop_prob,
                "check_steps": self.check_steps,
                # the first objective's runner; anchor_run_options: every objective's options
                "runner": getattr(runner, "describe", lambda: {"runner": type(runner).__name__})(),
                "anchor_run_options": {o: self.run_options(o, pool) for o in self.objectives}
                if self.runner is None
                else None,
                "deviations": self.deviations(),
                "fixed_anchors": self.anchors is not None,
                "given_losses": self.anchor_losses is not None,
                "similarity": self.similarity,
                "vector": self.vector,
                "circuit": self.circuit,
                "n_edges": self.n_edges,
                "tau": self.tau,
                **self.eap,
                "max_rows": self.max_rows,
                "max_length": self.max_length,
                "answer_tokens": self.answer_tokens,
            },
            "anchors": {
                name: {"easy": entries(easy, "easy"), "hard": entries(hard, "hard")}
                for name, (easy, hard) in groups.items()
            },
        }
        if vote is not None:
            meta["stable_by_objective"] = {
                o: {"easy": entries(e, "easy"), "hard": entries(h, "hard")} for o, (e, h) in vote.by_objective.items()
            }
            meta["runs"] = [
                {"objective": o, "seed": s, **self._run_info.get((o, s), {})} for o, s in self.anchor_runs()
            ]
            meta["seed_agreement"] = {}
            for o, runs in self._values.items():
                pairs = [
                    [self.seeds[a], self.seeds[b], spearman(runs[a], runs[b])]
                    for a in range(len(runs))
                    for b in range(a + 1, len(runs))
                ]
                meta["seed_agreement"][o] = {
                    "of": self.anchor_by,
                    "mean_spearman": mean_or_none([p[2] for p in pairs]),
                    "pairs": pairs,
                }
            means = {o: [sum(col) / len(col) for col in zip(*runs)] for o, runs in self._values.items()}
            names = list(means)
            meta["objective_agreement"] = [
                [a, b, spearman(means[a], means[b])] for i, a in enumerate(names) for b in names[i + 1 :]
            ]
        return meta


def _options(name: str, value) -> dict:
    """An options table of UnlearnConfig fields (``unlearn_options`` or one objective's)."""
    import dataclasses

    from ...training.config import UnlearnConfig

    if value is None:
        return {}
    if not isinstance(value, dict):
        raise UnlearnError(f"scorer cud: option {name} must be a table of training options, got {value!r}")
    known = {f.name for f in dataclasses.fields(UnlearnConfig)}
    unknown = sorted(set(value) - known)
    if unknown:
        raise UnlearnError(f"scorer cud: option {name}: unknown training option(s) {', '.join(unknown)}")
    taken = sorted(set(value) & set(RUN_SET))
    if taken:
        raise UnlearnError(f"scorer cud: option {name}: {', '.join(taken)} set by each anchor run itself; remove it")
    return dict(value)


def _by_objective(value, objectives: Sequence[str]) -> dict[str, dict]:
    """``unlearn_by_objective``: {objective: training options}, each objective one of ``objectives``."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise UnlearnError(
            f'scorer cud: option unlearn_by_objective must be a table per objective, e.g. {{"npo": {{"lr": 1e-5}}}}, '
            f"got {value!r}"
        )
    other = sorted(set(value) - set(objectives))
    if other:
        raise UnlearnError(
            f"scorer cud: option unlearn_by_objective names {', '.join(other)}, not among the objectives "
            f"({', '.join(objectives)})"
        )
    return {o: _options(f"unlearn_by_objective.{o}", v) for o, v in value.items()}
