"""Per mode: the sampler's hazard and mean skew less the kernel trace's, over every guest and run of reps.jsonl."""
import json
import sys
from pathlib import Path

rows = [json.loads(line) for line in (Path(__file__).parent / "reps.jsonl").read_text().splitlines()]
if not rows:
    sys.exit("no runs in reps.jsonl")
for mode in sorted({r["mode"] for r in rows}):
    ws = [w for r in rows if r["mode"] == mode for w in r["per_guest"].values()]
    h = [100 * (w["hazard"] - w["t_hazard"]) for w in ws]
    s = [w["skew"] - w["t_skew"] for w in ws]
    print(f"{mode}: {len(ws)} guest-runs; hazard off by {min(h):+.1f} to {max(h):+.1f} points "
          f"(mean {sum(h) / len(h):+.1f}); skew off by at most {max(map(abs, s)):.2f} ms")
