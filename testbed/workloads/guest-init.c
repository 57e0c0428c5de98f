/*
 * /init of the cosched test guest: runs one multi-threaded workload and
 * reports on the serial console.
 *
 * The kernel passes the words after "--" on its command line to init as
 * argv, so a guest is told what to run by its domain XML:
 *
 *     <cmdline>console=ttyS0 quiet -- barrier threads=2 chunk=20000</cmdline>
 *
 * Workloads (argv[1]); each worker thread is pinned to its own vCPU:
 *   barrier   compute `chunk` LCG steps, then meet at a spin barrier;
 *             iters = barrier crossings counted by every thread (one
 *             crossing of all `threads` threads adds `threads` to iters).
 *   deadline  the skew microbenchmark of the Xen gang-scheduling paper:
 *             compute chunks of `chunk_ms` and count completions globally; a
 *             chunk is missed when, while its thread computed it, the global
 *             count grew by more than the number of threads (a sibling got
 *             ahead: the threads fell out of step);
 *             iters = chunks, missed = missed chunks.
 *   spinlock  take one test-and-test-and-set spinlock around `cs` LCG steps,
 *             with `chunk` steps outside it; iters = acquisitions.
 *   lu        blocked LU factorisation of an n x n matrix (block b) with a
 *             spin barrier after each phase of each step; iters = factorisations.
 *             After each one a row of L*U (a different row each time) is
 *             checked against the original matrix; a relative residual over
 *             1e-9 counts an error.
 *   ep        independent `chunk`-step loops, no sharing (each thread keeps
 *             its result on its own cache lines); iters = chunks.
 *   blocking  `chunk` steps, then sleep `sleep_us`: vCPUs are often idle;
 *             iters = chunks.
 *   pingpong  two threads pass a token through a pipe; iters = round trips.
 *   phases    `barrier` and `blocking` in turn, `phase_ms` (guest time) each,
 *             starting with barrier; every thread switches at the same
 *             barrier crossing. iters = barrier crossings plus chunks, and
 *             the result line also says which phase is running
 *             (phase=<number of phases begun so far, from 0>: even numbers
 *             are barrier phases).
 *   idle      threads sleep; the guest only keeps its kernel running.
 *   exec      real software: the command after the options (the first word
 *             that starts with '/'), run again and again, its output
 *             discarded; a word '|' joins two commands with a pipe. Its
 *             processes may run on any vCPU. iters = completed runs; a run
 *             that fails counts an error. /data holds `data_kib` KiB of text
 *             (default 1024), made at start, for commands that need an input.
 *
 * Every `interval_ms` one line that the host parses is printed, by a
 * reporter thread on whichever vCPU runs first (one reporter per vCPU):
 *
 *     cosched-result workload=NAME t_ms=<guest monotonic ms> iters=<total> [missed=<total>] errors=<total> hist=<i>:<n>,...

 * Before the workload starts the guest prints where its live counters are
 *
 *     cosched-counters gpa=<guest-physical address> magic=<header value>
 *
 * a 4 KiB page: magic and thread count (two u64), then per thread, 64 bytes
 * apart from offset 64, iters, missed and errors (u64). The host reads it
 * from QEMU's memory at exact instants (testbed.guests.Guest.counters).
 *
 * `errors` counts failed self-checks: a worker that could not be pinned to its
 * vCPU, or an LU factorisation whose residual is too large; each failure also
 * prints a `cosched-error ...` line.
 *
 * Counters are cumulative, so a reader can take any two lines and divide.
 * `hist` counts iterations by how long each took (time since the same
 * thread's previous iteration), in log-linear buckets of microseconds: four
 * buckets per power of two; bucket i < 4 holds i us, bucket i >= 4 holds
 * [(4 + i % 4) << (i / 4 - 1), (5 + i % 4) << (i / 4 - 1)) us. Only non-empty
 * buckets are printed.
 * `poweroff_ms` or `reboot_ms` (guest monotonic time since init started):
 * the guest then powers itself off or reboots, as its own shutdown would
 * (prints `cosched-poweroff` or `cosched-reboot` first).
 *
 * Init must never exit (the kernel would panic): it sleeps forever when the
 * workload is unknown.
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/mount.h>
#include <sys/reboot.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define MAX_THREADS 63          /* the live page holds a header and 63 threads */

