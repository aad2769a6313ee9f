// ---- gpumux worker prelude (inserted by gpumux-cuda's transformation) ----
// Mutable state of one preemptible launch, in device memory. The claim word
// packs the retreat request with the next block index, so one atomic both
// claims work and reads the request: a claim that saw no request is run to the
// end, one that saw it runs nothing and lowers `resume`, so [resume, end) is
// exactly the work left. The last worker to leave publishes the result and
// resets the state, so the next launch needs no host-side reset. A request
// made with a compare-and-swap (`gmx_cut`) also returns the next block index
// at that instant: the exact point where the workers stop.
struct gmx_ctl_t {
    // -- first 128-byte line: claims, and what the host reads back (32 bytes) --
    unsigned long long claim;        // low 32 bits: next block (relative to begin); high 32: seq to retreat
    unsigned int resume;             // lowest relative index claimed after the request (0xffffffff: none)
    unsigned int result_next;        // published by the last worker: first block not done
    unsigned int result_workers;     // workers that ran blocks
    unsigned int result_seq;         // which launch the result belongs to
    unsigned int pad0[26];
    // -- second line: the exit count, apart from the claim word so that
    // workers leaving do not queue behind workers still claiming --
    unsigned long long exit_word;    // low 32 bits: workers that left (all of the grid); high 32: those that ran blocks
    // Per-SM retreat, written by the host only (one 32-bit store each, so no
    // reset is needed): word i holds SMs 16i..16i+15 in its low 16 bits and the
    // low 16 bits of the launch's seq in its high 16. A worker whose SM's bit
    // is set for its launch claims nothing more and leaves; the others go on.
    unsigned int gone[16];
    // Host memory mapped for the device (0: none), set by the host once per
    // record and never reset: the last worker copies the result there too,
    // so the host sees the launch end by reading its own memory instead of
    // querying an event and then copying the result back (a synchronous copy
    // of several µs on every launch's path).
    unsigned long long host_result;
    unsigned int pad1[12];
    unsigned int sm_workers[256];    // workers per SM, for the per-SM cap (only when the launch has one)
};

