"""Do difficulty scores split a forget set into easy and hard halves that unlearn differently?

The CUD paper's stratification experiment at our scale, on real TOFU and the embedded model:

1. **Target**: SmolLM2-135M-Instruct fine-tuned (LoRA, merged) on the 20 authors of TOFU
   ``forget10_perturbed`` (400 QA with paraphrased and perturbed answers).
2. **Pools**: authors 0-1 of those 20 are CUD's anchor pool (their anchor runs retain the query
   pool); authors 2-3 are held-out retain QA (never unlearned, never in a retain loss: they
   measure what unlearning destroys); authors 4-19 (320 QA) are the query pool.
3. **Scores** of the query pool: ``cud`` (inputs mode, anchors chosen on the anchor pool only),
   ``mrd`` (fp64) and ``loss``.
4. **Sets** of ``--set-size`` QA: per scorer the easiest and the hardest, plus ``--random-sets``
   disjoint random sets.
5. **Budget**: one pilot grad_diff run on the first random set (seed 99, probability traced
   every 2 steps) fixes the optimizer steps for every run: the whole epoch nearest to the step
   at which the set's mean answer probability had fallen to half its starting value (no run is
   saturated, and every sample of a set is unlearned equally often).
6. **Runs**: every set x objective x seed is unlearned from the target with that budget, the
   rest of the query pool as retain set. Efficacy = 100 x (1 - mean p_after / mean p_before)
   on the set; retained knowledge = held-out retain probability. For the first seed, truth
   ratio and ROUGE-L on the set and a small Model Utility (``--mu-size`` QA per part) too.
7. **Report**: per scorer and objective, hard - random and easy - random efficacy in points
   with 95% bootstrap intervals (runs, i.e. sets x seeds, resampled within each group);
   Spearman of each score with the post-unlearning loss of the random sets' samples.

Every stage is cached in ``--cache`` (default ``$UNLEARN_CACHE_DIR/study/cud_stratification``),
built in a temporary folder and renamed when complete, so an interrupted study resumes with
the first unfinished stage. ``--workers 2`` with one process per ``--worker K`` splits the stages
(single-threaded processes get more out of 2 cores than one two-threaded one); a worker waits
for the stages it needs from the other, and worker 0 writes the report. Prints one JSON line;
writes ``--out``/cud_stratification.{json,md,png}.

    UNLEARN_TOFU_DIR=../shared/data/tofu python bench/cud_stratification.py --out docs/study
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import shutil
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from cud_stratification_v2 import mean_nlls, write_samples  # noqa: E402 - v2 took them over unchanged

STAGE_FORMAT = 1
RECORDS = Path(__file__).resolve().parent / "results" / "cud_stratification"
PAPER = {"hard_minus_random": -14.1, "easy_minus_random": 3.3}


@dataclass
class StudyConfig:
    model: str = "smollm2-135m"
    data: str = "tofu:forget10_perturbed"
    anchor_authors: tuple = (0, 1)
    heldout_authors: tuple = (2, 3)
    set_size: int = 40
    random_sets: int = 3
    scorers: tuple = ("cud", "mrd", "loss")
    objectives: tuple = ("grad_diff", "npo", "simnpo")
    seeds: tuple = (3, 4)  # CUD's anchor runs use seeds 0-2
    max_length: int = 128
    # frozen base weights in bf16 under the LoRA adapters, as the library does on CUDA and the
    # reference code (open-unlearning, TOFU) trains; on a CPU with AMX this halves the study's time
    finetune: dict = field(default_factory=lambda: dict(lr=1e-3, epochs=3.0, lora_r=16, lora_alpha=32.0,
                                                        batch_size=8, grad_accum=1, dtype="bf16"))
    unlearn: dict = field(default_factory=lambda: dict(lr=5e-4, lora_r=16, lora_alpha=32.0, batch_size=4,
                                                       grad_accum=1, dtype="bf16"))
    pilot_max_steps: int = 30
    pilot_target: float = 0.5  # the budget: steps until grad_diff keeps this fraction of the probability
    cud: dict = field(default_factory=lambda: dict(steps=5, n_edges=75, objectives=["grad_diff", "npo"],
                                                   seeds=[0, 1, 2], stop_prob=0.1, check_steps=2))
    cud_anchor_unlearn: dict = field(default_factory=lambda: dict(lr=1e-3, epochs=3.0, lora_r=16, lora_alpha=32.0,
                                                                  batch_size=2, grad_accum=1, dtype="bf16"))
    target_threads: int = 2  # fixed, so that a rebuilt target is bit-identical to the recorded one
    fingerprint_tolerance: float = 1e-3  # max |NLL difference| of a rebuilt target on the held-out QA
    mrd: dict = field(default_factory=lambda: dict(perturbations=4, precision="fp64"))
    mu_size: int = 10
    extras_seeds: int = 1  # truth ratio, ROUGE-L and Model Utility for the first this-many seeds
    device: str | None = None

    QA_PER_AUTHOR = 20


# ----------------------------------------------------------------------------- data

def load_rows(config: StudyConfig):
    from unlearn_plugins.data.tofu import load_split

    samples = load_split(config.data)
    n_authors = len(samples) // config.QA_PER_AUTHOR

    def rows_of(authors):
        return [i for a in authors for i in range(a * config.QA_PER_AUTHOR, (a + 1) * config.QA_PER_AUTHOR)]

    anchor = rows_of(config.anchor_authors)
    heldout = rows_of(config.heldout_authors)
    query = [i for i in range(len(samples)) if i not in set(anchor) | set(heldout)]
    if n_authors * config.QA_PER_AUTHOR != len(samples):
        raise SystemExit(f"error: {config.data}: {len(samples)} rows is not a whole number of TOFU authors")
    return samples, anchor, heldout, query


# ----------------------------------------------------------------------------- measurements


def generate(model, tok, questions, max_new_tokens: int, batch_size: int = 16) -> list[str]:
    """Greedy answers (left-padded batches), stopped at the end token."""
    import torch

    from unlearn_plugins.data.tofu import end_token_id, prompt_text

    device = next(model.parameters()).device
    side = tok.padding_side
    tok.padding_side = "left"
    out = []
    try:
        for i in range(0, len(questions), batch_size):
            prompts = [prompt_text(tok, q) for q in questions[i:i + batch_size]]
            batch = tok(prompts, return_tensors="pt", padding=True, add_special_tokens=False).to(device)
            with torch.inference_mode():
                ids = model.generate(**batch, max_new_tokens=max_new_tokens, do_sample=False,
                                     eos_token_id=end_token_id(tok), pad_token_id=tok.pad_token_id)
            out += tok.batch_decode(ids[:, batch["input_ids"].shape[1]:], skip_special_tokens=True)
    finally:
        tok.padding_side = side
    return [s.strip() for s in out]


def qa_metrics(model, tok, samples, config: StudyConfig, *, role: str) -> dict:
    """TOFU's per-sample metrics of one set: ``forget`` (prob, truth ratio of paraphrased vs
    perturbed, ROUGE-L), ``retain`` (the same, true-better truth ratio), ``options`` (real
    authors / world facts: prob over the options, truth ratio, ROUGE-L)."""
    from unlearn_plugins.benchmarks.tofu import metrics as tm

    pairs, owners = [], []
    for j, s in enumerate(samples):
        first = s.answer if role == "options" else s.extra["paraphrased_answer"]
        for a in [first, *s.extra["perturbed_answer"]]:
            pairs.append((s.question, a))
            owners.append(j)
    nll = mean_nlls(model, tok, pairs, config.max_length)
    grouped = [[] for _ in samples]
    for j, v in zip(owners, nll):
        grouped[j].append(v)
    ratios = [tm.truth_ratio(g[0], g[1:]) for g in grouped]
    longest = max(len(tok(s.answer, add_special_tokens=False)["input_ids"]) for s in samples)
    gens = generate(model, tok, [s.question for s in samples], longest + 17)
    rouge = [tm.rouge_recall(g, s.answer)["rougeL_recall"] for g, s in zip(gens, samples)]
    out = {"truth_ratio_raw": ratios, "rougeL": rouge}
    if role == "options":
        out["prob"] = [tm.probability_with_options(g[0], g[1:]) for g in grouped]
    else:
        out["prob"] = [math.exp(-v) for v in mean_nlls(model, tok, [(s.question, s.answer) for s in samples],
                                                        config.max_length)]
    agg = tm.forget_truth_ratio if role == "forget" else tm.true_better_truth_ratio
    out["summary"] = {"prob": sum(out["prob"]) / len(samples), "truth_ratio": agg(ratios),
                      "rougeL": sum(rouge) / len(samples)}
    return out


def model_utility(model, tok, heldout, config: StudyConfig) -> dict:
    """TOFU's Model Utility (harmonic mean of 9 parts) on ``mu_size`` QA per part: held-out
    retain QA of the target's authors, real authors, world facts."""
    from unlearn_plugins.benchmarks.tofu import metrics as tm
    from unlearn_plugins.data.tofu import load_split

    n = config.mu_size
    parts = {"retain": qa_metrics(model, tok, heldout[:n], config, role="retain")["summary"],
             "real_authors": qa_metrics(model, tok, load_split("tofu:real_authors_perturbed")[:n], config,
                                        role="options")["summary"],
             "world_facts": qa_metrics(model, tok, load_split("tofu:world_facts_perturbed")[:n], config,
                                       role="options")["summary"]}
    values = [parts[p][m] for p in parts for m in ("prob", "truth_ratio", "rougeL")]
    return {"model_utility": tm.harmonic_mean(values), "parts": parts}


