// Kernels for the preemption benchmark. `spin`: each block busy-waits for a
// set time (on the GPU's nanosecond global timer) and counts how often it ran (lost or redone work
// shows as a count other than one). `probe`: a short kernel whose blocks tell
// the host, through host-mapped memory, that the kernel started (flags[0]) and
// that its last block finished (flags[1]); `trial` tags the signals, so
// nothing needs resetting between trials.
__device__ __forceinline__ unsigned long long now_ns() {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}
extern "C" __global__ void spin(unsigned int* __restrict__ runs, unsigned long long block_ns) {
    const unsigned long long t0 = now_ns();
    if (threadIdx.x == 0) atomicAdd(&runs[blockIdx.x], 1u);
    while (now_ns() - t0 < block_ns) { }
}
extern "C" __global__ void probe(volatile unsigned int* host_flags, unsigned int* __restrict__ done_blocks,
                                 float* __restrict__ work, unsigned int iters, unsigned int trial) {
    if (threadIdx.x == 0) {
        host_flags[0] = trial;
        __threadfence_system();
    }
    float v = (float)threadIdx.x;
    for (unsigned int i = 0; i < iters; ++i) v = fmaf(v, 0.999f, 0.5f);
    work[blockIdx.x * blockDim.x + threadIdx.x] = v;
    __syncthreads();
    if (threadIdx.x == 0) {
        __threadfence();
        // done_blocks counts over all trials: the last block of trial t sees t * gridDim.x - 1.
        if (atomicAdd(done_blocks, 1u) == trial * gridDim.x - 1u) {
            host_flags[1] = trial;
            __threadfence_system();
        }
    }
}
