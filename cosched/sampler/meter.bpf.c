// SPDX-License-Identifier: GPL-2.0
/*
 * cosched's in-kernel meter: the state of every metered vCPU thread, kept
 * from the scheduler's own events, and per guest the time some vCPU ran
 * while a sibling waited for a CPU (hazard) and the time some waited while
 * none ran (partial contention), exactly.
 *
 * Built with `make meter` (clang -target bpf), loaded by meter.py through
 * libbpf. CO-RE: the few task_struct fields read are declared below with
 * preserve_access_index and found in the running kernel's BTF at load, so
 * no kernel headers are needed.
 *
 * A thread is in one of five states: running (on a CPU), waiting (runnable,
 * queued), sleeping, frozen (its cgroup frozen: a co-stopped vCPU), or
 * dead (it exited).
 * User space adds a thread in state UNKNOWN, which counts in nothing until
 * the thread's first switch or wake-up says what it is.
 *
 * Long waits: a metered thread also in `watched` (the switcher's boost
 * guests) arms its timer when it starts waiting for a CPU; if it is still
 * in that same wait `long_wait_ns` later (config[0]) while a sibling runs,
 * its thread id goes to the `long_waits` ring buffer, which wakes the
 * switcher. So a wait is known long when it is, without a look.
 */
#include <stdbool.h>
#include <linux/types.h>
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>
#include <bpf/bpf_core_read.h>

char LICENSE[] SEC("license") = "GPL";

struct task_struct {
	int pid;
	unsigned int frozen:1;		/* set by cgroup_enter_frozen() before it schedules */
} __attribute__((preserve_access_index));

enum { UNKNOWN = 0, RUNNING = 1, WAITING = 2, SLEEPING = 3, FROZEN = 4, DEAD = 5 };
#define TASK_DEAD 0x80

struct thread {				/* one metered vCPU thread; times cumulative, ns */
	struct bpf_spin_lock lock;
	__u32 guest;
	__u32 state;
	__u32 pad;
	__u64 since;			/* CLOCK_MONOTONIC ns of the last change */
	__u64 run;
	__u64 wait;
	__u64 frozen;
};

struct guest {				/* per guest: how many of its threads run and wait */
	struct bpf_spin_lock lock;
	__u32 running;
	__u32 waiting;
	__u32 pad;
	__u64 since;
	__u64 hazard;
	__u64 partial;
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 65536);
	__type(key, __u32);		/* thread id */
	__type(value, struct thread);
	__uint(map_flags, BPF_F_NO_PREALLOC);
} threads SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 16384);
	__type(key, __u32);		/* a guest number given by user space */
	__type(value, struct guest);
	__uint(map_flags, BPF_F_NO_PREALLOC);
} guests SEC(".maps");

struct watch {				/* one watched thread: its long-wait timer */
	struct bpf_timer timer;
	__u64 since;			/* the start of the wait it is armed for */
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 65536);
	__type(key, __u32);		/* thread id */
	__type(value, struct watch);
	__uint(map_flags, BPF_F_NO_PREALLOC);
} watched SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u64);		/* long_wait_ns: 0 reports nothing */
} config SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 1 << 16);
} long_waits SEC(".maps");

#define CLOCK_MONOTONIC 1

/* The timer of a watched thread: still in the wait it was armed for, next
 * to a running sibling? Then report it. */
static int expired(void *map, __u32 *key, struct watch *w)
{
	__u32 tid = *key, id, state;
	struct thread *t = bpf_map_lookup_elem(&threads, &tid);
	struct guest *g;
	__u32 *out;
	__u64 since;

	if (!t)
		return 0;
	bpf_spin_lock(&t->lock);
	state = t->state;
	since = t->since;
	id = t->guest;
	bpf_spin_unlock(&t->lock);
	if (state != WAITING || since != w->since)
		return 0;
	g = bpf_map_lookup_elem(&guests, &id);
	if (!g || !*(volatile __u32 *)&g->running)
		return 0;
	out = bpf_ringbuf_reserve(&long_waits, sizeof(*out), 0);
	if (out) {
		*out = tid;
		bpf_ringbuf_submit(out, 0);
	}
	return 0;
}

/* A watched thread started waiting at now: report it if it still waits long_wait_ns from now. */
static __always_inline void arm(__u32 tid, __u64 now)
{
	struct watch *w = bpf_map_lookup_elem(&watched, &tid);
	__u32 zero = 0;
	__u64 *after = bpf_map_lookup_elem(&config, &zero);

	if (!w || !after || !*after)
		return;
	w->since = now;
	bpf_timer_init(&w->timer, &watched, CLOCK_MONOTONIC);	/* -EBUSY once done: harmless */
	bpf_timer_set_callback(&w->timer, expired);
	bpf_timer_start(&w->timer, *after, 0);
}

/* Thread tid enters state at now; wake: a wake-up, which changes nothing
 * for a thread still on its CPU (woken before it slept). */
static __always_inline void change(__u32 tid, __u32 state, __u64 now, bool wake)
{
	struct thread *t = bpf_map_lookup_elem(&threads, &tid);
	struct guest *g;
	__u32 old, id;
	__u64 dt;

	if (!t)
		return;
	bpf_spin_lock(&t->lock);
	old = t->state;
	id = t->guest;
	if (old == state || (wake && old == RUNNING)) {
		bpf_spin_unlock(&t->lock);
		return;
	}
	dt = now > t->since ? now - t->since : 0;
	if (old == RUNNING)
		t->run += dt;
	else if (old == WAITING)
		t->wait += dt;
	else if (old == FROZEN)
		t->frozen += dt;
	t->state = state;
	t->since = now;
	bpf_spin_unlock(&t->lock);
	if (state == WAITING)
		arm(tid, now);

	g = bpf_map_lookup_elem(&guests, &id);
	if (!g)
		return;
	bpf_spin_lock(&g->lock);
	dt = now > g->since ? now - g->since : 0;
	if (g->running && g->waiting)
		g->hazard += dt;
	else if (g->waiting)
		g->partial += dt;
	g->since = now;
	if (old == RUNNING && g->running)
		g->running--;
	else if (old == WAITING && g->waiting)
		g->waiting--;
	if (state == RUNNING)
		g->running++;
	else if (state == WAITING)
		g->waiting++;
	bpf_spin_unlock(&g->lock);
}

SEC("tp_btf/sched_switch")
int BPF_PROG(on_switch, bool preempt, struct task_struct *prev, struct task_struct *next,
	     unsigned int prev_state)
{
	__u64 now = bpf_ktime_get_ns();
	__u32 state;

	if (preempt || prev_state == 0)		/* TASK_RUNNING: still runnable, queued */
		state = WAITING;
	else if (prev_state & TASK_DEAD)	/* its last switch: it exited */
		state = DEAD;
	else if (BPF_CORE_READ_BITFIELD(prev, frozen))
		state = FROZEN;
	else
		state = SLEEPING;
	change(prev->pid, state, now, false);
	change(next->pid, RUNNING, now, false);
	return 0;
}

SEC("tp_btf/sched_wakeup")
int BPF_PROG(on_wakeup, struct task_struct *p)
{
	change(p->pid, WAITING, bpf_ktime_get_ns(), true);
	return 0;
}
