/* Shared by the fuzz harnesses (tests/fuzz/fuzz_*.c) and the seed generator (fuzz_seeds.c): the tables the
 * service harness keeps, the limits it runs under, and small helpers to build packed requests and to write
 * a fuzz input to a file the readers can open.
 *
 * Every harness defines LLVMFuzzerTestOneInput; it is linked either with libFuzzer (-fsanitize=fuzzer, the
 * fuzzers) or with replay_main.c (any compiler: the CTest replay of tests/fuzz/corpus/). A harness reports a
 * broken invariant with FUZZ_CHECK, which prints the condition and aborts, so both drivers see a crash. */
#ifndef CARLS_FUZZ_COMMON_H
#define CARLS_FUZZ_COMMON_H

#include "carls.pb-c.h"
#include "kb_table_config.h"

#include <stddef.h>
#include <stdint.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* An invariant of the code under test: on failure prints file:line and the condition, then aborts. */
#define FUZZ_CHECK(cond)                                                                                    \
    do {                                                                                                    \
        if (!(cond))                                                                                        \
            fuzz_fail(__FILE__, __LINE__, #cond);                                                           \
    } while (0)
_Noreturn void fuzz_fail(const char *file, int line, const char *what);

/* ---- the service harness's tables and limits ---------------------------------------------------------- */

/* Limits the service harness runs with: small, so inputs explore logic rather than allocation size. */
#define FUZZ_MAX_MESSAGE_BYTES (1u << 20)
#define FUZZ_MAX_KEY_BYTES 64u
#define FUZZ_MAX_DIM 64u
#define FUZZ_MAX_KEYS_PER_REQUEST 64u

/* The base tables, kept in existence (with exactly this config) by the service harness between inputs:
 *   FUZZ_TABLE_EMB   embedding, dim 8, uniform init, SGD, immediate updates, Flat cosine knn index, LRU
 *                    eviction over 256 rows;
 *   FUZZ_TABLE_LAZY  embedding, dim 4, AdaGrad, lazy updates (max_pending 4), frequency admission (2),
 *                    oldest-first eviction over 256 rows;
 *   FUZZ_TABLE_FEAT  feature table, no eviction (the harness reads records back after a put). */
#define FUZZ_TABLE_EMB "emb"
#define FUZZ_TABLE_LAZY "lazy"
#define FUZZ_TABLE_FEAT "feat"
#define FUZZ_EMB_DIM 8u
#define FUZZ_LAZY_DIM 4u
#define FUZZ_BASE_TABLES 3
#define FUZZ_BASE_MAX_ROWS 256u

/* Name of base table i (0 <= i < FUZZ_BASE_TABLES). */
const char *fuzz_base_table_name(int i);

/* Fills w->config (its nested messages in the rest of *w, the server's own wire-form storage) with base table
 * i's config. */
void fuzz_base_table_config(int i, kb_table_config_wire_t *w);

/* Packs req into a new buffer (*out, *out_len; the caller frees *out). */
void fuzz_pack_request(const Carls__Request *req, uint8_t **out, size_t *out_len);

/* A create_table request for base table i from client_id / sequence, packed (caller frees *out). */
void fuzz_pack_create_base(int i, uint64_t client_id, uint64_t sequence, uint8_t **out, size_t *out_len);

/* ---- files for the readers ---------------------------------------------------------------------------- */

/* An anonymous in-memory file (memfd) holding data, and a path that opens it ("/proc/self/fd/N"); the
 * readers under test take a path. Returns the descriptor (close it when done); aborts when it cannot. */
int fuzz_memfile(const uint8_t *data, size_t size, char *path, size_t path_len);

/* A fresh directory <base>/carls-fuzz-<tag>-XXXXXX into dir, base being /dev/shm when writable (else $TMPDIR
 * or /tmp). Aborts when it cannot be made. */
void fuzz_scratch_dir(const char *tag, char *dir, size_t dir_len);

/* Removes the files in dir, then dir (the harnesses make no subdirectories). */
void fuzz_remove_dir(const char *dir);

/* The path of a file `name` in a scratch directory of its own (fuzz_scratch_dir(tag)), for a harness's
 * write-back: made on the first call; the file and the directory are removed at exit. One per program. */
const char *fuzz_scratch_file(const char *tag, const char *name);

/* Whole-file readers guard their files with a trailing CRC-32 that random mutations almost never match. So
 * read(path, data, size) runs on the input as it is, and then, when size >= min_size, on a copy "fixed up":
 * prepare(copy, size) first (when given: e.g. a length field set to the real size), then the last 4 bytes
 * set to the little-endian CRC-32 of the bytes before them; skipped when the copy equals the input. path
 * opens an in-memory file (fuzz_memfile) holding the bytes, valid until read returns. */
void fuzz_read_with_crc_fixup(const uint8_t *data, size_t size, size_t min_size, void (*prepare)(uint8_t *, size_t),
                              void (*read)(const char *path, const uint8_t *data, size_t size));

#endif
