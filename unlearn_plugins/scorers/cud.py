"""CUD, Circuit-guided Unlearning Difficulty (arXiv 2601.09624), as a difficulty scorer.

1. Anchors: unlearning runs (objectives x seeds) on the samples being scored; per run,
   easy = the k highest post-unlearning answer losses (forgotten), hard = the k lowest
   (remembered); common anchors are chosen by >= ceil(runs / 2) runs, and samples in
   both sets are dropped from both.
2. Circuits: EAP-IG score matrix per sample (:mod:`unlearn_plugins.circuits.eap_ig`);
   anchor matrix = mean over the anchor samples (the query left out when it is one of
   them); circuit = greedy top-n with pruning (n = 75) by default.
3. Score: s_E, s_H = similarity of the query circuit to the easy / hard anchor circuits;
   CUD = d_E / (d_E + d_H), d = max(1 - s, 0); 1 = hard to unlearn.

Anchor runs go through a small interface, :class:`AnchorRunner` (``losses(samples, ...)
-> per-sample answer losses after unlearning``); the default one calls
:func:`unlearn_plugins.training.run.run_unlearning`. Anchor losses and per-sample score
matrices are cached on disk (``$UNLEARN_CACHE_DIR/cud``), keyed by a fingerprint of the
model weights, the samples and the settings, so a second scoring skips both.

Under ``accelerate launch`` (:meth:`CUDScorer.prepare_shard`) the processes share the anchor
runs and the matrices through that cache, then the main process scores from it.
"""

from __future__ import annotations

import hashlib
import json
import math
import sys
import tempfile
from pathlib import Path
from typing import Any, Protocol, Sequence

from ..errors import UnlearnError
from ..interfaces import QASample


class AnchorError(UnlearnError):
    """Anchor selection left too few easy or hard anchors."""


# ----------------------------------------------------------------------------- fingerprints

def model_fingerprint(model) -> str:
    """A digest of every parameter (name, shape, dtype, sums, first values): changes when
    the weights change (another fine-tune, an adapter), cheap to compute."""
    import torch

    h = hashlib.sha256()
    with torch.no_grad():
        for name, p in model.named_parameters():
            flat = p.detach().reshape(-1)
            head = flat[:16].double().cpu().tolist()
            stats = [float(flat.double().sum()), float(flat.double().pow(2).sum())]
            h.update(json.dumps([name, list(p.shape), str(p.dtype), stats, head]).encode())
    return h.hexdigest()[:24]


def samples_fingerprint(samples: Sequence[QASample]) -> str:
    h = hashlib.sha256()
    for s in samples:
        h.update(json.dumps([s.question, s.answer]).encode())
    return h.hexdigest()[:24]


def _digest(*parts: Any) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:32]


def default_cache_dir() -> Path:
    from ..models import cache_dir

    return cache_dir() / "cud"


# ----------------------------------------------------------------------------- anchors

def select_anchors(loss_runs: Sequence[Sequence[float]], k: int, min_votes: int | None = None):
    """(easy, hard) sample indices from per-run post-unlearning losses.

    Per run: easy = the k highest losses, hard = the k lowest (ties: lower index first).
    A sample is a common anchor when at least ``min_votes`` runs (default ceil(runs / 2))
    chose it; samples that end up in both sets are removed from both.
    """
    if not loss_runs:
        raise AnchorError("CUD anchors need at least one unlearning run")
    n = len(loss_runs[0])
    if any(len(run) != n for run in loss_runs):
        raise AnchorError("CUD anchors: every run must give one loss per sample")
    if not 1 <= k <= n:
        raise AnchorError(f"CUD anchors: k = {k} must be between 1 and the number of samples ({n})")
    votes = min_votes if min_votes is not None else math.ceil(len(loss_runs) / 2)
    easy_votes, hard_votes = [0] * n, [0] * n
    for run in loss_runs:
        order = sorted(range(n), key=lambda i: (-run[i], i))
        for i in order[:k]:
            easy_votes[i] += 1
        for i in sorted(range(n), key=lambda i: (run[i], i))[:k]:
            hard_votes[i] += 1
    easy = {i for i in range(n) if easy_votes[i] >= votes}
    hard = {i for i in range(n) if hard_votes[i] >= votes}
    both = easy & hard
    return sorted(easy - both), sorted(hard - both)


