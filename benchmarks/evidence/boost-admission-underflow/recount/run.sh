#!/bin/sh
# One A/B side: OUT=<dir> sh run.sh, from the checkout under test (cwd), as root.
# Two boost guests on barrier for 40 s while rebuilds.py rebuilds the kernel's
# root domains every 3 s and samples its deadline admission total; the daemon's
# log is kept beside the suite's results.
set -e
here=$(dirname "$(readlink -f "$0")")
mkdir -p "$OUT"
python3 -u "$here/rebuilds.py" 100000 3 > "$OUT/samples.txt" 2>&1 &
stress=$!
python -m benchmarks.suite --guests 2 --workloads barrier --modes boost --reps 1 --seconds 40 \
    --no-truth --meter off --out "$OUT" > "$OUT/suite.out" 2>&1 || true
kill -TERM $stress; wait $stress || true
cp "$(ls -td /tmp/cosched-bench-* | head -1)/daemon.log" "$OUT/daemon.log"
