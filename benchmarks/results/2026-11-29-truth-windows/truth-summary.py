"""Summarise test_truth -s outputs: per source/mode, |cosched - trace| hazard and skew, |trace - kernel| run and wait."""
import re, sys, statistics as st
rows = {}
for path in sys.argv[1:]:
    case = None
    for line in open(path):
        m = re.match(r"^(meter|proc) (cfs|gang):", line)
        if m: case = m.group(0)[:-1]; continue
        m = re.match(r"^\S+: hazard cosched ([\d.]+) trace ([\d.]+); skew cosched ([\d.]+) ms trace ([\d.]+) ms", line)
        if m and case:
            h1, h2, s1, s2 = map(float, m.groups())
            rows.setdefault(case, {}).setdefault("hazard", []).append(100 * abs(h1 - h2))
            rows[case].setdefault("skew", []).append(abs(s1 - s2))
        m = re.match(r"^\s+thread \d+: run cosched ([\d.]+) trace ([\d.]+) kernel ([\d.]+); wait cosched ([\d.]+) trace ([\d.]+) kernel ([\d.]+)", line)
        if m and case:
            rc, rt, rk, wc, wt, wk = map(float, m.groups())
            rows[case].setdefault("run trace-kernel", []).append(100 * abs(rt - rk))
            rows[case].setdefault("wait trace-kernel", []).append(100 * abs(wt - wk))
for case, d in sorted(rows.items()):
    print(case, "  ".join(f"{k}: n={len(v)} median {st.median(v):.2f} max {max(v):.2f}" for k, v in d.items()))