class AnchorRunner(Protocol):
    """Runs one unlearning method on the samples and returns each sample's mean answer NLL
    after unlearning (same order)."""

    def losses(self, samples: Sequence[QASample], *, model: Any, tokenizer: Any, objective: str,
               seed: int) -> list[float]:
        ...


class TrainerAnchorRunner:
    """Anchor runs with :func:`unlearn_plugins.training.run.run_unlearning` (LoRA by default).

    ``model_spec``: what to unlearn (default: the scored model's ``name_or_path``);
    ``options``: UnlearnConfig fields (lr, epochs, max_steps, retain, lora_r, ...).
    """

    def __init__(self, model_spec: str | None = None, options: dict | None = None, batch_size: int = 8):
        self.model_spec = model_spec
        self.options = dict(options or {})
        self.batch_size = batch_size

    def describe(self) -> dict:
        return {"runner": "run_unlearning", "model_spec": self.model_spec, "options": self.options}

    def losses(self, samples, *, model, tokenizer, objective, seed):
        from ..sharding import launched_processes

        spec = self.model_spec or getattr(getattr(model, "config", None), "_name_or_path", None)
        if not spec:
            raise UnlearnError("CUD anchor runs need the model's folder or hub id: pass the scorer option model_spec")
        device = next(model.parameters()).device
        gpu = (device.index or 0) if device.type == "cuda" else None
        if launched_processes() > 1 or gpu:  # in a launcher's group, or on a GPU other than the first
            return self.losses_in_child(samples, spec=spec, gpu=gpu, objective=objective, seed=seed)
        # the Trainer takes "cuda" (its first visible GPU), not "cuda:0"
        return self.losses_here(samples, spec=spec, device=device.type, tokenizer=tokenizer, objective=objective,
                                seed=seed)

    def losses_here(self, samples, *, spec: str, device: str, tokenizer, objective: str, seed: int) -> list[float]:
        """One run in this process (which must not be one of several launched ones: the Trainer
        would join their group)."""
        import torch

        from ..data.tofu import encode_samples
        from ..files import write_jsonl
        from ..likelihood import answer_nll
        from ..models import load_model
        from ..training.config import UnlearnConfig
        from ..training.run import run_unlearning

        with tempfile.TemporaryDirectory(prefix="cud-anchor-") as tmp:
            forget = Path(tmp) / "forget.json"
            write_jsonl(forget, [s.to_record() for s in samples])
            config = UnlearnConfig(out=str(Path(tmp) / "run"), model=spec, forget=str(forget),
                                   objective=objective, seed=seed, device=device, **self.options)
            result = run_unlearning(config)
            if config.full_finetune:
                unlearned, _ = load_model(str(result.out), device=device)
            else:
                unlearned, _ = load_model(spec, device=device, adapter=str(result.out))
            encoded = encode_samples(tokenizer, samples, max_length=config.max_length)
            stats = answer_nll(unlearned, encoded, tokenizer.pad_token_id, batch_size=self.batch_size)
            del unlearned
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
        return [s / max(n, 1) for s, n in stats]

    def losses_in_child(self, samples, *, spec: str, gpu: int | None, objective: str, seed: int) -> list[float]:
        """One run in a fresh single-process Python (:mod:`unlearn_plugins.scorers.anchor_job`):
        under ``accelerate launch`` each process does its own anchor runs, and an in-process
        Trainer would join the launcher's group (DDP across unrelated runs). ``gpu``: this
        process's CUDA index, made the child's only visible GPU."""
        import os
        import subprocess

        from ..files import write_json
        from ..sharding import single_process_env

        env = single_process_env()
        if gpu is not None:
            visible = [x.strip() for x in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if x.strip()]
            env["CUDA_VISIBLE_DEVICES"] = visible[gpu] if gpu < len(visible) else str(gpu)
        with tempfile.TemporaryDirectory(prefix="cud-anchor-job-") as tmp:
            job, out = Path(tmp) / "job.json", Path(tmp) / "losses.json"
            write_json(job, {"model_spec": spec, "options": self.options, "batch_size": self.batch_size,
                             "device": "cpu" if gpu is None else "cuda", "objective": objective, "seed": seed,
                             "samples": [s.to_record() for s in samples]})
            done = subprocess.run([sys.executable, "-m", "unlearn_plugins.scorers.anchor_job", str(job), str(out)],
                                  env=env, check=False)
            if done.returncode != 0 or not out.is_file():
                raise UnlearnError(f"CUD anchor run {objective}/seed {seed} failed in its child process "
                                   f"(exit code {done.returncode}; its output is above)")
            return json.loads(out.read_text())["losses"]


