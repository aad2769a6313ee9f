// What a worker's claim between two blocks waits for when the SM's other
// warps spin (docs/history/benchmarks.md, "The launch path, and what the
// low-priority client loses": the gap before an SM's next block is 3-35 µs as
// workers, 0.2 natively, when the bench's low-priority blocks busy-spin on
// %globaltimer, and ~1 µs when they pause 100 ns between reads).
//
// Part 1, the pieces: on every SM the first block to arrive is the prober, the
// other seven (256 threads each, 8 per SM) are fillers of one kind. The
// prober's thread 0 times, in SM clock cycles, each piece of the prelude's
// claim (`gmx_claim`): a volatile load of the SM's `gone` word, the 64-bit
// atomicAdd on the claim word, a block barrier, the whole claim (load,
// atomic, shared store, barrier, shared load), and a %globaltimer read.
// Filler kinds: none (the prober alone), a busy spin on %globaltimer (the
// bench's), a busy spin on %clock64, the %globaltimer spin with a 100 ns
// __nanosleep, and an FMA loop that reads the clock every 64 FMAs.
//
// Part 2, what a remedy is worth: a GPU full of fixed-time blocks (as
// `gpumux-cuda-check fill`), natively and through worker loops that differ in
// what comes between two blocks (`worker_fill`: the prelude's claim, without
// its `gone` check, the next claim prefetched, no claim at all, workers that
// leave after a few blocks for fresh ones, a sleep between blocks, and native
// blocks that first read a flag). Rate = native elapsed / elapsed; every
// block is counted once.
//
// Part 3, where the time goes: per warp, natively and as workers that run
// blocks in a fixed order (no claim), each warp's start, spin end and the
// block's end after its barrier; and per worker, the time its blocks took
// beyond their spin by the order in which the workers entered their SM.
// docs/history/benchmarks.md ("Why workers lose beside busy warps", run 173) has the
// results: the H100 favours the warps that entered an SM first.
//
//   nvcc -O3 -arch=sm_90 -o claim_starve claim_starve.cu && ./claim_starve
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
__device__ __forceinline__ long long clk() {
    long long c;
    asm volatile("mov.u64 %0, %%clock64;" : "=l"(c) :: "memory");
    return c;
}
__device__ __forceinline__ unsigned smid() {
    unsigned s;
    asm volatile("mov.u32 %0, %%smid;" : "=r"(s));
    return s;
}

enum Filler { NONE = 0, GTIME = 1, CLOCK = 2, GTIME_SLEEP = 3, FMA = 4, FILLERS = 5 };
static const char* FILLER_NAMES[] = {"none", "busy %globaltimer", "busy %clock64", "%globaltimer, 100 ns sleep", "FMA, clock every 64"};

enum Op { OP_CLOCK = 0, OP_LOAD, OP_ATOM, OP_BAR, OP_CLAIM, OP_GTIME, OPS };
static const char* OP_NAMES[] = {"two clock reads", "volatile load (gone)", "atomicAdd u64 (claim)", "block barrier", "whole claim", "%globaltimer read"};

__device__ void fill_for(int kind, unsigned long long ns, float* sink) {
    const unsigned long long t0 = gtime();
    if (kind == GTIME) {
        while (gtime() - t0 < ns) {}
    } else if (kind == GTIME_SLEEP) {
        while (gtime() - t0 < ns) __nanosleep(100);
    } else if (kind == CLOCK) {
        const long long c0 = clk();
        const long long cycles = (long long)(ns * 2); // ~2 GHz: about ns; the prober ends well before
        while (clk() - c0 < cycles) {}
    } else if (kind == FMA) {
        float a = threadIdx.x * 1e-3f, b = 1.0001f, c = 0.9999f;
        while (gtime() - t0 < ns) {
#pragma unroll
            for (int i = 0; i < 64; ++i) a = fmaf(a, b, c);
        }
        if (a == 12345.f) *sink = a;
    }
}