static long opt_threads;          /* 0: one per online vCPU */
static long opt_chunk = 20000;    /* LCG steps per unit of work */
static long opt_interval_ms = 1000;
static long opt_chunk_ms = 100;   /* deadline: chunk length */
static long opt_cs = 200;         /* spinlock: critical section steps */
static long opt_sleep_us = 2000;
static long opt_data_kib = 1024;   /* exec: size of /data */  /* blocking: sleep between chunks */
static long opt_n = 128;          /* lu: matrix size */
static long opt_b = 16;           /* lu: block size */
static long opt_phase_ms = 20000; /* phases: length of each phase */
static long opt_poweroff_ms;      /* power off this long after start (0: never) */
static long opt_reboot_ms;        /* reboot this long after start (0: never) */
static uint64_t started_ns;       /* phases: when the workload started */

#define HIST_BUCKETS 136       /* up to 2^34 us */

/* The live counters: one page, locked in memory, whose guest-physical
 * address the guest prints first ("cosched-counters gpa=0x... magic=0x...").
 * The host reads them from QEMU's memory at any instant, whether or not a
 * vCPU of the guest is running: a starved guest cannot print, but its
 * counters stand where it left them. Each thread's counts on its own cache line. */
#define LIVE_MAGIC 0x65766c6964656863ull          /* "chedlive", little-endian */
struct live_page {
    uint64_t magic, threads;
    char pad[48];
    struct { volatile uint64_t iters, missed, errors; char pad[40]; } t[MAX_THREADS];
};
static struct live_page fallback_page __attribute__((aligned(4096)));
static struct live_page *live = &fallback_page;

/* per-thread timing and results, each thread on its own cache lines */
static struct {
    uint64_t last_ns;
    volatile uint64_t sink;
    volatile uint64_t hist[HIST_BUCKETS];
    char pad[24];
} count[MAX_THREADS];

static uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + ts.tv_nsec;
}

static int hist_bucket(uint64_t us) {
    if (us < 4)
        return (int)us;
    int msb = 63 - __builtin_clzll(us);
    int i = 4 * (msb - 1) + (int)((us >> (msb - 2)) & 3);
    return i < HIST_BUCKETS ? i : HIST_BUCKETS - 1;
}

/* one iteration of thread `id` is done: count it and how long it took */
static void count_iter(long id) {
    uint64_t now = now_ns();
    if (count[id].last_ns)
        count[id].hist[hist_bucket((now - count[id].last_ns) / 1000)]++;
    count[id].last_ns = now;
    live->t[id].iters++;
}

/* `steps` LCG steps; the result goes to the thread's own line, so that
 * computing shares nothing between threads */
static void compute(long id, long steps) {
    uint64_t x = (uint64_t)steps;
    for (long i = 0; i < steps; i++)
        x = x * 6364136223846793005ULL + 1442695040888963407ULL;
    count[id].sink += x;
}

static long phase_now(void) {
    return (long)((now_ns() - started_ns) / 1000000 / (uint64_t)opt_phase_ms);
}

/* Sense-reversing centralized spin barrier: the spinning is the point.
 * The last thread to arrive also notes the phase (for `phases`), so every
 * thread leaves the crossing with the same one. */
static struct { long count, waiting, phase; int sense; } bar;

static void barrier_wait(int *local_sense) {
    *local_sense = !*local_sense;
    if (__atomic_add_fetch(&bar.waiting, 1, __ATOMIC_ACQ_REL) == bar.count) {
        __atomic_store_n(&bar.waiting, 0, __ATOMIC_RELAXED);
        __atomic_store_n(&bar.phase, phase_now(), __ATOMIC_RELAXED);
        __atomic_store_n(&bar.sense, *local_sense, __ATOMIC_RELEASE);
    } else {
        while (__atomic_load_n(&bar.sense, __ATOMIC_ACQUIRE) != *local_sense)
            __builtin_ia32_pause();
    }
}