# ----------------------------------------------------------------------------- stages

class Records:
    """The study's ledger in the repository (``--records``): the small result files of every
    finished stage, so that a study longer than one machine's lifetime resumes on a fresh
    machine with an empty cache. Models are not recorded; the target is rebuilt from its recipe
    and checked against its recorded fingerprint."""

    FILES = ("stage.json", "result.json", "extras.json", "scores.jsonl", "scores.jsonl.meta.json", "budget.json",
             "before.json", "fingerprint.json")

    def __init__(self, root: Path | None):
        from unlearn_plugins.study.records import unpacked

        self.root = root  # written to (loose records)
        self.read = None if root is None else unpacked(root)  # read from: packed records too

    def restore(self, folder: Path) -> bool:
        """Fill the cache folder from its record (build-then-rename); False when there is none."""
        from unlearn_plugins.stages import DONE

        if self.root is None or folder.name.startswith("target-"):
            return False
        record = self.read / folder.name
        if not (record / DONE).is_file():
            return False
        tmp = folder.with_name(f"{folder.name}.tmp-{os.getpid()}")
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.copytree(record, tmp)
        if not (folder / DONE).is_file():
            shutil.rmtree(folder, ignore_errors=True)
            os.replace(tmp, folder)
        else:
            shutil.rmtree(tmp, ignore_errors=True)
        return True

    def save(self, folder: Path) -> None:
        """Copy a finished stage's result files into the ledger (temporary folder, then rename)."""
        from unlearn_plugins.stages import DONE

        record = None if self.root is None else self.root / folder.name
        if record is None or (record / DONE).is_file() or (self.read / folder.name / DONE).is_file():
            return
        tmp = record.with_name(f"{record.name}.tmp-{os.getpid()}")
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        for name in self.FILES:
            if (folder / name).is_file():
                shutil.copy2(folder / name, tmp / name)
        shutil.rmtree(record, ignore_errors=True)
        os.replace(tmp, record)

    def fingerprint(self, folder: Path) -> dict | None:
        path = None if self.root is None else self.read / folder.name / "fingerprint.json"
        return json.loads(path.read_text()) if path and path.is_file() else None


