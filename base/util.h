/* Small helpers shared by every program: clocks, hashing, checked allocation, number parsing. */
#ifndef CARLS_UTIL_H
#define CARLS_UTIL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* A byte string (not NUL-terminated): a key of the bank (kb_key_t) and of the models that read bank rows
 * (nn_key_t) are both this, so a list of them passes between the two without a copy. */
typedef struct {
    const void *data;
    size_t len;
} carls_bytes_t;

/* Monotonic clock in milliseconds / microseconds, for timeouts and latencies. */
int64_t carls_monotonic_ms(void);
int64_t carls_monotonic_us(void);
/* Wall clock in milliseconds since the epoch, for timestamps stored with data. */
int64_t carls_wall_ms(void);

/* 64-bit hash of a byte string (a seeded FNV-1a folded through splitmix64). Stable across platforms and
 * releases: initial values and shard placement depend on it. */
uint64_t carls_hash64(const void *data, size_t len, uint64_t seed);

/* splitmix64 step: advances *state and returns the next pseudo-random value. */
uint64_t carls_splitmix64(uint64_t *state);

/* A uniform double in [0, 1) from the top 53 bits of the next splitmix64 value (advances *state). */
double carls_unit_double(uint64_t *state);

/* Allocation that aborts with file:line on failure (out of memory is not a recoverable error here). */
void *carls_xmalloc_at(size_t size, const char *file, int line);
void *carls_xcalloc_at(size_t n, size_t size, const char *file, int line);
void *carls_xrealloc_at(void *ptr, size_t size, const char *file, int line);
#define carls_xmalloc(size) carls_xmalloc_at((size), __FILE__, __LINE__)
#define carls_xcalloc(n, size) carls_xcalloc_at((n), (size), __FILE__, __LINE__)
#define carls_xrealloc(ptr, size) carls_xrealloc_at((ptr), (size), __FILE__, __LINE__)

/* Growable arrays: the capacity an array of cap elements of elem bytes needs to hold need of them: cap
 * itself when it is enough, else doubled (from 16) until it is, so that appending one at a time costs
 * amortised O(1). Aborts when need elements of elem bytes overflow size_t. For arrays that share one count
 * (grow each to the same capacity); carls_grow does it for one array. */
size_t carls_grow_cap(size_t cap, size_t need, size_t elem);
/* Makes ptr (an array of *cap elements of elem bytes) hold at least need elements: reallocates it to
 * carls_grow_cap's capacity when it is too small, updates *cap and returns the (possibly moved) array.
 * Aborts with file:line when out of memory. */
void *carls_grow_at(void *ptr, size_t *cap, size_t need, size_t elem, const char *file, int line);
#define carls_grow(ptr, cap, need, elem) carls_grow_at((ptr), (cap), (need), (elem), __FILE__, __LINE__)

/* CRC-32 (zlib's crc32: IEEE 802.3, the one in gzip and PNG) of len bytes, continuing crc: start with 0,
 * feed the pieces in order. Any len (zlib's own takes 32-bit lengths). */
uint32_t carls_crc32(uint32_t crc, const void *data, size_t len);

/* The index of the first NaN or Inf among v[0..n), or n when every value is finite. Scans in blocks without
 * an early exit inside a block, so the compiler vectorizes it (a request's rows are checked on the hot path). */
size_t carls_first_nonfinite(const float *v, size_t n);

/* Strict number parsing for command lines and text fields: the whole string must be a number in range,
 * integers in decimal digits only (carls_parse_i64: after an optional '-'; no blanks, no '+'). 0 on
 * success, -1 otherwise (*out untouched). */
int carls_parse_u64(const char *text, uint64_t *out);
int carls_parse_i64(const char *text, int64_t *out);
int carls_parse_float(const char *text, float *out);

/* Items' keys in the bank: kb-maker writes an item's rows (pixels, embedding, neighbour list, label) under its
 * decimal index, and the trainer reads them, and the neighbour lists' keys, back. CARLS_NO_ITEM is no item
 * (an empty neighbour slot). */
#define CARLS_NO_ITEM UINT32_MAX
/* Writes item's key to buf (>= 11 bytes); returns its length. */
size_t carls_item_key(uint32_t item, char *buf);
/* Parses a key written by carls_item_key; CARLS_NO_ITEM for anything else (including an empty slot). */
uint32_t carls_key_item(const void *data, size_t len);

/* The index of name among names[0..n-1], compared without regard to case (so config files and command lines
 * may write "Adam" or "INFO"), or -1 when it is none of them or NULL. For enums named by a table. */
int carls_name_index(const char *name, const char *const *names, int n);

/* The "error text + return code" idiom of functions that take (char *err, size_t errlen): formats the
 * message into err (when err is not NULL and errlen > 0) and returns rc. */
int carls_errorf(char *err, size_t errlen, int rc, const char *fmt, ...) __attribute__((format(printf, 4, 5)));

/* Fills buf with n random bytes from the OS. 0 on success. */
int carls_random_bytes(void *buf, size_t n);

#endif
