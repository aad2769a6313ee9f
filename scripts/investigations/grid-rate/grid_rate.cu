// How many kernels a second the GPU itself turns around in the daemon's
// pattern, with a host loop that does nothing else: S streams, each keeping D
// kernels launched and not yet seen ended (D = 2: the daemon's queue ahead),
// each kernel's end seen by the host polling a word in mapped host memory
// that the kernel's last block writes (as the workers' `host_result`). Shapes:
//   1 x 32      a tiny kernel launched natively (one block writes the word);
//   132 x 256   a co-located worker grid: one block per SM, all but one leave at
//               once, the last to leave (an exit count) publishes the word;
//   4224 x 256  a full worker grid of an empty kernel (32 per SM), the same.
// Prints the rate (kernels seen ended per second) and the mean time from a
// launch call's return to its end seen, per row. docs/history/benchmarks.md (session
// 15) has what it measured and why: the daemon's 8 clients make 50-75k/s.
//   nvcc -O2 -arch=sm_90 -o grid_rate grid_rate.cu && ./grid_rate
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>
#include <cuda_runtime.h>

#define CHECK(x) do { cudaError_t e = (x); if (e != cudaSuccess) { \
    fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e)); exit(1); } } while (0)

// Every block counts its exit; the last resets the count and publishes `seq`
// to the host (the worker prelude's `gmx_leave`, without the claims).
__global__ void grid_end(unsigned int* exits, volatile unsigned int* host, unsigned int seq) {
    if (threadIdx.x != 0) return;
    __threadfence();
    const unsigned int e = atomicAdd(exits, 1u);
    if (e != gridDim.x - 1u) return;
    __threadfence();
    atomicExch(exits, 0u);
    __threadfence_system();
    *host = seq;
}

using Clock = std::chrono::steady_clock;
static double us(Clock::duration d) { return std::chrono::duration<double, std::micro>(d).count(); }

struct Row { int blocks, threads, streams, depth; double rate, latency_us; };

static Row run(int blocks, int threads, int streams, int depth, double seconds) {
    std::vector<cudaStream_t> s(streams);
    for (auto& x : s) CHECK(cudaStreamCreateWithFlags(&x, cudaStreamNonBlocking));
    unsigned int* exits; CHECK(cudaMalloc(&exits, 64 * sizeof(unsigned int) * streams));
    CHECK(cudaMemset(exits, 0, 64 * sizeof(unsigned int) * streams));
    unsigned int* host; CHECK(cudaHostAlloc(&host, 64 * sizeof(unsigned int) * streams, cudaHostAllocMapped));
    for (int i = 0; i < 64 * streams; ++i) host[i] = 0;
    unsigned int* dhost; CHECK(cudaHostGetDevicePointer(&dhost, host, 0));
    std::vector<unsigned int> launched(streams, 0), seen(streams, 0);
    std::vector<std::vector<Clock::time_point>> at(streams, std::vector<Clock::time_point>(depth + 1));
    auto launch = [&](int i) {
        unsigned int seq = ++launched[i];
        grid_end<<<blocks, threads, 0, s[i]>>>(exits + 64 * i, dhost + 64 * i, seq);
        at[i][seq % (depth + 1)] = Clock::now();
    };
    long done = 0; double lat = 0;
    auto t0 = Clock::now(), end = t0 + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
    for (int i = 0; i < streams; ++i) for (int d = 0; d < depth; ++d) launch(i);
    while (Clock::now() < end) {
        for (int i = 0; i < streams; ++i) {
            unsigned int now_seen = *(volatile unsigned int*)(host + 64 * i);
            while (seen[i] < now_seen) {
                ++seen[i];
                auto t = Clock::now();
                lat += us(t - at[i][seen[i] % (depth + 1)]);
                ++done;
                launch(i);
            }
        }
    }
    double span = us(Clock::now() - t0) / 1e6;
    CHECK(cudaDeviceSynchronize());
    CHECK(cudaGetLastError());
    for (auto& x : s) CHECK(cudaStreamDestroy(x));
    CHECK(cudaFree(exits)); CHECK(cudaFreeHost(host));
    return Row{blocks, threads, streams, depth, done / span, done ? lat / done : 0};
}

int main() {
    CHECK(cudaSetDeviceFlags(cudaDeviceMapHost));
    CHECK(cudaFree(0));
    run(132, 256, 8, 2, 0.05);  // warm-up
    std::vector<Row> rows;
    const int shapes[3][2] = {{1, 32}, {132, 256}, {4224, 256}};
    for (auto& sh : shapes)
        for (int streams : {1, 8})
            for (int depth : {1, 2}) rows.push_back(run(sh[0], sh[1], streams, depth, 0.3));
    const char* c = getenv("CUDA_DEVICE_MAX_CONNECTIONS");
    printf("CUDA_DEVICE_MAX_CONNECTIONS=%s\n%-12s %8s %6s %12s %16s\n", c ? c : "(unset: 8)", "grid", "streams", "depth",
           "kernels/s", "launch->seen us");
    for (auto& r : rows)
        printf("%5d x %-4d %8d %6d %12.0f %16.1f\n", r.blocks, r.threads, r.streams, r.depth, r.rate, r.latency_us);
    return 0;
}
