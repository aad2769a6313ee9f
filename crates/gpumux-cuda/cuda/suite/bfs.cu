// One top-down BFS level: every vertex of the current level labels its
// unvisited neighbours with the next level. Racing writers store the same
// value, so the result is deterministic. Irregular.
extern "C" __global__ void bfs_step(unsigned int* __restrict__ level, const unsigned int* __restrict__ rowptr,
                                    const unsigned int* __restrict__ cols, unsigned int nv, unsigned int cur) {
    const unsigned int v = blockIdx.x * blockDim.x + threadIdx.x;
    if (v >= nv || level[v] != cur) return;
    for (unsigned int k = rowptr[v]; k < rowptr[v + 1]; ++k) {
        const unsigned int u = cols[k];
        if (level[u] == 0xffffffffu) level[u] = cur + 1u;
    }
}