static void pin_self(long cpu) {
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET((int)cpu, &set);
    if (sched_setaffinity(0, sizeof set, &set) != 0 || sched_getcpu() != (int)cpu) {
        live->t[cpu].errors++;
        printf("cosched-error pin_self cpu=%ld: %s\n", cpu, sched_getcpu() < 0 ? "no cpu" : "not pinned");
    }
}

static void *barrier_thread(void *arg) {
    long id = (long)arg;
    int sense = 0;
    for (;;) {
        compute(id, opt_chunk);
        barrier_wait(&sense);
        count_iter(id);
    }
    return NULL;
}

/* deadline: steps per chunk calibrated once, so a chunk takes chunk_ms when the vCPU runs */
static long deadline_steps;
static uint64_t chunks_done;      /* all threads' completed chunks */

/* In step, every sibling completes one chunk while this thread completes
 * one, so the global count grows by the number of threads between two of
 * its completions; more means a sibling ran while this one did not. */
static void *deadline_thread(void *arg) {
    long id = (long)arg;
    uint64_t last = 0;
    for (;;) {
        compute(id, deadline_steps);
        uint64_t now = __atomic_add_fetch(&chunks_done, 1, __ATOMIC_ACQ_REL);
        if (last && now - last > (uint64_t)opt_threads)
            live->t[id].missed++;
        last = now;
        count_iter(id);
    }
    return NULL;
}

static volatile int lock;

static void *spinlock_thread(void *arg) {
    long id = (long)arg;
    for (;;) {
        while (__atomic_exchange_n(&lock, 1, __ATOMIC_ACQUIRE))
            while (__atomic_load_n(&lock, __ATOMIC_RELAXED))
                __builtin_ia32_pause();
        compute(id, opt_cs);
        __atomic_store_n(&lock, 0, __ATOMIC_RELEASE);
        count_iter(id);
        compute(id, opt_chunk);
    }
    return NULL;
}

static double *mat, *orig;
static long check_row;

static void lu_init(void) {
    long n = opt_n;
    for (long i = 0; i < n; i++)
        for (long j = 0; j < n; j++)
            mat[i * n + j] = (i == j) ? n + 1.0 : 1.0 / (1.0 + i + j);
}

/* a -= l * u on b x b blocks at (bi, bj), (bi, bk), (bk, bj) */
static void lu_update(long bi, long bj, long bk) {
    long n = opt_n, b = opt_b;
    for (long i = bi * b; i < (bi + 1) * b; i++)
        for (long k = bk * b; k < (bk + 1) * b; k++) {
            double l = mat[i * n + k];
            for (long j = bj * b; j < (bj + 1) * b; j++)
                mat[i * n + j] -= l * mat[k * n + j];
        }
}

static void lu_diag(long bk) {
    long n = opt_n, b = opt_b, lo = bk * b, hi = lo + b;
    for (long k = lo; k < hi; k++)
        for (long i = k + 1; i < hi; i++) {
            mat[i * n + k] /= mat[k * n + k];
            for (long j = k + 1; j < hi; j++)
                mat[i * n + j] -= mat[i * n + k] * mat[k * n + j];
        }
}

static void lu_perimeter(long bi, long bk, int column) {
    /* column blocks (bi, bk): L part; row blocks (bk, bi): U part */
    long n = opt_n, b = opt_b, lo = bk * b;
    for (long k = lo; k < lo + b; k++)
        for (long r = 0; r < b; r++) {
            if (column) {
                long i = bi * b + r;
                mat[i * n + k] /= mat[k * n + k];
                for (long j = k + 1; j < lo + b; j++)
                    mat[i * n + j] -= mat[i * n + k] * mat[k * n + j];
            } else {
                long j = bi * b + r;
                for (long i = k + 1; i < lo + b; i++)
                    mat[i * n + j] -= mat[i * n + k] * mat[k * n + j];
            }
        }
}

