/* Fuzz target "checkpoint": the trainer checkpoint reader, carls_ckpt_read (base/checkpoint.h).
 *
 * The reader takes a path, so each input is put in an in-memory file (memfd) and read through
 * /proc/self/fd/N; nothing touches the disk. Every input is read twice:
 *  1. as it is, which exercises the magic, version, length and checksum checks;
 *  2. "fixed up" (when it is long enough to have a header and a trailer): the header's length field is set
 *     to the input's real size and the last 4 bytes to the CRC-32 of the bytes before them, so mutations
 *     get past the checksum and reach the tensor parser. A valid checkpoint is unchanged by the fix-up.
 * When a read succeeds: the accessors must agree with each other (count, shapes, numel, find by name) and
 * writing the checkpoint back (carls_ckpt_write into a temporary directory) must reproduce the input byte
 * for byte, since a file the reader accepts has no slack. */
#include "fuzz_common.h"

#include "bytes.h"
#include "checkpoint.h"
#include "test_util.h"
#include "util.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define S_HEADER_BYTES 34u /* fixed part of a checkpoint header (see checkpoint.c) */

/* Where the write-back goes (fuzz_scratch_file, made on the first input). */
static const char *s_rewrite_path;

/* Checks a checkpoint that was read from data (size bytes). */
static void s_check_loaded(const carls_ckpt_t *ck, const uint8_t *data, size_t size)
{
    FUZZ_CHECK(carls_ckpt_file_bytes(ck) == size);
    const char *kind = carls_ckpt_kind(ck);
    FUZZ_CHECK(kind && strlen(kind) >= 1 && strlen(kind) <= CARLS_CKPT_MAX_KIND);
    int count = carls_ckpt_count(ck);
    FUZZ_CHECK(count >= 0 && (unsigned)count <= CARLS_CKPT_MAX_TENSORS);
    for (int i = 0; i < count; i++) {
        const carls_ckpt_tensor_t *t = carls_ckpt_tensor(ck, i);
        FUZZ_CHECK(t && t->name && strlen(t->name) >= 1 && strlen(t->name) <= CARLS_CKPT_MAX_NAME);
        FUZZ_CHECK(t->ndim >= 1 && t->ndim <= CARLS_CKPT_MAX_DIMS);
        int64_t numel = 1;
        for (int d = 0; d < t->ndim; d++) {
            FUZZ_CHECK(t->dims[d] >= 1);
            numel *= t->dims[d];
        }
        FUZZ_CHECK(numel == t->numel && (uint64_t)numel <= CARLS_CKPT_MAX_ELEMENTS);
        FUZZ_CHECK(t->data != NULL);
        FUZZ_CHECK(carls_ckpt_find(ck, t->name) == t);
    }
    const int blobs = carls_ckpt_blob_count(ck);
    FUZZ_CHECK(blobs >= 0 && (unsigned)blobs <= CARLS_CKPT_MAX_BLOBS && (unsigned)(count + blobs) <= CARLS_CKPT_MAX_TENSORS);
    for (int i = 0; i < blobs; i++) {
        size_t len = 0, again = 0;
        const char *name = carls_ckpt_blob_name(ck, i, &len);
        FUZZ_CHECK(name && strlen(name) >= 1 && strlen(name) <= CARLS_CKPT_MAX_NAME);
        FUZZ_CHECK(len >= 1 && carls_ckpt_find(ck, name) == NULL);
        const unsigned char *b = carls_ckpt_blob(ck, name, &again);
        FUZZ_CHECK(b != NULL && again == len && b[len] == '\0');
    }
    char err[512];
    if (carls_ckpt_write(ck, s_rewrite_path, err, sizeof err) != 0) {
        fprintf(stderr, "fuzz_checkpoint: write-back failed: %s\n", err);
        abort();
    }
    size_t len;
    uint8_t *again = test_read_file(s_rewrite_path, 0, &len);
    FUZZ_CHECK(again != NULL);
    FUZZ_CHECK(len == size && memcmp(again, data, size) == 0);
    free(again);
}

/* Reads the checkpoint at path (holding data) and checks the outcome. */
static void s_read(const char *path, const uint8_t *data, size_t size)
{
    carls_ckpt_t *ck = NULL;
    char err[512] = "";
    int rc = carls_ckpt_read(path, &ck, err, sizeof err);
    if (rc == CARLS_CKPT_OK) {
        FUZZ_CHECK(ck != NULL);
        s_check_loaded(ck, data, size);
        carls_ckpt_destroy(&ck);
        FUZZ_CHECK(ck == NULL);
    } else {
        FUZZ_CHECK(ck == NULL);
        FUZZ_CHECK(rc < 0 && rc >= CARLS_CKPT_EINVAL && rc != CARLS_CKPT_EIO);
        FUZZ_CHECK(err[0] != '\0');
        FUZZ_CHECK(strcmp(carls_ckpt_strerror(rc), "unknown error") != 0);
    }
}

/* Sets the header's u64 file length (offset 16, little-endian) to the input's real size. */
static void s_fix_length(uint8_t *buf, size_t size)
{
    carls_put_le64(buf + 16, (uint64_t)size); /* the file length at offset 16 */
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (!s_rewrite_path)
        s_rewrite_path = fuzz_scratch_file("ckpt", "rewrite.ckpt");
    fuzz_read_with_crc_fixup(data, size, S_HEADER_BYTES + 4, s_fix_length, s_read);
    return 0;
}
