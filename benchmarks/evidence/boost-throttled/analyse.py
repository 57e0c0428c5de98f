"""Per boost log (tid, entered ns, returned ns, dl.runtime ns after the zero reservation):
how long boosts stayed, and how many returned with the very budget their vCPU's last
return had (the vCPU was throttled, not run, through the whole boost)."""
import sys
from collections import defaultdict

for path in sys.argv[1:]:
    rows = [line.split() for line in open(path)]
    by = defaultdict(list)
    for tid, entered, returned, runtime in rows:
        by[tid].append(((int(returned) - int(entered)) / 1e6, int(runtime)))
    stays = sorted(s for ev in by.values() for s, _ in ev)
    q = lambda p: stays[int(p * (len(stays) - 1))]
    again = [(b, a) for ev in by.values() for a, b in zip(ev, ev[1:])]
    same = sum(b[1] == a[1] for b, a in again)
    spent = sum(r <= 0 for ev in by.values() for _, r in ev)
    first = sorted(ev[0][0] for ev in by.values())
    print(f"{path}: {len(rows)} boosts of {len(by)} vCPUs; stay ms p10/p50/p90/max "
          f"{q(0.1):.2f}/{q(0.5):.2f}/{q(0.9):.2f}/{stays[-1]:.2f}; budget spent at the return: {spent}; "
          f"later boosts returning with the budget of the vCPU's last return: {same} of {len(again)}; "
          f"first boost of each vCPU stayed {', '.join(f'{s:.1f}' for s in first)} ms")