/* relative residual of row r of L*U against the original (L unit lower, U upper, in place) */
static double lu_residual(long r) {
    long n = opt_n;
    double worst = 0.0;
    for (long j = 0; j < n; j++) {
        double sum = 0.0;
        for (long k = 0; k <= (r < j ? r : j); k++)
            sum += (k == r ? 1.0 : mat[r * n + k]) * mat[k * n + j];
        double a = orig[r * n + j], d = (sum - a) / (a != 0.0 ? a : 1.0);
        if (d < 0) d = -d;
        if (d > worst) worst = d;
    }
    return worst;
}

static void *lu_thread(void *arg) {
    long id = (long)arg, nb = opt_n / opt_b, p = opt_threads;
    int sense = 0;
    for (;;) {
        if (id == 0)
            lu_init();
        barrier_wait(&sense);
        for (long k = 0; k < nb; k++) {
            if (id == 0)
                lu_diag(k);
            barrier_wait(&sense);
            for (long i = k + 1 + id; i < nb; i += p) {
                lu_perimeter(i, k, 1);
                lu_perimeter(i, k, 0);
            }
            barrier_wait(&sense);
            for (long t = id; t < (nb - k - 1) * (nb - k - 1); t += p)
                lu_update(k + 1 + t / (nb - k - 1), k + 1 + t % (nb - k - 1), k);
            barrier_wait(&sense);
        }
        if (id == 0) {
            double res = lu_residual(check_row);
            if (!(res <= 1e-9)) {
                live->t[0].errors++;
                printf("cosched-error lu row=%ld residual=%g\n", check_row, res);
            }
            check_row = (check_row + 1) % opt_n;
            count_iter(0);
        }
    }
    return NULL;
}

static void *ep_thread(void *arg) {
    long id = (long)arg;
    for (;;) {
        compute(id, opt_chunk);
        count_iter(id);
    }
    return NULL;
}

/* exec: the command (argv from exec_argv), and where each '|' split it */
static char **exec_argv;
static int exec_argc;

static pid_t spawn(char **argv, int in, int out) {
    pid_t pid = fork();
    if (pid != 0)
        return pid;
    cpu_set_t all;
    CPU_ZERO(&all);
    for (int c = 0; c < CPU_SETSIZE; c++)
        CPU_SET(c, &all);
    sched_setaffinity(0, sizeof all, &all);      /* the worker is pinned: its children are not */
    int null = open("/dev/null", O_RDWR);
    dup2(in >= 0 ? in : null, 0);
    dup2(out >= 0 ? out : null, 1);
    dup2(null, 2);
    for (int fd = 3; fd < 64; fd++)
        close(fd);
    execv(argv[0], argv);
    _exit(127);
}

static void *exec_thread(void *arg) {
    long id = (long)arg;
    static char *cmds[16][64];
    int n = 0, k = 0;
    for (int i = 0; i < exec_argc && n < 16; i++) {
        if (!strcmp(exec_argv[i], "|")) {
            cmds[n][k] = NULL;
            n++, k = 0;
        } else if (k < 63) {
            cmds[n][k++] = exec_argv[i];
        }
    }
    cmds[n++][k] = NULL;
    int said = 0;
    for (;;) {
        pid_t pids[16];
        int in = -1, ok = 1;
        for (int c = 0; c < n; c++) {
            int fds[2] = {-1, -1};
            if (c + 1 < n && pipe(fds))
                ok = 0;
            pids[c] = spawn(cmds[c], in, fds[1]);
            if (in >= 0)
                close(in);
            if (fds[1] >= 0)
                close(fds[1]);
            in = fds[0];
        }
        for (int c = 0; c < n; c++) {
            int status = 0;
            if (pids[c] < 0 || waitpid(pids[c], &status, 0) < 0 || !WIFEXITED(status) || WEXITSTATUS(status))
                ok = 0;
        }
        if (ok) {
            count_iter(id);
        } else {
            live->t[id].errors++;
            if (!said++)
                printf("cosched-error exec %s failed\n", cmds[0][0]);
        }
    }
    return NULL;
}

