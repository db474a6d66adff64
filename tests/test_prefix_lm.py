"""The prompt-shared lm-eval model class (unlearn_plugins.evaluation.prefix_lm) gives HFLM's numbers:
every TOFU metric to 1e-5 (relative) and generations and greedy flags exactly, for a plain
model, an unmerged adapter and batches of mixed lengths; lm-eval's own CLI reaches it."""

from __future__ import annotations

import glob
import json
import math
from pathlib import Path

import pytest
from support_checks import lm_eval

from unlearn_plugins.evaluation.prefix_lm import plan

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.usefixtures("single_thread")

TASKS = [
    "tofu_forget01_prob",
    "tofu_forget01_truth_ratio",
    "tofu_forget01_extraction_strength",
    "tofu_forget01_rouge",
    "tofu_retain_prob",
    "tofu_retain_truth_ratio",
    "tofu_retain_rouge",
    "tofu_real_authors",
    "tofu_world_facts",
]


def test_plan_scores_each_sequence_once():
    prompt = [1, 2, 3]
    pairs = [
        (prompt, [4, 5, 6]),  # an answer
        (prompt, [4, 5, 6]),  # the same request from another task
        (prompt + [4], [5, 6]),  # a suffix of it (extraction strength)
        (prompt, [4, 5]),  # a prefix of it
        (prompt, [7, 8]),  # another answer after the same prompt
        ([9, 9], [4]),  # another prompt
    ]
    p = plan(pairs)
    assert [g.stem for g in p.groups] == [(1, 2), (9,)]
    assert p.groups[0].suffixes == [(3, 4, 5, 6), (3, 7, 8)]  # the prefix [4, 5] read from [4, 5, 6]
    assert p.groups[1].suffixes == [(9, 4)]
    assert p.where == [(0, 0, 0, 3), (0, 0, 0, 3), (0, 0, 1, 3), (0, 0, 0, 2), (0, 1, 0, 2), (1, 0, 0, 1)]


def _evaluate(model_dir, tofu_dir, scoring, **kwargs):
    from unlearn_plugins.evaluation.lm_eval_runner import evaluate_model

    return evaluate_model(
        str(model_dir),
        TASKS,
        limit=5,
        batch_size=3,  # batches mix prompts and answers of several lengths
        tofu_dir=str(tofu_dir),
        max_gen_toks=24,
        scoring=scoring,
        **kwargs,
    )


def _assert_same(old, new):
    assert old.summary["metrics"].keys() == new.summary["metrics"].keys()
    for task, metrics in old.summary["metrics"].items():
        for name, a in metrics.items():
            b = new.summary["metrics"][task][name]
            if a is None or (isinstance(a, float) and math.isnan(a)):
                assert b is None or math.isnan(b), (task, name)
            elif "rouge" in name or "extraction" in name:
                assert a == b, (task, name)
            else:  # abs: Model Utility's truth ratio, mean(max(0, 1 - tr)), cancels near tr = 1
                assert b == pytest.approx(a, rel=1e-5, abs=1e-6), (task, name)
    for task, rows in old.samples.items():
        others = {r["doc_id"]: r for r in new.samples[task]}
        for row in rows:
            for name in old.summary["metrics"][task]:  # each sample's value, before aggregation
                a, b = row.get(name), others[row["doc_id"]].get(name)
                if isinstance(a, float):
                    assert b == pytest.approx(a, rel=1e-5), (task, name, row["doc_id"])
            for a, b in zip(row["filtered_resps"], others[row["doc_id"]]["filtered_resps"], strict=True):
                if isinstance(a, (list, tuple)):
                    assert bool(a[1]) == bool(b[1]), (task, row["doc_id"])  # greedy flags
                    assert b[0] == pytest.approx(a[0], rel=1e-5, abs=1e-5)
                else:
                    assert a == b, (task, row["doc_id"])  # generations


def test_same_numbers_as_hflm_on_a_plain_model(tiny_model_dir, tofu_dir):
    old = _evaluate(tiny_model_dir, tofu_dir, "hf")
    new = _evaluate(tiny_model_dir, tofu_dir, "prefix")
    assert new.summary["scoring"] == "prefix" and old.summary["scoring"] == "hf"
    _assert_same(old, new)
    # the extraction strength's suffix requests were read from shared rows, not recomputed
    assert len(new.samples["tofu_forget01_extraction_strength"][0]["filtered_resps"]) > 3


