/* The maker's GPU forward pass (nn_encode_u8_cuda: pinned memory, two streams, cuBLAS) against its CPU twin
 * (nn_encode_u8_cpu) on the experiment's MLP (784-256-128-10): embeddings and class probabilities must agree
 * to float rounding; then items/s of both, and of the plain synchronous nn_mlp_encode on the GPU for
 * comparison. Exits 77 (skipped) without CUDA in the build or without a GPU.
 * Usage: test_encode_parity [FASHION_MNIST_DIR]   (synthetic pixels when the data set is not there) */
#include "maker_testlib.h"

#include "data_fmnist.h"
#include "nn_device.h"
#include "nn_mlp.h"
#include "nn_mlp_encode_u8.h"

#include "util.h"

#include <math.h>
#include <string.h>

int main(int argc, char **argv)
{
    if (!nn_cuda_compiled() || nn_cuda_device_count() == 0) {
        printf("SKIPPED: no CUDA device\n");
        return 77;
    }
    char err[512];
    carls_fmnist_t ds;
    memset(&ds, 0, sizeof ds);
    int n = 60000;
    uint8_t *px = NULL;
    if (carls_fmnist_load(argc > 1 ? argv[1] : NULL, &ds, err, sizeof err) == 0) {
        px = ds.train.pixels;
        n = ds.train.n;
        printf("data: Fashion-MNIST training images (%d)\n", n);
    } else {
        px = carls_xmalloc((size_t)n * 784);
        uint64_t s = 1;
        for (size_t i = 0; i < (size_t)n * 784; i++) {
            px[i] = (uint8_t)(carls_splitmix64(&s) >> 56);
        }
        printf("data: %d synthetic images (%s)\n", n, err);
    }
    nn_mlp_config_t cfg = {.in_dim = 784, .n_hidden = 2, .hidden = {256, 128}, .num_classes = 10};
    nn_mlp_t *cpu = NULL, *gpu = NULL;
    if (nn_mlp_new(&cfg, NN_DEVICE_CPU, 4096, 5, &cpu, err, sizeof err) != 0 ||
        nn_mlp_new(&cfg, NN_DEVICE_CUDA, 4096, 5, &gpu, err, sizeof err) != 0) {
        fprintf(stderr, "model: %s\n", err);
        return 1;
    }
    const size_t E = 128, C = 10;
    float *e_cpu = carls_xmalloc(sizeof(float) * (size_t)n * E), *e_gpu = carls_xmalloc(sizeof(float) * (size_t)n * E);
    float *p_cpu = carls_xmalloc(sizeof(float) * (size_t)n * C), *p_gpu = carls_xmalloc(sizeof(float) * (size_t)n * C);
    float *x = carls_xmalloc(sizeof(float) * 4096 * 784);
    int64_t t0 = carls_monotonic_us();
    nn_mlp_encode_u8(cpu, px, n, e_cpu, p_cpu, 4096);
    double cpu_s = (double)(carls_monotonic_us() - t0) / 1e6;
    nn_mlp_encode_u8(gpu, px, n, e_gpu, p_gpu, 4096); /* warm-up, and the values compared */
    double we = 0, wp = 0;
    for (size_t i = 0; i < (size_t)n * E; i++) {
        double d = fabs((double)e_cpu[i] - e_gpu[i]) / (1.0 + fabs(e_cpu[i]));
        we = d > we ? d : we;
    }
    for (size_t i = 0; i < (size_t)n * C; i++) {
        double d = fabs((double)p_cpu[i] - p_gpu[i]);
        wp = d > wp ? d : wp;
    }
    printf("parity over %d images: embeddings max scaled error %.3g, probabilities max abs error %.3g\n", n, we, wp);
    MT_CHECK(we < 1e-4, "embeddings differ: %g", we);
    MT_CHECK(wp < 1e-5, "probabilities differ: %g", wp);
    printf("CPU (nn_encode_u8_cpu, 1 OpenBLAS thread): %.0f items/s\n", n / cpu_s);
    const int chunks[] = {1024, 4096, 16384};
    for (int c = 0; c < 3; c++) {
        double best = 1e30;
        for (int r = 0; r < 3; r++) {
            t0 = carls_monotonic_us();
            nn_mlp_encode_u8(gpu, px, n, e_gpu, NULL, chunks[c]);
            double s = (double)(carls_monotonic_us() - t0) / 1e6;
            best = s < best ? s : best;
        }
        printf("GPU pipelined (nn_encode_u8_cuda, chunk %d): %.0f items/s (%.2f ms for %d)\n", chunks[c], n / best,
               best * 1e3, n);
    }
    /* For comparison: the model's own synchronous eval forward (float input copied per batch of 4096). */
    {
        double best = 1e30;
        for (int r = 0; r < 3; r++) {
            t0 = carls_monotonic_us();
            for (int off = 0; off < n; off += 4096) {
                int m = n - off < 4096 ? n - off : 4096;
                for (size_t i = 0; i < (size_t)m * 784; i++) {
                    x[i] = px[(size_t)off * 784 + i] * (1.0f / 255.0f);
                }
                nn_mlp_encode(gpu, x, m, e_gpu + (size_t)off * E);
            }
            double s = (double)(carls_monotonic_us() - t0) / 1e6;
            best = s < best ? s : best;
        }
        printf("GPU synchronous (nn_mlp_encode, float input, batch 4096): %.0f items/s\n", n / best);
    }
    nn_mlp_destroy(&cpu);
    nn_mlp_destroy(&gpu);
    free(e_cpu);
    free(e_gpu);
    free(p_cpu);
    free(p_gpu);
    free(x);
    if (px != ds.train.pixels) {
        free(px);
    }
    carls_fmnist_free(&ds);
    return mt_finish("test_encode_parity", NULL);
}
