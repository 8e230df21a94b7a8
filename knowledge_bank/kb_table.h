/* An embedding table: key bytes (no dictionary) -> float vector of fixed dim, with metadata, per-row
 * optimizer state and the lazy update's pending gradients.
 *
 * Concurrency: rows are spread over KB_TABLE_STRIPES stripes by key hash, each with its own mutex, row map,
 * list of rows that hold pending gradients (oldest first, for max_age_ms) and list of rows changed since
 * the last persist ("dirty"). A batch operation locks one stripe at a time, so concurrent requests on
 * different keys proceed in parallel and no lock order issues arise.
 *
 * The lazy update (DESIGN.md, CARLS §3.2): kb_table_push adds each gradient row to its key's pending set;
 * the set is applied -- outliers dropped (kb_lazy.h), the rest averaged, ONE optimizer step -- when the key
 * is next looked up, when it has waited max_age_ms (kb_table_expire), or when max_pending gradients have
 * gathered. With the immediate policy every gradient is one optimizer step at once. */
#ifndef KB_TABLE_H
#define KB_TABLE_H

#include "carls.pb-c.h"
#include "kb_init.h"
#include "kb_lazy.h"
#include "kb_optimizer.h"
#include "kb_store.h"

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define KB_TABLE_STRIPES 64

/* A table's configuration with every default filled in. */
typedef struct {
    uint32_t dim;
    kb_init_kind_t init;
    float init_scale;
    uint64_t init_seed;
    kb_optimizer_config_t optimizer;
    bool immediate;        /* UPDATE_IMMEDIATE: no pending set */
    uint32_t max_age_ms;
    uint32_t max_pending;  /* 1..CARLS_MAX_PENDING_LIMIT */
    kb_outlier_config_t outlier;
} kb_table_config_t;

/* Validates a wire config and fills defaults into *out. Returns 0, or -1 with a message in err. */
int kb_table_config_from_proto(const Carls__TableConfig *in, uint32_t max_dim, kb_table_config_t *out, char *err,
                               size_t errlen);

/* Writes a config to wire form. `opt` and `lazy` are storage for the nested messages. */
void kb_table_config_to_proto(const kb_table_config_t *in, Carls__TableConfig *out, Carls__OptimizerConfig *opt,
                              Carls__LazyUpdateConfig *lazy);

/* One row. value and opt_state point into the row's own allocation; key follows them. */
typedef struct kb_row {
    int64_t id;              /* unique in the table, stable across restarts (nearest-neighbour ids) */
    uint64_t version;        /* put version, incremented by each applied update */
    uint64_t frequency;      /* lookups + gradient rows seen */
    uint64_t opt_steps;      /* optimizer steps taken (Adam bias correction) */
    int64_t updated_at_ms;   /* wall clock of the last change; 0 = never changed */
    float *value;            /* (dim) */
    float *opt_state;        /* (kb_optimizer_state_floats) */
    float *pending;          /* (max_pending, dim) while pending_count > 0, else NULL */
    uint32_t pending_count;
    int64_t pending_since_ms; /* monotonic time of the first pending gradient */
    struct kb_row *pending_prev, *pending_next; /* stripe's pending list, oldest first */
    struct kb_row *dirty_next;                  /* stripe's dirty list */
    bool dirty;
    uint32_t key_len;
    uint8_t *key;
} kb_row_t;

/* Counters, updated atomically; read with kb_table_get_stats. */
typedef struct {
    uint64_t rows;
    uint64_t pending_keys;
    uint64_t pending_gradients;
    uint64_t gradients_received;
    uint64_t gradients_applied;
    uint64_t outliers_dropped;
    uint64_t updates_applied;
    uint64_t applied_on_lookup;
    uint64_t applied_on_age;
    uint64_t applied_on_count;
    uint64_t lookups;
    uint64_t puts;
} kb_table_stats_t;

typedef struct kb_table kb_table_t;

/* Creates an empty table. Caller owns the result. */
kb_table_t *kb_table_new(int64_t id, const char *name, const kb_table_config_t *cfg);
void kb_table_destroy(kb_table_t **self_p);

int64_t kb_table_id(const kb_table_t *self);
const char *kb_table_name(const kb_table_t *self);
const kb_table_config_t *kb_table_config(const kb_table_t *self);
void kb_table_get_stats(kb_table_t *self, kb_table_stats_t *out);

/* Looks up n keys (already validated): writes n*dim values and, if meta is not NULL, n metadata records.
 * Applies pending gradients of each key first. Unseen keys are created with their initial value unless
 * no_create, in which case they are answered with the initial value and frequency 0. Returns the number
 * of optimizer steps taken. */
uint64_t kb_table_lookup(kb_table_t *self, const ProtobufCBinaryData *keys, size_t n, bool no_create,
                         float *values, uint64_t *versions, int64_t *updated_at_ms, uint64_t *frequencies);

/* Writes n rows (n*dim values, validated) with the given version. Pending gradients of a key stay pending
 * and will apply on top of the new value. */
void kb_table_put(kb_table_t *self, const ProtobufCBinaryData *keys, size_t n, const float *values,
                  uint64_t version);

/* Adds n gradient rows (n*dim values, validated, finite). Returns optimizer steps taken now (immediate
 * policy, or keys reaching max_pending). */
uint64_t kb_table_push(kb_table_t *self, const ProtobufCBinaryData *keys, size_t n, const float *gradients);

/* Applies the pending sets that have waited at least max_age_ms at monotonic time now_ms. Returns the
 * number of keys updated. */
uint64_t kb_table_expire(kb_table_t *self, int64_t now_ms);

/* Restores a row loaded from the store (start-up only, before the table is shared). Returns 0, or -1 if the
 * record does not fit the table's config (logged and skipped by the caller). */
int kb_table_restore_row(kb_table_t *self, const kb_store_row_t *rec);

/* Moves every dirty row's current state into *out (grown as needed; *count updated) and clears the dirty
 * marks. The caller owns the records (kb_store_row_free each). */
void kb_table_take_dirty(kb_table_t *self, kb_store_row_t **out, size_t *count, size_t *capacity);

/* Number of rows held. */
size_t kb_table_row_count(kb_table_t *self);

#endif
