// CSR sparse matrix-vector product, one warp per row, shuffle reduction in a
// fixed order (deterministic). Memory-bound and irregular.
extern "C" __global__ void spmv_csr(float* __restrict__ y, const unsigned int* __restrict__ rowptr,
                                    const unsigned int* __restrict__ cols, const float* __restrict__ vals,
                                    const float* __restrict__ x, unsigned int rows) {
    const unsigned int warp = (blockIdx.x * blockDim.x + threadIdx.x) / 32u;
    const unsigned int lane = threadIdx.x % 32u;
    if (warp >= rows) return;  // whole warps leave together
    float sum = 0.0f;
    for (unsigned int k = rowptr[warp] + lane; k < rowptr[warp + 1]; k += 32u) sum += vals[k] * x[cols[k]];
    for (int off = 16; off > 0; off /= 2) sum += __shfl_down_sync(0xffffffffu, sum, off);
    if (lane == 0) y[warp] = sum;
}
