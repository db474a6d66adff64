"""`unlearn study`: experiment grids (methods x forget sizes x seeds) from a TOML study file,
built in parallel as cached stages, reported with confidence intervals over the seeds.

- :mod:`.spec`: the study file's format, its validation (the tables every study kind shares);
- :mod:`.cells`: each cell as stages of the shared cache (:mod:`unlearn_plugins.stages`);
- :mod:`.cud`: the CUD difficulty scores and strata of a forget set ([cud]);
- each benchmark's study (``[benchmark] source``: TOFU's by default, ``"movielens"``, ``"wmdp"``):
  its tables, cells, stage kinds and report come from the benchmark's folder through its
  :class:`unlearn_plugins.interfaces.Benchmark` (unlearn_plugins/benchmarks/NAME/);
- :mod:`.executors`: local worker processes or a Dask cluster;
- :mod:`.runner`: scheduling the cells, failures, resumption, records;
- :mod:`.records`: finished cells' results kept beside the code (``--records``);
- :mod:`.report_writer`: the one writer of every study kind's report (the demos' and the
  benchmarks' too): a record and summary.md's sections with their files, written together.
"""

from .spec import Study, StudyError, builtin_studies, expand, load_study

__all__ = ["Study", "StudyError", "load_study", "builtin_studies", "expand", "run_study"]


def run_study(*args, **kwargs):
    """See :func:`.runner.run_study` (imported on use: torch is not needed to read a study)."""
    from .runner import run_study as run

    return run(*args, **kwargs)
