"""docs/results.md's reading of reglu_tofu_v2 ("How to read it", beside the generated verdict
block) against docs/study/reglu_tofu_v2/study.json and the committed records: every number the
page states about the study is one the report holds; this test fails when they disagree.
The verdict block itself is checked in tests/test_design_report.py."""

from __future__ import annotations

import json
import statistics

from support_checks import ROOT, report_fixtures

from unlearn_plugins.study.records import unpacked

SHORT = {
    "grad_diff": "GradDiff",
    "ihl": "IHL",
    "ihl_fila": "IHL + FILA",
    "ihl_vila": "IHL + VILA",
    "ihl_rila": "IHL + RILA",
    "reglu": "ReGLU",
    "ihl_random_residual": "IHL + random residual",
}
WORDS = {1: "One", 2: "Two", 3: "Three", 4: "Four", 5: "Five", 6: "Six", 7: "Seven"}


study, readme = report_fixtures(
    "reglu_tofu_v2", "## What `reglu_tofu_v2` found", name="readme", until="## What `reglu_tofu` found", one_line=True
)


def row(study: dict, family: str, method: str, rival: str) -> dict:
    (found,) = [
        r for r in study["analysis"]["families"][family]["rows"] if (r["method"], r["rival"]) == (method, rival)
    ]
    return found


def test_the_study_is_complete(study):
    assert study["complete"] and not study["failed"] and not study["not_run"]


def test_cost_is_the_records(study, readme):
    folders = list(unpacked(ROOT / "bench" / "results" / "reglu_tofu_v2").glob("*/resources.json"))
    seconds = 0.0
    for path in folders:

        def walk(x):
            nonlocal seconds
            if isinstance(x, dict):
                if "seconds" in x and "threads" in x:
                    seconds += x["seconds"] * x["threads"]
                    return
                for v in x.values():
                    walk(v)
            elif isinstance(x, list):
                for v in x:
                    walk(v)

        walk(json.loads(path.read_text()))
    assert f"about {seconds / 3600:.1f} CPU-hours" in readme
    assert f"over the {len(folders)} record folders'" in readme
    cells = study["cells"].values()
    assert f"{len(cells)} of {len(cells)} cells" in readme


def test_primary_means_and_utility(study, readme):
    primary = study["analysis"]["families"]["primary"]["rows"]
    smallest = min(primary, key=lambda r: r["holm_p"])
    assert f"the smallest Holm p is {smallest['holm_p']:.3f} (against {SHORT[smallest['rival']]})" in readme
    assert not any(r["reject"] for r in primary)
    higher = [SHORT[r["rival"]] + "'s" for r in primary if r["difference"] > 0]
    lower = [SHORT[r["rival"]] + "'s" for r in primary if r["difference"] < 0]
    said = f"higher than {', '.join(higher[:-1])} and {higher[-1]} on average and lower than {' and '.join(lower)}"
    assert said in readme
    utility = study["analysis"]["utility"]
    assert f"its utility loss ({utility['reglu']['mean']:+.3f})" in readme
    means = {m: s["forget_quality"]["mean"] for m, s in study["summaries"].items()}
    ranked = sorted(means, key=means.get, reverse=True)
    assert "Quality means over the ten authors: " + ", ".join(f"{SHORT[m]} {means[m]:.3f}" for m in ranked) in readme
    test_authors = [str(a) for a in study["design"]["test_authors"]]
    target = [study["references"][a]["full"]["forget_quality"] for a in test_authors]
    assert f"scores {min(target):.3f}-{max(target):.3f} on these authors" in readme
    (leader,) = {r["method"] for r in study["analysis"]["families"]["leader"]["rows"]}
    assert f"The post hoc leader, {SHORT[leader]}," in readme
    assert f"largest utility loss ({utility[leader]['text']})" in readme
    assert min(utility, key=lambda m: utility[m]["mean"]) == leader


