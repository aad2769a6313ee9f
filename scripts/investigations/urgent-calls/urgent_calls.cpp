// What a native launch costs the host in the daemon's urgent pattern, and
// what each of the device process's calls adds to the urgent kernel's
// turnaround (docs/history/benchmarks.md, "The urgent kernel's native floor").
//
// The device process starts an urgent native launch with three driver
// calls on a high-priority stream: cuLaunchKernel, cuStreamWriteValue32 of
// the launch's number into host memory (its end, read by a poll), and
// cuEventRecord of an end event (a fault's witness). In the daemon's
// priority experiment these took 6.6-9.5 + 3.0-4.7 us, against 4.2-4.6 +
// 0.5-0.8 us for the same calls made back to back on an idle GPU (run 191).
// This program makes the same calls outside the daemon, in a context made
// as the daemon's (its own, CU_CTX_SCHED_SPIN; run.sh sets 32 hardware
// queues), in three parts:
//  1. each call's time and the turnaround (the first call until the host
//     reads the published number), with and without the event record and
//     against cuStreamSynchronize: idle GPU or one kept full by 20 us
//     low-priority blocks, a launch every 0.3-1.5 ms or back to back;
//  2. whether a warm driver makes the first call after a gap cheaper (a
//     cuStreamQuery or cuEventQuery every 10 us of the gap, or sched_yield);
//  3. whether a low-priority kernel queued behind the running one (the
//     daemon's queue ahead) slows the urgent kernel down.
//
// Usage: urgent_calls CUBIN [TRIALS]   (run.sh builds it with nvcc and runs it)
#include <cuda.h>
#include <sched.h>

#include <atomic>
#include <deque>
#include <thread>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

static void check(CUresult r, const char* what) {
    if (r != CUDA_SUCCESS) {
        const char* s = nullptr;
        cuGetErrorString(r, &s);
        fprintf(stderr, "%s failed: %s\n", what, s ? s : "?");
        exit(1);
    }
}
#define CK(x) check((x), #x)

using Clock = std::chrono::steady_clock;
static double us(Clock::time_point a, Clock::time_point b) {
    return std::chrono::duration<double, std::micro>(b - a).count();
}

// How the thread waits between urgent launches: the device process polls
// its device between commands, yielding the CPU between tries after its
// first 64 (gpumux_ring::relax).
enum GapMode { PLAIN, YIELD, STREAM_QUERY, EVENT_QUERY, NGAPMODES };
static const char* GAP_NAMES[] = {"spin", "yield", "streamq", "eventq"};

static void spin_for(double micros, GapMode mode = PLAIN, CUstream s = nullptr, CUevent e = nullptr) {
    auto t0 = Clock::now();
    auto last = t0;
    while (us(t0, Clock::now()) < micros) {
        if (mode == YIELD) sched_yield();
        if ((mode == STREAM_QUERY || mode == EVENT_QUERY) && us(last, Clock::now()) >= 10) {
            // A cheap driver call every 10 us keeps the driver's state warm (if that is what a gap loses).
            if (mode == STREAM_QUERY) (void)cuStreamQuery(s);
            else (void)cuEventQuery(e);
            last = Clock::now();
        }
    }
}

struct Samples {
    std::vector<double> launch, write, record, turn;
};

static double pct(std::vector<double> v, double p) {
    if (v.empty()) return 0;
    std::sort(v.begin(), v.end());
    size_t i = std::min(v.size() - 1, (size_t)(p / 100.0 * (v.size() - 1) + 0.5));
    return v[i];
}

// The urgent kernel and what its launch needs: each call of `launch` makes
// the device process's calls for one urgent native launch and waits for its
// end as the daemon sees it.
struct Urgent {
    CUfunction spin;
    int sms;
    CUstream hi;
    CUevent ended;
    CUdeviceptr flag_dev;
    volatile unsigned* flag;
    unsigned long long ns;
    unsigned seq;

