// Tiled SGEMM C = A * B (n x n, row-major), 64x64 block tile, 4x4 outputs per
// thread, 2-D grid. Compute-bound.
#define BM 64
#define BK 16
extern "C" __global__ void __launch_bounds__(256) sgemm(float* __restrict__ C, const float* __restrict__ A,
                                                       const float* __restrict__ B, unsigned int n) {
    __shared__ float As[BK][BM + 4];
    __shared__ float Bs[BK][BM];
    const unsigned int tx = threadIdx.x % 16u, ty = threadIdx.x / 16u;
    const unsigned int row0 = blockIdx.y * BM, col0 = blockIdx.x * BM;
    float acc[4][4] = {};
    for (unsigned int k0 = 0; k0 < n; k0 += BK) {
        for (unsigned int t = threadIdx.x; t < BM * BK; t += 256u) {
            const unsigned int r = t / BK, c = t % BK;       // A tile: 64 rows x 16 cols
            As[c][r] = A[(size_t)(row0 + r) * n + k0 + c];
            const unsigned int br = t / BM, bc = t % BM;     // B tile: 16 rows x 64 cols
            Bs[br][bc] = B[(size_t)(k0 + br) * n + col0 + bc];
        }
        __syncthreads();
#pragma unroll
        for (unsigned int k = 0; k < BK; ++k) {
            float a[4], b[4];
#pragma unroll
            for (int i = 0; i < 4; ++i) a[i] = As[k][ty * 4 + i];
#pragma unroll
            for (int j = 0; j < 4; ++j) b[j] = Bs[k][tx * 4 + j];
#pragma unroll
            for (int i = 0; i < 4; ++i)
#pragma unroll
                for (int j = 0; j < 4; ++j) acc[i][j] = fmaf(a[i], b[j], acc[i][j]);
        }
        __syncthreads();
    }
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) C[(size_t)(row0 + ty * 4 + i) * n + col0 + tx * 4 + j] = acc[i][j];
}
