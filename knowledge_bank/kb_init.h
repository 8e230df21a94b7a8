/* Deterministic initial values for unseen keys.
 *
 * The value depends only on (key bytes, seed, kind, scale, dim): every shard, every restart and every
 * machine gives the same vector, so a key never needs a dictionary entry before first use. The stream is
 * splitmix64 seeded with carls_hash64(key, seed). */
#ifndef KB_INIT_H
#define KB_INIT_H

#include <stddef.h>
#include <stdint.h>

typedef enum {
    KB_INIT_ZEROS = 0,
    KB_INIT_UNIFORM = 1, /* uniform in [-scale, scale] */
    KB_INIT_NORMAL = 2,  /* normal, mean 0, standard deviation scale */
} kb_init_kind_t;

/* Writes dim values for key into out. */
void kb_init_value(kb_init_kind_t kind, float scale, uint64_t seed, const void *key, size_t key_len, float *out,
                   uint32_t dim);

const char *kb_init_name(kb_init_kind_t kind);
int kb_init_parse(const char *name, kb_init_kind_t *out);

#endif
