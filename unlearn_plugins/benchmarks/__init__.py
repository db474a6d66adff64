"""The built-in benchmarks, one folder each: everything specific to a benchmark (its data
loader, its lm-eval task YAMLs with their metric code beside them, its study source, stage
kinds and report, its demo and CLI verbs) lives in ``benchmarks/NAME/``. The core reaches a
benchmark only through the ``register_benchmarks`` hook and the
:class:`unlearn_plugins.interfaces.Benchmark` it registers (registry.toml lists the built-ins'
plugin modules, as a third party's entry point would); no core module imports this package
(`lint-imports` holds that)."""
