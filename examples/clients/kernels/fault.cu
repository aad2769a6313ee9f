// Deliberately faults: writes through a pointer far outside any allocation
// (`p` plus a huge offset), so the GPU raises an illegal address and the
// context is lost. Used to test the daemon's recovery; never run it for output.
extern "C" __global__ void fault(unsigned int* p) {
    p[(1ull << 40) + threadIdx.x] = 0xdeadbeefu;
}