    // The kernel, the stream write of its number into host memory, the end
    // event's record (if `record`), then a spin until the host reads the
    // number; with `sync`, the kernel and cuStreamSynchronize instead. Times
    // each call and the turnaround into `s` (the record only if made).
    void launch(Samples& s, bool record, bool sync = false) {
        void* a[] = {&ns};
        seq++;
        auto t0 = Clock::now();
        CK(cuLaunchKernel(spin, sms, 1, 1, 256, 1, 1, 0, hi, a, nullptr));
        auto t1 = Clock::now();
        s.launch.push_back(us(t0, t1));
        if (sync) {
            CK(cuStreamSynchronize(hi));
            s.turn.push_back(us(t0, Clock::now()));
            return;
        }
        CK(cuStreamWriteValue32(hi, flag_dev, seq, 0));
        auto t2 = Clock::now();
        if (record) CK(cuEventRecord(ended, hi));
        auto t3 = Clock::now();
        while (*flag != seq) {
        }
        auto t4 = Clock::now();
        s.write.push_back(us(t1, t2));
        if (record) s.record.push_back(us(t2, t3));
        s.turn.push_back(us(t0, t4));
    }
};

enum Variant { FULL, NO_RECORD, SYNC, NVARIANTS };
static const char* NAMES[] = {"launch+write+record", "launch+write", "launch+sync"};

