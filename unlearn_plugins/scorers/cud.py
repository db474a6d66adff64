"""CUD, Circuit-guided Unlearning Difficulty (arXiv 2601.09624), as a difficulty scorer.

1. Anchor pool: samples the model knows, *disjoint* from the samples being scored (the
   paper's code chooses anchors on TOFU forget10 and scores the other TOFU rows). Default
   for TOFU data: forget10, or retain90[3200:3600] when the scored samples overlap forget10;
   ``anchor_data=self`` chooses anchors among the scored samples (circular: ``unlearn
   stratify`` then drops them).
2. Anchors: unlearning runs on the pool (objectives x seeds, default 2 x 3), each stopped
   at the first check where the pool's mean answer probability falls below ``stop_prob``;
   per run, easy = the k highest post-unlearning losses (or loss increases), hard = the k
   lowest; a sample is an objective's anchor when at least half its seeds (2 of 3) chose it,
   a common anchor when at least half the objectives did; samples in both sets are dropped.
   ``per_objective=true`` scores against each objective's anchors separately.
3. Circuits: EAP-IG score matrix per sample (:mod:`unlearn_plugins.circuits.eap_ig`);
   anchor matrix = mean over the anchor samples (the query left out when it is one of
   them); circuit = greedy top-n with pruning (n = 75) by default.
4. Score: s_E, s_H = similarity of the query circuit to the easy / hard anchor circuits;
   CUD = d_E / (d_E + d_H), d = max(1 - s, 0); 1 = hard to unlearn.

Anchor runs go through a small interface, :class:`AnchorRunner` (``losses(samples, ...)
-> per-sample answer losses after unlearning``); the default one calls
:func:`unlearn_plugins.training.run.run_unlearning`. Anchor losses and per-sample score
matrices are cached on disk (``$UNLEARN_CACHE_DIR/cud``), keyed by a fingerprint of the
model weights, the samples and the settings, so a second scoring skips both. What the runs
chose (votes per anchor, seed-to-seed rank agreement, where each run stopped) is in
:attr:`CUDScorer.last_metadata` (``unlearn score`` writes it to ``OUT.meta.json``).

Under ``accelerate launch`` (:meth:`CUDScorer.prepare_shard`) the processes share the anchor
runs and the matrices through that cache, then the main process scores from it.
See docs/methods.md for the reference code and every deliberate deviation.
"""

from __future__ import annotations

import hashlib
import json
import math
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, Sequence

from ..errors import UnlearnError
from ..interfaces import QASample


class AnchorError(UnlearnError):
    """Anchor selection left too few easy or hard anchors."""


#: ``anchor_data`` value that chooses anchors among the scored samples (the old, circular way)
IN_SAMPLE = "self"
#: TOFU anchor pools tried in order when ``anchor_data`` is not given: (pool, retain set of its
#: anchor runs); the first pool that shares no sample with the scored data is used
TOFU_ANCHOR_POOLS = (("tofu:forget10", "tofu:retain90"),
                     ("tofu:retain90[3200:3600]", "tofu:retain90[0:3200]"))
ANCHOR_BY = ("loss", "increase")


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


def _key(sample: QASample) -> tuple[str, str]:
    """A sample's identity across files (TOFU has one question asked of two authors)."""
    return (sample.question, sample.answer)


# ----------------------------------------------------------------------------- the anchor pool

@dataclass
class AnchorPool:
    """The samples the anchor runs unlearn and the anchors are chosen from."""

    samples: list[QASample]
    spec: str
    in_sample: bool = False
    dropped: int = 0  # pool samples left out because they are also scored
    run_options: dict = field(default_factory=dict)  # defaults for the anchor runs (their retain set)

    def describe(self) -> dict:
        return {"spec": self.spec, "size": len(self.samples), "in_sample": self.in_sample,
                "dropped_scored_samples": self.dropped, "fingerprint": samples_fingerprint(self.samples),
                "run_defaults": self.run_options}


def tofu_folder_of(samples: Sequence[QASample]) -> Path | None:
    """The TOFU folder the samples were read from (it holds forget10.json and retain90.json), or None."""
    folders = {Path(s.source).parent for s in samples}
    if len(folders) != 1:
        return None
    folder = folders.pop()
    return folder if (folder / "forget10.json").is_file() and (folder / "retain90.json").is_file() else None


