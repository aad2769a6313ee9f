// What the calls the daemon's hot paths make cost on this host: a monotonic
// clock read (`Instant::now` is clock_gettime(CLOCK_MONOTONIC)) and a
// sched_yield. On a virtual machine the clock's cost depends on the
// clocksource (tsc through the vDSO: tens of ns; kvm-clock or a hypervisor's
// page: more; a clocksource the vDSO cannot read: a system call).
//   cc -O2 -o clock_cost clock_cost.c && ./clock_cost
#include <sched.h>
#include <stdio.h>
#include <time.h>

static double now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e9 + t.tv_nsec;
}

int main(void) {
    const int n = 2000000;
    struct timespec t;
    volatile long sink = 0;
    for (int round = 0; round < 3; round++) {
        double a = now_ns();
        for (int i = 0; i < n; i++) {
            clock_gettime(CLOCK_MONOTONIC, &t);
            sink += t.tv_nsec;
        }
        double b = now_ns();
        for (int i = 0; i < n / 10; i++) sched_yield();
        double c = now_ns();
        printf("clock_gettime(CLOCK_MONOTONIC) %.1f ns; sched_yield %.1f ns\n", (b - a) / n, (c - b) / (n / 10));
    }
    return (int)(sink & 0);
}
