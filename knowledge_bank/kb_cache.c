#include "kb_cache.h"

#include "log.h"
#include "util.h"

#include <stdlib.h>
#include <time.h>

struct kb_cache {
    uint64_t budget;
    kb_store_reader_t *reader;
    atomic_int_fast64_t resident;
    atomic_uint_fast64_t collecting, compacted;
    atomic_uint_fast64_t reads, loads, evictions;
};

kb_cache_t *kb_cache_new(uint64_t budget, kb_store_reader_t *reader)
{
    kb_cache_t *self = carls_xcalloc(1, sizeof *self);
    self->budget = budget;
    self->reader = reader;
    return self;
}

void kb_cache_destroy(kb_cache_t **self_p)
{
    if (!self_p || !*self_p)
        return;
    kb_store_reader_close(&(*self_p)->reader);
    free(*self_p);
    *self_p = NULL;
}

void kb_cache_note_epoch(kb_cache_t *self, uint64_t epoch)
{
    if (self)
        atomic_store(&self->collecting, epoch);
}

void kb_cache_set_compacted(kb_cache_t *self, uint64_t epoch)
{
    if (self)
        atomic_store(&self->compacted, epoch);
}

uint64_t kb_cache_collecting(const kb_cache_t *self) { return atomic_load(&self->collecting); }
uint64_t kb_cache_compacted(const kb_cache_t *self) { return atomic_load(&self->compacted); }

void kb_cache_add(kb_cache_t *self, int64_t delta) { atomic_fetch_add(&self->resident, delta); }

bool kb_cache_over(const kb_cache_t *self) { return atomic_load(&self->resident) > (int64_t)self->budget; }

bool kb_cache_over_target(const kb_cache_t *self)
{
    return atomic_load(&self->resident) > (int64_t)(self->budget - self->budget / 16);
}

#define S_READ_TRIES 5

/* After a failed read (attempt counts from 0): waits a little longer each time, and after the last gives up:
 * the server stops rather than answer from part of its data. */
static void s_read_failed(int attempt, const char *err)
{
    LOG_WARN("reading rows back from storage failed (attempt %d of %d): %s", attempt + 1, S_READ_TRIES, err);
    if (attempt + 1 == S_READ_TRIES)
        CARLS_FATAL("cannot read rows back from storage: %s; stopping rather than answer a wrong value", err);
    struct timespec pause = {0, 20L * 1000000L << attempt};
    nanosleep(&pause, NULL);
}

int kb_cache_read(kb_cache_t *self, int64_t table_id, const uint8_t *key, uint32_t key_len, kb_store_row_t *out)
{
    atomic_fetch_add(&self->reads, 1);
    char err[512] = "";
    for (int attempt = 0;; attempt++) {
        int rc = kb_store_read_row(self->reader, table_id, key, key_len, out, err, sizeof err);
        if (rc >= 0) {
            if (rc)
                atomic_fetch_add(&self->loads, 1);
            return rc;
        }
        s_read_failed(attempt, err);
    }
}

void kb_cache_read_after(kb_cache_t *self, int64_t table_id, int64_t after_id, size_t limit, kb_store_row_t **out,
                         size_t *count)
{
    char err[512] = "";
    size_t had = *count;
    for (int attempt = 0;; attempt++) {
        if (kb_store_read_rows_after(self->reader, table_id, after_id, limit, out, count, err, sizeof err) == 0)
            return;
        while (*count > had)
            kb_store_row_free(&(*out)[--*count]);
        s_read_failed(attempt, err);
    }
}

void kb_cache_count_eviction(kb_cache_t *self) { atomic_fetch_add(&self->evictions, 1); }

void kb_cache_get_stats(const kb_cache_t *self, kb_cache_stats_t *out)
{
    int64_t resident = atomic_load(&self->resident);
    *out = (kb_cache_stats_t){.budget = self->budget,
                              .resident = resident > 0 ? (uint64_t)resident : 0,
                              .reads = atomic_load(&self->reads),
                              .loads = atomic_load(&self->loads),
                              .evictions = atomic_load(&self->evictions)};
}
