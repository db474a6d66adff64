"""Each entry of unlearn_plugins.evaluation.lm_eval_patches against the lm-eval installed.

The ``test_*_still_*`` tests show lm-eval's own behaviour that an entry works around: when one
fails, lm-eval no longer behaves so, and the entry (and its test) should be dropped. The others
show the entry doing its work."""

from __future__ import annotations

import logging

import pytest

from unlearn_plugins.evaluation import lm_eval_patches as patches

pytestmark = pytest.mark.usefixtures("single_thread")


def test_the_patches_were_checked_with_the_installed_lm_eval():
    """A new lm-eval: rerun this module, update CHECKED_WITH, drop the entries whose test fails."""
    import lm_eval

    assert lm_eval.__version__ == patches.CHECKED_WITH


# ----------------------------------------------------------------------------- log filters


def _hflm_warnings(tiny_model_dir, caplog) -> list[str]:
    from lm_eval.models.huggingface import HFLM
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="lm_eval.models.huggingface"):
        HFLM(pretrained=model, tokenizer=tokenizer, batch_size=1)
    return [r.getMessage() for r in caplog.records]


def _custom_dataset_warnings(caplog) -> list[str]:
    from lm_eval.api.task import ConfigurableTask

    def documents(**_):
        import datasets

        return {"test": datasets.Dataset.from_list([{"q": "a", "a": "b"}])}

    config = {
        "task": "noise_probe",
        "custom_dataset": documents,
        "test_split": "test",
        "doc_to_text": "{{q}}",
        "doc_to_target": "{{a}}",
        "output_type": "generate_until",
        "metric_list": [{"metric": "exact_match"}],
    }
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="lm_eval.api.task"):
        ConfigurableTask(config=config)
    return [r.getMessage() for r in caplog.records]


def test_lm_eval_still_logs_the_filtered_notices(tiny_model_dir, caplog, monkeypatch):
    """NOISE: with the filters passing everything (UNLEARN_VERBOSITY), lm-eval still logs each
    filtered notice when a model object is handed to HFLM and a task builds its documents in Python."""
    monkeypatch.setenv("UNLEARN_VERBOSITY", "INFO")
    logged = _hflm_warnings(tiny_model_dir, caplog) + _custom_dataset_warnings(caplog)
    for starts in patches.NOISE.values():
        for start in starts:
            assert any(start in line for line in logged), f"lm-eval no longer logs {start!r}: drop it from NOISE"


def test_the_filters_drop_the_notices(tiny_model_dir, caplog, monkeypatch):
    monkeypatch.delenv("UNLEARN_VERBOSITY", raising=False)
    logged = _hflm_warnings(tiny_model_dir, caplog) + _custom_dataset_warnings(caplog)
    for starts in patches.NOISE.values():
        for start in starts:
            assert not any(start in line for line in logged)


# ----------------------------------------------------------------------------- git describe


@pytest.fixture
def outside_git(tmp_path, monkeypatch):
    """The working folder is in no git repository (no repository above it is looked for)."""
    folder = tmp_path / "not-a-repository"
    folder.mkdir()
    monkeypatch.chdir(folder)
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path))
    return folder


def test_git_describe_still_prints_outside_a_repository(outside_git, capfd):
    """quiet_git: lm-eval's get_git_commit_hash lets git write "fatal: not a git repository" to
    the terminal (its stderr is not captured)."""
    import lm_eval.evaluator as evaluator
    from lm_eval.loggers.utils import get_git_commit_hash

    assert evaluator.get_git_commit_hash is get_git_commit_hash  # what quiet_git replaces
    capfd.readouterr()
    get_git_commit_hash()
    assert "not a git repository" in capfd.readouterr().err, "lm-eval silences git now: drop quiet_git"


def test_quiet_git_is_silent_and_restores_lm_eval(outside_git, capfd):
    import lm_eval.evaluator as evaluator

    original = evaluator.get_git_commit_hash
    capfd.readouterr()
    with patches.quiet_git():
        assert evaluator.get_git_commit_hash() is None
    assert capfd.readouterr().err == ""
    assert evaluator.get_git_commit_hash is original


# ----------------------------------------------------------------------------- shared logits


def _shared_requests(tokenizer):
    """Two requests with the same tokens split at different points: a whole answer after a
    prompt, and the answer's last token after the prompt and the rest of the answer (the MIA
    task's request beside the extraction strength's)."""
    prompt = tokenizer("the quick brown fox", add_special_tokens=False)["input_ids"]
    answer = tokenizer(" jumps over the lazy dog", add_special_tokens=False)["input_ids"]
    assert len(answer) >= 3
    whole = (("p", "a"), list(prompt), list(answer))
    last = (("p+a", "z"), list(prompt) + list(answer[:-1]), list(answer[-1:]))
    return whole, last


def _hflm(tiny_model_dir):
    from lm_eval.models.huggingface import HFLM
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    return HFLM(pretrained=model, tokenizer=tokenizer, batch_size=4, softmax_dtype="float32"), tokenizer


def test_hflm_still_reads_leading_logits_for_a_shared_request(tiny_model_dir):
    """exact_shared_logits: scored together with the whole answer, the one-token request gets
    another log-probability than when it is scored alone (HFLM gathers the leading positions of
    the whole answer's logits); alone, the answer's last token's log-probability is the same
    from both requests' forwards."""
    lm, tokenizer = _hflm(tiny_model_dir)
    whole, last = _shared_requests(tokenizer)
    alone = lm._loglikelihood_tokens([last], disable_tqdm=True)[0][0]
    together = lm._loglikelihood_tokens([whole, last], disable_tqdm=True)[1][0]
    assert together != pytest.approx(alone, abs=1e-4), "HFLM reads trailing logits now: drop exact_shared_logits"


def test_exact_shared_logits_gives_each_request_its_own_positions(tiny_model_dir):
    lm, tokenizer = _hflm(tiny_model_dir)
    whole, last = _shared_requests(tokenizer)
    with patches.exact_shared_logits():
        alone = lm._loglikelihood_tokens([last], disable_tqdm=True)[0][0]
        answers = lm._loglikelihood_tokens([whole, last], disable_tqdm=True)
        separate = lm._loglikelihood_tokens([whole], disable_tqdm=True)[0][0]
    assert answers[1][0] == pytest.approx(alone, rel=1e-5)
    assert answers[0][0] == pytest.approx(separate, rel=1e-5)  # the whole answer is untouched
    import lm_eval.models.huggingface as hf
    from lm_eval.models.utils import Collator

    assert hf.Collator is Collator  # restored


# ----------------------------------------------------------------------------- output writing


def test_lm_eval_tracker_still_logs_a_failed_write_instead_of_raising(tmp_path, caplog):
    """Not a patch, a check in lm_eval_outputs.write_outputs: lm-eval's EvaluationTracker logs
    that it could not write its results file and returns, so the files are checked after it."""
    from lm_eval.loggers import EvaluationTracker

    blocker = tmp_path / "a-file"
    blocker.write_text("in the way\n")
    tracker = EvaluationTracker(output_path=str(blocker / "out"))
    tracker.general_config_tracker.log_experiment_args(
        model_source="hf",
        model_args={"pretrained": "m"},
        system_instruction=None,
        chat_template=None,
        fewshot_as_multiturn=False,
    )
    with caplog.at_level(logging.INFO, logger="lm_eval.loggers.evaluation_tracker"):
        tracker.save_results_aggregated(results={"results": {}}, samples=None)  # no exception
    assert any("Could not save results aggregated" in r.getMessage() for r in caplog.records)