def test_same_numbers_as_hflm_with_an_unmerged_adapter(tiny_model_dir, tofu_dir, tmp_path):
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    lora = get_peft_model(base, LoraConfig(r=4, lora_alpha=8, target_modules="all-linear", init_lora_weights=False))
    with torch.no_grad():
        for name, param in lora.named_parameters():
            if "lora_B" in name:
                param.normal_(0, 0.05, generator=torch.Generator().manual_seed(0))
    lora.save_pretrained(tmp_path / "adapter")
    old = _evaluate(tiny_model_dir, tofu_dir, "hf", adapter=str(tmp_path / "adapter"))
    new = _evaluate(tiny_model_dir, tofu_dir, "prefix", adapter=str(tmp_path / "adapter"))
    assert "adapter_merged" not in new.summary
    _assert_same(old, new)
    plain = _evaluate(tiny_model_dir, tofu_dir, "prefix")
    assert plain.summary["metrics"]["tofu_retain_prob"] != new.summary["metrics"]["tofu_retain_prob"]


def test_generation_stops_like_hflm(tiny_model_dir):
    """Stop strings, the end token and the cap: the text lm-eval keeps is HFLM's."""
    from lm_eval.api.instance import Instance
    from lm_eval.models.huggingface import HFLM
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from unlearn_plugins.evaluation.prefix_lm import PrefixSharedLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    prompts = ["a", "the quick brown fox", "b c", "x y z w v u"]
    texts = {}
    for cls in (HFLM, PrefixSharedLM):
        lm = cls(pretrained=model, tokenizer=tok, batch_size=3)
        for until in ([], ["e"], [" ", "a"]):
            gen = {"until": until, "max_gen_toks": 12, "do_sample": False}
            requests = [Instance("generate_until", {}, (p, gen), 0) for p in prompts]
            texts.setdefault(cls.__name__, []).append(lm.generate_until(requests, disable_tqdm=True))
    assert texts["HFLM"] == texts["PrefixSharedLM"]
    assert any(t for batch in texts["HFLM"] for t in batch)  # something was generated


