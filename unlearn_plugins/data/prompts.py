"""Prompt formats: how a question becomes the prompt a model is trained, evaluated and scored on.

A format is a chat template (the tokenizer's own, a named one below, or a Jinja file), an
optional system prompt and the ``date_string`` every template is rendered with. Llama-3.x
templates insert a date (``strftime_now`` when none is given): rendered without a fixed one,
the same run on another day trained and evaluated on other prompts, and a cached evaluation
answered for a prompt a rerun no longer builds. The default format is the tokenizer's own
template with :data:`DEFAULT_DATE`; a model without a template gets the plain
``Question: ...\\nAnswer: `` format.

The format in force is this process's (:func:`active`), set by :func:`using` from a command's
``--prompt-format`` / a run's ``prompt_format`` / a study's ``[model] prompt_format``. It lives
in the environment (``UNLEARN_PROMPT_FORMAT``), so the processes a stage starts (the CUD
scorer's anchor runs, a study's workers) render the same prompts.

The named TOFU formats are open-unlearning's (github.com/locuslab/open-unlearning,
``configs/model/*.yaml`` ``template_args``, read at commit d3d7cf9; ``phi-1_5.yaml`` at
9be0625, before its removal in 703caee), see docs/gpu.md.
"""

from __future__ import annotations

import contextlib
import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path

from ..errors import UnlearnError

#: the date every template is rendered with unless a format or option says another (Llama-3.1's
#: templates' own default)
DEFAULT_DATE = "26 Jul 2024"
DEFAULT = "tokenizer"
ENV = "UNLEARN_PROMPT_FORMAT"

#: the user turn of a tag-based format, as open-unlearning's ``preprocess_chat_instance`` builds
#: it when ``apply_chat_template`` is false (the tokenizer adds BOS there: ``bos_token`` here)
_LLAMA2_CHAT = (
    "{{ bos_token }}{% for message in messages %}{% if message['role'] == 'user' %}"
    "[INST] {{ message['content'] }} [/INST]{% endif %}{% endfor %}"
)
_PHI_15 = (
    "{% for message in messages %}{% if message['role'] == 'user' %}"
    "Question: {{ message['content'] }}\nAnswer: {% endif %}{% endfor %}"
)

#: name -> (template: None = the tokenizer's own, system prompt, date string, where it comes from)
FORMATS: dict[str, tuple[str | None, str | None, str, str]] = {
    DEFAULT: (None, None, DEFAULT_DATE, "the tokenizer's chat template, the date fixed"),
    "tofu-llama3": (
        None,
        "You are a helpful assistant.",
        "10 Apr 2025",
        "open-unlearning configs/model/Llama-3.2-1B-Instruct.yaml, Llama-3.1-8B-Instruct.yaml",
    ),
    "tofu-llama2-chat": (_LLAMA2_CHAT, None, DEFAULT_DATE, "open-unlearning configs/model/Llama-2-7b-chat-hf.yaml"),
    "tofu-phi-1.5": (_PHI_15, None, DEFAULT_DATE, "open-unlearning configs/model/phi-1_5.yaml"),
}


@dataclass(frozen=True)
class PromptFormat:
    name: str
    template: str | None = None  # None: the tokenizer's own chat template
    system_prompt: str | None = None
    date_string: str = DEFAULT_DATE

    @property
    def is_default(self) -> bool:
        return self == PromptFormat(DEFAULT)

    def definition(self) -> dict:
        """What the prompts depend on (the part of a cache key; a file's content, not its path)."""
        return asdict(self)


def resolve(
    spec: str | None = None, *, date_string: str | None = None, system_prompt: str | None = None, where: str = ""
) -> PromptFormat:
    """A format from a name of :data:`FORMATS` or a Jinja file (None: the default), with the
    date and system prompt given overriding the format's own. ``where`` names the option in errors."""
    flag = where or "--prompt-format"
    name = spec or DEFAULT
    if name in FORMATS:
        template, system, date, _ = FORMATS[name]
    else:
        path = Path(name).expanduser()
        if not path.is_file():
            raise UnlearnError(f"{flag} {name!r}: neither a format ({', '.join(FORMATS)}) nor a Jinja template file")
        try:
            template = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise UnlearnError(f"{flag} {name}: cannot read the template ({exc})") from None
        _check_template(template, f"{flag} {name}")
        system, date = None, DEFAULT_DATE
    if date_string is not None:
        if not isinstance(date_string, str) or not date_string.strip():
            raise UnlearnError(f"{where or '--date-string'}: must be a non-empty date such as {DEFAULT_DATE!r}")
        date = date_string
    return PromptFormat(name, template, system_prompt if system_prompt is not None else system, date)


def _check_template(template: str, where: str) -> None:
    """A Jinja template that renders a question (errors before any model loads)."""
    try:
        import jinja2
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        text = (
            ImmutableSandboxedEnvironment()
            .from_string(template)
            .render(
                messages=[{"role": "user", "content": "QUESTIONSLOT"}],
                add_generation_prompt=True,
                bos_token="",
                eos_token="",
                date_string=DEFAULT_DATE,
            )
        )
    except jinja2.TemplateError as exc:
        raise UnlearnError(f"{where}: not a usable Jinja chat template ({type(exc).__name__}: {exc})") from None
    if "QUESTIONSLOT" not in text:
        raise UnlearnError(f"{where}: the template does not render the user's message (messages[-1]['content'])")


def active() -> PromptFormat:
    """The format in force in this process (:func:`using`), else the default."""
    raw = os.environ.get(ENV)
    if not raw:
        return PromptFormat(DEFAULT)
    try:
        return PromptFormat(**json.loads(raw))
    except (TypeError, ValueError):
        raise UnlearnError(f"{ENV}: not a prompt format this version writes; unset it") from None


@contextlib.contextmanager
def using(fmt: PromptFormat | dict | None):
    """``fmt`` in force inside the block (and in the processes started there); None: leave the
    one in force as it is."""
    if fmt is None:
        yield active()
        return
    if isinstance(fmt, dict):
        fmt = PromptFormat(**fmt)
    before = os.environ.get(ENV)
    os.environ[ENV] = json.dumps(fmt.definition(), sort_keys=True)
    try:
        yield fmt
    finally:
        if before is None:
            os.environ.pop(ENV, None)
        else:
            os.environ[ENV] = before


def key_part(fmt: PromptFormat | dict | None) -> tuple:
    """A format's part of a cache key: nothing for the default (keys made before formats existed
    stay as they were; the default renders as those runs did, less the calendar), else its
    definition."""
    if fmt is None:
        return ()
    if isinstance(fmt, dict):
        fmt = PromptFormat(**fmt)
    return () if fmt.is_default else ("prompt-format", fmt.definition())


__all__ = ["PromptFormat", "FORMATS", "DEFAULT_DATE", "resolve", "active", "using", "key_part"]
