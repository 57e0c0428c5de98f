/*
 * /init of the cosched test guest: runs one multi-threaded workload and
 * reports on the serial console.
 *
 * The kernel passes everything after "--" on its command line to init as
 * argv, so a guest is told what to run by its domain XML:
 *
 *     <cmdline>console=ttyS0 quiet -- barrier threads=2 chunk=20000</cmdline>
 *
 * Workloads (argv[1]):
 *   barrier  threads compute `chunk` LCG steps, then meet at a spin barrier;
 *            one iteration = one barrier crossing by every thread.
 *   idle     threads sleep; the guest only keeps its kernel running.
 *
 * Every `interval_ms` the first thread prints one line that the host parses:
 *
 *     cosched-result workload=barrier t_ms=<guest monotonic ms> iters=<total>
 *
 * `iters` is cumulative, so a reader can take any two lines and divide.
 * Init must never exit (the kernel would panic), so it sleeps forever when
 * the workload is unknown.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static long opt_threads;          /* 0: one per online vCPU */
static long opt_chunk = 20000;    /* LCG steps between barriers */
static long opt_interval_ms = 1000;

static volatile uint64_t sink;

static uint64_t now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void compute(long steps) {
    uint64_t x = (uint64_t)steps;
    for (long i = 0; i < steps; i++)
        x = x * 6364136223846793005ULL + 1442695040888963407ULL;
    sink += x;
}

/* Sense-reversing centralized spin barrier: the spinning is the point. */
static struct {
    long count;
    long waiting;
    int sense;
} bar;

static void barrier_wait(int *local_sense) {
    *local_sense = !*local_sense;
    if (__atomic_add_fetch(&bar.waiting, 1, __ATOMIC_ACQ_REL) == bar.count) {
        __atomic_store_n(&bar.waiting, 0, __ATOMIC_RELAXED);
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
    sched_setaffinity(0, sizeof set, &set);
}

static void *barrier_thread(void *arg) {
    long id = (long)arg;
    int sense = 0;
    uint64_t iters = 0, next = now_ms() + opt_interval_ms;
    pin_self(id);
    for (;;) {
        compute(opt_chunk);
        barrier_wait(&sense);
        iters++;
        if (id == 0 && now_ms() >= next) {
            uint64_t t = now_ms();
            printf("cosched-result workload=barrier t_ms=%llu iters=%llu\n",
                   (unsigned long long)t, (unsigned long long)iters);
            fflush(stdout);
            next = t + opt_interval_ms;
        }
    }
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

int main(int argc, char **argv) {
    const char *workload = argc > 1 ? argv[1] : "barrier";
    void *(*fn)(void *) = NULL;
    setvbuf(stdout, NULL, _IOLBF, 0);
    for (int i = 2; i < argc; i++) {
        char *eq = strchr(argv[i], '=');
        if (!eq) continue;
        long v = strtol(eq + 1, NULL, 10);
        if (!strncmp(argv[i], "threads=", 8)) opt_threads = v;
        else if (!strncmp(argv[i], "chunk=", 6)) opt_chunk = v;
        else if (!strncmp(argv[i], "interval_ms=", 12)) opt_interval_ms = v;
    }
    if (opt_threads <= 0)
        opt_threads = online_cpus();
    if (!strcmp(workload, "barrier")) fn = barrier_thread;
    else if (!strcmp(workload, "idle")) fn = idle_thread;
    if (!fn) {
        printf("cosched-error unknown workload=%s\n", workload);
        for (;;) sleep(3600);
    }
    bar.count = opt_threads;
    printf("cosched-ready workload=%s threads=%ld chunk=%ld\n",
           workload, opt_threads, opt_chunk);
    pthread_t tid;
    for (long i = 1; i < opt_threads; i++)
        pthread_create(&tid, NULL, fn, (void *)i);
    fn((void *)0);
    return 0;
}
