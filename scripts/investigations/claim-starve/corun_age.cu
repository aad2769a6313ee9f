// Two kernels' workers on the same SMs: does it matter which came first?
//
// claim_starve.cu found that the H100's warp schedulers favour the warps that
// entered an SM first: of 8 persistent workers per SM beside busy-spinning
// warps, the first in loses 0.2 µs a 20 µs block and the last 17.6. Here a
// memory-bound kernel (the daemon bench's STREAM triad, one float4 a thread)
// and a compute-bound one (its FMA loop, four chains a thread) run as
// persistent workers that claim blocks with an atomic, as gpumux's do, each
// with a fixed number of workers per SM, launched one after the other on two
// streams (the second 50 µs after the first). Each counts the blocks it
// finishes in a 20 ms window while both run; alone, each has every SM's 8
// slots. Printed per setting: each kernel's rate over its rate alone, their
// sum (STP over the window) and the lower over the higher (fairness). "own
// SMs": each kernel on half the SMs with all their slots.
//
//   nvcc -O3 -arch=sm_90 -o corun_age corun_age.cu && ./corun_age
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>
#include <cuda_runtime.h>

#define CHECK(x) do { cudaError_t e = (x); if (e != cudaSuccess) { \
    fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e)); exit(1); } } while (0)

__device__ __forceinline__ unsigned long long gtime() {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t) :: "memory");
    return t;
}
__device__ __forceinline__ unsigned smid() {
    unsigned s;
    asm volatile("mov.u32 %0, %%smid;" : "=r"(s));
    return s;
}

__global__ void now(unsigned long long* out) { *out = gtime(); }

__global__ void sleep_for(unsigned long long ns) {
    const unsigned long long t0 = gtime();
    while (gtime() - t0 < ns) __nanosleep(1000);
}

enum Kind { TRIAD = 0, FMA = 1 };
static const unsigned TRIAD_BLOCKS = 1u << 16;  // 16 Mi float4 per array, 256 a block
static const unsigned FMA_ITERS = 1024;

struct Work {
    float4* a;
    const float4* b;
    const float4* c;
    float* out;
};

// A persistent worker: claims a block, runs it, until `stop_at`; counts the
// blocks that ended inside [start_at, stop_at). Workers on SMs outside
// [sm_lo, sm_hi) or beyond `per_sm` on their SM leave at once.
__global__ void __launch_bounds__(256, 8) worker(int kind, Work w, unsigned long long start_at, unsigned long long stop_at,
                       unsigned long long* claim, unsigned long long* counted, unsigned* sm_count,
                       unsigned sm_lo, unsigned sm_hi, unsigned per_sm, unsigned* placed, unsigned chunk) {
    __shared__ unsigned slot[2];
    const unsigned s = smid();
    if (threadIdx.x == 0) {
        unsigned go = 0;
        if (s >= sm_lo && s < sm_hi && atomicAdd(&sm_count[s], 1u) < per_sm) go = 1;
        if (go) atomicAdd(&placed[s], 1u);
        slot[1] = go;
    }
    __syncthreads();
    if (slot[1] == 0u) return;
    unsigned long long mine = 0;
    for (;;) {
        if (threadIdx.x == 0) {
            const unsigned long long t = gtime();
            slot[1] = t < stop_at ? 1u : 0u;
            slot[0] = (unsigned)atomicAdd(claim, (unsigned long long)chunk);
        }
        __syncthreads();
        if (slot[1] == 0u) break;
        const unsigned i = slot[0];
        __syncthreads();
        if (kind == TRIAD) {
            // `chunk` blocks a claim (no barrier between them: the body has none).
            for (unsigned j = 0; j < chunk; ++j) {
                const unsigned k = ((i + j) % TRIAD_BLOCKS) * 256u + threadIdx.x;
                const float4 x = w.b[k], y = w.c[k];
                w.a[k] = make_float4(x.x + 3.f * y.x, x.y + 3.f * y.y, x.z + 3.f * y.z, x.w + 3.f * y.w);
            }
        } else {
            float a = threadIdx.x * 1e-3f, b = i * 1e-3f, c = 0.5f, d = 0.25f;
#pragma unroll 4
            for (unsigned k = 0; k < FMA_ITERS; ++k) {
                a = fmaf(a, 0.9999f, 0.0001f);
                b = fmaf(b, 0.9998f, 0.0002f);
                c = fmaf(c, 0.9997f, 0.0003f);
                d = fmaf(d, 0.9996f, 0.0004f);
            }
            w.out[(i % 4096u) * 256u + threadIdx.x] = a + b + c + d;
        }
        __syncthreads();
        if (threadIdx.x == 0) {
            const unsigned long long t = gtime();
            if (t >= start_at && t < stop_at) mine += kind == TRIAD ? chunk : 1u;
        }
    }
    if (threadIdx.x == 0) atomicAdd(counted, mine);
}

