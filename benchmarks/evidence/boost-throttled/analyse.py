"""Per boost log, a line per return from a boost: tid, entered ns, returned ns, and the
budget (dl.runtime) in ns: read after the zero reservation (``instrument.diff``), or, in
``straight/`` and ``straight-no-margin/`` (``straight/instrument.diff``), read before the
return, followed by how far (ns) the deadline lay ahead and whether the thread was
runnable (1). How long boosts stayed, how many returned with the very budget their
vCPU's last return had (the vCPU was throttled, not run, through the whole boost), and,
where known, how the spent ones returned."""
import sys
from collections import defaultdict

PERIOD_NS = 8_000_000 + 1_000_000    # a 2 ms boost's period, and the knob's margin

for path in sys.argv[1:]:
    rows = [line.split() for line in open(path)]
    by = defaultdict(list)
    for tid, entered, returned, runtime, *more in rows:
        by[tid].append(((int(returned) - int(entered)) / 1e6, runtime, more))
    stays = sorted(s for ev in by.values() for s, _, _ in ev)
    q = lambda p: stays[int(p * (len(stays) - 1))]
    again = [(b, a) for ev in by.values() for a, b in zip(ev, ev[1:])]
    spent_rows = [(r, m) for ev in by.values() for _, r, m in ev if r != "NA" and int(r) <= 0]
    same = sum(b[1] == a[1] for b, a in again)
    first = sorted(ev[0][0] for ev in by.values())
    line = (f"{path}: {len(rows)} boosts of {len(by)} vCPUs; stay ms p10/p50/p90/max "
            f"{q(0.1):.2f}/{q(0.5):.2f}/{q(0.9):.2f}/{stays[-1]:.2f}; budget spent at the return: {len(spent_rows)}; "
            f"later boosts returning with the budget of the vCPU's last return: {same} of {len(again)}; "
            f"first boost of each vCPU stayed {', '.join(f'{s:.1f}' for s in first)} ms")
    if rows and len(rows[0]) == 6:
        straight = sum(m[1] == "1" and m[0] != "NA" and int(m[0]) <= PERIOD_NS for _, m in spent_rows)
        far = sum(m[0] != "NA" and int(m[0]) > PERIOD_NS for _, m in spent_rows)
        asleep = sum(m[1] == "0" for _, m in spent_rows)
        stuck = sum(b[1] == a[1] and b[1] != "NA" and int(b[1]) <= 0 for b, a in again)
        line += f"; of those, with a spent budget: {stuck}; of the spent: {straight} runnable with the deadline within a period (straight), {far} further, {asleep} asleep"
    print(line)
