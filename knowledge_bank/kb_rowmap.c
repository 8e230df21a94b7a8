#include "kb_rowmap.h"

#include "kb_row.h"
#include "util.h"

#include <stdlib.h>
#include <string.h>

void kb_rowmap_init(kb_rowmap_t *map) { memset(map, 0, sizeof *map); }

void kb_rowmap_free(kb_rowmap_t *map)
{
    free(map->slots);
    memset(map, 0, sizeof *map);
}

uint64_t kb_rowmap_hash(const void *key, size_t len)
{
    uint64_t h = carls_hash64(key, len, 0x6b625f726f776d61ULL);
    return h ? h : 1;
}

static int s_key_equal(const struct kb_row *row, const void *key, size_t len)
{
    return row->key_len == len && memcmp(row->key, key, len) == 0;
}

struct kb_row *kb_rowmap_find(const kb_rowmap_t *map, uint64_t hash, const void *key, size_t len)
{
    if (map->capacity == 0)
        return NULL;
    size_t mask = map->capacity - 1;
    for (size_t i = hash & mask;; i = (i + 1) & mask) {
        const kb_rowmap_slot_t *slot = &map->slots[i];
        if (slot->hash == 0)
            return NULL;
        if (slot->hash == hash && s_key_equal(slot->row, key, len))
            return slot->row;
    }
}

void kb_rowmap_prefetch_slot(const kb_rowmap_t *map, uint64_t hash)
{
    if (map->capacity)
        __builtin_prefetch(&map->slots[hash & (map->capacity - 1)]);
}

void kb_rowmap_prefetch_row(const kb_rowmap_t *map, uint64_t hash, size_t bytes)
{
    if (map->capacity == 0)
        return;
    size_t mask = map->capacity - 1;
    for (size_t i = hash & mask; map->slots[i].hash != 0; i = (i + 1) & mask) {
        if (map->slots[i].hash == hash) {
            const char *row = (const char *)map->slots[i].row;
            for (size_t at = 0; at < bytes; at += 64)
                __builtin_prefetch(row + at);
            return;
        }
    }
}

static void s_place(kb_rowmap_t *map, uint64_t hash, struct kb_row *row)
{
    size_t mask = map->capacity - 1;
    size_t i = hash & mask;
    while (map->slots[i].hash != 0)
        i = (i + 1) & mask;
    map->slots[i] = (kb_rowmap_slot_t){hash, row};
}

static void s_grow(kb_rowmap_t *map)
{
    size_t old_cap = map->capacity;
    kb_rowmap_slot_t *old = map->slots;
    map->capacity = old_cap ? old_cap * 2 : 16;
    map->slots = carls_xcalloc(map->capacity, sizeof *map->slots);
    for (size_t i = 0; i < old_cap; i++)
        if (old[i].hash)
            s_place(map, old[i].hash, old[i].row);
    free(old);
}

void kb_rowmap_insert(kb_rowmap_t *map, uint64_t hash, struct kb_row *row)
{
    /* Keep the load factor under 0.7 so probe sequences stay short. */
    if ((map->count + 1) * 10 > map->capacity * 7)
        s_grow(map);
    s_place(map, hash, row);
    map->count++;
}

struct kb_row *kb_rowmap_remove(kb_rowmap_t *map, uint64_t hash, const void *key, size_t len)
{
    if (map->capacity == 0)
        return NULL;
    size_t mask = map->capacity - 1;
    size_t i = hash & mask;
    while (map->slots[i].hash != 0 && !(map->slots[i].hash == hash && s_key_equal(map->slots[i].row, key, len)))
        i = (i + 1) & mask;
    if (map->slots[i].hash == 0)
        return NULL;
    struct kb_row *found = map->slots[i].row;
    /* Backward-shift deletion: move later members of the probe run into the hole so that find never stops
     * early at a slot emptied by a removal. */
    size_t hole = i;
    for (size_t j = (i + 1) & mask; map->slots[j].hash != 0; j = (j + 1) & mask) {
        size_t home = map->slots[j].hash & mask;
        /* Entry j may move to the hole if its home is not cyclically within (hole, j]. */
        int home_in_range = (hole <= j) ? (home > hole && home <= j) : (home > hole || home <= j);
        if (!home_in_range) {
            map->slots[hole] = map->slots[j];
            hole = j;
        }
    }
    map->slots[hole] = (kb_rowmap_slot_t){0, NULL};
    map->count--;
    return found;
}
