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
 * A thread woken on its own CPU while that CPU is idle (the wake-up handled
 * there, by the idle task) waits for no other task: only for its CPU to
 * leave idle, 8-16 us on a virtual host. It runs from its wake-up, as the
 * kernel bills it; were another task switched in there first, it waits
 * from that switch (`woken`: the one such thread per CPU).
 *
 * Long waits: a metered thread also in `watched` (the switcher's boost
 * guests) arms its timer when it starts waiting for a CPU; if it is still
 * in that same wait `long_wait_ns` later (config[0]) while a sibling runs,
 * its thread id goes to the `long_waits` ring buffer, which wakes the
 * switcher; with no sibling running then, it looks again every
 * `long_wait_ns` for as long as the wait lasts. So a wait is known long
 * when it is, without a look.
 */
#include <stdbool.h>
#include <linux/types.h>
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>
#include <bpf/bpf_core_read.h>

char LICENSE[] SEC("license") = "GPL";

struct thread_info {
	__u32 cpu;			/* task_cpu(), since Linux 5.16 */
} __attribute__((preserve_access_index));

struct task_struct {
	struct thread_info thread_info;
	int pid;
	unsigned int frozen:1;		/* set by cgroup_enter_frozen() before it schedules */
} __attribute__((preserve_access_index));

struct task_struct___515 {		/* task_cpu() before 5.16 */
	unsigned int cpu;
} __attribute__((preserve_access_index));

/* The CPU whose run queue holds p: whichever field this kernel has (the
 * other branch's relocation fails at load, and the branch is dropped). */
static __always_inline __u32 task_cpu(struct task_struct *p)
{
	if (bpf_core_field_exists(p->thread_info.cpu))
		return BPF_CORE_READ(p, thread_info.cpu);
	return BPF_CORE_READ((struct task_struct___515 *)p, cpu);
}

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
	__s32 running;			/* signed: see change() */
	__s32 waiting;
	__u32 pad;
	__u64 since;
	__u64 hazard;
	__u64 partial;
};

/*
 * At most CAPACITY threads, guests and watched threads at once. A batch read
 * walks every bucket of a hash map, full or not: at 65,536 the daemon's two
 * reads took a median 199 us, at 8,192 87 us (8 threads followed, 2-CPU
 * development host, docs/decisions/0019-meter-map-size.md).
 */
#define CAPACITY 8192

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, CAPACITY);
	__type(key, __u32);		/* thread id */
	__type(value, struct thread);
	__uint(map_flags, BPF_F_NO_PREALLOC);
} threads SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, CAPACITY);
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
	__uint(max_entries, CAPACITY);
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

struct woken {				/* per CPU: the thread woken on it while it idled */
	__u32 tid;			/* 0: none */
	__u32 pad;
	__u64 since;			/* its wake-up */
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct woken);
} woken SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 1 << 16);
} long_waits SEC(".maps");

#define CLOCK_MONOTONIC 1

/* The timer of a watched thread: still in the wait it was armed for, next
 * to a running sibling? Then report it. Still in it with no sibling
 * running: look again long_wait_ns later, so that a wait that turns into a
 * hazard only when a sibling starts running is reported too. */
static int expired(void *map, __u32 *key, struct watch *w)
{
	__u32 tid = *key, id, state, zero = 0;
	struct thread *t = bpf_map_lookup_elem(&threads, &tid);
	__u64 *after = bpf_map_lookup_elem(&config, &zero);
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
	if (!g)
		return 0;
	if (*(volatile __s32 *)&g->running <= 0) {
		if (after && *after)
			bpf_timer_start(&w->timer, *after, 0);
		return 0;
	}
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

/* Thread tid enters state at now, unless it is not metered or already in
 * it; wake: a wake-up, which changes nothing for a thread still on its CPU
 * (woken before it slept); since: only if its state began then (0: any).
 * True if it changed. */
static __always_inline bool change(__u32 tid, __u32 state, __u64 now, bool wake, __u64 since)
{
	struct thread *t = bpf_map_lookup_elem(&threads, &tid);
	struct guest *g;
	__u32 old, id;
	__u64 dt;

	if (!t)
		return false;
	bpf_spin_lock(&t->lock);
	old = t->state;
	id = t->guest;
	if ((wake && old == RUNNING) || (since && t->since != since)) {
		bpf_spin_unlock(&t->lock);
		return false;
	}
	dt = now > t->since ? now - t->since : 0;
	if (old == state) {
		if (state == RUNNING) {		/* switched in, running since its wake-up: */
			t->run += dt;		/* a new since, which its CPU's woken slot no longer matches */
			t->since = now;
		}
		bpf_spin_unlock(&t->lock);
		return false;
	}
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

	/* Two CPUs may change one thread at once (a woken slot's thread moved
	 * to the other CPU), so their guest updates may come in either order:
	 * unclamped signed counts end right whatever the order. */
	g = bpf_map_lookup_elem(&guests, &id);
	if (!g)
		return true;
	bpf_spin_lock(&g->lock);
	dt = now > g->since ? now - g->since : 0;
	if (g->running > 0 && g->waiting > 0)
		g->hazard += dt;
	else if (g->waiting > 0)
		g->partial += dt;
	g->since = now;
	if (old == RUNNING)
		g->running--;
	else if (old == WAITING)
		g->waiting--;
	if (state == RUNNING)
		g->running++;
	else if (state == WAITING)
		g->waiting++;
	bpf_spin_unlock(&g->lock);
	return true;
}

SEC("tp_btf/sched_switch")
int BPF_PROG(on_switch, bool preempt, struct task_struct *prev, struct task_struct *next,
	     unsigned int prev_state)
{
	__u64 now = bpf_ktime_get_ns();
	__u32 zero = 0, state;
	struct woken *w = bpf_map_lookup_elem(&woken, &zero);

	if (w && w->tid) {			/* this CPU's first switch since it woke w->tid */
		if (w->tid != next->pid)	/* another task got it first: w->tid waits from now */
			change(w->tid, WAITING, now, false, w->since);
		w->tid = 0;
	}
	if (preempt || prev_state == 0)		/* TASK_RUNNING: still runnable, queued */
		state = WAITING;
	else if (prev_state & TASK_DEAD)	/* its last switch: it exited */
		state = DEAD;
	else if (BPF_CORE_READ_BITFIELD(prev, frozen))
		state = FROZEN;
	else
		state = SLEEPING;
	change(prev->pid, state, now, false, 0);
	change(next->pid, RUNNING, now, false, 0);
	return 0;
}

SEC("tp_btf/sched_wakeup")
int BPF_PROG(on_wakeup, struct task_struct *p)
{
	__u64 now = bpf_ktime_get_ns();
	__u32 zero = 0;
	struct woken *w;

	if (bpf_get_current_task_btf()->pid == 0 && task_cpu(p) == bpf_get_smp_processor_id()) {
		w = bpf_map_lookup_elem(&woken, &zero);		/* woken by its idle CPU */
		if (w && !w->tid) {
			if (change(p->pid, RUNNING, now, true, 0)) {
				w->tid = p->pid;
				w->since = now;
			}
			return 0;
		}
	}
	change(p->pid, WAITING, now, true, 0);
	return 0;
}