struct Side {
    int kind;
    unsigned per_sm, sm_lo, sm_hi;
    unsigned chunk = 1;  // blocks a claim (the triad only)
};

struct Gpu {
    int sms;
    Work w;
    unsigned long long *claim, *counted, *tnow;
    unsigned *sm_count, *placed;
    cudaStream_t s[2];
};

// Runs one or two kernels; returns each one's blocks per ms in the window.
static std::vector<double> run(Gpu& g, const std::vector<Side>& sides, std::vector<double>* mean_placed) {
    const double window_ms = 20.0;
    CHECK(cudaMemset(g.claim, 0, 64));
    CHECK(cudaMemset(g.counted, 0, 64));
    CHECK(cudaMemset(g.sm_count, 0, 2 * 1024 * 4));
    CHECK(cudaMemset(g.placed, 0, 2 * 1024 * 4));
    now<<<1, 1>>>(g.tnow);
    CHECK(cudaDeviceSynchronize());
    unsigned long long t0 = 0;
    CHECK(cudaMemcpy(&t0, g.tnow, 8, cudaMemcpyDeviceToHost));
    // Both launched and resident well before the window opens (the host's
    // launches take µs; the second waits 50 µs behind a sleeper).
    const unsigned long long start_at = t0 + 2000000ull, stop_at = start_at + (unsigned long long)(window_ms * 1e6);
    for (size_t k = 0; k < sides.size(); ++k) {
        const Side& d = sides[k];
        if (k > 0) sleep_for<<<1, 32, 0, g.s[k]>>>(50000ull);
        worker<<<g.sms * 8, 256, 0, g.s[k]>>>(d.kind, g.w, start_at, stop_at, g.claim + 8 * k, g.counted + k,
                                            g.sm_count + 1024 * k, d.sm_lo, d.sm_hi, d.per_sm, g.placed + 1024 * k, d.chunk);
        CHECK(cudaGetLastError());
    }
    CHECK(cudaDeviceSynchronize());
    std::vector<unsigned long long> counted(2);
    CHECK(cudaMemcpy(counted.data(), g.counted, 16, cudaMemcpyDeviceToHost));
    std::vector<unsigned> placed(2048);
    CHECK(cudaMemcpy(placed.data(), g.placed, placed.size() * 4, cudaMemcpyDeviceToHost));
    std::vector<double> rates;
    mean_placed->clear();
    for (size_t k = 0; k < sides.size(); ++k) {
        rates.push_back(counted[k] / window_ms);
        double p = 0;
        for (unsigned s = sides[k].sm_lo; s < sides[k].sm_hi; ++s) p += placed[1024 * k + s];
        mean_placed->push_back(p / (sides[k].sm_hi - sides[k].sm_lo));
    }
    return rates;
}