// Immutable description of one launch, passed by value (constant bank).
struct gmx_launch_t {
    uint3 grid;                      // the user's grid, for blockIdx/gridDim
    unsigned int begin;              // first linear block index of this launch
    unsigned int count;              // blocks in this launch
    unsigned int chunk;              // blocks per claim
    unsigned int cap;                // workers per SM at most (balances small grids); 0xffffffff: no cap
    unsigned int seq;                // nonzero launch number; a retreat names it
    unsigned long long sm_mask[4];   // SMs this launch may run on (bit i = SM i)
    unsigned int slots;              // workers that can run blocks at once (SMs in the mask x workers per SM)
    unsigned int pad;
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

// Leader only: has the host asked this launch's workers to leave SM `s`
// (`gone`)? Read before every claim, so a worker leaves after the chunk it is
// running: blocks are never claimed and then abandoned, and the workers on
// the other SMs claim what is left.
static __device__ __forceinline__ bool gmx_gone(const gmx_ctl_t* c, const gmx_launch_t& L, unsigned int s) {
    const unsigned int w = *((const volatile unsigned int*)&c->gone[s >> 4]);
    return (w >> 16) == (L.seq & 0xffffu) && ((w >> (s & 15u)) & 1u) != 0u;
}

// Leader only: may this block work here? (SM in the mask, SM under its cap.)
// `st[1]` remembers whether the block counted itself on its SM, so that it
// can uncount itself when it leaves (no serial reset of 256 counters at the end).
// A launch without a cap (the host sends 0xffffffff when the occupancy bounds
// it anyway) skips the counter: one atomic round trip less on every worker's
// critical path.
static __device__ __forceinline__ unsigned int gmx_enter(gmx_ctl_t* c, const gmx_launch_t& L, unsigned int* st) {
    st[1] = 0u;
    st[2] = 0u;
    const unsigned int s = gmx_smid();
    st[3] = s;
    // Constant indices only: a run-time index into a parameter would copy the
    // whole launch description to local memory.
    const unsigned long long w = s < 64u ? L.sm_mask[0] : s < 128u ? L.sm_mask[1] : s < 192u ? L.sm_mask[2] : L.sm_mask[3];
    if (s >= 256u || ((w >> (s & 63u)) & 1ull) == 0ull || gmx_gone(c, L, s)) return 0u;
    if (L.cap == 0xffffffffu) return 1u;
    st[1] = 1u;
    return atomicAdd(&c->sm_workers[s], 1u) < L.cap ? 1u : 0u;
}

// Leader only. Claims up to `L.chunk` blocks (none on an SM the launch must leave). Guided self-scheduling: the
// claim shrinks to a share of what is left (estimated from this worker's
// previous claim, st[2]) as the launch nears its end, so the last claims are
// single blocks and no worker keeps a long tail while the others are done.
static __device__ __forceinline__ void gmx_claim(gmx_ctl_t* c, const gmx_launch_t& L, volatile unsigned int* slot, unsigned int* st) {
    if (gmx_gone(c, L, st[3])) {
        slot[0] = L.begin;
        slot[1] = 0u;
        return;
    }
    unsigned int want = L.chunk;
    if (want > 1u) {
        const unsigned int seen = st[2];
        const unsigned int share = (seen < L.count ? L.count - seen : 0u) / (2u * L.slots + 1u);
        want = share < 1u ? 1u : (share < want ? share : want);
    }
    const unsigned long long old = atomicAdd(&c->claim, (unsigned long long)want);
    const unsigned int first = (unsigned int)old;
    st[2] = first;
    unsigned int n = 0u;
    if ((unsigned int)(old >> 32) == L.seq) {
        atomicMin(&c->resume, first);
    } else if (first < L.count) {
        n = (L.count - first < want) ? (L.count - first) : want;
    }
    slot[0] = L.begin + first;
    slot[1] = n;
}

// Leader only, once per block of the grid, at the very end. st[0]: the block
// worked here; st[1]: it counted itself on its SM.
static __device__ __forceinline__ void gmx_leave(gmx_ctl_t* c, const gmx_launch_t& L, unsigned int grid_blocks, const unsigned int* st) {
    // A block stays on its SM: uncount it where it counted itself.
    if (st[1] != 0u) atomicSub(&c->sm_workers[gmx_smid()], 1u);
    // Release: this worker's claims and resume update happen before its exit is counted.
    __threadfence();
    const unsigned long long worked = st[0] != 0u ? (1ull << 32) : 0ull;
    const unsigned long long e = atomicAdd(&c->exit_word, 1ull | worked);
    if ((unsigned int)e != grid_blocks - 1u) return;
    // Last one out (acquire): every other worker has made its final update,
    // and every per-SM counter is back at zero. The exchanges read and reset
    // in one round trip each, issued back to back.
    __threadfence();
    // The reset leaves this launch's seq as a (moot) retreat request: a cut
    // (`gmx_cut`, the host's refill) that comes after the end sees that the
    // launch is over instead of taking a fresh record for an unstarted one.
    // The next launch has another seq and ignores it.
    const unsigned long long claim = atomicExch(&c->claim, ((unsigned long long)L.seq) << 32);
    const unsigned int resume = atomicExch(&c->resume, 0xffffffffu);
    atomicExch(&c->exit_word, 0ull);
    const unsigned int claimed = (unsigned int)claim;
    unsigned int next = resume != 0xffffffffu ? resume : claimed;
    if (next > L.count) next = L.count;
    volatile gmx_ctl_t* v = c;
    v->result_next = L.begin + next;
    v->result_workers = (unsigned int)((e + worked) >> 32);
    // The host reads the result after the kernel has completed: no fence needed.
    v->result_seq = L.seq;
    volatile unsigned int* h = (volatile unsigned int*)(*(volatile unsigned long long*)&c->host_result);
    if (h != 0) {
        h[0] = L.begin + next;
        h[1] = (unsigned int)((e + worked) >> 32);
        // Everything before (this worker's stores, and through the exit count
        // every other worker's) is visible system-wide before the seq that
        // tells the host the result is there.
        __threadfence_system();
        h[2] = L.seq;
    }
}
// ---- end of gpumux worker prelude ----
