// Kernels of the oversubscription check (oversubscribe.rs): each goes over a
// whole buffer of n 32-bit words with a grid-stride loop (n may pass 2^32).

// x[i] = a hash of (i, seed).
extern "C" __global__ void fill_words(unsigned* x, unsigned long long n, unsigned seed) {
    unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
    for (unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        unsigned long long z = i * 0x9E3779B97F4A7C15ull + seed;
        z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
        z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
        x[i] = (unsigned)(z ^ (z >> 31));
    }
}

// One LCG step on every word, round r.
extern "C" __global__ void step_words(unsigned* x, unsigned long long n, unsigned r) {
    unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
    for (unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        x[i] = x[i] * 1664525u + 1013904223u + r;
    }
}

// An order-independent 64-bit digest of every (index, word): the sum of a
// mix of both (a changed or moved word changes it but for a 2^-64 chance).
extern "C" __global__ void digest_words(const unsigned* x, unsigned long long n, unsigned long long* out) {
    unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
    unsigned long long sum = 0;
    for (unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        unsigned long long z = (i << 32) ^ x[i];
        z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
        z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
        sum += z ^ (z >> 31);
    }
    atomicAdd(out, sum);
}
