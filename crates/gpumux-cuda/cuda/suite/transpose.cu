// Batched matrix transpose through a padded shared-memory tile: 3-D grid
// (x: column tiles, y: row tiles, z: matrix in the batch), block 32 x 8.
#define TILE 32
#define ROWS 8
extern "C" __global__ void transpose(float* __restrict__ out, const float* __restrict__ in, unsigned int n) {
    __shared__ float tile[TILE][TILE + 1];  // +1: no bank conflicts on the transposed read
    const size_t base = (size_t)blockIdx.z * n * n;
    unsigned int x = blockIdx.x * TILE + threadIdx.x;
    unsigned int y = blockIdx.y * TILE + threadIdx.y;
    for (unsigned int j = 0; j < TILE; j += ROWS)
        if (x < n && y + j < n) tile[threadIdx.y + j][threadIdx.x] = in[base + (size_t)(y + j) * n + x];
    __syncthreads();
    x = blockIdx.y * TILE + threadIdx.x;
    y = blockIdx.x * TILE + threadIdx.y;
    for (unsigned int j = 0; j < TILE; j += ROWS)
        if (x < n && y + j < n) out[base + (size_t)(y + j) * n + x] = tile[threadIdx.x][threadIdx.y + j];
}