int main(int argc, char** argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: %s CUBIN [TRIALS]\n", argv[0]);
        return 2;
    }
    int trials = argc > 2 ? atoi(argv[2]) : 200;
    CK(cuInit(0));
    CUdevice dev;
    CK(cuDeviceGet(&dev, 0));
    CUcontext ctx;
    // The daemon's CUDA device: its own context, spin scheduling.
    CUctxCreateParams params = {};
    CK(cuCtxCreate_v4(&ctx, &params, CU_CTX_SCHED_SPIN, dev));
    int sms = 0;
    CK(cuDeviceGetAttribute(&sms, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, dev));
    CUmodule mod;
    CK(cuModuleLoad(&mod, argv[1]));
    CUfunction spin;
    CK(cuModuleGetFunction(&spin, mod, "spin"));
    int least, greatest;
    CK(cuCtxGetStreamPriorityRange(&least, &greatest));
    CUstream hi, lo;
    CK(cuStreamCreateWithPriority(&hi, CU_STREAM_NON_BLOCKING, greatest));
    CK(cuStreamCreateWithPriority(&lo, CU_STREAM_NON_BLOCKING, least));
    CUevent ended;
    CK(cuEventCreate(&ended, CU_EVENT_DISABLE_TIMING));
    void* host = nullptr;
    CK(cuMemHostAlloc(&host, 4096, CU_MEMHOSTALLOC_DEVICEMAP | CU_MEMHOSTALLOC_PORTABLE));
    CUdeviceptr flag_dev;
    CK(cuMemHostGetDevicePointer(&flag_dev, host, 0));
    volatile unsigned* flag = (volatile unsigned*)host;
    *flag = 0;

    unsigned long long lp_ns = 20000;
    Urgent urgent{spin, sms, hi, ended, flag_dev, flag, 15000, 0};
    std::mt19937 rng(7);
    std::uniform_real_distribution<double> gap(300, 1500);
    // Queues `n` low-priority launches of 20 us blocks filling every SM (8
    // of 256 threads each, 100 waves: ~2 ms a launch), then lets them start.
    auto queue_lp = [&](int n) {
        unsigned blocks = (unsigned)sms * 8 * 100;
        void* a[] = {&lp_ns};
        for (int i = 0; i < n; i++) CK(cuLaunchKernel(spin, blocks, 1, 1, 256, 1, 1, 0, lo, a, nullptr));
        spin_for(5000);
    };

    printf("# %d SMs; urgent: %d x 256 threads of 15 us on the high-priority stream\n", sms, sms);
    printf("%-10s %-5s %-20s %9s %9s %9s %9s %9s %9s %9s\n", "gpu", "gap", "variant", "launch50", "launch99",
           "write50", "record50", "record99", "turn50", "turn99");
    for (int busy = 0; busy < 2; busy++) {
        for (int gaps = 1; gaps >= 0; gaps--) {
            // Queued for longer than the phase lasts.
            if (busy) queue_lp(3 * trials * (gaps ? 1 : 0) + 300);
            Samples s[NVARIANTS];
            for (int t = 0; t < trials * NVARIANTS; t++) {
                Variant v = (Variant)(t % NVARIANTS);
                if (gaps) spin_for(gap(rng));
                urgent.launch(s[v], v == FULL, v == SYNC);
                // The device process queries the event now and then: so does this.
                if (v == FULL) (void)cuEventQuery(ended);
            }
            for (int v = 0; v < NVARIANTS; v++) {
                printf("%-10s %-5s %-20s %9.2f %9.2f %9.2f %9.2f %9.2f %9.1f %9.1f\n", busy ? "lp-20us" : "idle",
                       gaps ? "yes" : "no", NAMES[v], pct(s[v].launch, 50), pct(s[v].launch, 99),
                       pct(s[v].write, 50), pct(s[v].record, 50), pct(s[v].record, 99), pct(s[v].turn, 50),
                       pct(s[v].turn, 99));
            }
            fflush(stdout);
            if (busy) {
                // Drop what is left of the low-priority queue: wait it out.
                CK(cuStreamSynchronize(lo));
            }
        }
    }
    // Does a warm driver make the first call after a gap cheaper? The
    // urgent launch (launch + write + record) after 0.3-1.5 ms of each way
    // of waiting, idle GPU and busy, modes interleaved.
    printf("\n%-10s %-8s %9s %9s %9s %9s %9s %9s\n", "gpu", "gapmode", "launch50", "launch99", "write50", "record50",
           "turn50", "turn99");
    for (int busy = 0; busy < 2; busy++) {
        if (busy) queue_lp(4 * trials + 300);
        Samples s[NGAPMODES];
        for (int t = 0; t < trials * NGAPMODES; t++) {
            GapMode m = (GapMode)(t % NGAPMODES);
            spin_for(gap(rng), m, hi, ended);
            urgent.launch(s[m], true);
        }
        for (int m = 0; m < NGAPMODES; m++)
            printf("%-10s %-8s %9.2f %9.2f %9.2f %9.2f %9.1f %9.1f\n", busy ? "lp-20us" : "idle", GAP_NAMES[m],
                   pct(s[m].launch, 50), pct(s[m].launch, 99), pct(s[m].write, 50), pct(s[m].record, 50),
                   pct(s[m].turn, 50), pct(s[m].turn, 99));
        fflush(stdout);
        if (busy) CK(cuStreamSynchronize(lo));
    }
    // Does a low-priority kernel queued behind the running one (the
    // daemon's queue ahead) slow the urgent kernel down? A helper thread
    // keeps 2 ms low-priority kernels of 20 us blocks going, `depth` of them
    // in flight: 1 launches the next once the last ended (a gap of a launch
    // every 2 ms), 2 keeps the next queued behind the running one.
    printf("\n%-22s %9s %9s %9s %9s\n", "lp kernels in flight", "launch50", "turn50", "turn90", "turn99");
    for (int round = 0; round < 2; round++) {
        for (int depth = 1; depth <= 2; depth++) {
            std::atomic<bool> stop{false};
            std::thread feeder([&] {
                cuCtxSetCurrent(ctx);
                std::deque<CUevent> flight;
                unsigned blocks = (unsigned)sms * 8 * 100;
                while (!stop.load()) {
                    void* a[] = {&lp_ns};
                    CUevent e;
                    cuEventCreate(&e, CU_EVENT_DISABLE_TIMING);
                    cuLaunchKernel(spin, blocks, 1, 1, 256, 1, 1, 0, lo, a, nullptr);
                    cuEventRecord(e, lo);
                    flight.push_back(e);
                    if ((int)flight.size() >= depth) {
                        while (cuEventQuery(flight.front()) == CUDA_ERROR_NOT_READY && !stop.load()) {
                        }
                        cuEventDestroy(flight.front());
                        flight.pop_front();
                    }
                }
                for (CUevent e : flight) {
                    cuEventSynchronize(e);
                    cuEventDestroy(e);
                }
            });
            spin_for(5000);
            Samples s1;
            for (int t = 0; t < trials; t++) {
                spin_for(gap(rng));
                urgent.launch(s1, true);
            }
            stop.store(true);
            feeder.join();
            printf("%-22d %9.2f %9.1f %9.1f %9.1f\n", depth, pct(s1.launch, 50), pct(s1.turn, 50), pct(s1.turn, 90),
                   pct(s1.turn, 99));
            fflush(stdout);
        }
    }
    CK(cuCtxSynchronize());
    return 0;
}