class Study:
    def __init__(self, config: StudyConfig, cache: Path, shard: int = 0, shards: int = 1, records: Path | None = None):
        from unlearn_plugins.stages import Stages, digest

        self.shard, self.shards, self.owner = shard, shards, 0

        self.config, self.cache = config, cache
        self.digest = digest
        self.records = Records(records)
        n_sets = 2 * len(config.scorers) + config.random_sets
        n_runs = n_sets * len(config.objectives) * len(config.seeds)
        self.stages = Stages(cache, total=3 + len(config.scorers) + n_runs + (n_sets if config.extras_seeds else 0))
        self.samples, self.anchor, self.heldout, self.query = load_rows(config)
        # a stage's key: the target's (model, data, fine-tune budget) plus what that stage reads
        self.key = digest("cud-stratification", STAGE_FORMAT, config.model, config.data, config.finetune,
                          config.max_length)
        self.started = time.perf_counter()
        self._target: str | None = None

    def folder(self, name: str, parts) -> Path:
        """A stage's cache folder: ``kind/name`` plus the key of what it depends on."""
        return self.stages.folder(name.split("/")[0], name.split("/")[-1], self.digest(self.key, parts))

    def cached(self, name: str, parts) -> bool:
        from unlearn_plugins.stages import DONE

        folder = self.folder(name, parts)
        return (folder / DONE).is_file() or self.records.restore(folder)

    def stage(self, label: str, name: str, parts, build) -> Path:
        """Build the stage (or read it from the cache or the records); a stage another worker
        owns is waited for."""
        from unlearn_plugins.stages import DONE

        folder = self.folder(name, parts)
        if not (folder / DONE).is_file():
            self.records.restore(folder)
        if self.owner % self.shards != self.shard and not (folder / DONE).is_file():
            self.log(f"waiting for worker {self.owner % self.shards}: {label}")
            while not (folder / DONE).is_file():
                time.sleep(10)
        folder = self.stages.run(label, folder, build)
        self.records.save(folder)
        return folder

    def log(self, msg: str) -> None:
        print(f"[{time.perf_counter() - self.started:7.0f} s] {msg}", file=sys.stderr, flush=True)

    def phase(self, jobs: list[tuple[int, Any]]) -> list[Any]:
        """Run this worker's jobs ``(owner, thunk)`` first, then collect every job's result
        (the others' from the cache, waiting for them where needed)."""
        for owner, thunk in jobs:
            if owner % self.shards == self.shard:
                self.owner = owner
                thunk()
        out = []
        for owner, thunk in jobs:
            self.owner = owner
            out.append(thunk())
        return out

    # -- the target (built on first need: a study resumed from records may need none)
    def target(self) -> str:
        """The merged target's folder. Whichever worker needs it first builds it (with a fixed
        thread count); the other waits. A rebuilt target must match the recorded fingerprint
        (answer NLLs on the held-out QA), else the recorded stages belong to another model."""
        import torch

        from unlearn_plugins.errors import UnlearnError
        from unlearn_plugins.files import write_json
        from unlearn_plugins.stages import DONE
        from unlearn_plugins.training import FinetuneConfig, run_finetune

        if self._target:
            return self._target
        c = self.config
        folder = self.folder("target", [])

        def build(tmp: Path):
            data = write_samples(tmp / "train.json", self.samples)
            threads = torch.get_num_threads()
            torch.set_num_threads(c.target_threads)
            try:
                run_finetune(FinetuneConfig(out=str(tmp / "run"), model=c.model, data=data, merge=True, save_steps=0,
                                            max_length=c.max_length, seed=0, device=c.device, **c.finetune))
                model, tok = self.load(str(tmp / "run" / "merged"))
                nll = mean_nlls(model, tok, [(s.question, s.answer) for s in self.heldout_samples], c.max_length)
            finally:
                torch.set_num_threads(threads)
            write_json(tmp / "fingerprint.json", {"heldout_nll": nll, "threads": c.target_threads,
                                                  "torch": torch.__version__})

        while not (folder / DONE).is_file():
            try:
                self.stages.run("fine-tune the target on 20 TOFU authors", folder, build)
            except UnlearnError as exc:
                if " is in use by " not in str(exc):
                    raise
                self.log("waiting for the other worker to build the target")  # it holds the stage's lock
                time.sleep(30)
        recorded = self.records.fingerprint(folder)
        if recorded is not None:
            now = json.loads((folder / "fingerprint.json").read_text())
            gap = fingerprint_gap(recorded, now, c.fingerprint_tolerance, self.records.root)
            self.log(f"target matches its recorded fingerprint (max |NLL difference| {gap:.1e})")
        self.records.save(folder)
        self._target = str(folder / "run" / "merged")
        return self._target

    def load(self, model: str, adapter: str | None = None):
        from unlearn_plugins.models import load_model

        return load_model(model, device=self.config.device, adapter=adapter)

    # -- scores
    def scores(self, scorer: str) -> list[dict]:
        from unlearn_plugins.files import write_json, write_jsonl
        from unlearn_plugins.scoring import score_samples
        from unlearn_plugins.stratify import metadata_path, read_scores

        c = self.config
        query = [self.samples[i] for i in self.query]

        def build(tmp: Path):
            target = self.target()
            if scorer == "cud":
                from unlearn_plugins.scorers.cud import CUDScorer

                retain = write_samples(tmp / "anchor_retain.json", query)
                options = dict(c.cud)
                run = {**c.cud_anchor_unlearn, "retain": retain, "max_length": c.max_length, "save_steps": 0}
                obj = CUDScorer(anchor_data=[self.samples[i] for i in self.anchor], objectives=options.pop("objectives"),
                                seeds=options.pop("seeds"), model_spec=target, unlearn_options=run,
                                anchor_recipe="none",  # v1's own anchor runs (LoRA, cud_anchor_unlearn)
                                max_length=c.max_length, progress=True, **options)
            elif scorer == "mrd":
                from unlearn_plugins.scorers.mrd import MRDScorer

                obj = MRDScorer(max_length=c.max_length, progress=True, **c.mrd)
            elif scorer == "loss":
                from unlearn_plugins.scorers.baselines import LossScorer

                obj = LossScorer(max_length=c.max_length)
            else:
                raise SystemExit(f"error: --scorers: unknown scorer {scorer!r} (cud, mrd, loss)")
            model, tok = self.load(target)
            rows = score_samples(obj, query, model=model, tokenizer=tok, scorer_name=scorer)
            for row, i in zip(rows, self.query):
                row["row"] = i  # index into the 400-row split
            write_jsonl(tmp / "scores.jsonl", rows)
            meta = getattr(obj, "last_metadata", None)
            if meta:
                write_json(metadata_path(tmp / "scores.jsonl"), meta)

        settings = {"cud": [c.cud, c.cud_anchor_unlearn, self.anchor], "mrd": [c.mrd]}.get(scorer, [])
        folder = self.stage(f"score the query pool with {scorer}", f"scores/{scorer}", [scorer, self.query, settings],
                            build)
        return read_scores(folder / "scores.jsonl")

    # -- sets
    def sets(self, scores: dict[str, list[dict]]) -> dict[str, list[int]]:
        c = self.config
        out: dict[str, list[int]] = {}
        for name, rows in scores.items():
            anchors = sum(1 for r in rows if r.get("anchor"))
            if anchors:
                raise SystemExit(f"error: {name} scores mark {anchors} query rows as anchors: pools overlap")
            order = sorted(rows, key=lambda r: (r["score"], r["row"]))
            out[f"{name}_easy"] = sorted(r["row"] for r in order[:c.set_size])
            out[f"{name}_hard"] = sorted(r["row"] for r in order[-c.set_size:])
        rng = random.Random(1234)
        shuffled = list(self.query)
        rng.shuffle(shuffled)
        if c.random_sets * c.set_size > len(shuffled):
            raise SystemExit("error: not enough query rows for disjoint random sets")
        for k in range(c.random_sets):
            out[f"random{k}"] = sorted(shuffled[k * c.set_size:(k + 1) * c.set_size])
        return out

    # -- before
    def before(self) -> dict:
        def build(tmp: Path):
            from unlearn_plugins.files import write_json

            model, tok = self.load(self.target())
            nll = mean_nlls(model, tok, [(s.question, s.answer) for s in self.samples], self.config.max_length)
            write_json(tmp / "before.json", {"nll": nll, "mu": model_utility(model, tok, self.heldout_samples,
                                                                              self.config)})

        folder = self.stage("measure the target before unlearning", "before", [self.config.mu_size, self.heldout],
                            build)
        return json.loads((folder / "before.json").read_text())

    @property
    def heldout_samples(self):
        return [self.samples[i] for i in self.heldout]

    def unlearn_config(self, tmp: Path, rows: list[int], objective: str, seed: int, **budget):
        from unlearn_plugins.training import UnlearnConfig

        c = self.config
        forget = write_samples(tmp / "forget.json", [self.samples[i] for i in rows])
        chosen = set(rows)
        retain = write_samples(tmp / "retain.json", [self.samples[i] for i in self.query if i not in chosen])
        return UnlearnConfig(out=str(tmp / "run"), model=self.target(), forget=forget, retain=retain,
                             objective=objective, seed=seed, save_steps=0, max_length=c.max_length, device=c.device,
                             **{**c.unlearn, **budget})

    # -- the budget
    def budget(self, rows: list[int], nll_before: list[float]) -> dict:
        from unlearn_plugins.files import write_json
        from unlearn_plugins.scorers.cud import forget_prob_watch
        from unlearn_plugins.training.run import run_unlearning

        c = self.config

        def build(tmp: Path):
            from unlearn_plugins.data.tofu import encode_samples
            from unlearn_plugins.models import load_tokenizer

            tok = load_tokenizer(self.target())
            samples = [self.samples[i] for i in rows]
            config = self.unlearn_config(tmp, rows, "grad_diff", 99, max_steps=c.pilot_max_steps)
            watch = forget_prob_watch(encode_samples(tok, samples, max_length=c.max_length), tok.pad_token_id,
                                      every=2, stop_prob=None, trace=True)
            run_unlearning(config, callbacks=[watch])
            p0 = sum(math.exp(-nll_before[i]) for i in rows) / len(rows)
            checks = [{"step": ch["step"], "prob": round(ch["forget_prob"], 5)} for ch in watch.checks]
            crossing = next((ch["step"] for ch in checks if ch["prob"] <= c.pilot_target * p0), None)
            per_epoch = math.ceil(len(rows) / (c.unlearn["batch_size"] * c.unlearn["grad_accum"]))
            write_json(tmp / "budget.json", {"crossing_step": crossing, "steps_per_epoch": per_epoch,
                                             "prob_before": p0, "checks": checks})

        folder = self.stage("pilot: the unlearning budget", "budget",
                            [rows, c.unlearn, c.pilot_max_steps, c.pilot_target], build)
        budget = json.loads((folder / "budget.json").read_text())
        budget["steps"] = budget_steps(budget, c)
        return budget

    # -- one run (with its truth ratio / ROUGE-L / Model Utility for the first seeds: the adapter
    #    is not kept beyond the machine, so everything measured on it is measured here)
    def run(self, set_name: str, rows: list[int], objective: str, seed: int, steps: int, n: int, total: int) -> dict:
        from unlearn_plugins.files import write_json
        from unlearn_plugins.training.run import run_unlearning

        c = self.config
        with_extras = seed in c.seeds[:c.extras_seeds]

        def build(tmp: Path):
            config = self.unlearn_config(tmp, rows, objective, seed, max_steps=steps)
            started = time.perf_counter()
            run_unlearning(config)
            train_s = time.perf_counter() - started
            model, tok = self.load(self.target(), adapter=str(tmp / "run"))
            after = mean_nlls(model, tok, [(self.samples[i].question, self.samples[i].answer) for i in rows],
                              c.max_length)
            kept = mean_nlls(model, tok, [(s.question, s.answer) for s in self.heldout_samples], c.max_length)
            write_json(tmp / "result.json", {"rows": rows, "nll_after": after, "heldout_nll_after": kept,
                                             "train_seconds": round(train_s, 1),
                                             "seconds": round(time.perf_counter() - started, 1)})
            if with_extras:
                write_json(tmp / "extras.json", self.extras_of(model, tok, rows))

        folder = self.stage(f"run {n}/{total}: unlearn {set_name} with {objective}, seed {seed}",
                            *self._run_key(set_name, rows, objective, seed, steps), build)
        result = json.loads((folder / "result.json").read_text())
        if (folder / "extras.json").is_file():
            result["extras"] = json.loads((folder / "extras.json").read_text())
        return result

    def _run_key(self, set_name: str, rows, objective: str, seed: int, steps: int) -> tuple[str, list]:
        c = self.config
        extras = [c.mu_size] if seed in c.seeds[:c.extras_seeds] else None
        return f"run/{set_name}-{objective}-s{seed}", [rows, objective, seed, steps, c.unlearn, self.query, extras]

    def run_cached(self, set_name: str, rows, objective: str, seed: int, steps: int) -> bool:
        return self.cached(*self._run_key(set_name, rows, objective, seed, steps))

    def extras_of(self, model, tok, rows: list[int]) -> dict:
        m = qa_metrics(model, tok, [self.samples[i] for i in rows], self.config, role="forget")
        return {"set": m["summary"], "per_sample": {k: m[k] for k in ("truth_ratio_raw", "rougeL", "prob")},
                "utility": model_utility(model, tok, self.heldout_samples, self.config)}

    def extras_before(self, set_name: str, rows: list[int]) -> dict:
        from unlearn_plugins.files import write_json

        def build(tmp: Path):
            model, tok = self.load(self.target())
            write_json(tmp / "extras.json", self.extras_of(model, tok, rows))

        folder = self.stage(f"truth ratio, ROUGE-L, Model Utility: {set_name} before", f"extras/{set_name}-before",
                            [rows, self.config.mu_size], build)
        return json.loads((folder / "extras.json").read_text())


