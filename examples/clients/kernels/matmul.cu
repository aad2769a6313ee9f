// C = A * B for n x n row-major matrices, tiled in shared memory.
// Launch with block (TILE, TILE) and grid (ceil(n/TILE), ceil(n/TILE)).
#define TILE 16

extern "C" __global__ void matmul(const float* a, const float* b, float* c, unsigned int n) {
    __shared__ float ta[TILE][TILE];
    __shared__ float tb[TILE][TILE];
    unsigned int row = blockIdx.y * TILE + threadIdx.y;
    unsigned int col = blockIdx.x * TILE + threadIdx.x;
    float sum = 0.0f;
    for (unsigned int t = 0; t < (n + TILE - 1) / TILE; ++t) {
        unsigned int ac = t * TILE + threadIdx.x;
        unsigned int br = t * TILE + threadIdx.y;
        ta[threadIdx.y][threadIdx.x] = (row < n && ac < n) ? a[row * n + ac] : 0.0f;
        tb[threadIdx.y][threadIdx.x] = (br < n && col < n) ? b[br * n + col] : 0.0f;
        __syncthreads();
        for (unsigned int k = 0; k < TILE; ++k) {
            sum += ta[threadIdx.y][k] * tb[k][threadIdx.x];
        }
        __syncthreads();
    }
    if (row < n && col < n) {
        c[row * n + col] = sum;
    }
}
