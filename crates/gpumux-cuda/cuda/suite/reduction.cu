// Sum reduction in two kernels: per-block tree reduction in dynamic shared
// memory (a template device function), then one block sums the partials.
// Fixed order, so the result is deterministic.
template <unsigned int BS>
__device__ float block_sum(float v, float* sdata) {
    sdata[threadIdx.x] = v;
    __syncthreads();
    for (unsigned int s = BS / 2; s > 0; s >>= 1) {
        if (threadIdx.x < s) sdata[threadIdx.x] += sdata[threadIdx.x + s];
        __syncthreads();
    }
    return sdata[0];
}
extern "C" __global__ void reduce_partial(float* __restrict__ partial, const float* __restrict__ in, unsigned int n,
                                          unsigned int per_block) {
    extern __shared__ float sdata[];
    const unsigned int begin = blockIdx.x * per_block;
    const unsigned int end = min(begin + per_block, n);
    float v = 0.0f;
    for (unsigned int i = begin + threadIdx.x; i < end; i += 256u) v += in[i];
    const float s = block_sum<256>(v, sdata);
    if (threadIdx.x == 0) partial[blockIdx.x] = s;
}
extern "C" __global__ void reduce_final(float* __restrict__ out, const float* __restrict__ partial, unsigned int m) {
    extern __shared__ float sdata[];
    float v = 0.0f;
    for (unsigned int i = threadIdx.x; i < m; i += 256u) v += partial[i];
    const float s = block_sum<256>(v, sdata);
    if (threadIdx.x == 0) out[0] = s;
}