static void make_data(void) {
    static const char *words[] = {"scheduler", "vcpu", "gang", "barrier", "the", "of", "lock", "host", "guest",
                                  "slot", "thread", "cpu", "and", "a", "to", "run"};
    FILE *f = fopen("/data", "w");
    if (!f)
        return;
    uint64_t x = 12345;
    for (long n = 0; n < opt_data_kib << 10;) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        n += fprintf(f, "%s%s", words[(x >> 33) % 16], (x >> 40) % 11 ? " " : "\n");
    }
    fclose(f);
}

static void *blocking_thread(void *arg) {
    long id = (long)arg;
    struct timespec ts = {opt_sleep_us / 1000000, (opt_sleep_us % 1000000) * 1000};
    for (;;) {
        compute(id, opt_chunk);
        nanosleep(&ts, NULL);
        count_iter(id);
    }
    return NULL;
}

/* Barrier phases end at a crossing (all threads agree); blocking phases end
 * for each thread when its clock says so, and the barrier then waits for all. */
static void *phases_thread(void *arg) {
    long id = (long)arg;
    int sense = 0;
    struct timespec ts = {opt_sleep_us / 1000000, (opt_sleep_us % 1000000) * 1000};
    for (;;) {
        do {
            compute(id, opt_chunk);
            barrier_wait(&sense);
            count_iter(id);
        } while (__atomic_load_n(&bar.phase, __ATOMIC_RELAXED) % 2 == 0);
        while (phase_now() % 2 == 1) {
            compute(id, opt_chunk);
            nanosleep(&ts, NULL);
            count_iter(id);
        }
    }
    return NULL;
}

static int ping[2], pong[2];

static void *pingpong_thread(void *arg) {
    long id = (long)arg;
    char c = 0;
    for (;;) {
        if (id == 0) {
            if (write(ping[1], &c, 1) != 1 || read(pong[0], &c, 1) != 1)
                break;
            count_iter(0);
        } else {
            if (read(ping[0], &c, 1) != 1 || write(pong[1], &c, 1) != 1)
                break;
        }
    }
    for (;;)
        sleep(3600);
    return NULL;
}

static void *idle_thread(void *arg) {
    (void)arg;
    for (;;)
        sleep(3600);
    return NULL;
}

static long online_cpus(void) {
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) != 0)
        return 1;
    return CPU_COUNT(&set);
}

struct workload { const char *name; void *(*fn)(void *); int reports_missed; };

static const struct workload workloads[] = {
    {"barrier", barrier_thread, 0}, {"deadline", deadline_thread, 1}, {"spinlock", spinlock_thread, 0},
    {"lu", lu_thread, 0}, {"ep", ep_thread, 0}, {"blocking", blocking_thread, 0},
    {"pingpong", pingpong_thread, 0}, {"idle", idle_thread, 0}, {"phases", phases_thread, 0},
    {"exec", exec_thread, 0},
};

struct start { const struct workload *w; long id; };

static void *start_worker(void *arg) {
    struct start *s = arg;
    pin_self(s->id);
    return s->w->fn((void *)s->id);
}

/* The result line, printed by whichever reporter claims a slot (below). */
static const char *workload_name;
static const struct workload *workload;

static void report(void) {
    uint64_t iters = 0, missed = 0, errors = 0, hist[HIST_BUCKETS] = {0};
    for (long i = 0; i < opt_threads; i++) {
        iters += live->t[i].iters;
        missed += live->t[i].missed;
        errors += live->t[i].errors;
        for (int b = 0; b < HIST_BUCKETS; b++)
            hist[b] += count[i].hist[b];
    }
    char line[4096], *p = line, *end = line + sizeof line;
    p += snprintf(p, end - p, "cosched-result workload=%s t_ms=%llu iters=%llu", workload_name,
                  (unsigned long long)(now_ns() / 1000000), (unsigned long long)iters);
    if (workload->reports_missed)
        p += snprintf(p, end - p, " missed=%llu", (unsigned long long)missed);
    if (workload->fn == phases_thread)
        p += snprintf(p, end - p, " phase=%ld", phase_now());
    p += snprintf(p, end - p, " errors=%llu", (unsigned long long)errors);
    const char *sep = " hist=";
    for (int b = 0; b < HIST_BUCKETS && end - p > 32; b++)
        if (hist[b]) {
            p += snprintf(p, end - p, "%s%d:%llu", sep, b, (unsigned long long)hist[b]);
            sep = ",";
        }
    puts(line);
}

