"""TOFU (Maini et al. 2024): the benchmark's one folder, reached by the core through :mod:`.plugin`
(its :class:`~unlearn_plugins.interfaces.Benchmark`).

* ``tasks/`` - the lm-eval tasks ``tofu_*`` (``tasks/tofu``), ``tofu_mia`` and
  ``tofu_forget_exact_memorization`` (``tasks/tofu_mia``) and the probes ``tofu_forget_{paraphrase,
  format}_*`` (``tasks/tofu_probes``), each folder's task code in its ``utils.py``;
* :mod:`.data` - the N-author benchmark folder in TOFU's format that the demo and the author
  studies train and evaluate on (from a TOFU folder, the shipped subset or generated authors),
  and the holdout author of membership inference;
* ``tofu_subset/`` - real TOFU shipped in the package (authors 196-199, the first 20 real-authors
  and world-facts QA; TOFU's MIT licence beside them);
* :mod:`.metrics` - the metric formulas (truth ratio, Forget Quality, Model Utility, extraction
  strength) the tasks, the study and `unlearn eval`'s summary (through the registry) share;
* :mod:`.runner` and ``study/`` - TOFU's study kind, the default ``[benchmark] source``: by forget
  size, or with forget authors as the unit (design, sweeps, operating points, paired statistics);
* :mod:`.demo` (``demo.toml``) and :mod:`.demo_report` - `unlearn demo`, the default
  ``--benchmark``.

The QA data machinery every command uses (``tofu:SPLIT`` names, the prompt format, label masks)
is the core's :mod:`unlearn_plugins.data.qa`.
"""
