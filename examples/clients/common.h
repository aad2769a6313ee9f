/* Shared by the C examples: arguments, reading a kernel file, failing loudly. */
#ifndef GPUMUX_EXAMPLE_COMMON_H
#define GPUMUX_EXAMPLE_COMMON_H
#include "gpumux.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* --size: the problem's size (0: the program's default); --repeat: the kernel's launches
 * (each computes the same output, so --check holds for any count). */
struct options { const char *socket, *out; int check; long size; int repeat; };

static void die(const char *prog, const char *what, gpumux_status s) {
    fprintf(stderr, "%s: %s failed (status %d): %s\n", prog, what, (int)s, gpumux_last_error());
    exit(1);
}

#define TRY(prog, call) do { gpumux_status s_ = (call); if (s_ != GPUMUX_OK) die(prog, #call, s_); } while (0)

static struct options parse(const char *prog, int argc, char **argv) {
    struct options o = { NULL, NULL, 0, 0, 1 };
    for (int i = 1; i < argc; ++i) {
        if (!strcmp(argv[i], "--socket") && i + 1 < argc) o.socket = argv[++i];
        else if (!strcmp(argv[i], "--out") && i + 1 < argc) o.out = argv[++i];
        else if (!strcmp(argv[i], "--check")) o.check = 1;
        else if (!strcmp(argv[i], "--size") && i + 1 < argc) o.size = atol(argv[++i]);
        else if (!strcmp(argv[i], "--repeat") && i + 1 < argc) o.repeat = atoi(argv[++i]);
        else { fprintf(stderr, "%s: unknown argument %s (--socket PATH, --out FILE, --check, --size N, --repeat N)\n", prog, argv[i]); exit(2); }
        if (o.size < 0 || o.size > 16384 || o.repeat < 1 || o.repeat > 1000000) {
            fprintf(stderr, "%s: --size must be 0 to 16384 and --repeat 1 to 1000000\n", prog);
            exit(2);
        }
    }
    return o;
}

/* The kernel source: KERNEL_DIR is set by the Makefile. */
static char *read_kernel(const char *prog, const char *name) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", KERNEL_DIR, name);
    FILE *f = fopen(path, "rb");
    if (!f) { fprintf(stderr, "%s: cannot open %s\n", prog, path); exit(1); }
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    rewind(f);
    char *src = malloc((size_t)n + 1);
    if (!src || fread(src, 1, (size_t)n, f) != (size_t)n) { fprintf(stderr, "%s: cannot read %s\n", prog, path); exit(1); }
    src[n] = 0;
    fclose(f);
    return src;
}

static void write_out(const char *prog, const char *path, const void *data, size_t n) {
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(data, 1, n, f) != n || fclose(f) != 0) { fprintf(stderr, "%s: cannot write %s\n", prog, path); exit(1); }
}

/* On a simulated device: copies `n` bytes of `buf` back and compares them with `want`. */
static void check_round_trip(const char *prog, gpumux_client *c, gpumux_buffer buf, const void *want, size_t n) {
    void *back = malloc(n);
    if (!back) exit(1);
    TRY(prog, gpumux_copy_to_host(c, buf, 0, back, n, 0));
    if (memcmp(back, want, n) != 0) { fprintf(stderr, "%s: an input did not round-trip bitwise\n", prog); exit(1); }
    free(back);
}
#endif
