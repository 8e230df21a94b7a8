/* Fashion-MNIST loader (see data_fmnist.h). */
#include "data_fmnist.h"

#include "data_idx.h"
#include "util.h"

#include <assert.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int carls_image_set_load(const char *images_path, const char *labels_path, int num_classes, carls_image_set_t *out,
                         char *err, size_t errlen)
{
    memset(out, 0, sizeof *out);
    carls_idx_t img = {0}, lab = {0};
    int rc = carls_idx_read_gz(images_path, 3, &img, err, errlen);
    if (rc == 0) {
        rc = carls_idx_read_gz(labels_path, 1, &lab, err, errlen);
    }
    if (rc) {
        carls_idx_free(&img);
        carls_idx_free(&lab);
        return rc == CARLS_IDX_ENOENT ? CARLS_FMNIST_EMISSING : CARLS_FMNIST_EBAD;
    }
    if (img.dims[0] != lab.dims[0]) {
        rc = carls_errorf(err, errlen, CARLS_FMNIST_EBAD, "%s has %u images but %s has %u labels", images_path,
                    img.dims[0], labels_path, lab.dims[0]);
        goto fail;
    }
    for (uint64_t i = 0; i < lab.count; i++) {
        if (lab.data[i] >= num_classes) {
            rc = carls_errorf(err, errlen, CARLS_FMNIST_EBAD, "%s: label %u of example %llu is not below %d", labels_path,
                        lab.data[i], (unsigned long long)i, num_classes);
            goto fail;
        }
    }
    out->n = (int)img.dims[0];
    out->rows = (int)img.dims[1];
    out->cols = (int)img.dims[2];
    out->dim = out->rows * out->cols;
    out->pixels = img.data;
    out->labels = lab.data;
    return 0;
fail:
    carls_idx_free(&img);
    carls_idx_free(&lab);
    return rc;
}

int carls_fmnist_load(const char *dir, carls_fmnist_t *out, char *err, size_t errlen)
{
    memset(out, 0, sizeof *out);
    if (!dir) {
        dir = CARLS_FMNIST_DIR;
    }
    static const char *files[4] = {"train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz",
                                   "t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"};
    char paths[4][4096];
    for (int i = 0; i < 4; i++) {
        snprintf(paths[i], sizeof paths[i], "%s/%s", dir, files[i]);
    }
    char inner[1024] = "";
    int rc = carls_image_set_load(paths[0], paths[1], CARLS_FMNIST_CLASSES, &out->train, inner, sizeof inner);
    if (rc == 0) {
        rc = carls_image_set_load(paths[2], paths[3], CARLS_FMNIST_CLASSES, &out->test, inner, sizeof inner);
    }
    if (rc == CARLS_FMNIST_EMISSING) {
        carls_errorf(err, errlen, rc,
               "Fashion-MNIST not found (%s). Install the Debian package %s (apt-get install %s), or point "
               "--data-dir at a folder holding the four IDX files",
               inner, CARLS_FMNIST_PACKAGE, CARLS_FMNIST_PACKAGE);
    } else if (rc) {
        carls_errorf(err, errlen, rc, "Fashion-MNIST: %s", inner);
    }
    if (rc == 0 && (out->train.dim != out->test.dim)) {
        rc = carls_errorf(err, errlen, CARLS_FMNIST_EBAD, "Fashion-MNIST: train images are %dx%d, test images %dx%d",
                    out->train.rows, out->train.cols, out->test.rows, out->test.cols);
    }
    if (rc) {
        carls_fmnist_free(out);
    }
    out->classes = CARLS_FMNIST_CLASSES;
    return rc;
}

void carls_image_set_free(carls_image_set_t *set)
{
    if (!set) {
        return;
    }
    free(set->pixels);
    free(set->labels);
    memset(set, 0, sizeof *set);
}

void carls_fmnist_free(carls_fmnist_t *ds)
{
    if (!ds) {
        return;
    }
    carls_image_set_free(&ds->train);
    carls_image_set_free(&ds->test);
}

void carls_image_set_batch(const carls_image_set_t *set, const uint32_t *idx, int n, float *out, int32_t *labels)
{
    const float scale = 1.0f / 255.0f;
    for (int i = 0; i < n; i++) {
        assert(idx[i] < (uint32_t)set->n);
        const uint8_t *src = set->pixels + (size_t)idx[i] * (size_t)set->dim;
        float *dst = out + (size_t)i * (size_t)set->dim;
        for (int d = 0; d < set->dim; d++) {
            dst[d] = (float)src[d] * scale;
        }
        if (labels) {
            labels[i] = set->labels[idx[i]];
        }
    }
}

void carls_fmnist_args(carls_fmnist_args_t *g, const char **data, const char **data_dir, int *labels_per_class,
                       int min_labels, int *label_seed)
{
    const carls_arg_t rows[] = {
        carls_arg_string("data", data),
        carls_arg_string("data-dir", data_dir),
        carls_arg_int("labels-per-class", labels_per_class, min_labels, 6000),
        carls_arg_int("label-seed", label_seed, 0, 2147483647),
        {0},
    };
    _Static_assert(sizeof rows == sizeof g->rows, "carls_fmnist_args_t holds the rows");
    memcpy(g->rows, rows, sizeof rows);
}
