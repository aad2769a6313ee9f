// 256-bin histogram of bytes: per-block private histogram in shared memory,
// then one global atomic per bin. Atomics-bound. `hist` must start at zero.
#define BINS 256
extern "C" __global__ void histogram(unsigned int* __restrict__ hist, const unsigned int* __restrict__ words,
                                     unsigned int nwords, unsigned int words_per_block) {
    __shared__ unsigned int local[BINS];
    for (unsigned int b = threadIdx.x; b < BINS; b += blockDim.x) local[b] = 0u;
    __syncthreads();
    const unsigned int begin = blockIdx.x * words_per_block;
    const unsigned int end = min(begin + words_per_block, nwords);
    for (unsigned int i = begin + threadIdx.x; i < end; i += blockDim.x) {
        const unsigned int w = words[i];
        atomicAdd(&local[w & 0xffu], 1u);
        atomicAdd(&local[(w >> 8) & 0xffu], 1u);
        atomicAdd(&local[(w >> 16) & 0xffu], 1u);
        atomicAdd(&local[w >> 24], 1u);
    }
    __syncthreads();
    for (unsigned int b = threadIdx.x; b < BINS; b += blockDim.x)
        if (local[b] != 0u) atomicAdd(&hist[b], local[b]);
}