def default_anchor_pool(samples: Sequence[QASample]) -> AnchorPool:
    """For samples read from a TOFU folder: the first of :data:`TOFU_ANCHOR_POOLS` that shares
    no sample with them (forget10, the paper's pool; else authors 160-179), with the matching
    retain set for the anchor runs."""
    from ..data.tofu import load_split

    folder = tofu_folder_of(samples)
    if folder is None:
        raise UnlearnError("scorer cud: give anchor_data (a split of samples the model knows, disjoint from the "
                           "scored ones, e.g. --anchor-data tofu:forget10), or anchor_data=self to choose the anchors "
                           "among the scored samples; a default exists only for data read from a TOFU folder")
    scored = {_key(s) for s in samples}
    for pool_spec, retain_spec in TOFU_ANCHOR_POOLS:
        pool = load_split(pool_spec, folder)
        if not any(_key(p) in scored for p in pool):
            return AnchorPool(pool, pool_spec, run_options={"retain": retain_spec, "tofu_dir": str(folder)})
    raise UnlearnError(f"scorer cud: the scored samples overlap every default TOFU anchor pool "
                       f"({', '.join(p for p, _ in TOFU_ANCHOR_POOLS)}); pass anchor_data (samples the model knows, "
                       f"disjoint from the scored ones) or anchor_data=self")


def _as_samples(data: Sequence[Any], where: str) -> list[QASample]:
    out = []
    for i, item in enumerate(data):
        if isinstance(item, QASample):
            out.append(item)
        elif isinstance(item, dict) and isinstance(item.get("question"), str) and isinstance(item.get("answer"), str):
            extra = {k: v for k, v in item.items() if k not in ("question", "answer")}
            out.append(QASample(item["question"], item["answer"], i, where, 0, extra))
        else:
            raise UnlearnError(f"scorer cud: {where} item {i} is neither a QASample nor a record with "
                               f"'question' and 'answer'")
    return out


# ----------------------------------------------------------------------------- anchors

def _run_votes(loss_runs: Sequence[Sequence[float]], k: int) -> tuple[list[int], list[int]]:
    """Per sample, how many runs put it among their k highest (easy) / k lowest (hard) values."""
    if not loss_runs:
        raise AnchorError("CUD anchors need at least one unlearning run")
    n = len(loss_runs[0])
    if any(len(run) != n for run in loss_runs):
        raise AnchorError("CUD anchors: every run must give one loss per sample")
    if not 1 <= k <= n:
        raise AnchorError(f"CUD anchors: k = {k} must be between 1 and the number of samples ({n})")
    easy_votes, hard_votes = [0] * n, [0] * n
    for run in loss_runs:
        for i in sorted(range(n), key=lambda i: (-run[i], i))[:k]:  # ties: lower index first
            easy_votes[i] += 1
        for i in sorted(range(n), key=lambda i: (run[i], i))[:k]:
            hard_votes[i] += 1
    return easy_votes, hard_votes


def _keep(easy_votes: Sequence[int], hard_votes: Sequence[int], threshold: int) -> tuple[list[int], list[int]]:
    easy = {i for i, v in enumerate(easy_votes) if v >= threshold}
    hard = {i for i, v in enumerate(hard_votes) if v >= threshold}
    both = easy & hard
    return sorted(easy - both), sorted(hard - both)


def select_anchors(loss_runs: Sequence[Sequence[float]], k: int, min_votes: int | None = None):
    """(easy, hard) sample indices from per-run post-unlearning losses.

    Per run: easy = the k highest losses, hard = the k lowest (ties: lower index first).
    A sample is a common anchor when at least ``min_votes`` runs (default ceil(runs / 2),
    the reference code's threshold) chose it; samples in both sets are removed from both.
    """
    easy_votes, hard_votes = _run_votes(loss_runs, k)
    return _keep(easy_votes, hard_votes, min_votes if min_votes is not None else math.ceil(len(loss_runs) / 2))


@dataclass
class AnchorVote:
    """Anchors chosen by runs grouped by objective: ``easy`` / ``hard`` are the common ones,
    ``by_objective[o]`` each objective's own (majority of its seeds); ``easy_runs[i][o]`` /
    ``hard_runs[i][o]``: how many of objective o's runs chose pool sample i."""

    easy: list[int]
    hard: list[int]
    by_objective: dict[str, tuple[list[int], list[int]]]
    easy_runs: dict[int, dict[str, int]]
    hard_runs: dict[int, dict[str, int]]
    min_votes: dict[str, int]
    min_objectives: int


