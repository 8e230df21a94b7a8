/* trainer bench-sgemm: times nn's linear layer (one sgemm: out (B, OC) = inp (B, C) @ W^T, no bias) for a
 * large square product, which measures what OpenBLAS (or cuBLAS) can do on this machine, and for the GEMM
 * shapes of the default supervised model, which is what the training loop asks of it. */
#include "trainer.h"
#include "trainer_util.h"

#include "nn_device.h"

#include "carls_args.h"
#include "util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    int B, C, OC;
    const char *what;
} s_shape_t;

/* Seconds per call of linear_forward at this shape, over at least min_seconds of calls. */
static double s_time_shape(const nn_ops_t *ops, int B, int C, int OC, double min_seconds)
{
    float *inp = ops->alloc(sizeof(float) * (size_t)B * (size_t)C);
    float *w = ops->alloc(sizeof(float) * (size_t)OC * (size_t)C);
    float *out = ops->alloc(sizeof(float) * (size_t)B * (size_t)OC);
    ops->linear_forward(out, inp, w, NULL, B, C, OC); /* warm-up */
    ops->synchronize();
    int64_t calls = 0, t0 = carls_monotonic_us(), t = t0;
    while ((double)(t - t0) / 1e6 < min_seconds) {
        for (int r = 0; r < 4; r++) {
            ops->linear_forward(out, inp, w, NULL, B, C, OC);
        }
        ops->synchronize();
        calls += 4;
        t = carls_monotonic_us();
    }
    ops->free(inp);
    ops->free(w);
    ops->free(out);
    return (double)(t - t0) / 1e6 / (double)calls;
}

static void s_usage(FILE *out)
{
    fprintf(out, "usage: trainer bench-sgemm [--device cpu|cuda|auto] [--threads N] [--seconds S]\n");
}

int trainer_bench_main(int argc, char **argv)
{
    const char *device_text = "cpu";
    int threads = 0;
    float seconds = 1.0f;
    const carls_arg_t args[] = {
        carls_arg_string("device", &device_text),
        carls_arg_int("threads", &threads, 1, 1024),
        carls_arg_float("seconds", &seconds, 0.01, 600),
        {0},
    };
    const int parsed = carls_args_parse("trainer bench-sgemm", argc, argv, args, s_usage);
    if (parsed != 0) {
        return parsed > 0 ? 0 : 2;
    }
    nn_device_t device;
    if (trainer_setup_device(device_text, &device) != 0) {
        return 2;
    }
    int used = trainer_setup_threads(threads);
    const nn_ops_t *ops = nn_ops_for(device);
    static const s_shape_t shapes[] = {
        {1024, 1024, 1024, "square (peak)"},
        {2048, 2048, 2048, "square (peak)"},
        {128, 784, 512, "training: layer 1 forward"},
        {128, 512, 256, "training: layer 2 forward"},
        {128, 256, 10, "training: classifier forward"},
        {500, 784, 512, "evaluation: layer 1 forward"},
    };
    printf("%-6s %-7s %6s %6s %6s %12s %12s  %s\n", "device", "threads", "B", "C", "OC", "ms/call", "GFLOP/s",
           "shape");
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
        const s_shape_t *s = &shapes[i];
        double sec = s_time_shape(ops, s->B, s->C, s->OC, seconds);
        double gflops = 2.0 * s->B * s->C * s->OC / sec / 1e9;
        printf("%-6s %-7d %6d %6d %6d %12.4f %12.2f  %s\n", ops->name, device == NN_DEVICE_CPU ? used : 0, s->B,
               s->C, s->OC, sec * 1e3, gflops, s->what);
        fflush(stdout);
    }
    return 0;
}
