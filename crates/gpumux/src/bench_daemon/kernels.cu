// Kernels of `gpumux bench daemon` (docs/daemon.md, "Measured against MPS and
// time slicing"). The same source runs natively (NVRTC, plain launches) and
// through gpumuxd (transformed into preemptible workers), so every setting
// runs the same code. Each kernel's output is deterministic, so the bench
// compares it bitwise with the native run alone.

// GPU time in ns (the SM's global timer, the same on every SM).
static __device__ __forceinline__ unsigned long long bench_now() {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

// Every block spins for `ns` of GPU time, then counts itself in `done`: the
// priority experiment's urgent kernel and its low-priority filler. `done`
// proves that no block was lost or run twice.
// With `pause_ns`, the threads sleep that long between clock reads, leaving
// the SM's issue slots to other warps (`gpumux bench daemon --lp-pause-ns`).
extern "C" __global__ void spin(unsigned long long ns, unsigned int* done, unsigned int pause_ns) {
    const unsigned long long t0 = bench_now();
    while (bench_now() - t0 < ns) {
        if (pause_ns != 0u) __nanosleep(pause_ns);
    }
    __syncthreads();
    if (threadIdx.x == 0) atomicAdd(done, 1u);
}

// Nothing: what a launch costs by itself.
extern "C" __global__ void empty() {}

// Inputs: pseudo-random floats in [0, 1) (a multiplicative hash of the index).
extern "C" __global__ void init_f32(float* p, unsigned long long n, unsigned int seed) {
    for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; i < n;
         i += (unsigned long long)gridDim.x * blockDim.x) {
        const unsigned int h = ((unsigned int)i ^ seed) * 2654435761u;
        p[i] = (float)(h >> 8) * (1.0f / 16777216.0f);
    }
}

// Inputs: pseudo-random bytes.
extern "C" __global__ void init_bytes(unsigned char* p, unsigned long long n, unsigned int seed) {
    for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; i < n;
         i += (unsigned long long)gridDim.x * blockDim.x) {
        p[i] = (unsigned char)((((unsigned int)i ^ seed) * 2654435761u) >> 24);
    }
}

// STREAM triad, a = b + s * c, one float4 per thread: memory-bound.
extern "C" __global__ void triad(float4* a, const float4* b, const float4* c, float s, unsigned int n4) {
    const unsigned int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n4) {
        const float4 x = b[i], y = c[i];
        a[i] = make_float4(x.x + s * y.x, x.y + s * y.y, x.z + s * y.z, x.w + s * y.w);
    }
}

// Dependent FMA chains on registers, four per thread: compute-bound, no
// memory traffic but one store per thread.
extern "C" __global__ void fma_loop(float* out, unsigned int iters) {
    float a = threadIdx.x * 1e-3f, b = blockIdx.x * 1e-3f, c = 0.5f, d = 0.25f;
#pragma unroll 4
    for (unsigned int k = 0; k < iters; ++k) {
        a = fmaf(a, 0.9999f, 0.0001f);
        b = fmaf(b, 0.9998f, 0.0002f);
        c = fmaf(c, 0.9997f, 0.0003f);
        d = fmaf(d, 0.9996f, 0.0004f);
    }
    out[blockIdx.x * blockDim.x + threadIdx.x] = a + b + c + d;
}

// C = A B for n x n matrices (n a multiple of 16), 16 x 16 tiles in shared
// memory: the textbook tiled SGEMM, compute-bound with shared-memory traffic.
extern "C" __global__ void sgemm(const float* A, const float* B, float* C, int n) {
    __shared__ float As[16][16];
    __shared__ float Bs[16][16];
    const int row = blockIdx.y * 16 + threadIdx.y, col = blockIdx.x * 16 + threadIdx.x;
    float acc = 0.0f;
    for (int k0 = 0; k0 < n; k0 += 16) {
        As[threadIdx.y][threadIdx.x] = A[row * n + k0 + threadIdx.x];
        Bs[threadIdx.y][threadIdx.x] = B[(k0 + threadIdx.y) * n + col];
        __syncthreads();
#pragma unroll
        for (int k = 0; k < 16; ++k) acc = fmaf(As[threadIdx.y][k], Bs[k][threadIdx.x], acc);
        __syncthreads();
    }
    C[row * n + col] = acc;
}

// bins[v] += number of bytes equal to v, through a per-block shared
// histogram merged with global atomics: shared-memory atomics plus a read
// stream. Counts accumulate over launches (integers: order does not matter).
extern "C" __global__ void histogram(const unsigned char* data, unsigned int n, unsigned int* bins) {
    __shared__ unsigned int local[256];
    for (unsigned int b = threadIdx.x; b < 256; b += blockDim.x) local[b] = 0;
    __syncthreads();
    for (unsigned int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
        atomicAdd(&local[data[i]], 1u);
    __syncthreads();
    for (unsigned int b = threadIdx.x; b < 256; b += blockDim.x)
        if (local[b]) atomicAdd(&bins[b], local[b]);
}