def vote_anchors(runs_by_objective: dict[str, Sequence[Sequence[float]]], k: int, min_votes: int | None = None,
                 min_objectives: int | None = None) -> AnchorVote:
    """Two-level vote: per objective, anchors chosen by >= ``min_votes`` of its runs (default
    ceil(seeds / 2): 2 of 3); then common anchors chosen by >= ``min_objectives`` objectives
    (default ceil(objectives / 2)). At each level samples in both sets are dropped from both."""
    if not runs_by_objective:
        raise AnchorError("CUD anchors need at least one objective")
    by_objective, thresholds = {}, {}
    easy_runs: dict[int, dict[str, int]] = {}
    hard_runs: dict[int, dict[str, int]] = {}
    for objective, runs in runs_by_objective.items():
        easy_votes, hard_votes = _run_votes(runs, k)
        thresholds[objective] = min_votes if min_votes is not None else math.ceil(len(runs) / 2)
        by_objective[objective] = _keep(easy_votes, hard_votes, thresholds[objective])
        for i, v in enumerate(easy_votes):
            if v:
                easy_runs.setdefault(i, {})[objective] = v
        for i, v in enumerate(hard_votes):
            if v:
                hard_runs.setdefault(i, {})[objective] = v
    n = len(next(iter(runs_by_objective.values()))[0])
    across = min_objectives if min_objectives is not None else math.ceil(len(runs_by_objective) / 2)
    easy_obj, hard_obj = [0] * n, [0] * n
    for easy, hard in by_objective.values():
        for i in easy:
            easy_obj[i] += 1
        for i in hard:
            hard_obj[i] += 1
    easy, hard = _keep(easy_obj, hard_obj, across)
    return AnchorVote(easy, hard, by_objective, easy_runs, hard_runs, thresholds, across)


def spearman(a: Sequence[float], b: Sequence[float]) -> float | None:
    """Spearman rank correlation (ties: average ranks); None when either side is constant."""
    import warnings

    from scipy.stats import spearmanr

    if len(a) != len(b) or len(a) < 2:
        return None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a constant input: reported as None below
        rho = float(spearmanr(a, b).statistic)
    return None if math.isnan(rho) else rho


def _mean(values: Sequence[float | None]) -> float | None:
    values = [v for v in values if v is not None]
    return sum(values) / len(values) if values else None


# ----------------------------------------------------------------------------- anchor runs

class AnchorRunner(Protocol):
    """Runs one unlearning method on the samples and returns each sample's mean answer NLL
    after unlearning (same order). Optional: ``describe()`` (a dict, part of the cache key),
    ``last_info`` (a dict about the last run, recorded in the metadata) and
    ``reference_losses(samples, *, model, tokenizer)`` (the losses before unlearning)."""

    def losses(self, samples: Sequence[QASample], *, model: Any, tokenizer: Any, objective: str,
               seed: int) -> list[float]:
        ...


def _mean_prob(losses: Sequence[float]) -> float:
    """TOFU's forget probability of a set: the mean of exp(-mean answer NLL) per sample."""
    return sum(math.exp(-x) for x in losses) / max(len(losses), 1)


def forget_prob_watch(encoded: Sequence[dict], pad_token_id: int, *, every: int, stop_prob: float | None,
                      batch_size: int = 8, trace: bool = False):
    """A Trainer callback: before training and every ``every`` optimizer steps, the mean answer
    probability of ``encoded`` under the model being trained; stops training at the first check
    below ``stop_prob`` (None: never). ``checks`` lists (step, forget_prob[, per-sample losses])."""
    import contextlib

    import torch
    from transformers import TrainerCallback

    from ..likelihood import answer_nll

    class ForgetProbWatch(TrainerCallback):
        def __init__(self):
            self.checks: list[dict] = []
            self.stopped_at: int | None = None

        def check(self, args, state, model) -> float:
            training = model.training
            model.eval()
            autocast = (torch.autocast(device_type=args.device.type, dtype=torch.bfloat16) if args.bf16
                        else contextlib.nullcontext())
            with autocast:
                stats = answer_nll(model, encoded, pad_token_id, batch_size=batch_size)
            model.train(training)
            losses = [s / max(n, 1) for s, n in stats]
            entry = {"step": state.global_step, "forget_prob": _mean_prob(losses)}
            if trace:
                entry["losses"] = losses
            self.checks.append(entry)
            return entry["forget_prob"]

        def on_train_begin(self, args, state, control, model=None, **kwargs):
            self.check(args, state, model)

        def on_step_end(self, args, state, control, model=None, **kwargs):
            if self.stopped_at is None and state.global_step % every == 0:
                prob = self.check(args, state, model)
                if stop_prob is not None and prob < stop_prob:
                    self.stopped_at = state.global_step
                    control.should_training_stop = True
            return control

    return ForgetProbWatch()


