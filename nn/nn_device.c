/* Device selection and the per-device operation tables (see nn_device.h). */
#include "nn_device.h"

#include "log.h"
#include "util.h"

#include <cblas.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef CARLS_HAVE_CUDA
#include "nn_cuda.h"
#endif

/* The devices' names, for parsing and printing alike. */
static const struct {
    nn_device_t device;
    const char *name;
} s_device_names[] = {
    {NN_DEVICE_AUTO, "auto"},
    {NN_DEVICE_CPU, "cpu"},
    {NN_DEVICE_CUDA, "cuda"},
};

int nn_device_parse(const char *text, nn_device_t *out)
{
    if (!text || !out) {
        return -1;
    }
    for (size_t i = 0; i < sizeof s_device_names / sizeof s_device_names[0]; i++) {
        if (strcmp(text, s_device_names[i].name) == 0) {
            *out = s_device_names[i].device;
            return 0;
        }
    }
    return -1;
}

const char *nn_device_name(nn_device_t device)
{
    for (size_t i = 0; i < sizeof s_device_names / sizeof s_device_names[0]; i++) {
        if (s_device_names[i].device == device) {
            return s_device_names[i].name;
        }
    }
    return "?";
}

bool nn_cuda_compiled(void)
{
#ifdef CARLS_HAVE_CUDA
    return true;
#else
    return false;
#endif
}

int nn_cuda_device_count(void)
{
#ifdef CARLS_HAVE_CUDA
    return nn_cuda_device_count_raw();
#else
    return 0;
#endif
}

int nn_device_resolve(nn_device_t requested, nn_device_t *out, char *err, size_t errlen)
{
    if (requested == NN_DEVICE_CPU) {
        *out = NN_DEVICE_CPU;
        return 0;
    }
    if (!nn_cuda_compiled()) {
        if (requested == NN_DEVICE_CUDA) {
            snprintf(err, errlen, "--device cuda: this build has no CUDA kernels (nvcc was not found when it was "
                                  "configured, or CARLS_CUDA=OFF); use --device cpu or auto");
            return -1;
        }
        LOG_INFO("device auto: this build has no CUDA kernels, using the CPU");
        *out = NN_DEVICE_CPU;
        return 0;
    }
    int count = nn_cuda_device_count();
    if (count <= 0) {
        if (requested == NN_DEVICE_CUDA) {
            snprintf(err, errlen, "--device cuda: no usable CUDA device (no GPU, or no driver)");
            return -1;
        }
        LOG_INFO("device auto: no usable CUDA device (no GPU or no driver), falling back to the CPU");
        *out = NN_DEVICE_CPU;
        return 0;
    }
    if (requested == NN_DEVICE_AUTO) {
        LOG_INFO("device auto: %d CUDA device(s) found, using cuda", count);
    }
    *out = NN_DEVICE_CUDA;
    return 0;
}

/* ---- CPU memory ---- */

static void *s_cpu_alloc(size_t bytes)
{
    return carls_xcalloc(1, bytes);
}

static void s_cpu_free(void *ptr)
{
    free(ptr);
}

static void s_cpu_copy(void *dst, const void *src, size_t bytes)
{
    if (bytes) {
        memmove(dst, src, bytes);
    }
}

static void s_cpu_zero(void *ptr, size_t bytes)
{
    if (bytes) {
        memset(ptr, 0, bytes);
    }
}

static void s_cpu_synchronize(void)
{
}

