// `iters` steps of a 32-bit linear congruential generator per element: integer
// arithmetic, so the GPU, CuPy and the CPU agree bit for bit, and as heavy as
// `iters` makes it (the pipeline and event-timing examples size it to their copies).
extern "C" __global__ void lcg(const unsigned int* in, unsigned int* out, int n, int iters) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        unsigned int x = in[i];
        for (int k = 0; k < iters; ++k) {
            x = x * 1664525u + 1013904223u;
        }
        out[i] = x;
    }
}