// Part 1. out: [sm][op][rep] cycles; calib: [sm][2] (ns, cycles over the probe).
__global__ void probe(int kind, unsigned long long fill_ns, int reps, unsigned* sm_role, long long* out,
                      double* calib, unsigned* gone, unsigned long long* claim, float* sink) {
    __shared__ unsigned role;
    __shared__ unsigned slot[2];
    // Each timed value is stored here before the clock is read again: the
    // store issues only once the value is there, and the "memory" clobber of
    // the clock read keeps the compiler from moving it across.
    __shared__ volatile unsigned long long seen[4];
    const unsigned s = smid();
    if (threadIdx.x == 0) role = atomicAdd(&sm_role[s], 1u);
    __syncthreads();
    if (role != 0u) {
        fill_for(kind, fill_ns, sink);
        return;
    }
    // Let the fillers start.
    const unsigned long long g0 = gtime();
    while (gtime() - g0 < 20000ull) {}
    const long long c0 = clk();
    const unsigned long long g1 = gtime();
    long long* o = out + (size_t)s * OPS * reps;
    for (int r = 0; r < reps; ++r) {
        __syncthreads();
        if (threadIdx.x == 0) {
            long long a = clk();
            long long b = clk();
            o[OP_CLOCK * reps + r] = b - a;
            a = clk();
            const unsigned v = *((volatile unsigned*)&gone[s]);
            seen[0] = v;
            b = clk();
            o[OP_LOAD * reps + r] = b - a;
            a = clk();
            const unsigned long long old = atomicAdd(claim, 1ull);
            seen[1] = old;
            b = clk();
            o[OP_ATOM * reps + r] = b - a;
            a = clk();
            const unsigned long long t = gtime();
            seen[2] = t;
            b = clk();
            o[OP_GTIME * reps + r] = b - a;
        }
        __syncthreads();
        long long a = clk();
        __syncthreads();
        long long b = clk();
        if (threadIdx.x == 0) o[OP_BAR * reps + r] = b - a;
        __syncthreads();
        a = clk();
        if (threadIdx.x == 0) {
            const unsigned v = *((volatile unsigned*)&gone[s]);
            if (v == 0xdeadbeefu) {
                slot[1] = 0u;
            } else {
                const unsigned long long old = atomicAdd(claim, 1ull);
                slot[0] = (unsigned)old;
                slot[1] = 1u;
            }
        }
        __syncthreads();
        seen[3] = slot[1];
        b = clk();
        if (threadIdx.x == 0) o[OP_CLAIM * reps + r] = b - a;
    }
    if (threadIdx.x == 0) {
        calib[2 * s] = (double)(gtime() - g1);
        calib[2 * s + 1] = (double)(clk() - c0);
    }
}

// Part 2: a block of the bench's low-priority filler (`spin` in the daemon
// bench's kernels.cu): spin, barrier, thread 0 counts the block.
__device__ __forceinline__ void block_body(unsigned long long ns, unsigned* done) {
    const unsigned long long t0 = gtime();
    while (gtime() - t0 < ns) {}
    __syncthreads();
    if (threadIdx.x == 0) atomicAdd(done, 1u);
}

__global__ void native_fill(unsigned long long ns, unsigned* done) { block_body(ns, done); }

enum Loop { CLAIM = 0, NO_GONE, PREFETCH, PREFETCH_EARLY, STATIC, STATIC_NO_BAR, GEN_1, GEN_2, GEN_4X, LIFE_50, CLAIM_SLEEP, STATIC_SLEEP, PREFETCH_NO_GONE, FLAG, FLAG_PER_WARP, LOOPS };
static const char* LOOP_NAMES[] = {"claim (prelude)", "no gone check", "prefetch claim", "prefetch, slot early",
                                   "static, barrier", "static, no barrier", "generations, 1 each", "generations, 2 each",
                                   "4 generations", "8 gens, 50 us life", "claim, sleep 100 ns", "static, sleep 100 ns",
                                   "prefetch, no gone", "native + flag, barrier", "native + flag per warp"};

// Generations: the grid holds `gens` times the slots; a worker of any but the
// last generation leaves after `quota` claims (or, with `life_ns`, after the
// first claim past that long since it entered), so that a fresh worker takes
// its slot, as a fresh block does natively. The last generation runs to the end.
static void gen_shape(int loop, unsigned blocks, unsigned slots, unsigned* gens, unsigned* quota) {
    *gens = 1;
    *quota = 0xffffffffu;
    if (loop == GEN_1 || loop == GEN_2) {
        *quota = loop == GEN_1 ? 1u : 2u;
        *gens = (blocks + slots * *quota - 1) / (slots * *quota) + 1;
    } else if (loop == GEN_4X) {
        *gens = 4;
        *quota = (blocks + slots * 4 - 1) / (slots * 4);
    } else if (loop == LIFE_50) {
        *gens = 8;
    } else if (loop == FLAG || loop == FLAG_PER_WARP) {
        *gens = blocks / slots;  // the native grid
    }
}