int main() {
    Gpu g;
    CHECK(cudaDeviceGetAttribute(&g.sms, cudaDevAttrMultiProcessorCount, 0));
    int per_sm = 0;
    CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, worker, 256, 0));
    printf("%d SMs, %d workers of 256 per SM\n", g.sms, per_sm);
    const size_t bytes = (size_t)TRIAD_BLOCKS * 256 * 16;
    CHECK(cudaMalloc(&g.w.a, bytes));
    CHECK(cudaMalloc((void**)&g.w.b, bytes));
    CHECK(cudaMalloc((void**)&g.w.c, bytes));
    CHECK(cudaMemset(g.w.a, 0, bytes));
    CHECK(cudaMemset((void*)g.w.b, 0, bytes));
    CHECK(cudaMemset((void*)g.w.c, 0, bytes));
    CHECK(cudaMalloc(&g.w.out, 4096 * 256 * 4));
    CHECK(cudaMalloc(&g.claim, 64 * 8));
    CHECK(cudaMalloc(&g.counted, 64));
    CHECK(cudaMalloc(&g.tnow, 8));
    CHECK(cudaMalloc(&g.sm_count, 2 * 1024 * 4));
    CHECK(cudaMalloc(&g.placed, 2 * 1024 * 4));
    CHECK(cudaStreamCreateWithFlags(&g.s[0], cudaStreamNonBlocking));
    CHECK(cudaStreamCreateWithFlags(&g.s[1], cudaStreamNonBlocking));
    const unsigned all = g.sms, half = g.sms / 2;
    std::vector<double> placed;
    // Warm-up.
    run(g, {{TRIAD, 8, 0, all}}, &placed);
    const double triad_alone = run(g, {{TRIAD, 8, 0, all}}, &placed)[0];
    const double fma_alone = run(g, {{FMA, 8, 0, all}}, &placed)[0];
    printf("alone: triad %.1f blocks/ms, FMA %.1f blocks/ms\n\n", triad_alone, fma_alone);
    struct Setting { const char* name; std::vector<Side> sides; };
    std::vector<Setting> settings = {
        {"own SMs: triad, FMA", {{TRIAD, 8, 0, half}, {FMA, 8, half, all}}},
        {"4 + 4: triad first", {{TRIAD, 4, 0, all}, {FMA, 4, 0, all}}},
        {"4 + 4: FMA first", {{FMA, 4, 0, all}, {TRIAD, 4, 0, all}}},
        {"6 triad + 2 FMA: triad first", {{TRIAD, 6, 0, all}, {FMA, 2, 0, all}}},
        {"6 triad + 2 FMA: FMA first", {{FMA, 2, 0, all}, {TRIAD, 6, 0, all}}},
        {"2 triad + 6 FMA: triad first", {{TRIAD, 2, 0, all}, {FMA, 6, 0, all}}},
        {"2 triad + 6 FMA: FMA first", {{FMA, 6, 0, all}, {TRIAD, 2, 0, all}}},
        {"7 triad + 1 FMA: triad first", {{TRIAD, 7, 0, all}, {FMA, 1, 0, all}}},
        {"7 triad + 1 FMA: FMA first", {{FMA, 1, 0, all}, {TRIAD, 7, 0, all}}},
    };
    // Uneven splits of the SMs: the memory-bound kernel needs few SMs.
    static char names[8][48];
    const unsigned triad_sms[] = {11, 17, 22, 33, 44};
    for (int i = 0; i < 5; ++i) {
        snprintf(names[i], sizeof names[i], "own SMs: triad %u, FMA %u", triad_sms[i], all - triad_sms[i]);
        settings.push_back({names[i], {{TRIAD, 8, 0, triad_sms[i]}, {FMA, 8, triad_sms[i], all}}});
    }
    run(g, {{FMA, 8, 0, all}}, &placed);
    // The triad alone on part of the GPU, claiming 1 or 8 blocks at a time.
    const double triad_alone8 = run(g, {{TRIAD, 8, 0, all, 8}}, &placed)[0];
    printf("triad alone, 8 blocks a claim: %.1f blocks/ms (%.3f of 1 a claim)\n", triad_alone8, triad_alone8 / triad_alone);
    printf("%-10s %14s %14s\n", "triad SMs", "1 a claim", "8 a claim");
    for (unsigned n : {11u, 17u, 22u, 33u, 44u, 66u}) {
        const double r1 = run(g, {{TRIAD, 8, 0, n, 1}}, &placed)[0] / triad_alone;
        const double r8 = run(g, {{TRIAD, 8, 0, n, 8}}, &placed)[0] / triad_alone8;
        printf("%-10u %14.3f %14.3f\n", n, r1, r8);
    }
    for (unsigned n : {17u, 22u, 33u}) {
        static char nm[3][48];
        static int i = 0;
        snprintf(nm[i], 48, "own SMs, 8 a claim: triad %u", n);
        settings.push_back({nm[i++], {{TRIAD, 8, 0, n, 8}, {FMA, 8, n, all}}});
    }
    printf("\n");
    printf("%-34s %13s %13s %7s %9s   %s\n", "setting (first launched first)", "triad/alone", "FMA/alone", "STP",
           "fairness", "workers per SM placed (first, second)");
    for (int pass = 0; pass < 2; ++pass) {
        for (const Setting& st : settings) {
            const std::vector<double> r = run(g, st.sides, &placed);
            double tr = 0, fr = 0;
            for (size_t k = 0; k < st.sides.size(); ++k) {
                if (st.sides[k].kind == TRIAD) tr = r[k] / (st.sides[k].chunk == 8 ? triad_alone8 : triad_alone);
                else fr = r[k] / fma_alone;
            }
            printf("%-34s %13.3f %13.3f %7.3f %9.3f   %.2f, %.2f\n", st.name, tr, fr, tr + fr,
                   std::min(tr, fr) / std::max(tr, fr), placed[0], placed.size() > 1 ? placed[1] : 0.0);
        }
        printf("\n");
    }
    return 0;
}
