"""The boost window of one A/B side: samples of the admission total, rebuilds,
refused boosts and recounts while both guests were under boost.

    python window.py DIR
"""
import datetime
import re
import sys


def ts(line: str) -> float:
    return datetime.datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f").replace(
        tzinfo=datetime.timezone.utc).timestamp()


def main(d: str) -> None:
    lines = [l for l in open(f"{d}/daemon.log") if l[:4].isdigit()]
    plans = [(ts(l), l) for l in lines if "cosched.switcher action=plan" in l]
    i = next(k for k, (_, l) in enumerate(plans) if "watched=boost-cosched-bench-0,boost-cosched-bench-1" in l)
    start, end = plans[i][0], plans[i + 1][0]
    rows = [l.split() for l in open(f"{d}/samples.txt") if l[:1].isdigit()]
    inside = [r for r in rows if start <= float(r[0]) <= end]
    wrapped = sum(1 for r in inside if int(r[1]) < 0)
    rebuilds = sum(1 for r in inside if len(r) > 3)
    within = [l for l in lines if start <= ts(l) <= end]
    refused = sum(int(m.group(1)) for l in within for m in [re.search(r"boosts-refused count=(\d+)", l)] if m)
    recounts = sum(1 for l in within if "action=admission-recounted" in l)
    print(f"{d}: boost window {end - start:.1f} s, {rebuilds} rebuilds, {len(inside)} samples of the total, "
          f"{wrapped} wrapped ({100 * wrapped / max(len(inside), 1):.0f}%), {refused} boosts refused, {recounts} recounts")


if __name__ == "__main__":
    main(sys.argv[1])
