"""Former name of :mod:`unlearn_plugins.data.qa` (the question-answer data machinery every
command and method uses), kept so plugins written against ``unlearn_plugins.data.tofu`` still
import; new code imports :mod:`unlearn_plugins.data.qa`."""

from .qa import *  # noqa: F403
from .qa import (  # noqa: F401 - the names plugins use, listed for readers and linters
    HUB_ID,
    IGNORE_INDEX,
    MIN_MAX_LENGTH,
    QA_PER_AUTHOR,
    DataWarning,
    ForgetRetainPairs,
    PaddingCollator,
    author_slice,
    check_disjoint,
    configured_tofu_dir,
    encode_qa,
    encode_samples,
    load_split,
    pad_batch,
    parse_spec,
    prompt_ids,
    prompt_text,
    read_jsonl,
    resolve_tofu_dir,
    text_ids,
)