/* One reporter per vCPU, pinned there, all sleeping until the next report
 * slot; the first to wake claims it and prints. A guest whose host starves
 * one vCPU (its timers fire only when it runs) still reports on time from
 * another, so the host sees its progress over the whole interval. */
static uint64_t next_report_ns;

static void *reporter_thread(void *arg) {
    pin_self((long)arg);
    uint64_t step = (uint64_t)opt_interval_ms * 1000000;
    for (;;) {
        uint64_t due = __atomic_load_n(&next_report_ns, __ATOMIC_ACQUIRE);
        struct timespec ts = {(time_t)(due / 1000000000ull), (long)(due % 1000000000ull)};
        clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL);
        uint64_t next = due + step, now = now_ns();
        while (next <= now)
            next += step;                 /* slots missed while no vCPU ran are skipped */
        if (now >= due && __atomic_compare_exchange_n(&next_report_ns, &due, next, 0, __ATOMIC_ACQ_REL,
                                                      __ATOMIC_ACQUIRE))
            report();
    }
    return NULL;
}

/* Map the live page, lock it, keep the kernel from migrating it, and say
 * where it is in guest-physical memory (from /proc/self/pagemap). */
static void live_setup(void) {
    struct live_page *p = mmap(NULL, sizeof *p, PROT_READ | PROT_WRITE,
                               MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE | MAP_LOCKED, -1, 0);
    if (p == MAP_FAILED) {
        printf("cosched-counters unavailable: mmap failed\n");
        return;
    }
    live = p;
    live->threads = (uint64_t)opt_threads;
    live->magic = LIVE_MAGIC;
    mkdir("/proc", 0555);
    mount("proc", "/proc", "proc", 0, NULL);
    int fd = open("/proc/sys/vm/compact_unevictable_allowed", O_WRONLY);
    if (fd >= 0) {
        if (write(fd, "0\n", 2) != 2)
            printf("cosched-error compact_unevictable_allowed not set\n");
        close(fd);
    }
    uint64_t entry = 0;
    fd = open("/proc/self/pagemap", O_RDONLY);
    if (fd < 0 || pread(fd, &entry, sizeof entry, (off_t)((uintptr_t)p / 4096 * sizeof entry)) != sizeof entry
        || !(entry >> 63) || !(entry & ((1ull << 55) - 1))) {
        printf("cosched-counters unavailable: no page frame in /proc/self/pagemap\n");
    } else {
        printf("cosched-counters gpa=0x%llx magic=0x%llx\n",
               (unsigned long long)((entry & ((1ull << 55) - 1)) * 4096), (unsigned long long)LIVE_MAGIC);
    }
    if (fd >= 0)
        close(fd);
}

/* Power off or reboot once the time given has passed. */
static void *halt_thread(void *arg) {
    (void)arg;
    long ms = opt_poweroff_ms ? opt_poweroff_ms : opt_reboot_ms;
    struct timespec t = {ms / 1000, (ms % 1000) * 1000000L};
    nanosleep(&t, NULL);
    printf(opt_poweroff_ms ? "cosched-poweroff\n" : "cosched-reboot\n");
    sync();
    reboot(opt_poweroff_ms ? RB_POWER_OFF : RB_AUTOBOOT);
    return NULL;
}