def fingerprint_gap(recorded: dict, now: dict, tolerance: float, where) -> float:
    """The largest per-QA NLL difference between a rebuilt target and the recorded one; past
    ``tolerance`` the recorded stages were measured on another model, and the study stops."""
    if len(recorded["heldout_nll"]) != len(now["heldout_nll"]):
        raise SystemExit(f"error: {where}: the recorded target fingerprint covers {len(recorded['heldout_nll'])} "
                         f"QA, the rebuilt target {len(now['heldout_nll'])}")
    gaps = [abs(a - b) for a, b in zip(recorded["heldout_nll"], now["heldout_nll"])]
    gap = math.nan if any(math.isnan(g) for g in gaps) else max(gaps)
    if not gap <= tolerance:
        raise SystemExit(f"error: the rebuilt target differs from the recorded one (max |NLL difference| {gap:.2e} "
                         f"on the held-out QA > {tolerance}); the recorded stages in {where} belong to another "
                         "model: move them away to start over")
    return gap


def budget_steps(pilot: dict, config: StudyConfig) -> int:
    """The optimizer steps of every run: the whole epoch nearest to the pilot's step at which the
    probability had halved (whole epochs: every sample of a set is unlearned equally often;
    nearest, not the next: the next one, 30 steps on SmolLM2, left 92-100% efficacy, saturated)."""
    crossing, per_epoch = pilot["crossing_step"], pilot["steps_per_epoch"]
    if crossing is None:
        return config.pilot_max_steps
    return min(config.pilot_max_steps, per_epoch * max(1, round(crossing / per_epoch)))


