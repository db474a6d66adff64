"""What one full-parameter CUD anchor-run step costs with the paper's recipe (``anchor_recipe=paper``:
batch 4 x 8, all weights) on SmolLM2-135M: GradDiff and NPO, 2 steps each on 80 TOFU QA
(forget10_perturbed[0:80], retaining retain_perturbed), fp32, 2 threads; prints wall and CPU
seconds per objective and the process's peak memory (the numbers in docs/methods.md and
bench/cud_stratification_v3.py's estimate)::

    UNLEARN_TOFU_DIR=... OMP_NUM_THREADS=2 python bench/cud_anchor_run_cost.py
"""

import json
import resource
import time

import torch

from unlearn_plugins.data.qa import load_split
from unlearn_plugins.models import load_model
from unlearn_plugins.scorers.cud import CUDScorer, TrainerAnchorRunner


def main() -> None:
    torch.set_num_threads(2)
    pool = load_split("tofu:forget10_perturbed[0:80]")
    model, tok = load_model("smollm2-135m", device="cpu")
    out = {}
    for objective in ("grad_diff", "npo"):
        shared = {"retain": "tofu:retain_perturbed", "max_length": 128, "save_steps": 0, "max_steps": 2}
        # a 2-step run: one warmup step instead of the recipe's warmup epoch
        shared.update(warmup_epochs=None, warmup_steps=1)
        options = CUDScorer(objectives=[objective], unlearn_options=shared).run_options(objective)
        runner = TrainerAnchorRunner("smollm2-135m", options)
        wall, cpu = time.perf_counter(), time.process_time()
        runner.losses(pool, model=model, tokenizer=tok, objective=objective, seed=0)
        out[objective] = {
            "wall_s": time.perf_counter() - wall,
            "cpu_s": time.process_time() - cpu,
            "steps": runner.last_info["steps"],
            "prob_before": runner.last_info["forget_prob_before"],
            "prob_after": runner.last_info["forget_prob"],
            "options": options,
        }
        print(objective, json.dumps(out[objective]), flush=True)
    out["max_rss_gb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