class TrainerAnchorRunner:
    """Anchor runs with :func:`unlearn_plugins.training.run.run_unlearning` (LoRA by default).

    ``model_spec``: what to unlearn (default: the scored model's ``name_or_path``);
    ``options``: UnlearnConfig fields (lr, epochs, max_steps, retain, lora_r, ...): the most a
    run may do; ``stop_prob``: stop at the first check where the mean answer probability of
    the unlearned samples is below it (None: run the whole budget); ``check_steps``: optimizer
    steps between checks (default: about 4 per epoch); ``trace``: keep every check's
    per-sample losses in ``last_info`` (for budget studies).
    """

    def __init__(self, model_spec: str | None = None, options: dict | None = None, batch_size: int = 8,
                 stop_prob: float | None = None, check_steps: int | None = None, trace: bool = False):
        if stop_prob is not None and not 0 < float(stop_prob) < 1:
            raise UnlearnError(f"CUD anchor runs: stop_prob={stop_prob} must be between 0 and 1 (or none)")
        if check_steps is not None and int(check_steps) < 1:
            raise UnlearnError(f"CUD anchor runs: check_steps={check_steps} must be >= 1")
        self.model_spec = model_spec
        self.options = dict(options or {})
        self.batch_size = batch_size
        self.stop_prob = None if stop_prob is None else float(stop_prob)
        self.check_steps = None if check_steps is None else int(check_steps)
        self.trace = bool(trace)
        self.last_info: dict | None = None

    def describe(self) -> dict:
        return {"runner": "run_unlearning", "model_spec": self.model_spec, "options": self.options,
                "stop_prob": self.stop_prob, "check_steps": self.check_steps, "trace": self.trace}

    def max_length(self) -> int:
        from ..training.config import UnlearnConfig

        return int(self.options.get("max_length", UnlearnConfig.max_length))

    def reference_losses(self, samples, *, model, tokenizer) -> list[float]:
        """Per-sample answer NLL before unlearning, encoded as the runs encode them."""
        from ..data.tofu import encode_samples
        from ..likelihood import answer_nll

        encoded = encode_samples(tokenizer, samples, max_length=self.max_length())
        return [s / max(n, 1) for s, n in answer_nll(model, encoded, tokenizer.pad_token_id, batch_size=self.batch_size)]

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

    def check_every(self, n_samples: int, config) -> int:
        """Steps between checks: ``check_steps``, else about 4 checks per epoch."""
        if self.check_steps:
            return self.check_steps
        per_epoch = math.ceil(n_samples / (config.batch_size * config.grad_accum))
        return max(1, math.ceil(per_epoch / 4))

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
            encoded = encode_samples(tokenizer, samples, max_length=config.max_length)
            watch = None
            if self.stop_prob is not None or self.trace:
                watch = forget_prob_watch(encoded, tokenizer.pad_token_id, every=self.check_every(len(samples), config),
                                          stop_prob=self.stop_prob, batch_size=self.batch_size, trace=self.trace)
            result = run_unlearning(config, callbacks=[watch] if watch else [])
            if config.full_finetune:
                unlearned, _ = load_model(str(result.out), device=device)
            else:
                unlearned, _ = load_model(spec, device=device, adapter=str(result.out))
            stats = answer_nll(unlearned, encoded, tokenizer.pad_token_id, batch_size=self.batch_size)
            del unlearned
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
        losses = [s / max(n, 1) for s, n in stats]
        self.last_info = {
            "steps": result.record.get("steps"),
            "stopped_at_step": watch.stopped_at if watch else None,
            "forget_prob": _mean_prob(losses),
            "checks": watch.checks if watch else [],
        }
        return losses

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
                             "stop_prob": self.stop_prob, "check_steps": self.check_steps, "trace": self.trace,
                             "device": "cpu" if gpu is None else "cuda", "objective": objective, "seed": seed,
                             "samples": [s.to_record() for s in samples]})
            done = subprocess.run([sys.executable, "-m", "unlearn_plugins.scorers.anchor_job", str(job), str(out)],
                                  env=env, check=False)
            if done.returncode != 0 or not out.is_file():
                raise UnlearnError(f"CUD anchor run {objective}/seed {seed} failed in its child process "
                                   f"(exit code {done.returncode}; its output is above)")
            result = json.loads(out.read_text())
            self.last_info = result.get("info")
            return result["losses"]