# ----------------------------------------------------------------------------- analysis

def efficacy(result: dict, nll_before: list[float]) -> float:
    before = sum(math.exp(-nll_before[i]) for i in result["rows"]) / len(result["rows"])
    after = sum(math.exp(-v) for v in result["nll_after"]) / len(result["rows"])
    return 100.0 * (1.0 - after / before)


def diff_ci(a: list[float], b: list[float]) -> dict:
    """mean(a) - mean(b) with a 95% percentile bootstrap interval (each group resampled)."""
    import numpy as np
    from scipy.stats import bootstrap

    def stat(x, y, axis=-1):
        return np.mean(x, axis=axis) - np.mean(y, axis=axis)

    est = float(np.mean(a) - np.mean(b))
    if min(len(a), len(b)) < 2:  # an interim report: no interval from one run
        return {"diff": round(est, 2), "ci": None, "n": [len(a), len(b)]}
    ci = bootstrap((np.asarray(a), np.asarray(b)), stat, vectorized=True, paired=False, n_resamples=10000,
                   confidence_level=0.95, method="percentile", random_state=0).confidence_interval
    return {"diff": round(est, 2), "ci": [round(float(ci.low), 2), round(float(ci.high), 2)],
            "n": [len(a), len(b)]}


def stratified_diff_ci(strata: list[tuple[list[float], list[float]]], n_resamples: int = 10000) -> dict:
    """The mean over strata of mean(a) - mean(b), with a 95% percentile bootstrap interval that
    resamples a and b within each stratum (for one stratum: :func:`diff_ci`)."""
    import numpy as np

    if len(strata) == 1:
        return diff_ci(*strata[0])
    est = float(np.mean([np.mean(a) - np.mean(b) for a, b in strata]))
    n = [sum(len(a) for a, _ in strata), sum(len(b) for _, b in strata)]
    if min(min(len(a), len(b)) for a, b in strata) < 2:
        return {"diff": round(est, 2), "ci": None, "n": n}
    rng = np.random.default_rng(0)
    total = np.zeros(n_resamples)
    for a, b in strata:
        a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
        total += (a[rng.integers(0, len(a), (n_resamples, len(a)))].mean(1)
                  - b[rng.integers(0, len(b), (n_resamples, len(b)))].mean(1))
    low, high = np.percentile(total / len(strata), [2.5, 97.5])
    return {"diff": round(est, 2), "ci": [round(float(low), 2), round(float(high), 2)], "n": n}


