/*
 * A synthetic guest: a process that looks like QEMU to cosched's discovery,
 * so that hundreds of vCPUs fit on a small test host.
 *
 * Started (by testbed/synthetic.py) with argv[0] "qemu-system-x86_64" and
 *
 *     -name guest=NAME,debug-threads=on -uuid UUID [-id VMID]
 *     -smp N -workload spin|barrier|sleep [-sleep-ms MS] [-parent PID]
 *
 * it runs N threads named "CPU <i>/KVM", as QEMU names vCPU threads, each
 * running the workload, and its main thread is named like QEMU's. The
 * caller moves the threads into per-vCPU cgroups laid out as libvirt lays
 * them out; the program itself never touches cgroups or scheduling.
 *
 *   spin     each thread computes without pause: always runnable;
 *   barrier  compute 20,000 steps, then meet the other threads at a spin
 *            barrier: threads that do not run together make no progress;
 *   sleep    compute a little, then sleep (-sleep-ms, default 1 ms): mostly idle.
 *
 * Every second the main thread prints "synthetic iters=<total>" (crossings
 * for barrier, loops otherwise) on stdout, flushed. It exits on SIGTERM.
 * With -parent it is killed when its parent (PID, the thread that started
 * it) ends, however that ends: a test or benchmark killed by a signal
 * leaves no guest spinning behind it.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <sys/prctl.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define MAX_VCPUS 1024
#define STEPS 20000

static int nthreads;
static const char *workload = "sleep";
static long sleep_ns = 1000000;
static atomic_ulong iters[MAX_VCPUS];
static atomic_uint arrived;
static atomic_uint generation;
static volatile sig_atomic_t stop;

static unsigned long compute(unsigned long x, int steps)
{
    for (int i = 0; i < steps; i++)
        x = x * 6364136223846793005UL + 1442695040888963407UL;
    return x;
}

static void barrier_wait(void)
{
    unsigned gen = atomic_load(&generation);
    if (atomic_fetch_add(&arrived, 1) + 1 == (unsigned)nthreads) {
        atomic_store(&arrived, 0);
        atomic_fetch_add(&generation, 1);
        return;
    }
    while (atomic_load(&generation) == gen && !stop)
        ;
}

static void *vcpu(void *arg)
{
    long index = (long)arg;
    unsigned long x = (unsigned long)index + 1;

    while (!stop) {
        if (strcmp(workload, "spin") == 0) {
            x = compute(x, STEPS);
        } else if (strcmp(workload, "barrier") == 0) {
            x = compute(x, STEPS);
            barrier_wait();
        } else {
            struct timespec pause = {sleep_ns / 1000000000, sleep_ns % 1000000000};
            x = compute(x, STEPS / 20);
            nanosleep(&pause, NULL);
        }
        atomic_fetch_add(&iters[index], 1);
    }
    return (void *)x;
}

static void on_term(int sig)
{
    (void)sig;
    stop = 1;
}

int main(int argc, char **argv)
{
    pthread_t threads[MAX_VCPUS];

    long parent = 0;

    nthreads = 1;
    for (int i = 1; i + 1 < argc; i++) {
        if (strcmp(argv[i], "-smp") == 0)
            nthreads = atoi(argv[i + 1]);
        else if (strcmp(argv[i], "-workload") == 0)
            workload = argv[i + 1];
        else if (strcmp(argv[i], "-sleep-ms") == 0)
            sleep_ns = atol(argv[i + 1]) * 1000000L;
        else if (strcmp(argv[i], "-parent") == 0)
            parent = atol(argv[i + 1]);
    }
    /* SIGKILL: a vCPU thread may be frozen, and then a SIGTERM'd process never ends */
    if (parent && (prctl(PR_SET_PDEATHSIG, SIGKILL) != 0 || getppid() != parent)) {
        fprintf(stderr, "synthetic-qemu: parent %ld is gone\n", parent);
        return 1;
    }
    if (nthreads < 1 || nthreads > MAX_VCPUS) {
        fprintf(stderr, "synthetic-qemu: -smp must be 1..%d\n", MAX_VCPUS);
        return 2;
    }
    signal(SIGTERM, on_term);
    signal(SIGINT, on_term);
    pthread_setname_np(pthread_self(), "qemu-system-x86");
    for (long i = 0; i < nthreads; i++) {
        char name[16];
        if (pthread_create(&threads[i], NULL, vcpu, (void *)i) != 0) {
            perror("synthetic-qemu: pthread_create");
            return 1;
        }
        snprintf(name, sizeof name, "CPU %ld/KVM", i);     /* named before "ready" is printed */
        pthread_setname_np(threads[i], name);
    }
    printf("synthetic ready vcpus=%d workload=%s\n", nthreads, workload);
    fflush(stdout);
    while (!stop) {
        unsigned long total = 0;
        sleep(1);
        for (int i = 0; i < nthreads; i++)
            total += atomic_load(&iters[i]);
        printf("synthetic iters=%lu\n", total);
        fflush(stdout);
    }
    for (int i = 0; i < nthreads; i++)
        pthread_join(threads[i], NULL);
    return 0;
}
