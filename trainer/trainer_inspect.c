/* trainer inspect FILE|DIR: verifies a checkpoint (the reader checks magic, version, length, CRC, shapes)
 * and prints its header and, per tensor, its shape and summary statistics. A directory means the file its
 * `latest` pointer names. Exit status 1 with the reader's message when the file is refused. */
#include "trainer.h"

#include "checkpoint.h"

#include <ctype.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

int trainer_inspect_main(int argc, char **argv)
{
    if (argc != 2 || strcmp(argv[1], "--help") == 0) {
        fprintf(argc == 2 ? stdout : stderr, "usage: trainer inspect FILE|DIR\n");
        return argc == 2 ? 0 : 2;
    }
    char path[4096], err[2048];
    snprintf(path, sizeof path, "%s", argv[1]);
    struct stat st;
    if (stat(argv[1], &st) == 0 && S_ISDIR(st.st_mode)) {
        if (carls_ckpt_latest_path(argv[1], path, sizeof path, err, sizeof err) != 0) {
            fprintf(stderr, "trainer inspect: %s\n", err);
            return 1;
        }
    }
    carls_ckpt_t *c = NULL;
    int rc = carls_ckpt_read(path, &c, err, sizeof err);
    if (rc != 0) {
        fprintf(stderr, "trainer inspect: refused (%s): %s\n", carls_ckpt_strerror(rc), err);
        return 1;
    }
    int64_t total = 0;
    for (int i = 0; i < carls_ckpt_count(c); i++) {
        total += carls_ckpt_tensor(c, i)->numel;
    }
    printf("file: %s\n", path);
    printf("format: %s version %u, %llu bytes, crc32 %08x (verified)\n", CARLS_CKPT_MAGIC,
           carls_ckpt_blob_count(c) ? CARLS_CKPT_VERSION_BLOBS : CARLS_CKPT_VERSION,
           (unsigned long long)carls_ckpt_file_bytes(c), carls_ckpt_crc(c));
    printf("kind: %s\n", carls_ckpt_kind(c));
    printf("step: %llu\n", (unsigned long long)carls_ckpt_step(c));
    printf("tensors: %d (%lld floats)\n", carls_ckpt_count(c), (long long)total);
    printf("  %-24s %-18s %10s %12s %12s %12s %12s\n", "name", "shape", "elements", "min", "max", "mean", "rms");
    for (int i = 0; i < carls_ckpt_count(c); i++) {
        const carls_ckpt_tensor_t *t = carls_ckpt_tensor(c, i);
        char shape[128];
        int len = snprintf(shape, sizeof shape, "[");
        for (int d = 0; d < t->ndim && len < (int)sizeof shape; d++) {
            len += snprintf(shape + len, sizeof shape - (size_t)len, "%s%lld", d ? ", " : "", (long long)t->dims[d]);
        }
        if (len < (int)sizeof shape) {
            snprintf(shape + len, sizeof shape - (size_t)len, "]");
        }
        double mn = INFINITY, mx = -INFINITY, sum = 0, sq = 0;
        int64_t nonfinite = 0;
        for (int64_t k = 0; k < t->numel; k++) {
            double v = t->data[k];
            if (!isfinite(v)) {
                nonfinite++;
                continue;
            }
            mn = v < mn ? v : mn;
            mx = v > mx ? v : mx;
            sum += v;
            sq += v * v;
        }
        double n = (double)(t->numel - nonfinite);
        printf("  %-24s %-18s %10lld %12.5g %12.5g %12.5g %12.5g", t->name, shape, (long long)t->numel,
               n ? mn : NAN, n ? mx : NAN, n ? sum / n : NAN, n ? sqrt(sq / n) : NAN);
        if (nonfinite) {
            printf("  (%lld not finite)", (long long)nonfinite);
        }
        printf("\n");
    }
    if (carls_ckpt_blob_count(c)) {
        printf("blobs: %d (the trainer's state for --resume)\n", carls_ckpt_blob_count(c));
    }
    for (int i = 0; i < carls_ckpt_blob_count(c); i++) {
        size_t len = 0;
        const char *name = carls_ckpt_blob_name(c, i, &len);
        const char *text = carls_ckpt_text(c, name);
        bool printable = text != NULL;
        for (size_t k = 0; printable && k < len; k++) {
            printable = isprint((unsigned char)text[k]);
        }
        uint64_t v = 0;
        if (printable) {
            printf("  %-24s text \"%s\"\n", name, text);
        } else if (len == 8 && carls_ckpt_get_u64(c, name, &v, NULL, 0) == 0) {
            printf("  %-24s u64 %llu\n", name, (unsigned long long)v);
        } else {
            printf("  %-24s %zu bytes\n", name, len);
        }
    }
    carls_ckpt_destroy(&c);
    return 0;
}