def test_noise_ceiling_and_who_is_inside_it(study, readme):
    ceiling = study["noise_ceiling"]
    lo = {k: min(c[k]["min"] for c in ceiling.values()) for k in ("forget_quality", "ks_statistic", "wasserstein_log")}
    hi = {k: max(c[k]["max"] for c in ceiling.values()) for k in ("forget_quality", "ks_statistic", "wasserstein_log")}
    assert (
        f"Quality {lo['forget_quality']:.3f}-{hi['forget_quality']:.3f} (KS statistic {lo['ks_statistic']:.2f}-"
        f"{hi['ks_statistic']:.2f}, Wasserstein distance of log truth ratios {lo['wasserstein_log']:.3f}-"
        f"{hi['wasserstein_log']:.3f}) on authors {' and '.join(sorted(ceiling))}"
    ) in readme
    means = {m: s["forget_quality"]["mean"] for m, s in study["summaries"].items()}
    inside = sorted(
        (m for m, v in means.items() if lo["forget_quality"] <= v <= hi["forget_quality"]),
        key=means.get,
        reverse=True,
    )
    assert f"{WORDS[len(inside)]} of the seven method means ({', '.join(SHORT[m] for m in inside)}) lie" in readme
    below = means["reglu"] < lo["forget_quality"] and lo["forget_quality"] - means["reglu"] < 0.001
    assert below and f"ReGLU's ({means['reglu']:.4f}) just below its lower end ({lo['forget_quality']:.4f})" in readme
    values = sum(len(c["seeds"]) for c in ceiling.values())
    (seeds,) = {len(c["seeds"]) for c in ceiling.values()}
    assert f"means over 10 authors set beside {values} single values ({len(ceiling)} authors x {seeds} seeds)" in readme
    assert "do not show that the methods are as close to the retain model as retraining noise allows" in readme
    w1 = [s["wasserstein_log"]["mean"] for s in study["summaries"].values()]
    assert min(w1) > hi["wasserstein_log"]
    assert f"no method reaches the floor (means {min(w1):.3f}-{max(w1):.3f})" in readme


def test_secondary_and_control(study, readme):
    ihl, fila = row(study, "wasserstein", "reglu", "ihl"), row(study, "wasserstein", "reglu", "ihl_fila")
    assert ihl["reject"] and fila["reject"] and ihl["difference"] < 0 and fila["difference"] < 0
    assert f"than IHL (Holm p {ihl['holm_p']:.3f}) and IHL + FILA ({fila['holm_p']:.3f})" in readme
    for m in ("ihl", "ihl_fila"):
        assert study["summaries"][m]["forget_prob"]["mean"] < 0.0005
    test_authors = [str(a) for a in study["design"]["test_authors"]]
    retain = [study["references"][a]["retain"]["forget_prob"] for a in test_authors]
    assert f"far below the retain models' {min(retain):.3f}-{max(retain):.3f}" in readme
    not_closer = [r for r in study["analysis"]["families"]["wasserstein"]["rows"] if not r["reject"]]
    assert {r["rival"] for r in not_closer} == {"grad_diff", "ihl_vila", "ihl_rila"}
    rila = row(study, "wasserstein", "reglu", "ihl_rila")
    assert f"(IHL + RILA is the closer on {rila['losses']} of 10 authors, Holm p {rila['holm_p']:.3f})" in readme
    control = row(study, "control", "ihl_rila", "ihl_random_residual")
    assert (
        f"above the random-residual init's on {control['wins']} of 10 authors "
        f"({control['difference']:+.3f}, Holm p {control['holm_p']:.3f})"
    ) in readme
    ops = study["operating_points"]
    rila, rand = ops["ihl_rila"]["use"], ops["ihl_random_residual"]["use"]
    assert (rila["lr"], rila["epoch"]) != (rand["lr"], rand["epoch"])
    said = (
        f"IHL + RILA lr {rila['lr']:.0e} for {rila['epoch']} epoch{'s' * (rila['epoch'] != 1)}, "
        f"the control lr {rand['lr']:.0e} for {rand['epoch']} epochs"
    )
    assert said.replace("e-0", "e-") in readme
    ties = row(study, "primary", "reglu", "ihl_rila")["ties"]
    assert f"ReGLU ties IHL + RILA on {ties} of the 10 authors" in readme