static const nn_ops_t s_cpu_ops = {
    .device = NN_DEVICE_CPU,
    .name = "cpu",
    .alloc = s_cpu_alloc,
    .free = s_cpu_free,
    .to_device = s_cpu_copy,
    .to_host = s_cpu_copy,
    .zero = s_cpu_zero,
    .synchronize = s_cpu_synchronize,
    .linear_forward = nn_linear_forward_cpu,
    .linear_backward = nn_linear_backward_cpu,
    .relu_forward = nn_relu_forward_cpu,
    .relu_backward = nn_relu_backward_cpu,
    .dropout_forward = nn_dropout_forward_cpu,
    .dropout_backward = nn_dropout_backward_cpu,
    .softmax_ce_forward = nn_softmax_ce_forward_cpu,
    .softmax_ce_backward = nn_softmax_ce_backward_cpu,
    .l2norm_forward = nn_l2norm_forward_cpu,
    .l2norm_backward = nn_l2norm_backward_cpu,
    .embedding_bag_forward = nn_embedding_bag_forward_cpu,
    .embedding_bag_backward = nn_embedding_bag_backward_cpu,
    .pairwise_sqdist_forward = nn_pairwise_sqdist_forward_cpu,
    .pairwise_sqdist_backward = nn_pairwise_sqdist_backward_cpu,
    .infonce_forward = nn_infonce_forward_cpu,
    .infonce_backward = nn_infonce_backward_cpu,
    .im2col_forward = nn_im2col_forward_cpu,
    .col2im_backward = nn_col2im_backward_cpu,
    .maxpool2d_forward = nn_maxpool2d_forward_cpu,
    .maxpool2d_backward = nn_maxpool2d_backward_cpu,
    .add = nn_add_cpu,
    .argmax = nn_argmax_cpu,
    .sgd_update = nn_sgd_update_cpu,
    .adam_update = nn_adam_update_cpu,
};

#ifdef CARLS_HAVE_CUDA
/* cuda/ knows nothing above it, so its embedding-bag twins take the mode as a plain int of their own. */
_Static_assert(NN_BAG_SUM == NN_CUDA_BAG_SUM && NN_BAG_MEAN == NN_CUDA_BAG_MEAN,
               "nn_bag_mode_t and the CUDA twins' mode constants disagree");
static const nn_ops_t s_cuda_ops = {
    .device = NN_DEVICE_CUDA,
    .name = "cuda",
    .alloc = nn_cuda_alloc,
    .free = nn_cuda_free,
    .to_device = nn_cuda_to_device,
    .to_host = nn_cuda_to_host,
    .zero = nn_cuda_zero,
    .synchronize = nn_cuda_synchronize,
    .linear_forward = nn_linear_forward_cuda,
    .linear_backward = nn_linear_backward_cuda,
    .relu_forward = nn_relu_forward_cuda,
    .relu_backward = nn_relu_backward_cuda,
    .dropout_forward = nn_dropout_forward_cuda,
    .dropout_backward = nn_dropout_backward_cuda,
    .softmax_ce_forward = nn_softmax_ce_forward_cuda,
    .softmax_ce_backward = nn_softmax_ce_backward_cuda,
    .l2norm_forward = nn_l2norm_forward_cuda,
    .l2norm_backward = nn_l2norm_backward_cuda,
    .embedding_bag_forward = nn_embedding_bag_forward_cuda,
    .embedding_bag_backward = nn_embedding_bag_backward_cuda,
    .pairwise_sqdist_forward = nn_pairwise_sqdist_forward_cuda,
    .pairwise_sqdist_backward = nn_pairwise_sqdist_backward_cuda,
    .infonce_forward = nn_infonce_forward_cuda,
    .infonce_backward = nn_infonce_backward_cuda,
    .im2col_forward = nn_im2col_forward_cuda,
    .col2im_backward = nn_col2im_backward_cuda,
    .maxpool2d_forward = nn_maxpool2d_forward_cuda,
    .maxpool2d_backward = nn_maxpool2d_backward_cuda,
    .add = nn_add_cuda,
    .argmax = nn_argmax_cuda,
    .sgd_update = nn_sgd_update_cuda,
    .adam_update = nn_adam_update_cuda,
};
#endif

const nn_ops_t *nn_ops_for(nn_device_t device)
{
    switch (device) {
    case NN_DEVICE_CPU:
        return &s_cpu_ops;
    case NN_DEVICE_CUDA:
#ifdef CARLS_HAVE_CUDA
        nn_cuda_init();
        return &s_cuda_ops;
#else
        return NULL;
#endif
    case NN_DEVICE_AUTO:
        break;
    }
    return NULL;
}

int nn_cpu_set_threads(int n)
{
    if (n < 1) {
        n = 1;
    }
    openblas_set_num_threads(n);
    return openblas_get_num_threads();
}