// The worker loops. `claim`: as the prelude (the leader reads `gone`, claims,
// writes the slot; a barrier; everyone reads it). `prefetch`: the next claim's
// atomic is issued before the block runs, its result written to the slot after
// it. `prefetch, slot early`: the leader waits for that atomic and writes the
// next slot before running the block, so between blocks there is only the
// barrier and the slot's read. `static`: no claim at all (worker w runs blocks
// w, w + W, ...), with and without the barrier between blocks.
__global__ void worker_fill(int loop, unsigned long long ns, unsigned blocks, unsigned* gone,
                            unsigned long long* claim, unsigned* done, unsigned slots, unsigned gens, unsigned quota) {
    __shared__ unsigned slot[2][2];
    const bool leader = threadIdx.x == 0;
    const unsigned s = smid();
    const bool last_gen = blockIdx.x >= slots * (gens - 1u);
    const unsigned long long entered = gtime();
    unsigned claims = 0;
    if (loop == FLAG) {
        // A native block that first asks whether to leave (one load, a barrier).
        if (leader) slot[0][1] = *((volatile unsigned*)&gone[s]);
        __syncthreads();
        if (slot[0][1] == 0u) block_body(ns, done);
        return;
    }
    if (loop == FLAG_PER_WARP) {
        // The same, each thread reading the flag itself: no barrier.
        if (*((volatile unsigned*)&gone[s]) == 0u) block_body(ns, done);
        return;
    }
    if (loop == STATIC || loop == STATIC_NO_BAR || loop == STATIC_SLEEP) {
        for (unsigned b = blockIdx.x; b < blocks; b += gridDim.x) {
            if (loop == STATIC) __syncthreads();
            if (loop == STATIC_SLEEP) __nanosleep(100);
            block_body(ns, done);
        }
        if (leader) atomicAdd(claim, (unsigned long long)((blocks - blockIdx.x + gridDim.x - 1) / gridDim.x));
        return;
    }
    unsigned long long next = 0;
    if (leader && (loop == PREFETCH || loop == PREFETCH_EARLY || loop == PREFETCH_NO_GONE)) {
        next = atomicAdd(claim, 1ull);
        slot[0][0] = (unsigned)next;
        slot[0][1] = next < blocks ? 1u : 0u;
    }
    for (unsigned p = 0;; p ^= 1u) {
        if (leader && loop != PREFETCH_EARLY) {
            bool stop = false;
            if (loop != NO_GONE && loop != PREFETCH_NO_GONE) stop = *((volatile unsigned*)&gone[s]) != 0u;
            if (!last_gen && loop >= GEN_1) {
                stop = stop || (loop == LIFE_50 ? (claims > 0u && gtime() - entered >= 50000ull) : claims >= quota);
                ++claims;
            }
            const bool pre = loop == PREFETCH || loop == PREFETCH_NO_GONE;
            const unsigned long long mine = pre ? next : (stop ? blocks : atomicAdd(claim, 1ull));
            slot[p][0] = (unsigned)mine;
            slot[p][1] = (stop || mine >= blocks) ? 0u : 1u;
            if (pre && slot[p][1] != 0u) next = atomicAdd(claim, 1ull);
        }
        __syncthreads();
        if (slot[p][1] == 0u) break;
        if (loop == CLAIM_SLEEP) __nanosleep(100);
        if (leader && loop == PREFETCH_EARLY) {
            const unsigned long long n = atomicAdd(claim, 1ull);
            slot[p ^ 1u][0] = (unsigned)n;
            slot[p ^ 1u][1] = n < blocks ? 1u : 0u;
        }
        block_body(ns, done);
    }
}

// Part 3, where a block's time goes, per warp: natively and as static-order
// workers (no claim, no barrier of the loop's own). Each warp's lane 0 stamps
// when it read its block's start (its t0) and when its spin ended; thread 0
// stamps the block's end after its barrier, and the SM. stamps: per block
// [8 warps x (t0, spin end)], end, sm.
__device__ __forceinline__ void block_body_stamped(unsigned long long ns, unsigned* done, unsigned b,
                                                   unsigned long long* st) {
    const unsigned long long t0 = gtime();
    unsigned long long t = t0;
    while ((t = gtime()) - t0 < ns) {}
    const unsigned w = threadIdx.x / 32u;
    if ((threadIdx.x & 31u) == 0u && w < 8u) {
        st[(size_t)b * 18 + 2 * w] = t0;
        st[(size_t)b * 18 + 2 * w + 1] = t;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        atomicAdd(done, 1u);
        st[(size_t)b * 18 + 16] = gtime();
        st[(size_t)b * 18 + 17] = smid();
    }
}