# ----------------------------------------------------------------------------- the scorer

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
            keep = x != -100 and seen < n
            seen += x != -100
            labels.append(x if keep else -100)
        out.append({**e, "labels": labels})
    return out


def _none_if_off(value):
    return None if isinstance(value, str) and value.strip().lower() in ("none", "null", "off", "") else value


class CUDScorer:
    """Difficulty scorer ``cud``: returns per sample {score, s_E, s_H, anchor, circuit...};
    with ``per_objective`` {score (mean over objectives), score_by_objective, s_E_by_objective,
    s_H_by_objective, anchor, circuit...}. ``last_metadata``: the anchors, their votes, the runs."""

    def __init__(self, *, anchor_data: str | Sequence[Any] | None = None, tofu_dir: str | None = None,
                 objectives: Sequence[str] = ("grad_diff", "npo"), seeds: Sequence[int] = (0, 1, 2),
                 k: int | None = None, min_votes: int | None = None, min_objectives: int | None = None,
                 per_objective: bool = False, anchor_by: str = "loss", stop_prob: float | None = 0.1,
                 check_steps: int | None = None, anchors: dict | None = None,
                 anchor_losses: Sequence[Sequence[float]] | None = None, runner: AnchorRunner | None = None,
                 model_spec: str | None = None, unlearn_options: dict | None = None,
                 similarity: str = "cosine", circuit: str = "greedy", n_edges: int = 75, tau: float | None = None,
                 mode: str = "inputs", steps: int = 5, baseline: str = "zero", metric: str = "prob",
                 max_rows: int = 20, max_length: int = 512, answer_tokens: int | None = None,
                 cache: bool = True, cache_dir: str | None = None,
                 progress: bool = False):
        from ..circuits.eap_ig import BASELINES, METRICS, MODES
        from ..circuits.similarity import SIMILARITIES

        for name, value, allowed in (("similarity", similarity, SIMILARITIES), ("mode", mode, MODES),
                                     ("baseline", baseline, BASELINES), ("metric", metric, METRICS),
                                     ("circuit", circuit, ("greedy", "topn", "threshold")),
                                     ("anchor_by", anchor_by, ANCHOR_BY)):
            if value not in allowed:
                raise UnlearnError(f"scorer cud: option {name}={value!r}; choose one of {', '.join(allowed)}")
        if circuit == "threshold" and tau is None:
            raise UnlearnError("scorer cud: circuit=threshold needs the option tau")
        if isinstance(objectives, str) or isinstance(seeds, (str, int)):
            raise UnlearnError("scorer cud: objectives and seeds are lists, e.g. objectives=[\"npo\"] seeds=[0,1,2]")
        self.objectives = list(objectives)
        self.seeds = [int(s) for s in seeds]
        for name, values in (("objectives", self.objectives), ("seeds", self.seeds)):
            if not values or len(set(values)) != len(values):
                raise UnlearnError(f"scorer cud: option {name}={values} must be a non-empty list without repeats")
        if anchor_data is not None and not isinstance(anchor_data, (str, list, tuple)):
            raise UnlearnError(f"scorer cud: anchor_data must be a split spec, 'self' or a list of samples, "
                               f"got {type(anchor_data).__name__}")
        if per_objective and anchors is not None:
            raise UnlearnError("scorer cud: per_objective=true chooses anchors per objective from anchor runs; "
                               "it cannot be combined with fixed anchors")
        self.anchor_data, self.tofu_dir = anchor_data, tofu_dir
        self.k, self.min_votes, self.min_objectives = k, min_votes, min_objectives
        self.per_objective, self.anchor_by = bool(per_objective), anchor_by
        self.stop_prob, self.check_steps = _none_if_off(stop_prob), _none_if_off(check_steps)
        self.anchors = anchors
        self.anchor_losses = [list(r) for r in anchor_losses] if anchor_losses is not None else None
        self.runner = runner
        self.model_spec, self.unlearn_options = model_spec, dict(unlearn_options or {})
        if runner is None:  # check stop_prob / check_steps now, not after the model load
            TrainerAnchorRunner(model_spec, self.unlearn_options, stop_prob=self.stop_prob, check_steps=self.check_steps)
        self.similarity, self.circuit, self.n_edges, self.tau = similarity, circuit, int(n_edges), tau
        self.eap = {"mode": mode, "steps": int(steps), "baseline": baseline, "metric": metric}
        self.max_rows, self.max_length = int(max_rows), int(max_length)
        if answer_tokens is not None and (isinstance(answer_tokens, bool) or not isinstance(answer_tokens, int)
                                          or answer_tokens < 1):
            raise UnlearnError(f"scorer cud: option answer_tokens={answer_tokens!r} must be an integer >= 1 or none")
        self.answer_tokens = answer_tokens  # the EAP-IG metric on the first N answer tokens (1: a Yes/No answer)
        self.cache = bool(cache)
        self.cache_dir = Path(cache_dir).expanduser() if cache_dir else None
        self.progress = progress
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

    def anchor_pool(self, samples: Sequence[QASample]) -> AnchorPool:
        """The samples the anchor runs unlearn: ``anchor_data`` (a split spec or samples) less any
        that are also scored; the scored samples themselves with ``anchor_data=self``; by default
        a disjoint TOFU pool (:func:`default_anchor_pool`)."""
        from ..data.tofu import load_split

        data = self.anchor_data
        if data is None:
            return default_anchor_pool(samples)
        if isinstance(data, str) and data == IN_SAMPLE:
            return AnchorPool(list(samples), IN_SAMPLE, in_sample=True)
        if isinstance(data, str):
            pool, spec = load_split(data, self.tofu_dir), data
        else:
            pool, spec = _as_samples(data, "anchor_data"), f"<{len(data)} samples>"
        scored = {_key(s) for s in samples}
        kept = [p for p in pool if _key(p) not in scored]
        if len(kept) < len(pool) and self.progress:
            print(f"cud: left {len(pool) - len(kept)} samples of the anchor pool {spec} out: they are also scored",
                  file=sys.stderr, flush=True)
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
            raise UnlearnError(f"scorer cud: the anchor pool {pool.spec} has {len(pool.samples)} samples{left}; "
                               f"it needs at least 4, disjoint from the scored ones")

    def _runner_for(self, pool: AnchorPool) -> AnchorRunner:
        if self.runner is not None:
            return self.runner
        options = {**pool.run_options, **self.unlearn_options}
        return TrainerAnchorRunner(self.model_spec, options, stop_prob=self.stop_prob, check_steps=self.check_steps)

    @staticmethod
    def _check_retain(pool: AnchorPool, runner) -> None:
        """The anchor runs must not retain what they unlearn (e.g. TOFU's default retain99 holds forget10)."""
        from ..data.tofu import load_split
        from ..training.config import UnlearnConfig

        if not isinstance(runner, TrainerAnchorRunner):
            return
        spec = runner.options.get("retain", UnlearnConfig.retain)
        if not spec:
            return
        retain = {_key(s) for s in load_split(spec, runner.options.get("tofu_dir"))}
        overlap = sum(_key(p) in retain for p in pool.samples)
        if overlap:
            raise UnlearnError(f"scorer cud: the anchor runs' retain set {spec} holds {overlap} of the "
                               f"{len(pool.samples)} anchor-pool samples ({pool.spec}); pass "
                               f"unlearn_options={{\"retain\": ...}} with a split disjoint from the pool")

    # ------------------------------------------------------------------ anchor runs
    def anchor_runs(self) -> list[tuple[str, int]]:
        """The (objective, seed) unlearning runs that choose the anchors, in order."""
        return [(objective, seed) for objective in self.objectives for seed in self.seeds]

    def anchor_loss_runs(self, pool: AnchorPool, *, model, tokenizer, model_fp: str, runner=None,
                         only: Sequence[int] | None = None) -> list[list[float]]:
        """Per (objective, seed) run, the pool's per-sample post-unlearning losses (cached).
        ``only``: positions in :meth:`anchor_runs` to do (a process's share under a launcher)."""
        runner = runner or self._runner_for(pool)
        return [self._anchor_run(pool, objective, seed, runner, model=model, tokenizer=tokenizer, model_fp=model_fp)
                for j, (objective, seed) in enumerate(self.anchor_runs()) if only is None or j in only]

    def _anchor_run(self, pool: AnchorPool, objective: str, seed: int, runner, *, model, tokenizer,
                    model_fp: str) -> list[float]:
        from ..files import write_json

        describe = getattr(runner, "describe", lambda: {"runner": type(runner).__name__})()
        key = _digest("anchor-run", model_fp, samples_fingerprint(pool.samples), objective, seed, describe)
        path = self._cache_root() / "anchors" / f"{key}.json"
        if self.cache and path.is_file():
            try:
                cached = json.loads(path.read_text())
                losses = [float(x) for x in cached["losses"]]
                self._run_info[(objective, seed)] = {"cached": True, **(cached.get("info") or {})}
                return losses
            except (OSError, ValueError, KeyError, TypeError):
                pass  # unreadable: redo the run
        if self.progress:
            print(f"cud: anchor run {objective}/seed {seed} on {len(pool.samples)} samples of {pool.spec}",
                  file=sys.stderr, flush=True)
        losses = [float(x) for x in runner.losses(pool.samples, model=model, tokenizer=tokenizer,
                                                   objective=objective, seed=seed)]
        if len(losses) != len(pool.samples):
            raise UnlearnError(f"CUD anchor run {objective}/seed {seed} returned {len(losses)} losses "
                               f"for {len(pool.samples)} samples")
        info = dict(getattr(runner, "last_info", None) or {})
        if self.cache:
            write_json(path, {"objective": objective, "seed": seed, "losses": losses, "runner": describe, "info": info})
        self._run_info[(objective, seed)] = {"cached": False, **info}
        return losses

    def _reference_losses(self, pool: AnchorPool, runner, *, model, tokenizer) -> list[float]:
        """The pool's answer losses before unlearning (for anchor_by=increase)."""
        if hasattr(runner, "reference_losses"):
            return [float(x) for x in runner.reference_losses(pool.samples, model=model, tokenizer=tokenizer)]
        return TrainerAnchorRunner(options={"max_length": self.max_length}).reference_losses(
            pool.samples, model=model, tokenizer=tokenizer)

    def choose_anchors(self, pool: AnchorPool, *, model, tokenizer, model_fp: str) -> dict[str, tuple[list[int], list[int]]]:
        """The anchor groups to score against, as pool positions: {"all": (easy, hard)}, or one
        group per objective with ``per_objective``."""
        n = len(pool.samples)
        self._vote, self._values, self._run_info = None, None, {}
        runs = None
        if self.anchors is not None:
            groups = {"all": (sorted(set(self.anchors["easy"])), sorted(set(self.anchors["hard"])))}
        else:
            runner = self._runner_for(pool)
            if self.anchor_losses is not None:
                runs = self.anchor_losses
                if len(runs) != len(self.anchor_runs()):
                    raise AnchorError(f"CUD: anchor_losses has {len(runs)} runs; objectives x seeds = "
                                      f"{len(self.anchor_runs())} (objective-major order)")
            else:
                self._check_retain(pool, runner)
                runs = self.anchor_loss_runs(pool, model=model, tokenizer=tokenizer, model_fp=model_fp, runner=runner)
            values = runs
            if self.anchor_by == "increase":
                before = self._reference_losses(pool, runner, model=model, tokenizer=tokenizer)
                values = [[after - b for after, b in zip(run, before)] for run in runs]
            self._values = {o: [v for (oo, _), v in zip(self.anchor_runs(), values) if oo == o] for o in self.objectives}
            k = self.k or max(1, round(n / 8))  # the paper code: 50 of 400
            self._vote = vote_anchors(self._values, k, self.min_votes, self.min_objectives)
            self._k = k
            groups = (dict(self._vote.by_objective) if self.per_objective
                      else {"all": (self._vote.easy, self._vote.hard)})
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
            "easy": vote.easy if vote else groups["all"][0], "hard": vote.hard if vote else groups["all"][1],
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
        return (f"CUD: {where} only {count} {kind} anchor(s) (need {need}{why}); stable {kind} anchors per "
                f"objective: {each} (k={self._k}, min_votes={self._vote.min_votes}, "
                f"min_objectives={self._vote.min_objectives}); raise k, add seeds, lower min_votes / min_objectives"
                + ("" if self.per_objective else ", or score per objective (per_objective=true)"))

    # ------------------------------------------------------------------ circuits
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
        if self.answer_tokens is not None:  # (absent otherwise: earlier cache keys stay valid)
            settings["answer_tokens"] = self.answer_tokens
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
                encoded = first_answer_tokens(encode_samples(tokenizer, [samples[i] for i in missing],
                                                             max_length=self.max_length), self.answer_tokens)
                batches = engine.iter_scores(encoded)
                position = missing
            else:  # the corrupt inputs of 'mean' / 'other' need every sample
                encoded = first_answer_tokens(encode_samples(tokenizer, samples, max_length=self.max_length),
                                              self.answer_tokens)
                batches = engine.iter_scores(encoded, indices=missing)
                position = range(len(samples))
            for idx, scores in batches:
                for j, m in zip(idx, scores):
                    i = position[j]
                    out[i] = m
                    if self.cache:
                        self._save(root / f"{keys[i]}.pt", m[g.edge_mask].contiguous())
        return out, g

    def _pool_matrices(self, pool: AnchorPool, positions: Sequence[int], *, model, tokenizer, model_fp: str) -> dict:
        """The anchors' matrices: per sample with the zero baseline; in the pool's context otherwise."""
        if self.eap["baseline"] == "zero":
            m, _ = self.score_matrices([pool.samples[i] for i in positions], model=model, tokenizer=tokenizer,
                                       model_fp=model_fp)
            return {i: m[j] for j, i in enumerate(positions)}
        m, _ = self.score_matrices(pool.samples, model=model, tokenizer=tokenizer, model_fp=model_fp, only=positions)
        return {i: m[i] for i in positions}

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

        pool = self.anchor_pool(samples)
        self._check_counts(samples, pool)
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
            runner = self._runner_for(pool)
            self._check_retain(pool, runner)
            self.anchor_loss_runs(pool, model=model, tokenizer=tokenizer, model_fp=model_fp, runner=runner, only=mine)
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
        import torch

        from ..circuits.similarity import circuit_similarity, cud

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
                    sims[kind] = circuit_similarity(query, anchor, self.similarity)
                results[name] = (cud(sims["easy"], sims["hard"]), sims, role)
            if self.per_objective:
                roles = {o: r for o, (_, _, r) in results.items() if r}
                row = {
                    "score": sum(s for s, _, _ in results.values()) / len(results),
                    "score_by_objective": {o: s for o, (s, _, _) in results.items()},
                    "s_E_by_objective": {o: sims["easy"] for o, (_, sims, _) in results.items()},
                    "s_H_by_objective": {o: sims["hard"] for o, (_, sims, _) in results.items()},
                    "anchor": (next(iter(roles.values())) if len(set(roles.values())) == 1 else "mixed") if roles else None,
                }
                if roles:
                    row["anchor_by_objective"] = roles
            else:
                score, sims, role = results["all"]
                row = {"score": score, "s_E": sims["easy"], "s_H": sims["hard"], "anchor": role}
            row.update({
                "circuit_edges": query.n_edges,
                "circuit_depth": None if query.n_edges == 0 else round(query.depth(), 4),
                "circuit_by_layer": query.placement()["by_destination"].tolist(),
            })
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
            "scorer": "cud", "format": 1, "scored_samples": len(samples),
            "anchor_pool": pool.describe(),
            "settings": {
                "objectives": self.objectives, "seeds": self.seeds, "per_objective": self.per_objective,
                "anchor_by": self.anchor_by, "k": self._k if vote else None,
                "min_votes": vote.min_votes if vote else None, "min_objectives": vote.min_objectives if vote else None,
                "stop_prob": self.stop_prob, "check_steps": self.check_steps,
                "runner": getattr(runner, "describe", lambda: {"runner": type(runner).__name__})(),
                "fixed_anchors": self.anchors is not None, "given_losses": self.anchor_losses is not None,
                "similarity": self.similarity, "circuit": self.circuit, "n_edges": self.n_edges, "tau": self.tau,
                **self.eap, "max_rows": self.max_rows, "max_length": self.max_length,
                "answer_tokens": self.answer_tokens,
            },
            "anchors": {name: {"easy": entries(easy, "easy"), "hard": entries(hard, "hard")}
                        for name, (easy, hard) in groups.items()},
        }
        if vote is not None:
            meta["stable_by_objective"] = {o: {"easy": entries(e, "easy"), "hard": entries(h, "hard")}
                                           for o, (e, h) in vote.by_objective.items()}
            meta["runs"] = [{"objective": o, "seed": s, **self._run_info.get((o, s), {})} for o, s in self.anchor_runs()]
            meta["seed_agreement"] = {}
            for o, runs in self._values.items():
                pairs = [[self.seeds[a], self.seeds[b], spearman(runs[a], runs[b])]
                         for a in range(len(runs)) for b in range(a + 1, len(runs))]
                meta["seed_agreement"][o] = {"of": self.anchor_by, "mean_spearman": _mean([p[2] for p in pairs]),
                                             "pairs": pairs}
            means = {o: [sum(col) / len(col) for col in zip(*runs)] for o, runs in self._values.items()}
            names = list(means)
            meta["objective_agreement"] = [[a, b, spearman(means[a], means[b])]
                                           for i, a in enumerate(names) for b in names[i + 1:]]
        return meta
