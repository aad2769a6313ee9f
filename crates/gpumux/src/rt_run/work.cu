// The GPU subtask of `gpumux rt run` (crates/gpumux/src/rt_run/lanes.rs): a compute-bound
// loop whose time grows linearly with `iters` (four dependent FMA chains per thread, no
// memory traffic), calibrated at start so that a kernel takes a subtask's stated time.
//
// `first` is the index of this launch's first block in the whole kernel: in multi mode the
// runner launches blocks [0, G/2) on one GPU and [G/2, G) on the other, and each block
// writes `stamp + b` at its whole-kernel index b, so the host can merge the two GPUs'
// outputs and check that every block of every job ran once, on a real GPU.
extern "C" __global__ void rt_work(unsigned int* out, unsigned int iters, unsigned int first, unsigned int stamp) {
    const unsigned int b = blockIdx.x + first;
    float x = threadIdx.x * 1e-3f, y = b * 1e-3f, z = 0.5f, w = 0.25f;
    for (unsigned int k = 0; k < iters; ++k) {
        x = fmaf(x, 0.9999f, 0.0001f);
        y = fmaf(y, 0.9998f, 0.0002f);
        z = fmaf(z, 0.9997f, 0.0003f);
        w = fmaf(w, 0.9996f, 0.0004f);
    }
    // Never true (the chains stay near 1), but the compiler cannot know: keeps every
    // thread's loop.
    if (x + y + z + w == -1.0f) out[b] = 0u;
    __syncthreads();
    if (threadIdx.x == 0) out[b] = stamp + b;
}