def test_lm_eval_cli_runs_the_tofu_tasks_with_hf_prefix(tiny_model_dir, tofu_dir, tmp_path):
    """`python -m unlearn_plugins.evaluation.lm_eval_cli --model hf-prefix` (the console script
    unlearn-lm-eval) is lm-eval's CLI with the class registered: the numbers of `--model hf`."""

    def run(module: str, model: str) -> float:
        out = tmp_path / model
        tasks = ROOT / "unlearn_plugins" / "benchmarks" / "tofu" / "tasks"
        metadata = json.dumps({"tofu_dir": str(tofu_dir)})
        flags = ["--limit", 3, "--device", "cpu", "--batch_size", 2, "--metadata", metadata, "--output_path", out]
        proc = lm_eval(
            f"pretrained={tiny_model_dir}", "tofu_forget01_truth_ratio", tasks, *flags, module=module, model=model
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
        (result,) = glob.glob(str(out / "**" / "results*.json"), recursive=True)
        data = json.loads(Path(result).read_text())
        assert data["config"]["model"] == model
        return data["results"]["tofu_forget01_truth_ratio"]["truth_ratio,none"]

    ours = run("unlearn_plugins.evaluation.lm_eval_cli", "hf-prefix")
    theirs = run("lm_eval", "hf")
    assert ours == pytest.approx(theirs, rel=1e-5)


def test_lm_eval_simple_evaluate_with_hf_prefix_gives_our_numbers(tiny_model_dir, tofu_dir):
    """lm-eval's own entry, ``simple_evaluate(model="hf-prefix")`` with TOFU's task folder as its
    TaskManager's include_path (the class registered by importing prefix_lm), gives the numbers
    of ``evaluate_model(scoring="prefix")``: the same requests, the same class."""
    import lm_eval
    from lm_eval.tasks import TaskManager

    import unlearn_plugins.evaluation.prefix_lm  # noqa: F401  (registers hf-prefix)
    from unlearn_plugins.evaluation.lm_eval_runner import evaluate_model
    from unlearn_plugins.host import get_component
    from unlearn_plugins.interfaces import LM_EVAL_TASK_DIR

    tasks = ["tofu_forget01_prob", "tofu_forget01_truth_ratio", "tofu_retain_truth_ratio"]
    ours = evaluate_model(str(tiny_model_dir), tasks, limit=3, batch_size=2, tofu_dir=str(tofu_dir))
    metadata = {"tofu_dir": str(tofu_dir), "tokenizer": str(tiny_model_dir)}  # as evaluate_model gives them
    tofu_tasks = get_component(LM_EVAL_TASK_DIR, "tofu")  # TOFU's task folder, as `--print-tasks-dir tofu` prints it
    manager = TaskManager(include_path=str(tofu_tasks), metadata=metadata)
    theirs = lm_eval.simple_evaluate(
        model="hf-prefix",
        model_args={"pretrained": str(tiny_model_dir), "softmax_dtype": "float32", "dtype": "float32"},
        tasks=tasks,
        task_manager=manager,
        limit=3,
        batch_size=2,
        device="cpu",
        bootstrap_iters=0,
    )
    assert theirs["config"]["model"] == "hf-prefix"
    compared = 0
    for task in tasks:
        for key, value in theirs["results"][task].items():
            metric, sep, _ = key.partition(",")
            if not sep or metric.endswith("_stderr"):
                continue
            if isinstance(value, float) and math.isnan(value):  # no retain reference: our summary says None
                assert ours.summary["metrics"][task][metric] is None, (task, metric)
                continue
            assert ours.summary["metrics"][task][metric] == value, (task, metric)
            compared += 1
    assert compared >= len(tasks)  # each task's own metric, at least


def test_generation_follows_a_scored_answer_without_decoding_it(tiny_model_dir):
    """A greedy generation after a prompt whose answer was scored reads the tokens on which the
    model's predictions agree with that answer from the scoring (one scored forward) and decodes
    only from where they part: the text is HFLM's either way."""
    from lm_eval.api.instance import Instance
    from lm_eval.models.huggingface import HFLM
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from unlearn_plugins.evaluation.prefix_lm import PrefixSharedLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    prompts = ["the quick brown fox", "a b c"]
    gen = {"until": [], "max_gen_toks": 10, "do_sample": False}
    reference = HFLM(pretrained=model, tokenizer=tok, batch_size=2)
    greedy = reference.generate_until([Instance("generate_until", {}, (p, gen), 0) for p in prompts], disable_tqdm=True)
    ids = [tok(g, add_special_tokens=False)["input_ids"] for g in greedy]
    # the first prompt's scored answer is its greedy text; the second's parts from it after 3 tokens
    wrong = (ids[1][3] + 1) % tok.vocab_size
    answers = [greedy[0], tok.decode(ids[1][:3] + [wrong] + ids[1][4:])]
    lm = PrefixSharedLM(pretrained=model, tokenizer=tok, batch_size=2)
    lm.loglikelihood([Instance("loglikelihood", {}, (p, a), 0) for p, a in zip(prompts, answers)], disable_tqdm=True)
    again = lm.generate_until([Instance("generate_until", {}, (p, gen), 0) for p in prompts], disable_tqdm=True)
    assert again == greedy
    assert lm.counts["drafted_tokens"] >= len(ids[0]) - 1 + 4  # read from the scoring, not decoded
    assert lm.counts["decoded_tokens"] < 2 * 10 - lm.counts["drafted_tokens"] + 1


def test_lookup_drafts_keep_the_greedy_text(tiny_model_dir):
    """A decoding step also checks the tokens that follow the sequence's last tokens in a reference
    (the prompt, a scored answer: lookup drafting): those the model would choose anyway are kept at
    once, the first it would not is replaced by its own choice. The tokens are greedy decoding's,
    one sequence at a time, whether the drafts are right, wrong or absent."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from unlearn_plugins.evaluation.prefix_lm import PrefixSharedLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    lm = PrefixSharedLM(pretrained=model, tokenizer=tok, batch_size=3, draft_tokens=4)
    contexts = [lm.tok_encode(p) for p in ("the quick brown fox", "a b c", "x y z w v u")]
    greedy = []
    for ctx in contexts:  # one at a time, transformers' own greedy search
        out = model.generate(torch.tensor([ctx]), max_new_tokens=20, do_sample=False, eos_token_id=None)
        greedy.append(out[0, len(ctx) :].tolist())
    shuffled = [list(reversed(g)) for g in greedy]
    cases = {
        "right": [[c + g] for c, g in zip(contexts, greedy)],  # the prompt then its greedy text
        "wrong": [[c + s] for c, s in zip(contexts, shuffled)],
        "none": None,
    }
    for name, references in cases.items():
        lm.counts.clear()
        tokens = lm._decode(contexts, [[], [], []], 20, set(), [], references=references)
        assert tokens == greedy, name
        if name == "right":
            assert lm.counts["draft_accepted_tokens"] >= 3 * 10  # most of the text read from the drafts
            assert lm.counts["draft_steps"] < 20
