#!/bin/bash
# A/B: boost and relaxed overhead, commit 5f11306 against main, alternating
set -e
for d in ab-old ab-new; do (cd /work/$d && make venv meter >/dev/null 2>&1); done
for rep in 1 2; do
  for d in ab-old ab-new; do
    cd /work/$d
    .venv/bin/python -m benchmarks.suite --guests 4 --workloads barrier,ep --modes boost,relaxed,gang,cfs --reps 1 --seconds 5 --no-truth --steady 0 --out /work/ab-out/$d-$rep > /work/ab-out/$d-$rep.log 2>&1
  done
done
