// k-means iterations, two kernels per iteration: assign each point to its
// nearest centroid, then recompute each centroid with one block per centroid
// (deterministic block reduction). Points: n x D floats, centroids: K x D.
#define D 4
extern "C" __global__ void kmeans_assign(unsigned int* __restrict__ label, const float* __restrict__ pts,
                                         const float* __restrict__ cent, unsigned int n, unsigned int k) {
    const unsigned int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float p[D];
    for (int d = 0; d < D; ++d) p[d] = pts[(size_t)i * D + d];
    unsigned int best = 0;
    float bestd = 3.4e38f;
    for (unsigned int c = 0; c < k; ++c) {
        float s = 0.f;
        for (int d = 0; d < D; ++d) {
            const float t = p[d] - cent[c * D + d];
            s = fmaf(t, t, s);
        }
        if (s < bestd) { bestd = s; best = c; }
    }
    label[i] = best;
}
extern "C" __global__ void kmeans_update(float* __restrict__ cent, const unsigned int* __restrict__ label,
                                         const float* __restrict__ pts, unsigned int n) {
    __shared__ float acc[256][D + 1];
    const unsigned int c = blockIdx.x;
    float s[D + 1] = {};
    for (unsigned int i = threadIdx.x; i < n; i += 256u)
        if (label[i] == c) {
            for (int d = 0; d < D; ++d) s[d] += pts[(size_t)i * D + d];
            s[D] += 1.f;
        }
    for (int d = 0; d <= D; ++d) acc[threadIdx.x][d] = s[d];
    __syncthreads();
    for (unsigned int h = 128; h > 0; h >>= 1) {
        if (threadIdx.x < h)
            for (int d = 0; d <= D; ++d) acc[threadIdx.x][d] += acc[threadIdx.x + h][d];
        __syncthreads();
    }
    if (threadIdx.x < D && acc[0][D] > 0.f) cent[c * D + threadIdx.x] = acc[0][threadIdx.x] / acc[0][D];
}
