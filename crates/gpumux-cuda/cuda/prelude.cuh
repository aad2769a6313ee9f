// ---- gpumux worker prelude (inserted by gpumux-cuda's transformation) ----
// Mutable state of one preemptible launch, in device memory. The claim word
// packs the retreat request with the next block index, so one atomic both
// claims work and reads the request: a claim that saw no request is run to the
// end, one that saw it runs nothing and lowers `resume`, so [resume, end) is
// exactly the work left. The last worker to leave publishes the result and
// resets the state, so the next launch needs no host-side reset.
struct gmx_ctl_t {
    unsigned long long claim;        // low 32 bits: next block (relative to begin); high 32: seq to retreat
    unsigned int resume;             // lowest relative index claimed after the request (0xffffffff: none)
    unsigned int workers;            // workers that ran blocks
    unsigned int exited;             // workers that left (all of the grid)
    unsigned int result_next;        // published by the last worker: first block not done
    unsigned int result_workers;
    unsigned int result_seq;         // which launch the result belongs to
    unsigned int sm_workers[256];    // workers per SM, for the per-SM cap
};

// Immutable description of one launch, passed by value (constant bank).
struct gmx_launch_t {
    uint3 grid;                      // the user's grid, for blockIdx/gridDim
    unsigned int begin;              // first linear block index of this launch
    unsigned int count;              // blocks in this launch
    unsigned int chunk;              // blocks per claim
    unsigned int cap;                // workers per SM at most (balances small grids)
    unsigned int seq;                // nonzero launch number; a retreat names it
    unsigned long long sm_mask[4];   // SMs this launch may run on (bit i = SM i)
};

static __device__ __forceinline__ unsigned int gmx_smid() {
    unsigned int r;
    asm volatile("mov.u32 %0, %%smid;" : "=r"(r));
    return r;
}

static __device__ __forceinline__ uint3 gmx_unlinear(unsigned int i, const uint3 g) {
    uint3 b;
    b.x = i % g.x;
    const unsigned int r = i / g.x;
    b.y = r % g.y;
    b.z = r / g.y;
    return b;
}

// Leader only: may this block work here? (SM in the mask, SM under its cap.)
// `st[1]` remembers whether the block counted itself on its SM, so that it
// can uncount itself when it leaves (no serial reset of 256 counters at the end).
static __device__ __forceinline__ unsigned int gmx_enter(gmx_ctl_t* c, const gmx_launch_t& L, unsigned int* st) {
    st[1] = 0u;
    const unsigned int s = gmx_smid();
    // Constant indices only: a run-time index into a parameter would copy the
    // whole launch description to local memory.
    const unsigned long long w = s < 64u ? L.sm_mask[0] : s < 128u ? L.sm_mask[1] : s < 192u ? L.sm_mask[2] : L.sm_mask[3];
    if (s >= 256u || ((w >> (s & 63u)) & 1ull) == 0ull) return 0u;
    st[1] = 1u;
    if (atomicAdd(&c->sm_workers[s], 1u) >= L.cap) return 0u;
    atomicAdd(&c->workers, 1u);
    return 1u;
}

static __device__ __forceinline__ void gmx_claim(gmx_ctl_t* c, const gmx_launch_t& L, volatile unsigned int* slot) {
    const unsigned long long old = atomicAdd(&c->claim, (unsigned long long)L.chunk);
    const unsigned int first = (unsigned int)old;
    unsigned int n = 0u;
    if ((unsigned int)(old >> 32) == L.seq) {
        atomicMin(&c->resume, first);
    } else if (first < L.count) {
        n = (L.count - first < L.chunk) ? (L.count - first) : L.chunk;
    }
    slot[0] = L.begin + first;
    slot[1] = n;
}

// Leader only, once per block of the grid, at the very end.
static __device__ __forceinline__ void gmx_leave(gmx_ctl_t* c, const gmx_launch_t& L, unsigned int grid_blocks, const unsigned int* st) {
    // A block stays on its SM: uncount it where it counted itself.
    if (st[1] != 0u) atomicSub(&c->sm_workers[gmx_smid()], 1u);
    __threadfence();
    if (atomicAdd(&c->exited, 1u) != grid_blocks - 1u) return;
    // Last one out: every other worker has made its final update, and every
    // per-SM counter is back at zero.
    __threadfence();
    volatile gmx_ctl_t* v = c;
    const unsigned int claimed = (unsigned int)v->claim;
    const unsigned int resume = v->resume;
    unsigned int next = resume != 0xffffffffu ? resume : claimed;
    if (next > L.count) next = L.count;
    v->result_next = L.begin + next;
    v->result_workers = v->workers;
    v->workers = 0u;
    v->resume = 0xffffffffu;
    v->exited = 0u;
    atomicExch(&c->claim, 0ull);
    __threadfence();
    // The host reads the result after the kernel has completed: no system fence needed.
    v->result_seq = L.seq;
}
// ---- end of gpumux worker prelude ----
