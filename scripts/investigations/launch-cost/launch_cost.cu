// What a kernel launch costs the host thread, by launch shape: the CUDA device's
// worker launches took 4-6 µs of `cuLaunchKernel` in the daemon's device process
// (docs/history/benchmarks.md, session 14) against ~3 µs for a native launch loop. Each
// row launches an empty kernel LAUNCHES times in batches of BATCH (synced between
// batches, not timed) and reports the mean and median time of the launch call.
//   nvcc -O2 -arch=sm_90 -o launch_cost launch_cost.cu && ./launch_cost
// Run it again with CUDA_DEVICE_MAX_CONNECTIONS=32 to see the hardware queues' part.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>
#include <cuda_runtime.h>

#define CHECK(x) do { cudaError_t e = (x); if (e != cudaSuccess) { \
    fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e)); exit(1); } } while (0)

template <int N> struct Params { unsigned char b[N]; };

// Reads one byte of its parameters so they are not optimized away.
template <int N> __global__ void empty(Params<N> p, int* out) {
    if (p.b[0] == 255 && threadIdx.x == 1234567) out[0] = 1;
}

// Like a worker whose SM is not in its mask: reads %smid and leaves.
__global__ void leaves(Params<96> p, int* out) {
    unsigned int s;
    asm volatile("mov.u32 %0, %%smid;" : "=r"(s));
    if (s == 1000u + p.b[0]) out[0] = 1;
}

static const int LAUNCHES = 20000, BATCH = 100;

struct Row { const char* name; double mean, p50; };

template <typename F> Row measure(const char* name, F launch_one) {
    std::vector<double> t;
    t.reserve(LAUNCHES);
    for (int w = 0; w < 2 * BATCH; ++w) launch_one(w);  // warm-up
    CHECK(cudaDeviceSynchronize());
    for (int i = 0; i < LAUNCHES; ++i) {
        auto a = std::chrono::steady_clock::now();
        launch_one(i);
        auto b = std::chrono::steady_clock::now();
        t.push_back(std::chrono::duration<double, std::micro>(b - a).count());
        if (i % BATCH == BATCH - 1) CHECK(cudaDeviceSynchronize());
    }
    CHECK(cudaGetLastError());
    double sum = 0; for (double x : t) sum += x;
    std::nth_element(t.begin(), t.begin() + t.size() / 2, t.end());
    return Row{name, sum / t.size(), t[t.size() / 2]};
}

int main() {
    int* out; CHECK(cudaMalloc(&out, 4));
    int lo, hi; CHECK(cudaDeviceGetStreamPriorityRange(&lo, &hi));
    std::vector<cudaStream_t> s(16), sp(16);
    for (int i = 0; i < 16; ++i) {
        CHECK(cudaStreamCreateWithFlags(&s[i], cudaStreamNonBlocking));
        CHECK(cudaStreamCreateWithPriority(&sp[i], cudaStreamNonBlocking, i % 2 ? hi : lo));
    }
    cudaEvent_t ev; CHECK(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
    Params<0 + 1> p1{}; Params<96> p96{}; Params<512> p512{};
    std::vector<Row> rows;
    rows.push_back(measure("1 block x 32, 1 B params, 1 stream", [&](int) { empty<1><<<1, 32, 0, s[0]>>>(p1, out); }));
    rows.push_back(measure("132 x 256, 96 B params, 1 stream", [&](int) { empty<96><<<132, 256, 0, s[0]>>>(p96, out); }));
    rows.push_back(measure("132 x 256, 512 B params, 1 stream", [&](int) { empty<512><<<132, 256, 0, s[0]>>>(p512, out); }));
    rows.push_back(measure("4224 x 256, 96 B params, 1 stream", [&](int) { empty<96><<<4224, 256, 0, s[0]>>>(p96, out); }));
    rows.push_back(measure("132 x 256, 96 B, smid and leave, 1 stream", [&](int) { leaves<<<132, 256, 0, s[0]>>>(p96, out); }));
    rows.push_back(measure("132 x 256, 96 B, 8 streams in turn", [&](int i) { empty<96><<<132, 256, 0, s[i % 8]>>>(p96, out); }));
    rows.push_back(measure("132 x 256, 96 B, 16 streams in turn", [&](int i) { empty<96><<<132, 256, 0, s[i % 16]>>>(p96, out); }));
    rows.push_back(measure("132 x 256, 96 B, 16 streams, 2 priorities", [&](int i) { empty<96><<<132, 256, 0, sp[i % 16]>>>(p96, out); }));
    rows.push_back(measure("132 x 256, 96 B, 1 stream, + event record", [&](int) {
        empty<96><<<132, 256, 0, s[0]>>>(p96, out); CHECK(cudaEventRecord(ev, s[0])); }));
    rows.push_back(measure("132 x 256, 96 B, 16 streams, + event record", [&](int i) {
        empty<96><<<132, 256, 0, s[i % 16]>>>(p96, out); CHECK(cudaEventRecord(ev, s[i % 16])); }));
    const char* c = getenv("CUDA_DEVICE_MAX_CONNECTIONS");
    printf("CUDA_DEVICE_MAX_CONNECTIONS=%s\n%-48s %8s %8s\n", c ? c : "(unset: 8)", "launch", "mean us", "p50 us");
    for (auto& r : rows) printf("%-48s %8.2f %8.2f\n", r.name, r.mean, r.p50);
    return 0;
}
