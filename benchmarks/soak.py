"""The long form of the fault suite, and its table of figures.

    python -m benchmarks.soak [--fuzz 10000] [--kills 100] [--restarts 50] [--real-cycles 50] [--cycles 1000] [--out DIR]
    python -m benchmarks.soak --report DIR

Runs, one after the other (never two VM-heavy suites at once), each test
file of the fault suite at full length:

* ``tests/unit/test_fuzz.py``: ``--fuzz`` fuzzed configuration files, preset
  files, annotations and domain XML documents each;
* ``tests/unit/engine/test_faults.py``: kernel errors (EBUSY, ENOENT, EPERM, EINVAL, a
  write that succeeds but does not take) injected into every actuator;
* ``tests/integration/test_chaos.py``: ``--kills`` SIGKILLs of the daemon
  or its switcher at random points of a rotation, ``--restarts`` restarts
  of the killed daemon with every CPU busy (timed), a switcher stopped
  mid-rotation, ``--real-cycles`` real guests created and destroyed next to
  a rotation, libvirtd restarted under load, an annotation flapping;
* ``tests/integration/test_synthetic.py``: ``--cycles`` synthetic guests
  created and destroyed next to a rotation.

Each test records what it did and found (``tests/support/soak.py``) into
``DIR/figures.json``; each file's pytest output is kept in ``DIR/NAME.log``
with its exit status. ``DIR/summary.md`` is the table: per part, cycles
run, faults injected, leaks found (target 0), daemon exits (target 0).
Default ``DIR``: ``benchmarks/results/soak-<time>``. ``--parts fuzz,chaos``
runs only those parts; into an existing ``DIR`` they replace that
directory's figures and status for the same parts (each part's row says
at which commit it ran).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from benchmarks import commit


def parts(args) -> list[tuple[str, list[str], dict]]:
    return [
        ("fuzz", ["tests/unit/test_fuzz.py"], {"COSCHED_FUZZ_EXAMPLES": str(args.fuzz)}),
        ("faults", ["tests/unit/engine/test_faults.py"], {}),
        ("chaos", ["tests/integration/test_chaos.py"],
         {"COSCHED_KILLS": str(args.kills), "COSCHED_REAL_CYCLES": str(args.real_cycles),
          "COSCHED_RESTARTS": str(args.restarts)}),
        ("synthetic", ["tests/integration/test_synthetic.py"], {"COSCHED_CYCLES": str(args.cycles)}),
    ]


def summary(res: dict, figures: dict) -> str:
    commits = sorted({run[3] for run in res["runs"]})
    lines = ["# Fault suite, long form", "", f"`{res['command']}`: {res['minutes']:.0f} minutes of runs in all "
             f"(parts run again included), at commit {', '.join(commits)}; host: {res['cpus']} CPUs, "
             f"kernel {res['kernel']}.", "",
             "| part | cycles run | faults injected | leaks found | daemon exits | notes |",
             "|---|---|---|---|---|---|"]
    dash = "—"
    for part in sorted(figures):
        f = figures[part]
        lines.append(f"| {part} | {f.get('cycles', dash)} | {f.get('faults', dash)} | {f.get('leaks', dash)} | "
                     f"{f.get('exits', dash)} | {f.get('notes', '')} |")
    total = {k: sum(f.get(k, 0) for f in figures.values()) for k in ("cycles", "faults", "leaks", "exits")}
    lines += [f"| **all** | {total['cycles']} | {total['faults']} | {total['leaks']} | {total['exits']} | |", "",
              "Faults injected: for fuzzed input, the inputs refused (each with an error naming its culprit); "
              "for the others, the kills, stops, restarts, policy changes or kernel errors made to happen.", "",
              "| test file | commit | pytest exit status |", "|---|---|---|"]
    lines += [f"| {name} (`{' '.join(files)}`) | {commit} | {status} |" for name, files, status, commit in res["runs"]]
    failed = [name for name, _, status, _ in res["runs"] if status != 0]
    lines += ["", "Every test passed." if not failed else f"Failed: {', '.join(failed)} (see NAME.log)."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--fuzz", type=int, default=10_000)
    ap.add_argument("--kills", type=int, default=100)
    ap.add_argument("--restarts", type=int, default=50)
    ap.add_argument("--real-cycles", type=int, default=50)
    ap.add_argument("--cycles", type=int, default=1000)
    ap.add_argument("--parts", default="fuzz,faults,chaos,synthetic", help="which parts to run (default: all)")
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--report", type=Path, default=None, help="redraw DIR/summary.md from its results")
    args = ap.parse_args(argv)
    if args.report:
        res = json.loads((args.report / "results.json").read_text())
        figures = json.loads((args.report / "figures.json").read_text())
        (args.report / "summary.md").write_text(summary(res, figures))
        return 0
    out = args.out or Path("benchmarks/results") / time.strftime("soak-%Y%m%d-%H%M%S")
    out.mkdir(parents=True, exist_ok=True)
    figures_file = (out / "figures.json").resolve()
    at = commit()
    command = " ".join(["python -m benchmarks.soak", *(argv if argv is not None else sys.argv[1:])])
    chosen = [p for p in parts(args) if p[0] in args.parts.split(",")]
    earlier = json.loads((out / "results.json").read_text()) if (out / "results.json").exists() else None
    figures = json.loads(figures_file.read_text()) if earlier and figures_file.exists() else {}
    if earlier:                                # the parts run again lose their earlier figures and status
        for name, _, _ in chosen:
            figures = {k: v for k, v in figures.items() if v.get("test_file") != name}
    figures_file.write_text(json.dumps(figures))
    res = {"command": command if not earlier else f"{earlier['command']}; {command}",
           "cpus": len(os.sched_getaffinity(0)), "kernel": os.uname().release,
           "runs": [r for r in (earlier or {}).get("runs", []) if r[0] not in {c[0] for c in chosen}],
           "minutes": (earlier or {}).get("minutes", 0.0)}
    t0 = time.monotonic()
    for name, files, env in chosen:
        print(f"soak: {name} ...", flush=True)
        with open(out / f"{name}.log", "w") as log:
            status = subprocess.run([sys.executable, "-m", "pytest", "-q", *files], stdout=log,
                                    stderr=subprocess.STDOUT,
                                    env={**os.environ, **env, "COSCHED_SOAK_OUT": str(figures_file),
                                         "COSCHED_SOAK_PART": name}).returncode
        res["runs"].append((name, files, status, at or "unknown"))
        print(f"soak: {name} exit {status}", flush=True)
    res["minutes"] += (time.monotonic() - t0) / 60
    (out / "results.json").write_text(json.dumps(res, indent=1))
    figures = json.loads(figures_file.read_text()) if figures_file.exists() else {}
    text = summary(res, figures)
    (out / "summary.md").write_text(text)
    print("\n" + text + f"\nwritten to {out}/")
    return 0 if all(run[2] == 0 for run in res["runs"]) else 1


if __name__ == "__main__":
    raise SystemExit(main())
