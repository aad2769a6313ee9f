// Kernels of urgent_calls.cpp (compiled to a cubin by run.sh).
extern "C" __global__ void spin(unsigned long long ns) {
    // Each block runs for `ns` of the GPU's global timer, as the daemon
    // bench's urgent and low-priority kernels do.
    unsigned long long t0, t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
    do {
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    } while (t - t0 < ns);
}
