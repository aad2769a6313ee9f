"""CUDA C the tests load (on the simulated device nothing is compiled, the
kernels take their time and compute nothing, but every check before that is
real: syntax, transformation, parameter sizes)."""

SCALE = r'''
extern "C" __global__ void scale(float* x, float a, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] *= a;
}
extern "C" __global__ void nothing() {}
'''

# __trap() in the body: the simulator's deterministic stand-in for a kernel fault.
TRAP = r'''
extern "C" __global__ void boom(float* x) { __trap(); }
'''
