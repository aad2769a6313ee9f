/* 2-D 5-point stencil through gpumuxd on a 512 x 512 grid (--size N: N x N, --repeat R: R launches). Inputs are
 * small integers, so 0.5 * c + 0.125 * (n + s + e + w) is exact in float
 * (fused or not); --check still allows a tolerance. */
#include "common.h"
#include <math.h>


int main(int argc, char **argv) {
    const char *prog = "stencil";
    struct options o = parse(prog, argc, argv);
    const int NX = o.size ? (int)o.size : 512, NY = NX;
    size_t bytes = sizeof(float) * (size_t)NX * NY;
    float *in = malloc(bytes), *out = malloc(bytes);
    if (!in || !out) return 1;
    for (int y = 0; y < NY; ++y)
        for (int x = 0; x < NX; ++x) in[y * NX + x] = (float)((x * 3 + y * 5) % 16);
    gpumux_client *c = NULL;
    TRY(prog, gpumux_connect(o.socket, "stencil", 0, 1.0, 0, &c));
    /* The module first: its compile (once per daemon) stays out of the span from the
     * first copy to the last, which `gpumux replay` compares (docs/calibration.md). */
    char *src = read_kernel(prog, "stencil.cu");
    gpumux_module *m = NULL;
    TRY(prog, gpumux_load_module(c, "stencil.cu", src, NULL, 0, &m));
    const gpumux_kernel *k = NULL;
    TRY(prog, gpumux_module_kernel(m, "stencil", &k));
    gpumux_buffer din, dout;
    TRY(prog, gpumux_alloc(c, bytes, &din));
    TRY(prog, gpumux_alloc(c, bytes, &dout));
    TRY(prog, gpumux_copy_to_device(c, din, 0, in, bytes, 0));
    gpumux_arg args[] = { gpumux_arg_buffer(din, 0), gpumux_arg_buffer(dout, 0), gpumux_arg_i32(NX), gpumux_arg_i32(NY) };
    gpumux_launch_config cfg = { { (NX + 15) / 16, (NY + 15) / 16, 1 }, { 16, 16, 1 }, 0, 0, 3000 };
    for (int r = 0; r < o.repeat; ++r) TRY(prog, gpumux_launch(c, k, &cfg, args, 4));
    TRY(prog, gpumux_sync(c, 0));
    TRY(prog, gpumux_copy_to_host(c, dout, 0, out, bytes, 0));
    if (o.out) write_out(prog, o.out, out, bytes);
    if (o.check) {
        if (gpumux_is_simulated(c)) {
            printf("%s: simulated device, kernels do not compute there; checking that the input round-trips\n", gpumux_device(c));
            check_round_trip(prog, c, din, in, bytes);
        } else {
            for (int y = 0; y < NY; ++y)
                for (int x = 0; x < NX; ++x) {
                    int i = y * NX + x;
                    float want = (x == 0 || y == 0 || x == NX - 1 || y == NY - 1)
                        ? in[i] : 0.5f * in[i] + 0.125f * (in[i - NX] + in[i + NX] + in[i - 1] + in[i + 1]);
                    if (fabsf(out[i] - want) > 1e-5f * fmaxf(1.0f, fabsf(want))) {
                        fprintf(stderr, "%s: out[%d][%d] is %g, the CPU's %g\n", prog, y, x, out[i], want);
                        return 1;
                    }
                }
        }
        printf("stencil: check passed\n");
    }
    gpumux_module_free(m);
    free(src);
    TRY(prog, gpumux_free(c, din));
    TRY(prog, gpumux_free(c, dout));
    TRY(prog, gpumux_disconnect(c));
    free(in); free(out);
    return 0;
}
