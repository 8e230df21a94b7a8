/* A user's own data set for the experiment that Fashion-MNIST feeds (graph regularisation: trainer graphreg and
 * kb-maker): dense features and integer labels from NumPy .npy files or CSV, named by a spec
 *
 *   npy:FEATURES.npy,LABELS.npy   features float32/float64/uint8 (N, D); labels integers (N,)
 *   csv:FEATURES.csv,LABELS.csv   features: N lines of D comma-separated numbers (a first line that is not
 *                                 numbers is a header and skipped); labels: one integer per line
 *
 * Labels are classes 0..C-1 (C = the largest label + 1, at most CARLS_USER_MAX_CLASSES), or -1 for an
 * unlabelled training example (never drawn into the labelled subset, counted in no accuracy). Test labels
 * must all be classes.
 *
 * The models and makers read examples as bytes, as they read Fashion-MNIST's grey levels: uint8 features are
 * taken as they are; float features are mapped to 0..255 by one affine map for the whole set (the training
 * set's minimum to 0, its maximum to 255; test values outside are clipped), which keeps distances up to a
 * common scale (so a neighbour graph on them is the graph on the floats, to within 1/255 of the range per
 * coordinate). Everything is read and checked before anything is returned: a bad shape, a NaN or infinity, a
 * label out of range or a row count that differs between the files is refused with a message naming the
 * file and where: "row R" (0-based data row; with "column C" for a NaN in .npy features) or, for what CSV
 * parsing finds, "line L" (1-based). */
#ifndef CARLS_DATA_USER_H
#define CARLS_DATA_USER_H

#include "data_fmnist.h"

#include <stddef.h>

#define CARLS_USER_MAX_CLASSES 254
#define CARLS_LABEL_NONE 255 /* the label byte of an unlabelled example (-1 in the file) */

enum {
    CARLS_USER_OK = 0,
    CARLS_USER_EIO = -1,  /* a file cannot be read */
    CARLS_USER_EBAD = -2, /* a file is invalid, or the spec is */
};

/* True when data names a user data set ("npy:..." or "csv:..."). */
int carls_user_data_is_spec(const char *data);

/* Loads the training set from spec and, when test_spec is not NULL or empty, the test set (else out->test is
 * empty, n = 0). out->classes is set from the labels. *out is zeroed first and owns its arrays on success. */
int carls_user_data_load(const char *spec, const char *test_spec, carls_fmnist_t *out, char *err, size_t errlen);

/* The data set an experiment names: "fashion-mnist" (from data_dir, NULL: the Debian package's; test_spec
 * must be empty) or a user spec as above. */
int carls_dataset_load(const char *data, const char *data_dir, const char *test_spec, carls_fmnist_t *out, char *err,
                       size_t errlen);

#endif
