"""Every study reaches its benchmark's study part through the host (`host.study_part`): TOFU's
by its name and its other source names, MovieLens's and WMDP's by theirs; each built-in part
has what the core's runner calls."""

from __future__ import annotations

import pytest

from unlearn_plugins.errors import UnlearnError
from unlearn_plugins.host import benchmarks, study_part, study_sources

#: what the core calls on every study part (unlearn_plugins.interfaces.Benchmark)
PART = ("read", "expand", "plan", "grid", "write_report")


def test_the_default_benchmarks_names_come_first_then_every_study_part():
    sources = study_sources(first="tofu")
    assert sources[:3] == ("tofu", "generated", "auto")
    assert {"movielens", "wmdp"} <= set(sources)
    assert sources.count("tofu") == 1 and len(sources) == len(set(sources))


@pytest.mark.parametrize("source", ["tofu", "generated", "auto"])
def test_tofus_source_names_reach_its_study_part(source):
    assert study_part(source).__name__ == "unlearn_plugins.benchmarks.tofu.runner"


@pytest.mark.parametrize("name", [n for n, b in benchmarks().items() if b.study])
def test_each_built_in_study_part_has_what_the_core_calls(name):
    part = study_part(name)
    assert part.__name__.startswith(f"unlearn_plugins.benchmarks.{name}.")
    missing = [f for f in PART if not callable(getattr(part, f, None))]
    assert not missing, f"{name}: {missing}"
    assert not hasattr(part, "run")  # the core's runner runs every study


def test_an_unknown_source_is_one_error_naming_it():
    with pytest.raises(UnlearnError, match=r"\[benchmark\] source 'hub': no registered benchmark reads such a study"):
        study_part("hub")
