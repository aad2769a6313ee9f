// All-pairs n-body accelerations with shared-memory tiles of bodies.
// Compute-bound. pos: float4 (x, y, z, mass) as 4 floats; acc: 4 floats per body.
#define NB_TILE 256
extern "C" __global__ void __launch_bounds__(NB_TILE) nbody(float* __restrict__ acc, const float* __restrict__ pos,
                                                           unsigned int n, float soft2) {
    __shared__ float4 sh[NB_TILE];
    const unsigned int i = blockIdx.x * NB_TILE + threadIdx.x;
    const float4 me = i < n ? reinterpret_cast<const float4*>(pos)[i] : make_float4(0.f, 0.f, 0.f, 0.f);
    float ax = 0.f, ay = 0.f, az = 0.f;
    for (unsigned int t = 0; t < n; t += NB_TILE) {
        const unsigned int j = t + threadIdx.x;
        sh[threadIdx.x] = j < n ? reinterpret_cast<const float4*>(pos)[j] : make_float4(0.f, 0.f, 0.f, 0.f);
        __syncthreads();
#pragma unroll 8
        for (unsigned int k = 0; k < NB_TILE; ++k) {
            const float4 o = sh[k];
            const float dx = o.x - me.x, dy = o.y - me.y, dz = o.z - me.z;
            const float r2 = fmaf(dx, dx, fmaf(dy, dy, fmaf(dz, dz, soft2)));
            const float inv = rsqrtf(r2);
            const float s = o.w * inv * inv * inv;
            ax = fmaf(dx, s, ax);
            ay = fmaf(dy, s, ay);
            az = fmaf(dz, s, az);
        }
        __syncthreads();
    }
    if (i < n) reinterpret_cast<float4*>(acc)[i] = make_float4(ax, ay, az, 0.f);
}
