"""One CUD anchor run in a fresh single-process Python, started by
:meth:`unlearn_plugins.scorers.cud.anchor_runs.TrainerAnchorRunner.losses_in_child` (under ``accelerate
launch`` an in-process Trainer would join the launcher's process group).

Usage: ``python -m unlearn_plugins.scorers.cud.anchor_job JOB.json OUT.json``; JOB holds the runner
settings and the samples as TOFU records, OUT receives ``{"losses": [...], "info": {...}}``
(``info``: the run's steps and stop checks, see ``TrainerAnchorRunner.last_info``).
"""

from __future__ import annotations

import json
import sys


def main(argv: list[str]) -> int:
    from ...errors import UnlearnError
    from ...files import write_json
    from ...interfaces import QASample
    from ...models import load_tokenizer
    from .anchor_runs import TrainerAnchorRunner

    job_path, out_path = argv
    job = json.loads(open(job_path, encoding="utf-8").read())
    samples = [
        QASample(r["question"], r["answer"], i, extra={k: v for k, v in r.items() if k not in ("question", "answer")})
        for i, r in enumerate(job["samples"])
    ]
    runner = TrainerAnchorRunner(
        job["model_spec"],
        job["options"],
        job["batch_size"],
        stop_prob=job.get("stop_prob"),
        check_steps=job.get("check_steps"),
        trace=bool(job.get("trace")),
    )
    try:
        losses = runner.losses_here(
            samples,
            spec=job["model_spec"],
            device=job["device"],
            tokenizer=load_tokenizer(job["model_spec"]),
            objective=job["objective"],
            seed=int(job["seed"]),
        )
    except UnlearnError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    write_json(out_path, {"losses": losses, "info": runner.last_info})
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
