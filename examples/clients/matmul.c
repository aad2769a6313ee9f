/* Tiled matmul through gpumuxd: C = A * B, 256 x 256 floats (--size N: N x N, --repeat R: R launches).
 * Inputs are multiples of 1/8 and 1/4 small enough that every product and
 * partial sum is exact in float, so the GPU's result equals the CPU's
 * whatever the order of additions; --check still allows a tolerance. */
#include "common.h"
#include <math.h>


int main(int argc, char **argv) {
    const char *prog = "matmul";
    struct options o = parse(prog, argc, argv);
    const int N = o.size ? (int)o.size : 256;
    size_t bytes = sizeof(float) * (size_t)N * N;
    float *A = malloc(bytes), *B = malloc(bytes), *C = malloc(bytes);
    if (!A || !B || !C) return 1;
    for (int i = 0; i < N * N; ++i) {
        A[i] = (float)((i * 7) % 17 - 8) * 0.125f;
        B[i] = (float)((i * 5) % 13 - 6) * 0.25f;
    }
    gpumux_client *c = NULL;
    TRY(prog, gpumux_connect(o.socket, "matmul", 0, 1.0, 0, &c));
    /* The module first: its compile (once per daemon) stays out of the span from the
     * first copy to the last, which `gpumux replay` compares (docs/calibration.md). */
    char *src = read_kernel(prog, "matmul.cu");
    gpumux_module *m = NULL;
    TRY(prog, gpumux_load_module(c, "matmul.cu", src, NULL, 0, &m));
    const gpumux_kernel *k = NULL;
    TRY(prog, gpumux_module_kernel(m, "matmul", &k));
    gpumux_buffer dA, dB, dC;
    TRY(prog, gpumux_alloc(c, bytes, &dA));
    TRY(prog, gpumux_alloc(c, bytes, &dB));
    TRY(prog, gpumux_alloc(c, bytes, &dC));
    TRY(prog, gpumux_copy_to_device(c, dA, 0, A, bytes, 0));
    TRY(prog, gpumux_copy_to_device(c, dB, 0, B, bytes, 0));
    gpumux_arg args[] = { gpumux_arg_buffer(dA, 0), gpumux_arg_buffer(dB, 0), gpumux_arg_buffer(dC, 0), gpumux_arg_i32(N) };
    gpumux_launch_config cfg = { { (N + 15) / 16, (N + 15) / 16, 1 }, { 16, 16, 1 }, 0, 0, 20000 };
    for (int r = 0; r < o.repeat; ++r) TRY(prog, gpumux_launch(c, k, &cfg, args, 4));
    TRY(prog, gpumux_sync(c, 0));
    TRY(prog, gpumux_copy_to_host(c, dC, 0, C, bytes, 0));
    if (o.out) write_out(prog, o.out, C, bytes);
    if (o.check) {
        if (gpumux_is_simulated(c)) {
            printf("%s: simulated device, kernels do not compute there; checking that inputs round-trip\n", gpumux_device(c));
            check_round_trip(prog, c, dA, A, bytes);
            check_round_trip(prog, c, dB, B, bytes);
        } else {
            for (int r = 0; r < N; ++r)
                for (int col = 0; col < N; ++col) {
                    float want = 0.0f;
                    for (int k2 = 0; k2 < N; ++k2) want += A[r * N + k2] * B[k2 * N + col];
                    float got = C[r * N + col];
                    if (fabsf(got - want) > 1e-4f * fmaxf(1.0f, fabsf(want))) {
                        fprintf(stderr, "%s: C[%d][%d] is %g, the CPU's %g\n", prog, r, col, got, want);
                        return 1;
                    }
                }
        }
        printf("matmul: check passed\n");
    }
    gpumux_module_free(m);
    free(src);
    TRY(prog, gpumux_free(c, dA));
    TRY(prog, gpumux_free(c, dB));
    TRY(prog, gpumux_free(c, dC));
    TRY(prog, gpumux_disconnect(c));
    free(A); free(B); free(C);
    return 0;
}
