/* One batch's word -> index map (see trainer_w2v.h): open addressing with linear probing over the
 * word bytes' hash; cleared for every batch, so the trainer never holds a vocabulary. */
#include "trainer_w2v.h"

#include "util.h"

#include <stdlib.h>
#include <string.h>

void w2v_map_init(w2v_map_t *m)
{
    memset(m, 0, sizeof *m);
    m->cap = 1024;
    m->slots = carls_xcalloc(m->cap, sizeof *m->slots);
}

void w2v_map_free(w2v_map_t *m)
{
    free(m->slots);
    free(m->key);
    free(m->len);
    memset(m, 0, sizeof *m);
}

void w2v_map_clear(w2v_map_t *m)
{
    memset(m->slots, 0, m->cap * sizeof *m->slots);
    m->n = 0;
}

static inline uint32_t s_hash(const char *key, uint8_t len)
{
    uint64_t h = 1469598103934665603ULL;
    for (uint8_t i = 0; i < len; i++)
        h = (h ^ (uint8_t)key[i]) * 1099511628211ULL;
    return (uint32_t)(h ^ (h >> 29));
}

static void s_rehash(w2v_map_t *m)
{
    free(m->slots);
    m->cap *= 2;
    m->slots = carls_xcalloc(m->cap, sizeof *m->slots);
    for (uint32_t i = 0; i < m->n; i++) {
        uint32_t s = s_hash(m->key[i], m->len[i]) & (m->cap - 1);
        while (m->slots[s])
            s = (s + 1) & (m->cap - 1);
        m->slots[s] = i + 1;
    }
}

/* The slot of key: the one holding it (its index into *index), or the empty slot where probing stopped
 * (*index UINT32_MAX). */
static uint32_t s_probe(const w2v_map_t *m, const char *key, uint8_t len, uint32_t *index)
{
    uint32_t s = s_hash(key, len) & (m->cap - 1);
    while (m->slots[s]) {
        uint32_t i = m->slots[s] - 1;
        if (m->len[i] == len && memcmp(m->key[i], key, len) == 0) {
            *index = i;
            return s;
        }
        s = (s + 1) & (m->cap - 1);
    }
    *index = UINT32_MAX;
    return s;
}

uint32_t w2v_map_get(const w2v_map_t *m, const char *key, uint8_t len)
{
    uint32_t i;
    s_probe(m, key, len, &i);
    return i;
}

uint32_t w2v_map_put(w2v_map_t *m, const char *key, uint8_t len)
{
    uint32_t found;
    const uint32_t s = s_probe(m, key, len, &found);
    if (found != UINT32_MAX)
        return found;
    if (m->n == m->n_cap) {
        m->n_cap = m->n_cap ? m->n_cap * 2 : 1024;
        m->key = carls_xrealloc(m->key, m->n_cap * sizeof *m->key);
        m->len = carls_xrealloc(m->len, m->n_cap);
    }
    uint32_t i = m->n++;
    m->key[i] = key;
    m->len[i] = len;
    m->slots[s] = i + 1;
    if (m->n * 2 > m->cap)
        s_rehash(m);
    return i;
}

void w2v_map_keys(const w2v_map_t *m, kb_key_t *keys)
{
    for (uint32_t i = 0; i < m->n; i++)
        keys[i] = (kb_key_t){m->key[i], m->len[i]};
}
