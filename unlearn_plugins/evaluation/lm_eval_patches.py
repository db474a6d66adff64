"""Every change this package makes to lm-eval's behaviour, in one place.

Each entry says why it exists and the lm-eval version it was checked against
(:data:`CHECKED_WITH`); tests/test_lm_eval_patches.py holds, per entry, a test that shows
lm-eval's own behaviour the entry works around. When lm-eval changes that behaviour the test
fails: drop the entry (and its test) then.

The entries, each with lm-eval's behaviour it works around and the test that shows it:

* :data:`NOISE` (logging filters): warnings a user of this package cannot act on;
  ``test_lm_eval_still_logs_the_filtered_notices``.
* :func:`quiet_git`: ``git describe`` prints "fatal: not a git repository" outside a repository;
  ``test_git_describe_still_prints_outside_a_repository``.
* :func:`exact_shared_logits`: HFLM gives a shorter continuation that shares its tokens with a
  longer one the longer one's LEADING log-probabilities;
  ``test_hflm_still_reads_leading_logits_for_a_shared_request``.

Only the two context managers replace anything of lm-eval's, and only while
:func:`patched` is entered (around ``simple_evaluate``); the filters are logging filters on
lm-eval's loggers, installed when this module is imported. Not patches, but lm-eval behaviour
relied on elsewhere and tested here too: its EvaluationTracker logs a failed write instead of
raising, so :func:`.lm_eval_outputs.write_outputs` checks the files it wrote
(``test_lm_eval_tracker_still_logs_a_failed_write_instead_of_raising``). The generation cap
(:func:`.lm_eval_runner.cap_generation`) is set on the loaded tasks through lm-eval's own
``Task.set_config``.
"""

from __future__ import annotations

import contextlib
import logging
import os

#: the lm-eval version each entry was last checked against (``lm_eval.__version__``)
CHECKED_WITH = "0.4.13"

#: lm-eval's notices that say nothing a user of this package can act on: every TOFU task builds
#: its documents in Python (custom_dataset), and the model is always handed over loaded
NOISE = {
    "lm_eval.api.task": ("Custom kwargs can be passed to `--metadata`",),
    "lm_eval.models.huggingface": (
        "`pretrained` model kwarg is not of type `str`",
        "Passed an already-initialized model through `pretrained`",
    ),
}


class DropNoise(logging.Filter):
    """Drops a logger's records that contain one of ``starts`` (all pass with UNLEARN_VERBOSITY set)."""

    def __init__(self, starts: tuple[str, ...]):
        super().__init__()
        self.starts = starts

    def filter(self, record: logging.LogRecord) -> bool:
        if os.environ.get("UNLEARN_VERBOSITY"):  # --verbosity asked for lm-eval's own words
            return True
        message = record.getMessage()
        return not any(start in message for start in self.starts)


def install_log_filters() -> None:
    """Put a :class:`DropNoise` on each logger of :data:`NOISE` (once)."""
    for name, starts in NOISE.items():
        logger = logging.getLogger(name)
        if not any(isinstance(f, DropNoise) for f in logger.filters):
            logger.addFilter(DropNoise(starts))


install_log_filters()


@contextlib.contextmanager
def quiet_git():
    """lm-eval records ``git describe`` of the working folder in its results, and outside a
    repository git prints "fatal: not a git repository" on every evaluation: its stderr is
    silenced (lm-eval already falls back when it fails)."""
    import subprocess

    import lm_eval.evaluator as evaluator

    original = getattr(evaluator, "get_git_commit_hash", None)
    if original is None:
        yield
        return

    def quiet():
        try:
            return subprocess.check_output(["git", "describe", "--always"], stderr=subprocess.DEVNULL).strip().decode()
        except (subprocess.CalledProcessError, FileNotFoundError, OSError):
            return None

    evaluator.get_git_commit_hash = quiet
    try:
        yield
    finally:
        evaluator.get_git_commit_hash = original


@contextlib.contextmanager
def exact_shared_logits():
    """lm-eval's HFLM computes requests that share their tokens (context + continuation, split at
    different points) in one forward and hands each the logits of the longest continuation. Its
    greedy check takes each request's trailing positions, but its log-probability gathers the
    LEADING ones, so a shorter continuation in such a group gets another token's log-probability:
    the MIA task's one-token request for an answer's last token shares its tokens with the
    extraction strength's whole-answer request, and got the first token's log-probability. Here
    each request of a group is given the trailing positions of its own continuation."""
    import lm_eval.models.huggingface as hf

    original = getattr(hf, "Collator", None)
    if original is None or not hasattr(original, "get_cache"):
        yield
        return

    class Collator(original):
        def get_cache(self, req_str, cxt_toks, cont_toks, logits):
            for request, cont, member_logits in super().get_cache(
                req_str=req_str, cxt_toks=cxt_toks, cont_toks=cont_toks, logits=logits
            ):
                if member_logits.dim() == 3 and member_logits.shape[1] > len(cont):
                    member_logits = member_logits[:, member_logits.shape[1] - len(cont) :, :]
                yield request, cont, member_logits

    hf.Collator = Collator
    try:
        yield
    finally:
        hf.Collator = original


@contextlib.contextmanager
def patched():
    """Every patch of this module in force (around ``lm_eval.simple_evaluate``)."""
    with quiet_git(), exact_shared_logits():
        yield
