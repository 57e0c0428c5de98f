"""Published tables are generated, never copied by hand: every table in a
section of ``benchmarks/README.md`` that publishes a kept run is one the
report draws from that run's ``results.json`` now."""
from __future__ import annotations

import json
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


def section(title: str, following: str) -> str:
    text = README.read_text()
    return text[text.index(f"\n## {title}\n"):text.index(f"\n## {following}\n")]


def test_the_full_runs_tables_are_what_the_report_draws_from_its_results():
    from benchmarks.report import summary
    drawn = set(tables(summary(json.loads((REPO / "benchmarks/latest/results.json").read_text()))))
    published = tables(section("Latest full run", "Scale"))
    assert len(published) >= 10
    stale = [t.split("\n")[0] for t in published if t not in drawn]
    assert not stale, f"tables the report no longer draws from benchmarks/latest/results.json: {stale}"


def _scale(kept: Path) -> str:
    from benchmarks.scale import summary
    return summary(json.loads((kept / "results.json").read_text()))


def _soak(kept: Path) -> str:
    from benchmarks.soak import summary
    return summary(json.loads((kept / "results.json").read_text()), json.loads((kept / "figures.json").read_text()))


@pytest.mark.parametrize("kept, draw, title, following", [
    ("scale-latest", _scale, "Scale", "Fault suite"),
    ("soak-latest", _soak, "Fault suite", None),
])
def test_the_scale_and_fault_suite_tables_are_what_their_tools_draw(kept, draw, title, following):
    text = README.read_text()
    body = text[text.index(f"\n## {title}\n"):text.index(f"\n## {following}\n") if following else None]
    published = tables(body)
    drawn = tables(draw(REPO / "benchmarks" / kept))
    assert drawn == tables((REPO / "benchmarks" / kept / "summary.md").read_text()), \
        f"benchmarks/{kept}/summary.md is not what its tool draws from its results"
    stale = [t.split("\n")[0] for t in published if t not in drawn]
    assert published and not stale, f"tables not drawn from benchmarks/{kept}: {stale}"
