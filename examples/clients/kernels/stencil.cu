// 5-point stencil on an nx x ny row-major grid: interior points become
// 0.5 * centre + 0.125 * (north + south + east + west); the border is copied.
extern "C" __global__ void stencil(const float* in, float* out, int nx, int ny) {
    int x = blockIdx.x * blockDim.x + threadIdx.x;
    int y = blockIdx.y * blockDim.y + threadIdx.y;
    if (x >= nx || y >= ny) return;
    int i = y * nx + x;
    if (x == 0 || y == 0 || x == nx - 1 || y == ny - 1) {
        out[i] = in[i];
    } else {
        out[i] = 0.5f * in[i] + 0.125f * (in[i - nx] + in[i + nx] + in[i - 1] + in[i + 1]);
    }
}