def sample_ci(a: tuple[list[float], list[float]], b: tuple[list[float], list[float]]) -> dict:
    """Efficacy of group a minus group b, each ``(p_before, p_after)`` per sample, with a 95%
    percentile bootstrap interval over the samples of each group (which samples happened to be
    chosen, rather than which seeds ran)."""
    import numpy as np
    from scipy.stats import bootstrap

    ab, aa, bb, ba = (np.asarray(x, dtype=float) for x in (*a, *b))

    def eff(before, after, idx):
        idx = np.asarray(idx, dtype=int)
        return 100.0 * (1.0 - after[idx].sum() / before[idx].sum())

    def stat(i, j):
        return eff(ab, aa, i) - eff(bb, ba, j)

    est = stat(np.arange(len(ab)), np.arange(len(bb)))
    ci = bootstrap((np.arange(len(ab)), np.arange(len(bb))), stat, vectorized=False, paired=False,
                   n_resamples=4000, confidence_level=0.95, method="percentile", random_state=0).confidence_interval
    return {"diff": round(float(est), 2), "ci": [round(float(ci.low), 2), round(float(ci.high), 2)],
            "n": [len(ab), len(bb)]}


def per_sample(results, names, objectives, seeds, nll0) -> tuple[list[float], list[float]]:
    """(p_before, p_after averaged over the given objectives and seeds) per sample of the sets."""
    after: dict[int, list[float]] = {}
    for name in names:
        for o in objectives:
            for seed in seeds:
                r = results[(name, o, seed)]
                for i, v in zip(r["rows"], r["nll_after"]):
                    after.setdefault(i, []).append(math.exp(-v))
    rows = sorted(after)
    return [math.exp(-nll0[i]) for i in rows], [sum(after[i]) / len(after[i]) for i in rows]


def analyse(config: StudyConfig, sets, results, scores, before, extras, budget, heldout_rows) -> dict:
    """Everything the report shows, from the runs present (all of them, unless ``--cached-only``
    reports an unfinished study: then each figure says over how many runs it is)."""
    from scipy.stats import spearmanr

    nll0 = before["nll"]
    eff = {(s, o, seed): efficacy(r, nll0) for (s, o, seed), r in results.items()}
    random_names = [s for s in sets if s.startswith("random")]

    def have(names, objectives):
        """The (set, objective, seed) runs present."""
        return [(n, o, seed) for n in names for o in objectives for seed in config.seeds if (n, o, seed) in eff]

    def compare(kind_set: str, objectives) -> dict | None:
        # only the (objective, seed) cells that the set and every random set have
        cells = [(o, seed) for o in objectives for seed in config.seeds
                 if all((n, o, seed) in eff for n in [kind_set, *random_names])]
        keys = [(kind_set, o, seed) for o, seed in cells]
        rnd_keys = [(n, o, seed) for n in random_names for o, seed in cells]
        if not keys:
            return None
        both = [seed for seed in config.seeds if any(k[2] == seed for k in keys) and any(k[2] == seed for k in rnd_keys)]
        objs = [o for o in objectives if any(k[1] == o for k in keys)]
        # stratified by objective: objectives differ far more from each other than sets do, so
        # runs are resampled within each objective and the per-objective differences averaged
        strata = [([eff[k] for k in keys if k[1] == o], [eff[k] for k in rnd_keys if k[1] == o]) for o in objs]
        out = {"runs": stratified_diff_ci(strata),
               "mean": round(sum(eff[k] for k in keys) / len(keys), 2),
               "random": round(sum(eff[k] for k in rnd_keys) / len(rnd_keys), 2)}
        if both and all((n, o, seed) in eff for n in [kind_set, *random_names] for o in objs for seed in both):
            out["samples"] = sample_ci(per_sample(results, [kind_set], objs, both, nll0),
                                       per_sample(results, random_names, objs, both, nll0))
        return out

    table: dict = {}
    for scorer in config.scorers:
        for objective in [*config.objectives, "all objectives"]:
            objectives = config.objectives if objective == "all objectives" else [objective]
            row = {}
            for kind in ("hard", "easy"):
                c = compare(f"{scorer}_{kind}", objectives)
                if c is None:
                    continue
                row[kind], row["random"] = c["mean"], c["random"]
                row[f"{kind}_minus_random"] = c["runs"]
                if "samples" in c:
                    row[f"{kind}_minus_random_by_sample"] = c["samples"]
            if row:
                table.setdefault(scorer, {})[objective] = row
    # Spearman of each score with the post-unlearning loss (mean over seeds) on the random sets' samples
    spearman: dict = {}
    for objective in config.objectives:
        post: dict[int, list[float]] = {}
        for key in have(random_names, [objective]):
            r = results[key]
            for i, v in zip(r["rows"], r["nll_after"]):
                post.setdefault(i, []).append(v)
        rows = sorted(post)
        if len(rows) < 3:
            continue
        loss_after = [sum(post[i]) / len(post[i]) for i in rows]
        for scorer, srows in scores.items():
            by_row = {r["row"]: r["score"] for r in srows}
            test = spearmanr([by_row[i] for i in rows], loss_after)
            spearman.setdefault(scorer, {})[objective] = {"rho": round(float(test.statistic), 3),
                                                          "p": round(float(test.pvalue), 4), "n": len(rows)}
    heldout = {}
    for (s, o, seed), r in results.items():
        p = sum(math.exp(-v) for v in r["heldout_nll_after"]) / len(r["heldout_nll_after"])
        heldout.setdefault(o, {}).setdefault(s, []).append(p)
    p_heldout_before = sum(math.exp(-nll0[i]) for i in heldout_rows) / len(heldout_rows)
    n_planned = len(sets) * len(config.objectives) * len(config.seeds)
    return {"complete": len(results) == n_planned, "runs": len(results), "runs_planned": n_planned,
            "heldout_retain_prob_before": round(p_heldout_before, 4),
            "efficacy": {f"{s}|{o}|{seed}": round(v, 2) for (s, o, seed), v in eff.items()},
            "table": table, "spearman": spearman,
            "heldout_retain_prob": {o: {s: round(sum(v) / len(v), 4) for s, v in d.items()} for o, d in heldout.items()},
            "extras": extras, "budget": budget, "utility_before": before["mu"]}


