// bins[v % nbins] += 1 for every value v of data[0..n): a per-block histogram
// in shared memory, merged into the global one with atomics.
// Launch with dynamic shared memory nbins * 4 bytes.
extern "C" __global__ void histogram(const unsigned int* data, unsigned int n, unsigned int* bins, unsigned int nbins) {
    extern __shared__ unsigned int local[];
    for (unsigned int i = threadIdx.x; i < nbins; i += blockDim.x) {
        local[i] = 0u;
    }
    __syncthreads();
    for (unsigned int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += blockDim.x * gridDim.x) {
        atomicAdd(&local[data[i] % nbins], 1u);
    }
    __syncthreads();
    for (unsigned int i = threadIdx.x; i < nbins; i += blockDim.x) {
        if (local[i] != 0u) {
            atomicAdd(&bins[i], local[i]);
        }
    }
}
