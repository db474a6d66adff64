"""A MovieLens study's evaluation stage (``rec_evaluate``): the recommendation tasks
(``movielens_rec``: AUC, LogLoss and accuracy on the retained users' test prompts;
``movielens_rec_forget``: the same on the forget users' training prompts, and the JSD of P(Yes) to
the retrain model's) through lm-eval, with the task metadata `unlearn eval` has no flag for.

A model with or without an adapter is read by lm-eval's HFLM (log-softmax in fp32); a sharded
recommender (``sharded``: a folder of :mod:`unlearn_plugins.benchmarks.movielens.sharded`) by
:class:`~unlearn_plugins.benchmarks.movielens.sharded_lm.ShardedRecommenderLM`. ``reference`` None: this
is the retrain model, whose forget predictions are saved as every other model's JSD reference
(``reference.json``)."""

from __future__ import annotations

from pathlib import Path

REFERENCE = "reference.json"


def build_evaluate(tmp: Path, p: dict) -> None:
    from unlearn_plugins.study.cells import need_stage

    for path, what in ((p["model"], "the model to evaluate"), (p["reference"], "the retrain model's JSD reference")):
        if path:
            need_stage(path, what)
    from lm_eval.models.huggingface import HFLM

    from unlearn_plugins.evaluation import lm_eval_runner as runner
    from unlearn_plugins.models import load_model, pick_device, resolve_model

    from ..tasks import metrics as rm
    from .source import FORGET_TASK

    model, adapter, sharded, reference = p["model"], p.get("adapter"), p.get("sharded"), p.get("reference")
    device, batch_size = p["device"], p["batch_size"]
    prepared = runner.prepare(
        list(p["tasks"]),
        metadata={
            "tokenizer": resolve_model(p["base"] if sharded else model),
            "rec_dir": str(p["bench"]),
            "retrain_reference": reference,
        },
    )
    if sharded is not None:
        from ..sharded import ShardedRecommender
        from ..sharded_lm import ShardedRecommenderLM

        lm = ShardedRecommenderLM(ShardedRecommender(sharded), device=device, batch_size=batch_size)
        model_args = {"pretrained": f"{p['base_name']}-sharded", "sharded": str(sharded)}
    else:
        loaded, tok = load_model(model, device=device, adapter=adapter)
        lm = HFLM(pretrained=loaded, tokenizer=tok, batch_size=batch_size, softmax_dtype="float32")
        model_args = {"pretrained": model, **({"peft": adapter} if adapter else {})}
    describe = {
        "model": model or str(sharded),
        "adapter": adapter,
        "device": pick_device(device),
        "batch_size": batch_size,
        "retrain_reference": reference,
    }
    evaluation = runner.evaluate(lm, prepared, describe=describe, model_args=model_args)
    if reference is None:
        rm.reference_from_samples(
            evaluation.samples[FORGET_TASK], tmp / REFERENCE, task=FORGET_TASK, model=model, adapter=adapter
        )
    runner.write_outputs(tmp, evaluation)


__all__ = ["build_evaluate", "REFERENCE"]
