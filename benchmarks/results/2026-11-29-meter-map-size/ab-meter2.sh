#!/bin/bash
cd /work/main
for rep in 1 2; do for v in old new; do
  cp /tmp/$v.bpf.o cosched/sampler/meter.bpf.o
  for mode in none gang; do
    echo "== $v rep $rep"; PYTHONPATH=/work/main timeout 300 .venv/bin/python /work/prof/threads.py $mode 15 2>&1 | grep -E "samples|tid"
  done
done; done
cp /tmp/new.bpf.o cosched/sampler/meter.bpf.o