# ----------------------------------------------------------------------------- the scorer

def _check_count(samples) -> None:
    if len(samples) < 4:
        raise UnlearnError(f"scorer cud needs at least 4 samples (2 easy + 2 hard anchors), got {len(samples)}")


class CUDScorer:
    """Difficulty scorer ``cud``: returns per sample {score, s_E, s_H, anchor, circuit}."""

    def __init__(self, *, objectives: Sequence[str] = ("grad_diff", "npo"), seeds: Sequence[int] = (0,),
                 k: int | None = None, min_votes: int | None = None, anchors: dict | None = None,
                 anchor_losses: Sequence[Sequence[float]] | None = None, runner: AnchorRunner | None = None,
                 model_spec: str | None = None, unlearn_options: dict | None = None,
                 similarity: str = "cosine", circuit: str = "greedy", n_edges: int = 75, tau: float | None = None,
                 mode: str = "inputs", steps: int = 5, baseline: str = "zero", metric: str = "prob",
                 max_rows: int = 20, max_length: int = 512, cache: bool = True, cache_dir: str | None = None,
                 progress: bool = False):
        from ..circuits.eap_ig import BASELINES, METRICS, MODES
        from ..circuits.similarity import SIMILARITIES

        for name, value, allowed in (("similarity", similarity, SIMILARITIES), ("mode", mode, MODES),
                                     ("baseline", baseline, BASELINES), ("metric", metric, METRICS),
                                     ("circuit", circuit, ("greedy", "topn", "threshold"))):
            if value not in allowed:
                raise UnlearnError(f"scorer cud: option {name}={value!r}; choose one of {', '.join(allowed)}")
        if circuit == "threshold" and tau is None:
            raise UnlearnError("scorer cud: circuit=threshold needs the option tau")
        self.objectives = list(objectives)
        self.seeds = [int(s) for s in seeds]
        self.k, self.min_votes = k, min_votes
        self.anchors = anchors
        self.anchor_losses = [list(r) for r in anchor_losses] if anchor_losses is not None else None
        self.runner = runner or TrainerAnchorRunner(model_spec, unlearn_options)
        self.similarity, self.circuit, self.n_edges, self.tau = similarity, circuit, int(n_edges), tau
        self.eap = {"mode": mode, "steps": int(steps), "baseline": baseline, "metric": metric}
        self.max_rows, self.max_length = int(max_rows), int(max_length)
        self.cache = bool(cache)
        self.cache_dir = Path(cache_dir).expanduser() if cache_dir else None
        self.progress = progress
        self.last_anchors: dict[str, Any] = {}
        self._shards: tuple[str, int] | None = None  # (run id, processes) after prepare_shard on the main process

    # ------------------------------------------------------------------ pieces
    def _cache_root(self) -> Path:
        return self.cache_dir or default_cache_dir()

    def anchor_runs(self) -> list[tuple[str, int]]:
        """The (objective, seed) unlearning runs that choose the anchors, in order."""
        return [(objective, seed) for objective in self.objectives for seed in self.seeds]

    def anchor_loss_runs(self, samples, *, model, tokenizer, model_fp: str,
                         only: Sequence[int] | None = None) -> list[list[float]]:
        """Per (objective, seed) run, the per-sample post-unlearning losses (cached).
        ``only``: positions in :meth:`anchor_runs` to do (a process's share under a launcher)."""
        runs = self.anchor_runs()
        return [self._anchor_run(samples, objective, seed, model=model, tokenizer=tokenizer, model_fp=model_fp)
                for j, (objective, seed) in enumerate(runs) if only is None or j in only]

    def _anchor_run(self, samples, objective: str, seed: int, *, model, tokenizer, model_fp: str) -> list[float]:
        from ..files import write_json

        describe = getattr(self.runner, "describe", lambda: {"runner": type(self.runner).__name__})()
        key = _digest("anchor-run", model_fp, samples_fingerprint(samples), objective, seed, describe)
        path = self._cache_root() / "anchors" / f"{key}.json"
        if self.cache and path.is_file():
            try:
                return json.loads(path.read_text())["losses"]
            except (OSError, ValueError, KeyError):
                pass  # unreadable: redo the run
        losses = [float(x) for x in self.runner.losses(samples, model=model, tokenizer=tokenizer,
                                                        objective=objective, seed=seed)]
        if len(losses) != len(samples):
            raise UnlearnError(f"CUD anchor run {objective}/seed {seed} returned {len(losses)} losses "
                               f"for {len(samples)} samples")
        if self.cache:
            write_json(path, {"objective": objective, "seed": seed, "losses": losses, "runner": describe})
        return losses

    def choose_anchors(self, samples, *, model, tokenizer, model_fp: str) -> tuple[list[int], list[int]]:
        if self.anchors is not None:
            easy, hard = sorted(set(self.anchors["easy"])), sorted(set(self.anchors["hard"]))
            runs = None
        else:
            runs = self.anchor_losses or self.anchor_loss_runs(samples, model=model, tokenizer=tokenizer,
                                                               model_fp=model_fp)
            k = self.k or max(1, round(len(samples) / 8))  # the paper code: 50 of 400
            easy, hard = select_anchors(runs, k, self.min_votes)
        for name, group in (("easy", easy), ("hard", hard)):
            bad = [i for i in group if not 0 <= i < len(samples)]
            if bad:
                raise AnchorError(f"CUD {name} anchors {bad} are not sample positions (0..{len(samples) - 1})")
            if len(group) < 2:
                raise AnchorError(f"CUD: only {len(group)} common {name} anchor(s) (need 2 for leave-one-out); "
                                  f"raise k, lower min_votes or add runs")
        if set(easy) & set(hard):
            raise AnchorError(f"CUD: samples {sorted(set(easy) & set(hard))} are both easy and hard anchors")
        self.last_anchors = {"easy": easy, "hard": hard, "loss_runs": runs}
        return easy, hard

    def score_matrices(self, samples, *, model, tokenizer, model_fp: str, only: Sequence[int] | None = None):
        """(n, n_src, n_dst) EAP-IG matrices, cached per sample. ``only``: load or compute just
        these positions (the other rows stay zero); the baselines still see every sample."""
        import torch

        from ..circuits.eap_ig import EAPIG
        from ..data.tofu import encode_samples

        engine = EAPIG(model, max_rows=self.max_rows, pad_token_id=tokenizer.pad_token_id,
                       progress=self.progress, **self.eap)
        g = engine.graph
        # corrupt inputs of 'mean' / 'other' depend on the whole set: key on it too
        context = samples_fingerprint(samples) if self.eap["baseline"] != "zero" else None
        settings = dict(self.eap, max_length=self.max_length, context=context, graph=g.to_dict())
        keys = [_digest("eap-ig", model_fp, s.question, s.answer, settings) for s in samples]
        root = self._cache_root() / "matrices"
        out = torch.zeros((len(samples), g.n_src, g.n_dst), dtype=torch.float32)
        missing = []
        for i in range(len(samples)) if only is None else only:
            path = root / f"{keys[i]}.pt"
            if self.cache and path.is_file():
                try:
                    out[i][g.edge_mask] = torch.load(path, map_location="cpu", weights_only=True)
                    continue
                except Exception:  # unreadable: recompute
                    pass
            missing.append(i)
        if missing:
            if self.eap["baseline"] == "zero":
                encoded = encode_samples(tokenizer, [samples[i] for i in missing], max_length=self.max_length)
                batches = engine.iter_scores(encoded)
                position = missing
            else:  # the corrupt inputs of 'mean' / 'other' need every sample
                encoded = encode_samples(tokenizer, samples, max_length=self.max_length)
                batches = engine.iter_scores(encoded, indices=missing)
                position = range(len(samples))
            for idx, scores in batches:
                for j, m in zip(idx, scores):
                    i = position[j]
                    out[i] = m
                    if self.cache:
                        self._save(root / f"{keys[i]}.pt", m[g.edge_mask].contiguous())
        return out, g

    @staticmethod
    def _save(path: Path, tensor) -> None:
        import torch

        from ..files import atomic_open

        with atomic_open(path, "wb") as handle:
            torch.save(tensor, handle)

    def _circuit(self, matrix, graph):
        from ..circuits.circuit import select

        return select(matrix, graph, method=self.circuit, n=self.n_edges, tau=self.tau)

    # ------------------------------------------------------------------ under accelerate launch
    def prepare_shard(self, samples: Sequence[QASample], shard: Sequence[int], *, model, tokenizer, group) -> None:
        """This process's share, into the disk cache: anchor run j of :meth:`anchor_runs` on
        process j mod N, and the EAP-IG matrices of ``shard``. The main process's :meth:`score`
        then finds everything there (and checks that every process wrote to the same cache
        folder with the same weights)."""
        from ..files import write_json

        _check_count(samples)
        if not self.cache:
            raise UnlearnError("scorer cud: scoring under accelerate launch needs cache=true (the processes hand "
                               "their anchor runs and score matrices to the main process through the cache)")
        model_fp = model_fingerprint(model)
        write_json(self._marker(group.run_id, group.index), {"model_fp": model_fp, "cache": str(self._cache_root())})
        runs = self.anchor_runs() if self.anchors is None and self.anchor_losses is None else []
        mine = [j for j in range(len(runs)) if j % group.count == group.index]
        print(f"cud: process {group.index} of {group.count}: anchor runs "
              f"{[f'{runs[j][0]}/{runs[j][1]}' for j in mine]}, score matrices of samples "
              f"{f'{shard[0]}..{shard[-1]}' if shard else 'none'}", file=sys.stderr, flush=True)
        if mine:
            self.anchor_loss_runs(samples, model=model, tokenizer=tokenizer, model_fp=model_fp, only=mine)
        if shard:
            self.score_matrices(samples, model=model, tokenizer=tokenizer, model_fp=model_fp, only=shard)
        if group.is_main:
            self._shards = (group.run_id, group.count)

    def _marker(self, run_id: str, index: int) -> Path:
        return self._cache_root() / "shards" / f"{run_id}-{index}.json"

    def _check_shards(self, model_fp: str) -> None:
        """On the main process after prepare_shard: every process used this cache folder and these weights."""
        run_id, count = self._shards
        self._shards = None
        markers = [self._marker(run_id, i) for i in range(count)]
        try:
            for i, marker in enumerate(markers):
                if not marker.is_file():
                    raise UnlearnError(
                        f"scorer cud: process {i} did not write to the cache folder {self._cache_root()} of the main "
                        f"process: under accelerate launch every process needs the same cache folder (set "
                        f"UNLEARN_CACHE_DIR or the option cache_dir to a folder they all see)")
                theirs = json.loads(marker.read_text())["model_fp"]
                if theirs != model_fp:
                    raise UnlearnError(f"scorer cud: process {i} loaded other weights than the main process "
                                       f"(fingerprint {theirs} vs {model_fp})")
        finally:
            for marker in markers:
                marker.unlink(missing_ok=True)

    # ------------------------------------------------------------------ the protocol
    def score(self, samples: Sequence[QASample], *, model, tokenizer) -> list[dict]:
        from ..circuits.similarity import circuit_similarity, cud

        _check_count(samples)
        model_fp = model_fingerprint(model)
        if self._shards is not None:
            self._check_shards(model_fp)
        easy, hard = self.choose_anchors(samples, model=model, tokenizer=tokenizer, model_fp=model_fp)
        matrices, graph = self.score_matrices(samples, model=model, tokenizer=tokenizer, model_fp=model_fp)
        sums = {"easy": matrices[easy].sum(0), "hard": matrices[hard].sum(0)}
        members = {"easy": set(easy), "hard": set(hard)}
        full = {name: self._circuit(sums[name] / len(members[name]), graph) for name in sums}
        rows = []
        for i in range(len(samples)):
            query = self._circuit(matrices[i], graph)
            sims = {}
            for name in ("easy", "hard"):
                anchor = full[name]
                if i in members[name]:  # leave the query out of its own anchor
                    anchor = self._circuit((sums[name] - matrices[i]) / (len(members[name]) - 1), graph)
                sims[name] = circuit_similarity(query, anchor, self.similarity)
            rows.append({
                "score": cud(sims["easy"], sims["hard"]),
                "s_E": sims["easy"], "s_H": sims["hard"],
                "anchor": "easy" if i in members["easy"] else "hard" if i in members["hard"] else None,
                "circuit_edges": query.n_edges,
                "circuit_depth": None if query.n_edges == 0 else round(query.depth(), 4),
                "circuit_by_layer": query.placement()["by_destination"].tolist(),
            })
        return rows