__global__ void native_stamped(unsigned long long ns, unsigned* done, unsigned long long* st) {
    block_body_stamped(ns, done, blockIdx.x, st);
}

__global__ void static_stamped(unsigned long long ns, unsigned blocks, unsigned* done, unsigned long long* st,
                               unsigned* worker_of, unsigned long long* entered) {
    if (threadIdx.x == 0) {
        entered[2 * blockIdx.x] = gtime();
        entered[2 * blockIdx.x + 1] = smid();
    }
    for (unsigned b = blockIdx.x; b < blocks; b += gridDim.x) {
        if (threadIdx.x == 0) worker_of[b] = blockIdx.x;
        block_body_stamped(ns, done, b, st);
    }
}

static double elapsed_us(cudaEvent_t a, cudaEvent_t b) {
    float ms = 0;
    CHECK(cudaEventElapsedTime(&ms, a, b));
    return ms * 1e3;
}

int main(int argc, char** argv) {
    const int reps = argc > 1 ? atoi(argv[1]) : 200;
    int sms = 0;
    CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    cudaDeviceProp prop;
    CHECK(cudaGetDeviceProperties(&prop, 0));
    printf("%s, %d SMs\n", prop.name, sms);
    int per_sm = 0;
    CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, probe, 256, 0));
    int per_sm_w = 0;
    CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm_w, worker_fill, 256, 0));
    printf("blocks of 256 per SM: probe %d, workers %d\n", per_sm, per_sm_w);

    unsigned *sm_role, *gone;
    unsigned long long* claim;
    long long* out;
    double* calib;
    float* sink;
    unsigned* done;
    CHECK(cudaMalloc(&done, 64));
    CHECK(cudaMalloc(&sm_role, 1024 * sizeof(unsigned)));
    CHECK(cudaMalloc(&gone, 1024 * sizeof(unsigned)));
    CHECK(cudaMemset(gone, 0, 1024 * sizeof(unsigned)));
    CHECK(cudaMalloc(&claim, 64));
    CHECK(cudaMalloc(&out, (size_t)1024 * OPS * reps * sizeof(long long)));
    CHECK(cudaMalloc(&calib, 2048 * sizeof(double)));
    CHECK(cudaMalloc(&sink, 64));

    printf("\n== part 1: one claim's pieces beside 7 filler blocks per SM (cycles; p50 / p90 / max over %d SMs x %d) ==\n",
           sms, reps);
    printf("%-28s", "op \\ fillers");
    for (int k = 0; k < FILLERS; ++k) printf(" | %-26s", FILLER_NAMES[k]);
    printf("\n");
    std::vector<std::vector<std::vector<long long>>> res(FILLERS, std::vector<std::vector<long long>>(OPS));
    double ghz = 0;
    for (int k = 0; k < FILLERS; ++k) {
        CHECK(cudaMemset(sm_role, 0, 1024 * sizeof(unsigned)));
        CHECK(cudaMemset(out, 0, (size_t)1024 * OPS * reps * sizeof(long long)));
        CHECK(cudaMemset(calib, 0, 2048 * sizeof(double)));
        // Fillers spin long enough to outlast the prober at its slowest.
        probe<<<sms * per_sm, 256>>>(k, 200ull * 1000 * 1000, reps, sm_role, out, calib, gone, claim, sink);
        CHECK(cudaGetLastError());
        CHECK(cudaDeviceSynchronize());
        std::vector<long long> h((size_t)sms * OPS * reps);
        CHECK(cudaMemcpy(h.data(), out, h.size() * sizeof(long long), cudaMemcpyDeviceToHost));
        std::vector<double> c(2 * sms);
        CHECK(cudaMemcpy(c.data(), calib, c.size() * sizeof(double), cudaMemcpyDeviceToHost));
        double ns = 0, cy = 0, probe_ms = 0;
        for (int s = 0; s < sms; ++s) { ns += c[2 * s]; cy += c[2 * s + 1]; probe_ms = std::max(probe_ms, c[2 * s] / 1e6); }
        if (k == NONE) ghz = cy / ns;
        for (int s = 0; s < sms; ++s)
            for (int op = 0; op < OPS; ++op)
                for (int r = 0; r < reps; ++r) res[k][op].push_back(h[((size_t)s * OPS + op) * reps + r]);
        fprintf(stderr, "fillers %s: probe took %.1f ms at most\n", FILLER_NAMES[k], probe_ms);
    }
    for (int op = 0; op < OPS; ++op) {
        printf("%-28s", OP_NAMES[op]);
        for (int k = 0; k < FILLERS; ++k) {
            auto& v = res[k][op];
            std::sort(v.begin(), v.end());
            char cell[64];
            snprintf(cell, sizeof cell, "%lld / %lld / %lld", v[v.size() / 2], v[v.size() * 9 / 10], v.back());
            printf(" | %-26s", cell);
        }
        printf("\n");
    }
    printf("(SM clock %.3f GHz from the probes with no fillers: 1000 cycles = %.2f us)\n", ghz, 1000 / ghz / 1e3);

    printf("\n== part 2: a GPU full of busy-spinning blocks, natively and through worker loops "
           "(256 threads, %d per SM; median of 5) ==\n", per_sm);
    printf("%-10s %-22s %12s %8s\n", "block us", "loop", "elapsed us", "rate");
    cudaEvent_t a, b;
    CHECK(cudaEventCreate(&a));
    CHECK(cudaEventCreate(&b));
    const unsigned long long block_us[] = {20, 100, 1000};
    for (unsigned long long bus : block_us) {
        const unsigned waves = bus >= 1000 ? 2 : 20;
        const unsigned blocks = sms * per_sm * waves;
        double native = 0;
        for (int mode = -1; mode < LOOPS; ++mode) {
            const unsigned slots = sms * per_sm_w;
            unsigned gens = 1, quota = 0;
            if (mode >= 0) gen_shape(mode, blocks, slots, &gens, &quota);
            std::vector<double> t;
            for (int rep = 0; rep <= 5; ++rep) {
                CHECK(cudaMemset(claim, 0, 8));
                CHECK(cudaMemset(done, 0, 4));
                CHECK(cudaEventRecord(a));
                if (mode < 0) native_fill<<<blocks, 256>>>(bus * 1000, done);
                else worker_fill<<<slots * gens, 256>>>(mode, bus * 1000, blocks, gone, claim, done, slots, gens, quota);
                CHECK(cudaEventRecord(b));
                CHECK(cudaEventSynchronize(b));
                CHECK(cudaGetLastError());
                if (rep > 0) t.push_back(elapsed_us(a, b));
            }
            unsigned ran = 0;
            CHECK(cudaMemcpy(&ran, done, 4, cudaMemcpyDeviceToHost));
            if (ran != blocks) { fprintf(stderr, "%s: %u of %u blocks ran\n", mode < 0 ? "native" : LOOP_NAMES[mode], ran, blocks); exit(1); }
            std::sort(t.begin(), t.end());
            const double e = t[t.size() / 2];
            if (mode < 0) native = e;
            printf("%-10llu %-22s %12.1f %8.3f   (grid %u x slots)\n", bus, mode < 0 ? "native" : LOOP_NAMES[mode], e,
                   native / e, gens);
        }
    }
    // Part 3.
    {
        const unsigned long long bus = 20;
        const unsigned blocks = sms * per_sm * 20;
        unsigned long long* st;
        unsigned* worker_of;
        CHECK(cudaMalloc(&st, (size_t)blocks * 18 * 8));
        CHECK(cudaMalloc(&worker_of, (size_t)blocks * 4));
        unsigned long long* entered;
        const unsigned W = sms * per_sm;
        CHECK(cudaMalloc(&entered, (size_t)W * 16));
        printf("\n== part 3: where a %llu us block's time goes, per warp (us; mean / p90 / max over blocks) ==\n", bus);
        printf("%-22s %10s %22s %22s %22s %22s\n", "mode", "elapsed", "start spread (warps)", "spin overrun",
               "barrier after last spin", "gap to next (worker)");
        for (int mode = 0; mode < 2; ++mode) {
            CHECK(cudaMemset(done, 0, 4));
            CHECK(cudaMemset(st, 0, (size_t)blocks * 18 * 8));
            CHECK(cudaEventRecord(a));
            if (mode == 0) native_stamped<<<blocks, 256>>>(bus * 1000, done, st);
            else static_stamped<<<W, 256>>>(bus * 1000, blocks, done, st, worker_of, entered);
            CHECK(cudaEventRecord(b));
            CHECK(cudaEventSynchronize(b));
            CHECK(cudaGetLastError());
            std::vector<unsigned long long> h((size_t)blocks * 18);
            CHECK(cudaMemcpy(h.data(), st, h.size() * 8, cudaMemcpyDeviceToHost));
            std::vector<unsigned> wo(blocks);
            CHECK(cudaMemcpy(wo.data(), worker_of, wo.size() * 4, cudaMemcpyDeviceToHost));
            std::vector<double> spread, overrun, bar, gap;
            std::vector<std::pair<unsigned, unsigned>> order;  // (worker, block) for gaps
            for (unsigned k = 0; k < blocks; ++k) {
                const unsigned long long* r = &h[(size_t)k * 18];
                unsigned long long lo = ~0ull, hi = 0, last = 0;
                for (int w = 0; w < 8; ++w) {
                    lo = std::min(lo, r[2 * w]);
                    hi = std::max(hi, r[2 * w]);
                    last = std::max(last, r[2 * w + 1]);
                    overrun.push_back(((double)(r[2 * w + 1] - r[2 * w]) - bus * 1000.0) / 1e3);
                }
                spread.push_back((hi - lo) / 1e3);
                bar.push_back(((double)r[16] - (double)last) / 1e3);
            }
            if (mode == 1) {
                // Worker w ran blocks w, w + W, ...: from one block's end stamp to the next's first start.
                for (unsigned k = 0; k + W < blocks; ++k) {
                    unsigned long long lo = ~0ull;
                    for (int w = 0; w < 8; ++w) lo = std::min(lo, h[(size_t)(k + W) * 18 + 2 * w]);
                    gap.push_back(((double)lo - (double)h[(size_t)k * 18 + 16]) / 1e3);
                }
            }
            auto cell = [](std::vector<double>& v) {
                static char buf[8][64];
                static int i = 0;
                char* c = buf[i++ % 8];
                if (v.empty()) { snprintf(c, 64, "-"); return c; }
                std::sort(v.begin(), v.end());
                double m = 0;
                for (double x : v) m += x;
                snprintf(c, 64, "%.2f / %.2f / %.1f", m / v.size(), v[v.size() * 9 / 10], v.back());
                return c;
            };
            printf("%-22s %10.1f %22s %22s %22s %22s\n", mode == 0 ? "native" : "static workers", elapsed_us(a, b),
                   cell(spread), cell(overrun), cell(bar), cell(gap));
            if (mode == 1) {
                // Per worker: the time its blocks took beyond their spins, by the order in
                // which the workers of its SM entered (0: first in).
                std::vector<unsigned long long> en((size_t)W * 2);
                CHECK(cudaMemcpy(en.data(), entered, en.size() * 8, cudaMemcpyDeviceToHost));
                std::vector<std::vector<unsigned>> on_sm(1024);
                for (unsigned w = 0; w < W; ++w) on_sm[en[2 * w + 1] & 1023].push_back(w);
                std::vector<double> extra(per_sm, 0), cnt(per_sm, 0), enter_lag(per_sm, 0);
                for (auto& ws : on_sm) {
                    if (ws.empty()) continue;
                    std::sort(ws.begin(), ws.end(), [&](unsigned x, unsigned y) { return en[2 * x] < en[2 * y]; });
                    for (size_t r = 0; r < ws.size() && r < (size_t)per_sm; ++r) {
                        const unsigned w = ws[r];
                        unsigned n = 0;
                        unsigned long long last = 0;
                        for (unsigned k = w; k < blocks; k += W) { ++n; last = h[(size_t)k * 18 + 16]; }
                        extra[r] += ((double)(last - en[2 * w]) / n - bus * 1000.0) / 1e3;
                        enter_lag[r] += (double)(en[2 * w] - en[2 * ws[0]]) / 1e3;
                        cnt[r] += 1;
                    }
                }
                printf("static workers by the order they entered their SM: us beyond the spin per block (entered after the first, us)\n");
                for (int r = 0; r < per_sm; ++r)
                    printf("  %d: %6.2f (%5.2f)  over %g workers\n", r, extra[r] / std::max(cnt[r], 1.0),
                           enter_lag[r] / std::max(cnt[r], 1.0), cnt[r]);
            }
        }
    }
    return 0;
}