int main(int argc, char **argv) {
    const char *name = argc > 1 ? argv[1] : "barrier";
    const struct workload *w = NULL;
    setvbuf(stdout, NULL, _IOLBF, 0);
    for (int i = 2; i < argc; i++) {
        if (argv[i][0] == '/') {          /* exec: the command starts here */
            exec_argv = argv + i, exec_argc = argc - i;
            break;
        }
        char *eq = strchr(argv[i], '=');
        if (!eq) continue;
        long v = strtol(eq + 1, NULL, 10);
        if (!strncmp(argv[i], "threads=", 8)) opt_threads = v;
        else if (!strncmp(argv[i], "chunk=", 6)) opt_chunk = v;
        else if (!strncmp(argv[i], "interval_ms=", 12)) opt_interval_ms = v;
        else if (!strncmp(argv[i], "chunk_ms=", 9)) opt_chunk_ms = v;
        else if (!strncmp(argv[i], "cs=", 3)) opt_cs = v;
        else if (!strncmp(argv[i], "sleep_us=", 9)) opt_sleep_us = v;
        else if (!strncmp(argv[i], "n=", 2)) opt_n = v;
        else if (!strncmp(argv[i], "data_kib=", 9)) opt_data_kib = v;
        else if (!strncmp(argv[i], "b=", 2)) opt_b = v;
        else if (!strncmp(argv[i], "phase_ms=", 9)) opt_phase_ms = v > 0 ? v : opt_phase_ms;
        else if (!strncmp(argv[i], "poweroff_ms=", 12)) opt_poweroff_ms = v;
        else if (!strncmp(argv[i], "reboot_ms=", 10)) opt_reboot_ms = v;
    }
    for (size_t i = 0; i < sizeof workloads / sizeof *workloads; i++)
        if (!strcmp(name, workloads[i].name))
            w = &workloads[i];
    if (!w) {
        printf("cosched-error unknown workload=%s\n", name);
        for (;;) sleep(3600);
    }
    if (opt_threads <= 0)
        opt_threads = online_cpus();
    if (opt_threads > MAX_THREADS)
        opt_threads = MAX_THREADS;
    if (!strcmp(name, "pingpong"))
        opt_threads = 2;
    if (!strcmp(name, "exec")) {
        if (!exec_argc) {
            printf("cosched-error exec needs a command\n");
            for (;;) sleep(3600);
        }
        opt_threads = 1;
    }
    if (opt_b <= 0 || opt_n % opt_b)
        opt_b = 16, opt_n = 128;
    bar.count = opt_threads;
    live_setup();
    if (!strcmp(name, "exec"))
        make_data();
    if (!strcmp(name, "deadline")) {
        /* The fastest of many short trials: a trial the host preempted (other
         * guests run meanwhile) only reads slower, so every guest arrives at
         * the same chunk, and chunks of different guests compare. */
        uint64_t best = UINT64_MAX;
        for (int trial = 0; trial < 50; trial++) {
            uint64_t t0 = now_ns();
            compute(0, 20000);
            uint64_t took = now_ns() - t0;
            if (took < best)
                best = took;
        }
        deadline_steps = (long)(20000ull * 1000000ull * (uint64_t)opt_chunk_ms / (best + 1));
    }
    if (!strcmp(name, "lu")) {
        mat = malloc(sizeof(double) * opt_n * opt_n);
        orig = malloc(sizeof(double) * opt_n * opt_n);
        lu_init();
        for (long i = 0; i < opt_n * opt_n; i++)
            orig[i] = mat[i];
    }
    if (pipe(ping) || pipe(pong))
        return 1;
    started_ns = now_ns();
    printf("cosched-ready workload=%s threads=%ld chunk=%ld\n", name, opt_threads, opt_chunk);
    static struct start starts[MAX_THREADS];
    pthread_t tid;
    for (long i = 0; i < opt_threads; i++) {
        starts[i] = (struct start){w, i};
        pthread_create(&tid, NULL, start_worker, &starts[i]);
    }
    workload_name = name;
    workload = w;
    long cpus = online_cpus();
    next_report_ns = now_ns() + (uint64_t)opt_interval_ms * 1000000;
    for (long i = 0; i < cpus && i < MAX_THREADS; i++)
        pthread_create(&tid, NULL, reporter_thread, (void *)i);
    if (opt_poweroff_ms > 0 || opt_reboot_ms > 0)
        pthread_create(&tid, NULL, halt_thread, NULL);
    for (;;)
        pause();
}