def markdown(config: StudyConfig, out: dict) -> str:
    def ci(row, kind):
        d, by_sample = row.get(f"{kind}_minus_random"), row.get(f"{kind}_minus_random_by_sample")
        if d is None:
            return "n/a"
        text = f"{d['diff']:+.1f} " + (f"[{d['ci'][0]:+.1f}, {d['ci'][1]:+.1f}]" if d["ci"] else "[1 run]")
        return text + (f" / [{by_sample['ci'][0]:+.1f}, {by_sample['ci'][1]:+.1f}]" if by_sample else "")

    def num(row, key):
        return f"{row[key]:.1f}" if key in row else "n/a"

    b = out["budget"]
    status = "" if out["complete"] else f"**Interim: {out['runs']} of {out['runs_planned']} runs.** "
    lines = [status + f"Efficacy = 100 x (1 - mean answer probability after / before) on the unlearned set, in points; "
             f"{config.set_size} QA per set, {b['steps']} optimizer steps of batch {config.unlearn['batch_size']} "
             f"at lr {config.unlearn['lr']} for every run, seeds {', '.join(map(str, config.seeds))}. "
             "Differences: estimate [95% CI, runs resampled (within each objective for all objectives)] / [95% CI, samples "
             "resampled]. Spearman: score vs "
             "post-unlearning loss (mean over seeds) of the random sets' samples.", "",
             "| scorer | objective | random | hard | easy | hard - random | easy - random | Spearman (p) |",
             "| --- | --- | ---: | ---: | ---: | --- | --- | --- |"]
    for scorer, by_obj in out["table"].items():
        for objective, row in by_obj.items():
            h, e = ci(row, "hard"), ci(row, "easy")
            if objective == "all objectives":
                lines.append(f"| **{scorer}** | **all** | | | | **{h}** | **{e}** | |")
                continue
            sp = out["spearman"].get(scorer, {}).get(objective)
            rho = f"{sp['rho']:+.2f} ({sp['p']:.2g})" if sp else "n/a"
            lines.append(f"| {scorer} | {objective} | {num(row, 'random')} | {num(row, 'hard')} | {num(row, 'easy')} | "
                         f"{h} | {e} | {rho} |")
    lines += ["", f"Retained knowledge: held-out retain probability (target: {out['heldout_retain_prob_before']:.3f}; "
              "mean over seeds) and, where measured (first seed), Model Utility on "
              f"{config.mu_size} QA per part (target: {out['utility_before']['model_utility']:.3f}), truth ratio "
              "and ROUGE-L of the unlearned set (before -> after).", "",
              "| objective | set | held-out retain prob | Model Utility | set truth ratio | set ROUGE-L |",
              "| --- | --- | ---: | ---: | --- | --- |"]
    extras = out["extras"]
    for objective, by_set in out["heldout_retain_prob"].items():
        first = next((v for k, v in extras.items() if k.startswith(objective + "|")), {})
        for name, prob in by_set.items():
            e, b0 = first.get(name), extras.get("before", {}).get(name)
            mu = f"{e['utility']['model_utility']:.3f}" if e else ""
            tr = f"{b0['set']['truth_ratio']:.3f} -> {e['set']['truth_ratio']:.3f}" if e and b0 else ""
            rg = f"{b0['set']['rougeL']:.3f} -> {e['set']['rougeL']:.3f}" if e and b0 else ""
            lines.append(f"| {objective} | {name} | {prob:.3f} | {mu} | {tr} | {rg} |")
    return "\n".join(lines) + "\n"


