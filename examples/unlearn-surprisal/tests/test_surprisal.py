"""The plugin's own tests, with only the fixtures unlearn-plugins gives plugin authors (pytest
finds them once unlearn-plugins is installed): a tiny model, its tokenizer, a TOFU folder, a
LoRA model and an attack context, all built offline in seconds."""

import torch
from unlearn_surprisal.attack import WeightNoise
from unlearn_surprisal.initializer import ForgetSubspaceInit
from unlearn_surprisal.objective import CappedAscent
from unlearn_surprisal.scorer import MaxSurprisalScorer
from unlearn_surprisal.task_data import forget_prompts

from unlearn_plugins.data.qa import encode_samples, load_split, pad_batch


def test_scorer_gives_one_finite_score_per_sample(unlearn_tiny_model, unlearn_tiny_tokenizer, unlearn_tofu_dir):
    samples = load_split("tofu:forget01[0:4]", unlearn_tofu_dir)
    scores = MaxSurprisalScorer().score(samples, model=unlearn_tiny_model, tokenizer=unlearn_tiny_tokenizer)
    assert len(scores) == 4 and all(torch.isfinite(torch.tensor(scores)))


def test_initializer_keeps_the_model_unchanged_at_step_0(unlearn_lora_model, unlearn_tiny_tokenizer, unlearn_tofu_dir):
    tok = unlearn_tiny_tokenizer
    forget = encode_samples(tok, load_split("tofu:forget01[0:4]", unlearn_tofu_dir), max_length=128)
    batch = pad_batch(forget, tok.pad_token_id)
    with torch.no_grad():
        before = unlearn_lora_model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    ForgetSubspaceInit().initialize(unlearn_lora_model, forget=forget, retain=[], tokenizer=tok)
    with torch.no_grad():
        after = unlearn_lora_model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    assert torch.allclose(before, after, atol=1e-5)  # lora_B = 0


def test_objective_ascends_on_forget_and_descends_on_retain(
    unlearn_lora_model, unlearn_tiny_tokenizer, unlearn_tofu_dir
):
    tok = unlearn_tiny_tokenizer

    def part(spec):
        return pad_batch(encode_samples(tok, load_split(spec, unlearn_tofu_dir), max_length=128), tok.pad_token_id)

    objective = CappedAscent(cap=50.0)
    loss = objective.loss(
        unlearn_lora_model, {"forget": part("tofu:forget01[0:2]"), "retain": part("tofu:retain99[0:2]")}
    )
    assert torch.isfinite(loss) and set(objective.last_terms) == {"forget", "active", "retain"}
    assert objective.last_terms["forget"] < 0 < objective.last_terms["retain"]


def test_attack_saves_a_changed_model(unlearn_attack_context):
    result = WeightNoise(scale=0.1).attack(unlearn_attack_context)
    assert result.info["layers"] > 0
    assert (unlearn_attack_context.out / "config.json").is_file()


def test_task_reads_the_forget_split_the_host_gives(unlearn_tiny_tokenizer, unlearn_tofu_dir):
    """`unlearn eval --forget-split` and a study pass the metadata forget_split (a split name or,
    in a study, a JSON-lines file); without it, the task's own split, forget01."""
    tok = unlearn_tiny_tokenizer

    def answers(**metadata):
        docs = forget_prompts(tokenizer=tok, tofu_dir=unlearn_tofu_dir, **metadata)["test"]
        return [a.removesuffix(tok.eos_token) for a in docs["answer"]]

    assert answers() == [s.answer for s in load_split("tofu:forget01", unlearn_tofu_dir)]
    given = unlearn_tofu_dir / "retain99.json"
    assert answers(forget_split=str(given), split="forget01") == [s.answer for s in load_split(str(given))]
    assert answers(forget_split="tofu:forget01[0:3]") == answers()[:3]