def test_operating_points(study, readme):
    ops = study["operating_points"]
    assert {m for m, op in ops.items() if op["qualified"]} == {"grad_diff", "reglu"}
    fallback = [m for m in ops if not ops[m]["qualified"]]
    assert all("capped at 4 evaluations" in ops[m]["reason"] for m in fallback)
    named = ", ".join(SHORT[m] for m in fallback[:-1]).replace("IHL + random residual", "the control")
    assert f"{named} and the control ran at the evaluated point that lost the least utility" in readme
    assert fallback[-1] == "ihl_random_residual"
    assert f"for {len(fallback)} of the {len(ops)} methods the cap, not the rule, chose the point" in readme
    for m, op in ops.items():  # at most 4 evaluations, spent in Forget Quality order
        evaluated = [op["points"][e["point"]]["forget_quality"] for e in op["evaluations"]]
        assert len(evaluated) <= 4 and evaluated == sorted(evaluated, reverse=True), m
        if not op["qualified"]:
            assert len(evaluated) == 4 < len(op["points"]), m
    rivals = {len(op["points"]) for m, op in ops.items() if m != "reglu"}
    assert rivals == {30}
    assert f"ReGLU chose among {len(ops['reglu']['points'])} trace points" in readme
    assert "each rival among 30" in readme
    gd, reglu = ops["grad_diff"]["use"], ops["reglu"]["use"]
    assert f"GradDiff (lr {gd['lr']:.0e}, {gd['epoch']} epochs)".replace("e-0", "e-") in readme
    assert (
        f"ReGLU (lr {reglu['lr']:.0e}, ROL weight {reglu['rol_weight']:g}, rank {reglu['rol_rank']}, "
        f"{reglu['epoch']} epochs)".replace("e-0", "e-")
    ) in readme
    points = ops["reglu"]["points"]
    assert reglu["forget_quality"] == max(p["forget_quality"] for p in points)
    assert (
        f"scored Forget Quality {reglu['forget_quality']:.3f} and utility {reglu['model_utility_diff']:+.3f} on "
        f"author {study['design']['reserved_author']} (tied best of its {len(points)} trace points)"
    ) in readme
    summary, utility = study["summaries"]["reglu"], study["analysis"]["utility"]["reglu"]
    assert f"on the test authors it scored {summary['forget_quality']['mean']:.3f} and {utility['mean']:+.3f}" in readme
    assert "winner's curse" not in readme  # an interpretation, said as one


def test_what_the_design_could_see(study, readme):
    """1.5 standard deviations of ReGLU's paired Forget Quality differences over the authors: the
    difference the design detected with power 0.87 (design.md, dz = 1.5 at n = 10)."""
    per_author = study["per_author"]
    authors = [str(a) for a in study["design"]["test_authors"]]

    def detectable(rival: str) -> float:
        diffs = [per_author["reglu"][a]["forget_quality"] - per_author[rival][a]["forget_quality"] for a in authors]
        return 1.5 * statistics.stdev(diffs)

    rivals = ["ihl_rila", "ihl_vila", "grad_diff", "ihl_fila", "ihl"]
    sizes = [detectable(r) for r in rivals]
    assert sizes == sorted(sizes)
    first, *rest = [f"{s:.2f}" for s in sizes]
    said = f"are {first} (against IHL + RILA), " + ", ".join(
        f"{s} ({SHORT[r]})" for s, r in zip(rest[:-1], rivals[1:-1])
    )
    assert said + f" and {rest[-1]} (IHL)" in readme
