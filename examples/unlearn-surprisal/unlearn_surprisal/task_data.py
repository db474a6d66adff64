"""Documents for the task folder: a TOFU split, each question in the model's chat prompt."""

from __future__ import annotations

from unlearn_plugins.data.qa import load_split, prompt_text
from unlearn_plugins.models import load_tokenizer


def forget_prompts(
    *,
    forget_split=None,
    split="forget01",
    tokenizer=None,
    pretrained=None,
    tofu_dir=None,
    system_prompt=None,
    **_metadata,
):
    """lm-eval ``custom_dataset``: lm-eval passes the task's metadata (with lm_eval's CLI,
    ``--model_args`` too, so ``pretrained``) and its ``dataset_kwargs``. The split is the host's
    ``forget_split`` (``unlearn eval --forget-split``, a study's forget set: a TOFU split name or
    a JSON-lines file), else the task's own ``split``."""
    import datasets

    source = tokenizer or pretrained
    if source is None:
        raise ValueError("surprisal tasks need the model's tokenizer: --model_args pretrained=MODEL")
    tok = source if hasattr(source, "apply_chat_template") else load_tokenizer(str(source))
    rows = [
        {"prompt": prompt_text(tok, s.question, system_prompt), "answer": s.answer + tok.eos_token}
        for s in load_split(forget_split or f"tofu:{split}", tofu_dir)
    ]
    return datasets.DatasetDict({"test": datasets.Dataset.from_list(rows)})