def plot(config: StudyConfig, out: dict, sets, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    names = [n for n in sets if not n.startswith("random")] + ["random"]
    fig, axes = plt.subplots(1, len(config.objectives), figsize=(4.2 * len(config.objectives), 3.6), sharey=True)
    for ax, objective in zip(np.atleast_1d(axes), config.objectives):
        means, errs = [], []
        for name in names:
            vals = [v for k, v in out["efficacy"].items()
                    if k.split("|")[1] == objective and (k.split("|")[0] == name or
                                                         (name == "random" and k.startswith("random")))]
            means.append(np.mean(vals) if vals else 0.0)
            errs.append(np.std(vals, ddof=1) if len(vals) > 1 else 0.0)
        colors = ["tab:green" if n.endswith("easy") else "tab:red" if n.endswith("hard") else "tab:gray"
                  for n in names]
        ax.bar(range(len(names)), means, yerr=errs, color=colors, capsize=3)
        ax.set_xticks(range(len(names)), [n.replace("_", "\n") for n in names], fontsize=8)
        ax.set_title(objective)
        ax.axhline(means[-1], color="tab:gray", lw=0.8, ls="--")
    np.atleast_1d(axes)[0].set_ylabel("efficacy (points; mean ± sd over runs)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


# ----------------------------------------------------------------------------- main

def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, default=Path("cud-stratification"), help="folder for the json/md/png")
    p.add_argument("--cache", type=Path, default=None)
    p.add_argument("--records", type=Path, default=RECORDS,
                   help="the ledger of finished stages' results, kept in the repository so that the study resumes "
                        "on a fresh machine (default: %(default)s; 'none': no ledger)")
    p.add_argument("--model", default=StudyConfig.model)
    p.add_argument("--device", default=None)
    p.add_argument("--set-size", type=int, default=StudyConfig.set_size)
    p.add_argument("--random-sets", type=int, default=StudyConfig.random_sets)
    p.add_argument("--objectives", default=",".join(StudyConfig.objectives))
    p.add_argument("--seeds", default=",".join(map(str, StudyConfig.seeds)))
    p.add_argument("--scorers", default=",".join(StudyConfig.scorers))
    p.add_argument("--workers", type=int, default=1,
                   help="split the stages over this many processes: start each with --worker K (0..N-1)")
    p.add_argument("--worker", type=int, default=0, help="this process's number (worker 0 writes the report)")
    p.add_argument("--cached-only", action="store_true",
                   help="report without computing the truth ratio / ROUGE-L / Model Utility stages not yet cached")
    p.add_argument("--extras-seeds", type=int, default=StudyConfig.extras_seeds,
                   help="truth ratio / ROUGE-L / Model Utility for the first N seeds (0: none)")
    args = p.parse_args(argv)

    from unlearn_plugins.files import write_json
    from unlearn_plugins.models import cache_dir
    from unlearn_plugins.process import quiet_libraries

    config = StudyConfig(model=args.model, device=args.device, set_size=args.set_size, random_sets=args.random_sets,
                         objectives=tuple(args.objectives.split(",")), seeds=tuple(int(s) for s in args.seeds.split(",")),
                         scorers=tuple(args.scorers.split(",")), extras_seeds=args.extras_seeds)
    cache = args.cache or cache_dir() / "study" / "cud_stratification"
    if str(args.records) == "none":
        args.records = None
    if not 0 <= args.worker < args.workers:
        raise SystemExit(f"error: --worker {args.worker} must be in 0..{args.workers - 1}")
    study = Study(config, cache, shard=args.worker, shards=args.workers, records=args.records)
    with quiet_libraries():
        # phases of jobs (owner worker, thunk); with --workers 1 everything runs here in order
        owners = {"cud": 0, "mrd": 1, "loss": 1}
        before, *score_rows = study.phase([(1, study.before)] + [
            (owners.get(name, j), lambda name=name: study.scores(name)) for j, name in enumerate(config.scorers)])
        scores = dict(zip(config.scorers, score_rows))
        sets = study.sets(scores)
        [budget] = study.phase([(0, lambda: study.budget(sets["random0"], before["nll"]))])
        study.log(f"budget: {budget['steps']} optimizer steps (pilot: {budget['checks']})")
        runs = [(s, o, seed) for seed in config.seeds for o in config.objectives for s in sets]
        if args.cached_only:  # an interim report of an unfinished study
            runs = [(s, o, seed) for s, o, seed in runs if study.run_cached(s, sets[s], o, seed, budget["steps"])]
        done = study.phase([(n, lambda n=n, s=s, o=o, seed=seed: study.run(
            s, sets[s], o, seed, budget["steps"], n + 1, len(runs))) for n, (s, o, seed) in enumerate(runs)])
        results = dict(zip(runs, done))
        extras: dict = {}
        for (s, o, seed), r in results.items():
            if "extras" in r:
                extras.setdefault(f"{o}|{seed}", {})[s] = r.pop("extras")
        if config.extras_seeds:
            names = [s for s in sets if not args.cached_only or study.cached(f"extras/{s}-before",
                                                                             [sets[s], config.mu_size])]
            got = study.phase([(j, lambda s=s: study.extras_before(s, sets[s])) for j, s in enumerate(names)])
            extras["before"] = dict(zip(names, got))
    if study.shard != 0:
        return 0  # worker 0 writes the report
    out = analyse(config, sets, results, scores, before, extras, budget, study.heldout)
    out["config"] = asdict(config)
    out["sets"] = sets
    args.out.mkdir(parents=True, exist_ok=True)
    write_json(args.out / "cud_stratification.json", out)
    (args.out / "cud_stratification.md").write_text(markdown(config, out))
    plot(config, out, sets, args.out / "cud_stratification.png")
    headline = {"study": "cud_stratification", "complete": out["complete"], "runs": out["runs"],
                "budget_steps": budget["steps"], "paper": PAPER,
                **{f"{kind}_minus_random{how}": {
                    s: out["table"].get(s, {}).get("all objectives", {}).get(f"{kind}_minus_random{how}")
                    for s in config.scorers}
                   for kind in ("hard", "easy") for how in ("", "_by_sample")},
                "spearman": out["spearman"]}
    print(json.dumps(headline))
    return 0


if __name__ == "__main__":
    sys.exit(main())
