"""The six plugin hooks: the contract between the host and every plugin.

Each hook is register-style (as in simonw/llm): the host passes a ``register``
callable and the plugin calls it once per component it provides::

    from unlearn_plugins import hookimpl

    @hookimpl
    def register_difficulty_scorers(register):
        register("my_scorer", MyScorer)

``register(name, component)``: ``name`` must be unique within its kind across
all installed plugins (a plugin that reuses a taken name is refused, naming the
plugin that holds it). What a component must be for each kind is defined in
:mod:`unlearn_plugins.interfaces`; docs/plugins.md has a tested example of each.
"""

from __future__ import annotations

import pluggy

PROJECT_NAME = "unlearn_plugins"

hookspec = pluggy.HookspecMarker(PROJECT_NAME)
hookimpl = pluggy.HookimplMarker(PROJECT_NAME)


@hookspec
def register_difficulty_scorers(register):
    """Register difficulty scorers.

    Component: a callable (usually a class, often a dataclass) taking keyword options
    and returning an object with ``score(samples, *, model, tokenizer) -> list[float]``
    (one finite float per sample, higher = harder to unlearn). See
    :class:`unlearn_plugins.interfaces.DifficultyScorer`.
    """


@hookspec
def register_adapter_initializers(register):
    """Register LoRA adapter initializers.

    Component: a callable taking keyword options and returning an object with
    ``initialize(peft_model, *, forget, retain, tokenizer) -> InitResult | None``
    that writes the LoRA weights (and, for residual inits, the base weights) of
    the already injected LoRA layers before training. See
    :class:`unlearn_plugins.interfaces.AdapterInitializer`.
    """


@hookspec
def register_unlearning_objectives(register):
    """Register unlearning objectives (training losses).

    Component: a callable taking keyword options and returning an object with
    ``needs_reference_model: bool`` and
    ``loss(model, batch, reference_model=None) -> torch.Tensor`` (a scalar with a
    gradient), plus optional attributes. See
    :class:`unlearn_plugins.interfaces.UnlearningObjective`.
    """


@hookspec
def register_lm_eval_task_dirs(register):
    """Register folders of lm-evaluation-harness task YAMLs.

    Component: a :class:`pathlib.Path` (or str) to a folder holding ``.yaml``
    task files; it is added to lm-eval's ``TaskManager(include_path=[...])`` by
    ``unlearn eval`` and listed with its path by ``unlearn plugins``.
    """


@hookspec
def register_attacks(register):
    """Register attacks on forgotten knowledge (relearning, quantization, ...).

    Component: a callable taking keyword options and returning an object with
    ``attack(context) -> AttackResult | None`` that saves the attacked model through
    ``context.save_model(model, tokenizer)``; ``unlearn attack`` writes it with attack.json and
    ``unlearn eval`` measures it. See :class:`unlearn_plugins.interfaces.Attack`.
    """


@hookspec
def register_benchmarks(register):
    """Register benchmarks.

    Component: a :class:`unlearn_plugins.interfaces.Benchmark`: the benchmark's lm-eval task
    folders (registered as task folders named after it), its built-in studies, its study parts
    (tables, cells, stage kinds, report), its `unlearn demo --benchmark NAME` and its CLI verbs,
    each named by a ``"module:attribute"`` reference that is imported only when used.
    """
