#include "util.h"

#include "log.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/random.h>
#include <time.h>
#include <zlib.h>

int64_t carls_monotonic_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

int64_t carls_monotonic_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

int64_t carls_wall_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

uint64_t carls_splitmix64(uint64_t *state)
{
    uint64_t z = (*state += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

double carls_unit_double(uint64_t *state)
{
    return (double)(carls_splitmix64(state) >> 11) * 0x1.0p-53;
}

uint64_t carls_hash64(const void *data, size_t len, uint64_t seed)
{
    const unsigned char *p = data;
    uint64_t h = 0xcbf29ce484222325ULL ^ seed;
    for (size_t i = 0; i < len; i++) {
        h ^= p[i];
        h *= 0x100000001b3ULL;
    }
    /* FNV-1a alone mixes its low bits poorly; one splitmix round fixes that. */
    return carls_splitmix64(&h);
}

void *carls_xmalloc_at(size_t size, const char *file, int line)
{
    void *p = malloc(size ? size : 1);
    if (!p) {
        carls_log_write(CARLS_LOG_ERROR, file, line, "out of memory allocating %zu bytes", size);
        abort();
    }
    return p;
}

void *carls_xcalloc_at(size_t n, size_t size, const char *file, int line)
{
    void *p = calloc(n ? n : 1, size ? size : 1);
    if (!p) {
        carls_log_write(CARLS_LOG_ERROR, file, line, "out of memory allocating %zu x %zu bytes", n, size);
        abort();
    }
    return p;
}

void *carls_xrealloc_at(void *ptr, size_t size, const char *file, int line)
{
    void *p = realloc(ptr, size ? size : 1);
    if (!p) {
        carls_log_write(CARLS_LOG_ERROR, file, line, "out of memory reallocating %zu bytes", size);
        abort();
    }
    return p;
}

size_t carls_grow_cap(size_t cap, size_t need, size_t elem)
{
    if (need <= cap) {
        return cap;
    }
    size_t max = elem ? SIZE_MAX / elem : SIZE_MAX; /* elements whose byte count fits in size_t */
    if (need > max) {
        CARLS_FATAL("an array of %zu elements of %zu bytes does not fit in memory", need, elem);
    }
    size_t grown = cap ? cap : 16;
    while (grown < need) {
        /* Doubling stops short of overflow: then need itself, which fits. */
        grown = grown > max / 2 ? need : grown * 2;
    }
    return grown;
}

void *carls_grow_at(void *ptr, size_t *cap, size_t need, size_t elem, const char *file, int line)
{
    if (need <= *cap) {
        return ptr;
    }
    size_t grown = carls_grow_cap(*cap, need, elem);
    ptr = carls_xrealloc_at(ptr, grown * elem, file, line);
    *cap = grown;
    return ptr;
}

/* Whether any of BLOCK floats is NaN or Inf (exponent bits all ones). A fixed count and no early exit: GCC
 * vectorizes it at -O2. */
enum { S_FINITE_BLOCK = 256 };
static bool s_block_has_nonfinite(const float *v)
{
    uint32_t bad = 0;
    for (size_t i = 0; i < S_FINITE_BLOCK; i++) {
        uint32_t bits;
        memcpy(&bits, &v[i], sizeof bits);
        bad |= (bits & 0x7f800000u) == 0x7f800000u;
    }
    return bad != 0;
}

size_t carls_first_nonfinite(const float *v, size_t n)
{
    size_t start = 0;
    for (; start + S_FINITE_BLOCK <= n; start += S_FINITE_BLOCK)
        if (s_block_has_nonfinite(v + start))
            break;
    for (size_t i = start; i < n; i++)
        if (!isfinite(v[i]))
            return i;
    return n;
}

uint32_t carls_crc32(uint32_t crc, const void *data, size_t len)
{
    const unsigned char *p = data;
    while (len > 0) {
        uInt chunk = len > (1u << 30) ? (1u << 30) : (uInt)len;
        crc = (uint32_t)crc32(crc, p, chunk);
        p += chunk;
        len -= chunk;
    }
    return crc;
}

int carls_parse_u64(const char *text, uint64_t *out)
{
    /* A digit first: strtoull would also take blanks, a '+' and a '-' (wrapping "-1" or " -1" around to
     * 2^64 - 1). */
    if (!text || !isdigit((unsigned char)*text))
        return -1;
    char *end;
    errno = 0;
    unsigned long long v = strtoull(text, &end, 10);
    if (errno || *end)
        return -1;
    *out = v;
    return 0;
}

int carls_parse_i64(const char *text, int64_t *out)
{
    if (!text)
        return -1;
    bool negative = *text == '-';
    uint64_t magnitude;
    if (carls_parse_u64(text + negative, &magnitude) != 0 || magnitude > (uint64_t)INT64_MAX + negative)
        return -1;
    /* -(magnitude - 1) - 1 reaches INT64_MIN without overflowing. */
    *out = !negative ? (int64_t)magnitude : magnitude == 0 ? 0 : -(int64_t)(magnitude - 1) - 1;
    return 0;
}

int carls_parse_float(const char *text, float *out)
{
    if (!text || !*text)
        return -1;
    char *end;
    errno = 0;
    float v = strtof(text, &end);
    if (errno || *end || !isfinite(v))
        return -1;
    *out = v;
    return 0;
}

size_t carls_item_key(uint32_t item, char *buf)
{
    return (size_t)snprintf(buf, 11, "%u", item);
}

uint32_t carls_key_item(const void *data, size_t len)
{
    const char *s = data;
    if (len == 0 || len > 10) {
        return CARLS_NO_ITEM;
    }
    uint64_t v = 0;
    for (size_t i = 0; i < len; i++) {
        if (s[i] < '0' || s[i] > '9') {
            return CARLS_NO_ITEM;
        }
        v = v * 10 + (uint64_t)(s[i] - '0');
    }
    return v >= CARLS_NO_ITEM ? CARLS_NO_ITEM : (uint32_t)v;
}

int carls_name_index(const char *name, const char *const *names, int n)
{
    for (int i = 0; name && i < n; i++) {
        if (strcasecmp(name, names[i]) == 0)
            return i;
    }
    return -1;
}

int carls_random_bytes(void *buf, size_t n)
{
    unsigned char *p = buf;
    while (n > 0) {
        ssize_t got = getrandom(p, n, 0);
        if (got < 0) {
            if (errno == EINTR)
                continue;
            return -1;
        }
        p += got;
        n -= (size_t)got;
    }
    return 0;
}

int carls_errorf(char *err, size_t errlen, int rc, const char *fmt, ...)
{
    if (err && errlen > 0) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, errlen, fmt, ap);
        va_end(ap);
    }
    return rc;
}
