"""Probes: the forget split asked another way (tasks/tofu_probes/). Forgetting that holds only
for the exact question in the exact chat format is not forgetting.

- ``paraphrase``: TOFU's paraphrased question (``paraphrased_question``, in the forget split's
  ``_perturbed`` file or in the split itself) in the model's chat prompt; the answer and its
  scoring as in ``tofu_forget_prob`` / ``tofu_forget_rouge``.
- ``format``: no chat template; a plain ``Question: ... / Answer: ...`` prompt after a few-shot
  prefix of retain QA (metadata ``probe_shot_split``, default ``retain_perturbed``, its first
  ``probe_shots`` = 3 rows that are not forget samples). The answer probability is the mean
  over the answer's tokens only (a plain format has no end-of-turn token); generation stops at
  a blank line or the next ``Question:``.

Documents have the TOFU tasks' shape, so :class:`TofuProbTask` and :class:`TofuRougeTask`
score them; ``key`` is the original question's, for pairing with the plain forget tasks.
"""

from __future__ import annotations

from typing import Any

from unlearn_plugins.data.qa import control_tokens, prompt_text, read_jsonl
from unlearn_plugins.errors import DataError
from unlearn_plugins.evaluation.lm_eval_requests import metadata_tokenizer, score_plan
from unlearn_plugins.evaluation.mia import load_qa_split
from unlearn_plugins.evaluation.reference import sample_key

from ..tofu.utils import _perturbed_path, _refuse_control_tokens

PROBES = ("paraphrase", "format")
SHOT_SPLIT = "retain_perturbed"
SHOTS = 3


def _plain(question: str, answer: str | None = None) -> str:
    return f"Question: {question}\nAnswer:" + (f" {answer}\n\n" if answer is not None else "")


def probe_dataset(
    *,
    probe: str = "paraphrase",
    forget_split: str | None = None,
    tofu_dir: str | None = None,
    system_prompt: str | None = None,
    probe_shot_split: str = SHOT_SPLIT,
    probe_shots: int = SHOTS,
    **metadata: Any,
):
    """lm-eval ``custom_dataset`` of the probe tasks (``dataset_kwargs.probe``)."""

    import datasets

    if probe not in PROBES:
        raise DataError(f"dataset_kwargs.probe must be one of {', '.join(PROBES)}, got {probe!r}")
    samples, label = load_qa_split(forget_split, tofu_dir, "forget")
    tok = metadata_tokenizer(metadata)
    specials = control_tokens(tok)
    docs = []
    if probe == "paraphrase":
        path = _perturbed_path(forget_split, None, tofu_dir)
        try:
            samples = read_jsonl(path, require=("question", "answer", "paraphrased_question"))
        except DataError as exc:
            raise DataError(
                f"{exc} (the paraphrase probe asks TOFU's paraphrased questions: the forget split, or "
                "NAME_perturbed.json beside it, must have the field)"
            ) from None
        eos = tok.eos_token
        if not eos:
            raise DataError(
                f"tokenizer {getattr(tok, 'name_or_path', '?')} has no eos token: TOFU scores the end token"
            )
        for s in samples:
            question = s.extra["paraphrased_question"]
            if not isinstance(question, str) or not question.strip():
                raise DataError(f"{s.where}: field 'paraphrased_question' must be a non-empty string")
            _refuse_control_tokens({"paraphrased_question": question, "answer": s.answer}, specials, s.where)
            docs.append(_doc(tok, s, label, prompt_text(tok, question, system_prompt), s.answer + eos))
    else:
        if isinstance(probe_shots, bool) or not isinstance(probe_shots, int) or probe_shots < 0:
            raise DataError(f"metadata 'probe_shots' must be an integer >= 0, got {probe_shots!r}")
        forget_keys = {sample_key(s.question, s.answer) for s in samples}
        shots = []
        if probe_shots:
            pool, _ = load_qa_split(probe_shot_split, tofu_dir, "probe_shot")
            shots = [s for s in pool if sample_key(s.question, s.answer) not in forget_keys][:probe_shots]
            if len(shots) < probe_shots:
                raise DataError(
                    f"metadata 'probe_shot_split' {probe_shot_split!r}: {len(shots)} QA outside the "
                    f"forget split, {probe_shots} needed (metadata 'probe_shots')"
                )
        prefix = "".join(_plain(s.question, s.answer) for s in shots)
        for s in samples:
            _refuse_control_tokens({"question": s.question, "answer": s.answer}, specials, s.where)
            docs.append(_doc(tok, s, label, prefix + _plain(s.question), " " + s.answer))
    return datasets.DatasetDict({"test": datasets.Dataset.from_list(docs)})


def _doc(tok, sample, label: str, prompt: str, continuation: str) -> dict:
    n, ws = score_plan(tok, prompt, continuation, sample.where)
    return {
        "key": sample_key(sample.question, sample.answer),
        "split": label,
        "where": sample.where,
        "question": sample.question,
        "answer": sample.answer,
        "prompt": prompt,
        "continuations": [continuation],
        "n_tokens": [n],
        "ws_sub": [ws],
    }
