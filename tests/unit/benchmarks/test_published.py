"""Published tables are generated, never copied by hand: every table in a
section of ``benchmarks/README.md`` that publishes a kept run is one the
report draws from that run's ``results.json`` now. A section names its run
by the first ``benchmarks/results/<date>-<commit>[-<tool>]/`` it mentions (the
tool's name tells apart the runs of two tools at one commit)."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
README = REPO / "benchmarks" / "README.md"


def tables(text: str) -> list[str]:
    out, cur = [], []
    for line in text.split("\n") + [""]:
        if line.startswith("|"):
            cur.append(line)
        elif cur:
            out.append("\n".join(cur))
            cur = []
    return out


def section(title: str, following: str | None) -> str:
    text = README.read_text()
    return text[text.index(f"\n## {title}\n"):text.index(f"\n## {following}\n") if following else None]


def kept(body: str) -> Path:
    """The run a section publishes: the first kept folder it names."""
    found = re.search(r"benchmarks/results/(\d{4}-\d\d-\d\d-[0-9a-f]{7,}(?:-[a-z]+)?)/", body)
    assert found, "the section names no kept run (benchmarks/results/<date>-<commit>[-<tool>]/)"
    return REPO / "benchmarks" / "results" / found.group(1)


@pytest.mark.parametrize("title, following, least", [
    ("Latest full run", "Default path cost", 18),       # make bench: every mixed host a table of its own
])
def test_the_suites_tables_are_what_the_report_draws_from_its_results(title, following, least):
    from benchmarks.report import summary
    body = section(title, following)
    run = kept(body)
    drawn = set(tables(summary(json.loads((run / "results.json").read_text()))))
    published = tables(body)
    assert len(published) >= least
    stale = [t.split("\n")[0] for t in published if t not in drawn]
    assert not stale, f"tables the report no longer draws from {run}/results.json: {stale}"


def _scale(kept: Path) -> str:
    from benchmarks.scale import summary
    return summary(json.loads((kept / "results.json").read_text()))


def _cost(kept: Path) -> str:
    from benchmarks.cost import summary
    return summary(json.loads((kept / "results.json").read_text()))


def _soak(kept: Path) -> str:
    from benchmarks.soak import summary
    return summary(json.loads((kept / "results.json").read_text()), json.loads((kept / "figures.json").read_text()))


@pytest.mark.parametrize("draw, title, following", [
    (_cost, "Default path cost", "Scale"),
    (_scale, "Scale", "Fault suite"),
    (_soak, "Fault suite", None),
])
def test_the_scale_and_fault_suite_tables_are_what_their_tools_draw(draw, title, following):
    body = section(title, following)
    run = kept(body)
    published = tables(body)
    drawn = tables(draw(run))
    assert drawn == tables((run / "summary.md").read_text()), \
        f"{run}/summary.md is not what its tool draws from its results"
    stale = [t.split("\n")[0] for t in published if t not in drawn]
    assert published and not stale, f"tables not drawn from {run}: {stale}"
