/* Fashion-MNIST from Debian's dataset-fashion-mnist package: 60,000 training and 10,000 test images, 28x28
 * grey levels, 10 classes, as gzipped IDX files in /usr/share/datasets/fashion-mnist. */
#ifndef CARLS_DATA_FMNIST_H
#define CARLS_DATA_FMNIST_H

#include "carls_args.h"

#include <stddef.h>
#include <stdint.h>

#define CARLS_FMNIST_DIR "/usr/share/datasets/fashion-mnist"
#define CARLS_FMNIST_PACKAGE "dataset-fashion-mnist"
#define CARLS_FMNIST_CLASSES 10

/* A labelled image set. */
typedef struct {
    int n;           /* images */
    int rows, cols;  /* image size (28 x 28) */
    int dim;         /* rows * cols */
    uint8_t *pixels; /* (n, dim) grey levels 0..255, owned */
    uint8_t *labels; /* (n) classes 0..num_classes-1, owned */
} carls_image_set_t;

typedef struct {
    carls_image_set_t train; /* train-images-idx3-ubyte.gz + train-labels-idx1-ubyte.gz */
    carls_image_set_t test;  /* t10k-images-idx3-ubyte.gz + t10k-labels-idx1-ubyte.gz */
    int classes;             /* number of classes (CARLS_FMNIST_CLASSES; a user data set's, data_user.h) */
} carls_fmnist_t;

enum {
    CARLS_FMNIST_OK = 0,
    CARLS_FMNIST_EMISSING = -1, /* a file is missing: the package is not installed (the message says so) */
    CARLS_FMNIST_EBAD = -2,     /* a file is unreadable or invalid */
};

/* Loads an image IDX (3 dimensions) and a label IDX (1 dimension) as one set, checking that the counts agree
 * and every label is below num_classes. *out is zeroed first and owns its arrays on success. */
int carls_image_set_load(const char *images_path, const char *labels_path, int num_classes, carls_image_set_t *out,
                         char *err, size_t errlen);

/* Loads both splits from dir (NULL: CARLS_FMNIST_DIR). A missing file gives CARLS_FMNIST_EMISSING with a
 * message naming the package to install. */
int carls_fmnist_load(const char *dir, carls_fmnist_t *out, char *err, size_t errlen);

/* The options that pick the Fashion-MNIST data and a labelled subset of its training images, shared by the
 * trainers and kb-maker, as a carls_args group (carls_arg_group(g->rows)): --data NAME, --data-dir DIR,
 * --labels-per-class N (min_labels..6000, the images of a class in the training set), --label-seed S, stored
 * into *data, *data_dir, *labels_per_class and *label_seed. The callers check NAME. */
typedef struct {
    carls_arg_t rows[5];
} carls_fmnist_args_t;
void carls_fmnist_args(carls_fmnist_args_t *g, const char **data, const char **data_dir, int *labels_per_class,
                       int min_labels, int *label_seed);

void carls_image_set_free(carls_image_set_t *set);
void carls_fmnist_free(carls_fmnist_t *ds);

/* Writes images idx[0..n-1] of set to out (n, dim) as floats pixel / 255, and their labels to labels (n) when
 * labels is not NULL. */
void carls_image_set_batch(const carls_image_set_t *set, const uint32_t *idx, int n, float *out, int32_t *labels);

#endif
