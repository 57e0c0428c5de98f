#!/bin/sh
# Every sched_switch of the host for SECONDS (default 2) in a tracefs
# instance of its own, with no filter: per CPU, switches into its idle
# task and out of it, how often it switched away from each task, and the
# tasks it switched to but never away from.
#     sh benchmarks/evidence/trace-run-check/unfiltered.sh [SECONDS]
set -e
T=$(awk '$3 == "tracefs" { print $2; exit }' /proc/mounts)
if [ -z "$T" ]; then T=/sys/kernel/tracing; mount -t tracefs nodev "$T"; MOUNTED=1; fi
I="$T/instances/trace-run-check"
mkdir "$I"
echo mono > "$I/trace_clock"
echo 1 > "$I/events/sched/sched_switch/enable"
echo 1 > "$I/tracing_on"; sleep "${1:-2}"; echo 0 > "$I/tracing_on"
awk '/sched_switch:/ {
        cpu = $0; sub(/^.*\[/, "", cpu); sub(/\].*$/, "", cpu)
        if ($0 ~ / next_pid=0 /) into[cpu]++
        if ($0 ~ / prev_pid=0 /) out[cpu]++
        from = $0; sub(/^.*prev_comm=/, "", from); sub(/ prev_prio=.*$/, "", from); sub(/ prev_pid=/, "/", from)
        n[cpu "  " from]++
        to = $0; sub(/^.*next_comm=/, "", to); sub(/ next_prio=.*$/, "", to); sub(/ next_pid=/, "/", to)
        m[cpu "  " to]++
     }
     END {
        for (c in into) printf "CPU %s: %d switches into idle, %d out of idle\n", c, into[c], out[c] + 0
        for (k in n) printf "  CPU %s, from %s: %d\n", substr(k, 1, index(k, " ") - 1), substr(k, index(k, " ") + 2), n[k]
        for (k in m) if (!(k in n))
            printf "  CPU %s, to %s %d times, never away from it\n", substr(k, 1, index(k, " ") - 1), substr(k, index(k, " ") + 2), m[k]
     }' "$I/trace" | sort
echo 0 > "$I/events/sched/sched_switch/enable"
rmdir "$I"
if [ -n "$MOUNTED" ]; then umount "$T"; fi
