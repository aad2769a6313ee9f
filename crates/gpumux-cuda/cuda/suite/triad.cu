// STREAM triad: a = b + s * c. Memory-bound; early return past the end.
extern "C" __global__ void __launch_bounds__(256) triad(float* __restrict__ a, const float* __restrict__ b,
                                                       const float* __restrict__ c, float s, unsigned int n) {
    const unsigned int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    a[i] = b[i] + s * c[i];
}
