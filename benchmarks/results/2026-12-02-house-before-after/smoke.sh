set -x
for i in 1 2; do
  (cd /tmp/exp/before && /work/main/.venv/bin/python -m benchmarks.suite --guests 3 --workloads barrier,blocking --modes batch,cfs,gang --reps 1 --seconds 4 --out /tmp/exp/smoke-before-$i) > /tmp/exp/smoke-before-$i.log 2>&1
  (cd /tmp/exp/ca && /work/main/.venv/bin/python -m benchmarks.suite --guests 3 --workloads barrier,blocking --modes batch,cfs,gang --reps 1 --seconds 4 --out /tmp/exp/smoke-after-$i) > /tmp/exp/smoke-after-$i.log 2>&1
done
echo ALLDONE
