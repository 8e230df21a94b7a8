/* data/: loads the real Fashion-MNIST files from the Debian package and checks what is known about them
 * (60,000 + 10,000 images of 28x28, exactly 6,000 and 1,000 per class). Exits 77, which CTest reports as
 * skipped, with "SKIPPED: ..." when the package is not installed. */
#include "data_fmnist.h"
#include "data_sample.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define CHECK(cond)                                                                                         \
    do {                                                                                                    \
        if (!(cond)) {                                                                                      \
            fprintf(stderr, "FAILED %s:%d: %s\n", __FILE__, __LINE__, #cond);                               \
            return 1;                                                                                       \
        }                                                                                                   \
    } while (0)

int main(void)
{
    struct stat st;
    if (stat(CARLS_FMNIST_DIR, &st) != 0) {
        printf("SKIPPED: %s is missing (Debian package %s not installed)\n", CARLS_FMNIST_DIR, CARLS_FMNIST_PACKAGE);
        return 77;
    }
    carls_fmnist_t ds;
    char err[1024];
    int rc = carls_fmnist_load(NULL, &ds, err, sizeof err);
    if (rc != 0) {
        fprintf(stderr, "FAILED: %s\n", err);
        return 1;
    }
    CHECK(ds.train.n == 60000 && ds.test.n == 10000);
    CHECK(ds.train.rows == 28 && ds.train.cols == 28 && ds.test.dim == 784);
    int train_counts[10] = {0}, test_counts[10] = {0};
    for (int i = 0; i < ds.train.n; i++) {
        train_counts[ds.train.labels[i]]++;
    }
    for (int i = 0; i < ds.test.n; i++) {
        test_counts[ds.test.labels[i]]++;
    }
    for (int c = 0; c < 10; c++) {
        CHECK(train_counts[c] == 6000 && test_counts[c] == 1000);
    }
    /* Not all black, not all white: the mean grey level of Fashion-MNIST is about 0.286. */
    double sum = 0;
    for (size_t i = 0; i < (size_t)ds.train.n * 784; i++) {
        sum += ds.train.pixels[i];
    }
    double mean = sum / ((double)ds.train.n * 784 * 255);
    printf("train mean grey level %.4f\n", mean);
    CHECK(mean > 0.27 && mean < 0.30);
    /* 10 labels per class from seed 0: 100 distinct examples, 10 of each class. */
    uint32_t lab[100];
    CHECK(carls_label_subset(ds.train.labels, (size_t)ds.train.n, 10, 10, 0, lab, NULL) == 0);
    for (int k = 0; k < 100; k++) {
        CHECK(ds.train.labels[lab[k]] == k / 10);
    }
    carls_fmnist_free(&ds);
    printf("Fashion-MNIST OK: 60000 train, 10000 test, 6000/1000 per class\n");
    return 0;
}
