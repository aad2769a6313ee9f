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

// ---- The programs experiment (`programs.rs`): whole programs checked against
// a CPU reference there, so every integer below is computed the same way on
// the host. Inputs come from `bench_hash`, mirrored by `programs::hash`.

// A 32-bit integer mix of index `i` (lowbias32 of i * golden ratio + seed).
static __device__ __forceinline__ unsigned int bench_hash(unsigned int i, unsigned int seed) {
    unsigned int x = i * 0x9e3779b9u + seed;
    x ^= x >> 16;
    x *= 0x7feb352du;
    x ^= x >> 15;
    x *= 0x846ca68bu;
    x ^= x >> 16;
    return x;
}

// p[i] = bench_hash(i, seed) % modulus + offset (wrapping), for i < n.
extern "C" __global__ void init_hash(unsigned int* p, unsigned int n, unsigned int seed, unsigned int modulus,
                                     int offset) {
    for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; i < n;
         i += (unsigned long long)gridDim.x * blockDim.x) {
        p[i] = bench_hash((unsigned int)i, seed) % modulus + (unsigned int)offset;
    }
}

// The wavefront's score matrix before a run, (tiles * 16 + 1) squared, row
// major: the first row and column are the gap penalties of an alignment
// (-gap * index), every other cell a sentinel (1 << 30) that a tile read
// before its neighbours wrote it turns into a wildly wrong score.
extern "C" __global__ void wave_init(int* score, unsigned int tiles, int gap) {
    const unsigned long long m = tiles * 16ull + 1ull;
    for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; i < m * m;
         i += (unsigned long long)gridDim.x * blockDim.x) {
        const unsigned int r = (unsigned int)(i / m), c = (unsigned int)(i % m);
        score[i] = r == 0u ? -gap * (int)c : c == 0u ? -gap * (int)r : (1 << 30);
    }
}

// One anti-diagonal `d` of a Needleman-Wunsch wavefront over tiles x tiles
// tiles of 16 x 16 cells (Rodinia's nw: 16 threads a block, one tile each).
// score[r][c] = max(score[r-1][c-1] + sim[r-1][c-1], score[r-1][c] - gap,
// score[r][c-1] - gap); block b takes tile (lo + b, d - lo - b), reads the
// row above and the column to its left (written by the launches of
// diagonals d-1 and d-2) into shared memory, sweeps the tile's own 31
// anti-diagonals with a barrier after each, and writes the tile back.
extern "C" __global__ void wave_tile(int* score, const int* sim, unsigned int tiles, unsigned int d, int gap) {
    __shared__ int s[17][17];
    __shared__ int ref[16][16];
    const unsigned int m = tiles * 16u + 1u;
    const unsigned int lo = d >= tiles ? d - tiles + 1u : 0u;
    const unsigned int ti = lo + blockIdx.x, tj = d - ti;
    const unsigned int r0 = ti * 16u, c0 = tj * 16u, tx = threadIdx.x;
    for (unsigned int k = 0; k < 16u; ++k) ref[k][tx] = sim[(size_t)(r0 + k) * (m - 1u) + c0 + tx];
    s[0][tx + 1u] = score[(size_t)r0 * m + c0 + tx + 1u];
    s[tx + 1u][0] = score[(size_t)(r0 + tx + 1u) * m + c0];
    if (tx == 0u) s[0][0] = score[(size_t)r0 * m + c0];
    __syncthreads();
    for (unsigned int k = 0; k < 31u; ++k) {
        if (tx <= k && k - tx < 16u) {
            const unsigned int r = tx + 1u, c = k - tx + 1u;
            s[r][c] = max(s[r - 1u][c - 1u] + ref[r - 1u][c - 1u], max(s[r - 1u][c] - gap, s[r][c - 1u] - gap));
        }
        __syncthreads();
    }
    for (unsigned int k = 0; k < 16u; ++k) score[(size_t)(r0 + k + 1u) * m + c0 + tx + 1u] = s[k + 1u][tx + 1u];
}

// One step of a 5-point integer Jacobi smoothing of an n x n grid (zero
// outside): out = (4 * centre + the four neighbours + 4) >> 3, through a
// 16 x 16 shared tile with a one-cell halo and a barrier. Integers, so the
// host's reference is exact; inputs below 2^20 keep every sum in 32 bits.
extern "C" __global__ void jacobi_tile(unsigned int* out, const unsigned int* in, unsigned int n) {
    __shared__ unsigned int t[18][18];
    const unsigned int x = blockIdx.x * 16u + threadIdx.x, y = blockIdx.y * 16u + threadIdx.y;
    const unsigned int lx = threadIdx.x + 1u, ly = threadIdx.y + 1u;
    const bool inside = x < n && y < n;
    const size_t at = (size_t)y * n + x;
    t[ly][lx] = inside ? in[at] : 0u;
    if (threadIdx.x == 0u) t[ly][0] = (inside && x > 0u) ? in[at - 1u] : 0u;
    if (threadIdx.x == 15u) t[ly][17] = (inside && x + 1u < n) ? in[at + 1u] : 0u;
    if (threadIdx.y == 0u) t[0][lx] = (inside && y > 0u) ? in[at - n] : 0u;
    if (threadIdx.y == 15u) t[17][lx] = (inside && y + 1u < n) ? in[at + n] : 0u;
    __syncthreads();
    if (inside)
        out[at] = (4u * t[ly][lx] + t[ly][lx - 1u] + t[ly][lx + 1u] + t[ly - 1u][lx] + t[ly + 1u][lx] + 4u) >> 3;
}

// p[i] += 1 for i < n (wrapping): the copy program's kernel between its two copies.
extern "C" __global__ void add_one(unsigned int* p, unsigned long long n) {
    for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; i < n;
         i += (unsigned long long)gridDim.x * blockDim.x) {
        p[i] += 1u;
    }
}
