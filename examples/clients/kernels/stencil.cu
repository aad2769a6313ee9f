// One Jacobi step of a 5-point stencil on a w x h grid (row-major): each
// interior point becomes the mean of itself and its four neighbours; the
// border is copied. Launch with a 2-D grid covering w x h.
extern "C" __global__ void stencil(const float* in, float* out, unsigned int w, unsigned int h) {
    unsigned int x = blockIdx.x * blockDim.x + threadIdx.x;
    unsigned int y = blockIdx.y * blockDim.y + threadIdx.y;
    if (x >= w || y >= h) {
        return;
    }
    unsigned int i = y * w + x;
    if (x == 0 || y == 0 || x == w - 1 || y == h - 1) {
        out[i] = in[i];
        return;
    }
    out[i] = 0.2f * (in[i] + in[i - 1] + in[i + 1] + in[i - w] + in[i + w]);
}
