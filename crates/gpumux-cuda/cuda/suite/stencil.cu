// 2-D 5-point Jacobi step with a shared-memory tile and halo; 2-D grid of
// 16 x 16 blocks. The tile origin comes from helper functions that read
// blockIdx, as library code often does.
#define ST 16
__device__ __forceinline__ int tile_x0() { return (int)(blockIdx.x * ST); }
__device__ __forceinline__ int tile_y0() { return (int)(blockIdx.y * ST); }
extern "C" __global__ void stencil5(float* __restrict__ out, const float* __restrict__ in, int n) {
    __shared__ float t[ST + 2][ST + 2];
    const int x = tile_x0() + (int)threadIdx.x, y = tile_y0() + (int)threadIdx.y;
    const int lx = threadIdx.x + 1, ly = threadIdx.y + 1;
    auto at = [&](int yy, int xx) { return (xx >= 0 && yy >= 0 && xx < n && yy < n) ? in[(size_t)yy * n + xx] : 0.0f; };
    t[ly][lx] = at(y, x);
    if (threadIdx.x == 0) t[ly][0] = at(y, x - 1);
    if (threadIdx.x == ST - 1) t[ly][ST + 1] = at(y, x + 1);
    if (threadIdx.y == 0) t[0][lx] = at(y - 1, x);
    if (threadIdx.y == ST - 1) t[ST + 1][lx] = at(y + 1, x);
    __syncthreads();
    if (x >= n || y >= n) return;  // after the last barrier: safe
    out[(size_t)y * n + x] = 0.2f * (t[ly][lx] + t[ly][lx - 1] + t[ly][lx + 1] + t[ly - 1][lx] + t[ly + 1][lx]);
}
