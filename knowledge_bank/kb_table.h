/* An embedding table: key bytes (no dictionary) -> float vector of fixed dim, with metadata, per-row
 * optimizer state and the lazy update's pending gradients.
 *
 * Concurrency: rows are spread over KB_TABLE_STRIPES stripes by key hash, each with its own mutex, row map,
 * list of rows that hold pending gradients (oldest first, for max_age_ms), list of rows changed since
 * the last persist ("dirty") and list of rows whose use count alone changed (reads: written in bulk, see
 * kb_table_take_frequencies). A batch operation locks one stripe at a time, so concurrent requests on
 * different keys proceed in parallel and no lock order issues arise.
 *
 * The lazy update (DESIGN.md, CARLS §3.2): kb_table_push adds each gradient row to its key's pending set;
 * the set is applied -- outliers dropped (kb_lazy.h), the rest averaged, ONE optimizer step -- when the key
 * is next looked up, when it has waited max_age_ms (kb_table_expire), or when max_pending gradients have
 * gathered. With the immediate policy every gradient is one optimizer step at once. */
#ifndef KB_TABLE_H
#define KB_TABLE_H

#include "kb_cache.h"
#include "kb_init.h"
#include "kb_knn.h"
#include "kb_lazy.h"
#include "kb_memory.h"
#include "kb_optimizer.h"
#include "kb_sampler.h"
#include "kb_store.h"

#include <protobuf-c/protobuf-c.h> /* ProtobufCBinaryData, the key type: request keys are used in place */
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define KB_TABLE_STRIPES 64

typedef enum { KB_TABLE_EMBEDDING = 0, KB_TABLE_FEATURE = 1 } kb_table_kind_t;
typedef enum { KB_ADMIT_ALL = 0, KB_ADMIT_FREQUENCY = 1, KB_ADMIT_BLOOM = 2 } kb_admission_kind_t;
typedef enum { KB_EVICT_NONE = 0, KB_EVICT_LRU = 1, KB_EVICT_OLDEST = 2 } kb_eviction_kind_t;

#define KB_KNN_SPEC_MAX 64
/* Gradients a lazy table gathers per key at most (the wire calls it CARLS_MAX_PENDING_LIMIT). */
#define KB_TABLE_MAX_PENDING 1024u

/* A table's configuration with every default filled in. Zero-initialized as a whole (it is compared with
 * memcmp for create_table's if_not_exists). */
typedef struct {
    kb_table_kind_t kind;
    uint32_t dim;          /* embedding tables; 0 for feature tables */
    kb_init_kind_t init;
    float init_scale;
    uint64_t init_seed;
    kb_optimizer_config_t optimizer;
    bool immediate;        /* UPDATE_IMMEDIATE: no pending set */
    uint32_t max_age_ms;
    uint32_t max_pending;  /* 1..KB_TABLE_MAX_PENDING */
    kb_outlier_config_t outlier;
    bool knn;                           /* keep a nearest-neighbour index */
    char knn_spec[KB_KNN_SPEC_MAX];     /* FAISS index-factory string */
    kb_knn_metric_t knn_metric;
    uint32_t knn_nprobe, knn_ef_search; /* 0: kb_knn defaults */
    kb_admission_kind_t admission;
    uint32_t min_frequency;             /* admission: sightings before a key is persisted / gets a row */
    uint32_t bloom_bits_log2, bloom_hashes;
    kb_eviction_kind_t eviction;
    uint64_t max_rows;                  /* eviction: rows kept at most (approximately: per stripe) */
} kb_table_config_t;

/* Completes a config made field by field (zeroed as a whole first): fields left 0 take their defaults
 * (init_scale 0.05, the optimizer's, max_age_ms 1000, max_pending 16, outlier threshold 3 and min_count 3,
 * min_frequency 2, bloom_bits_log2 20, bloom_hashes 4), the fields of a policy not in use are cleared (a
 * feature table keeps only its admission and eviction), and every value is checked against the table's
 * limits and max_dim; a knn spec by building an index from it. The enums are taken as given. Returns 0, or -1
 * with a message in err. */
int kb_table_config_finish(kb_table_config_t *cfg, uint32_t max_dim, char *err, size_t errlen);

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
    uint64_t not_admitted;
    uint64_t not_persisted;
    uint64_t evictions;
    kb_knn_stats_t knn; /* zero when the table has no index */
} kb_table_stats_t;

typedef struct kb_table kb_table_t;

/* Creates an empty table. Caller owns the result. */
kb_table_t *kb_table_new(int64_t id, const char *name, const kb_table_config_t *cfg);
void kb_table_destroy(kb_table_t **self_p);

/* Memory (kb_memory.h). The table counts every allocation it makes in its own estimate (kb_table_memory) and,
 * once set_memory has attached the bank's accounting (before the table is shared), in that too; the table
 * takes its bytes out of it when destroyed. base_bytes: what a new empty table of that config takes. */
void kb_table_set_memory(kb_table_t *self, kb_memory_t *mem);
uint64_t kb_table_memory(kb_table_t *self);
uint64_t kb_table_base_bytes(const kb_table_config_t *cfg);

typedef enum { KB_GROW_LOOKUP, KB_GROW_PUT, KB_GROW_PUSH, KB_GROW_FEATURE_PUT } kb_table_growth_op_t;

/* Bytes the rows that an operation on n keys would create are estimated to add (row blocks, pending buffers
 * for a push to a lazy table, feature records of record_lens[i] packed bytes for feature_put, the index's
 * share, and the growth of the row maps and the id index they cause), and in *new_rows how many rows that is:
 * keys without a row, except, for lookups and pushes under Bloom admission, keys that this sighting does not
 * admit yet. A key given twice counts twice. Under eviction only rows below max_rows are charged (a row over
 * it replaces an evicted one). Reads the table without changing it; concurrent requests may change the
 * answer, so it is an estimate to reserve with (kb_memory_reserve). */
uint64_t kb_table_growth(kb_table_t *self, kb_table_growth_op_t op, const ProtobufCBinaryData *keys, size_t n,
                         const size_t *record_lens, uint64_t *new_rows_out);

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

/* Appends a frequency-only record (table id, key, frequency; kb_store_row_t.frequency_only) to *out for
 * every persisted row whose use count alone changed since the last call -- reads count uses without making
 * the row dirty -- and clears those marks. Rows also marked dirty are left to kb_table_take_dirty, whose
 * whole-row record carries the count. */
void kb_table_take_frequencies(kb_table_t *self, kb_store_row_t **out, size_t *count, size_t *capacity);

/* Moves every dirty row's current state into *out (grown as needed; *count updated) and clears the dirty
 * marks. The caller owns the records (kb_store_row_free each).
 * With a cache (kb_cache.h), this and kb_table_take_frequencies stamp each row with the epoch the cache was
 * last told of (kb_cache_note_epoch): whoever takes rows must first tell it the epoch they go into, or a
 * row could leave memory before that epoch is in SQLite. */
void kb_table_take_dirty(kb_table_t *self, kb_store_row_t **out, size_t *count, size_t *capacity);

/* Marks every row that holds pending gradients dirty, so the next kb_table_take_dirty takes it whole. The
 * bank does this before it compacts journal epochs into SQLite without their pending sets: the sets as they
 * are then live on in the journal (kb_bank.c, "pending sets"). */
void kb_table_mark_pending_dirty(kb_table_t *self);

/* Read-only serving (kb-server --read-only, and a replication follower until it is promoted): while set, no
 * pending gradient is applied -- lookups and peeks answer the stored value, kb_table_expire does nothing --
 * so the sets stay as loaded, and reads count no use. May be changed while the table is shared. */
void kb_table_set_read_only(kb_table_t *self, bool read_only);

/* Applies one journaled row record to a table that is not shared yet (start-up of a read-only server,
 * which replays the journal into memory instead of into the store): a whole row replaces the key's row
 * (row id included), a deletion removes it, a frequency-only record sets the count of the row with that
 * row id. Returns 0, or -1 when a whole row does not fit the table's config (the caller logs and skips). */
int kb_table_replay_row(kb_table_t *self, const kb_store_row_t *rec);

/* kb_table_replay_row for a shared, read-only table (a replication follower applying its primary's records
 * while it serves reads): takes the row's stripe lock. The record came from the network: one missing a
 * buffer its counts promise, or with a row id above KB_TABLE_MAX_ROW_ID, is refused (-1). */
#define KB_TABLE_MAX_ROW_ID ((int64_t)1 << 40)
int kb_table_apply_row(kb_table_t *self, const kb_store_row_t *rec);

/* import_rows: creates or replaces each key's row with recs[i]'s whole state -- value (dim floats), optimizer
 * state (opt_floats equal to the table's; 0: the state starts fresh), opt_steps, version, updated_at_ms,
 * frequency, pending gradients (pending_count <= max_pending, lazy embedding tables only) or feature record.
 * recs are validated by the caller (row_id, deleted and frequency_only are ignored: a new row gets a new id,
 * an existing row keeps its id). The rows are persisted like any write; admission filters do not apply. */
void kb_table_import(kb_table_t *self, const kb_store_row_t *recs, size_t n);

/* Number of rows held. */
size_t kb_table_row_count(kb_table_t *self);

/* Current values of n keys without creating or counting them (pending gradients are applied first):
 * values (n*dim) and row ids (-1 for a key without a row, whose value is then its initial value). */
void kb_table_peek(kb_table_t *self, const ProtobufCBinaryData *keys, size_t n, float *values, int64_t *ids);

/* Nearest neighbours of nq query vectors: brings the index up to date with every change made before the
 * call, then searches. exclude: NULL or nq row ids never answered for their query. keys_out (nq*k) get
 * malloc'd copies of the keys (data NULL, len 0 where fewer than k exist); caller frees each data.
 * Returns 0, -ENOTSUP without an index, or a kb_knn error. */
int kb_table_knn(kb_table_t *self, const float *queries, size_t nq, uint32_t k, const int64_t *exclude,
                 ProtobufCBinaryData *keys_out, float *scores_out);

/* The fewest queries a slice of a request of nq queries may have (kb_knn_batch_min; 1 without an index). */
size_t kb_table_knn_batch_min(const kb_table_t *self, size_t nq);

/* The recent search time per query of kb_table_knn in ns, a moving average over calls like one of nq
 * queries (split to single queries, or kept in batches of kb_table_knn_batch_min), 0 before the first:
 * how finely a request of nq queries may be split among threads. */
uint64_t kb_table_knn_query_ns(const kb_table_t *self, size_t nq);

/* Brings the nearest-neighbour index up to date with every change made so far (the sweeper calls it so the
 * index does not lag far behind; kb_table_knn calls it before searching). 0 without an index. */
int kb_table_knn_flush(kb_table_t *self);

/* Feature tables. get: per key a malloc'd copy of its packed record (NULL and found=false if none).
 * put: replaces each key's record with records[i] (packed carls.FeatureRecord, validated by the caller). */
void kb_table_feature_get(kb_table_t *self, const ProtobufCBinaryData *keys, size_t n, uint8_t **records,
                          size_t *lens, bool *found);
void kb_table_feature_put(kb_table_t *self, const ProtobufCBinaryData *keys, size_t n, uint8_t *const *records,
                          const size_t *lens);

/* Candidate sampling (DESIGN.md; DynamicEmbedding §3.2.4). Draws n candidates with replacement by strategy
 * from a snapshot of the table's rows (rebuilt at most once a second, when the table changed), and reports
 * the positives first: out_keys / out_probs / out_positive get n_pos + n entries, keys as malloc'd copies
 * (caller frees each data). A positive's probability is what one draw picks it with (0 when the strategy can
 * never draw it, e.g. a key without a row under log-uniform). *mass and *rows describe the snapshot for
 * merging across shards (kb_sampler_mass). Returns 0, or -ENODATA when nothing can be drawn (empty table). */
int kb_table_sample(kb_table_t *self, kb_sampler_strategy_t strategy, const ProtobufCBinaryData *positives,
                    size_t n_pos, size_t n, uint64_t seed, ProtobufCBinaryData *out_keys, float *out_probs,
                    protobuf_c_boolean *out_positive, double *mass, uint64_t *rows);

/* Up to limit rows with row id > after_id, in row-id order, as snapshots (caller kb_store_row_free's each
 * and frees *out). Returns the count; *done is set when no further rows exist. */
size_t kb_table_scan(kb_table_t *self, int64_t after_id, size_t limit, kb_store_row_t **out, bool *done);

/* ---- tables larger than memory (kb-server --cache-bytes; kb_cache.h) ---- */

/* Whether a table of this config may keep rows only in storage: not with a nearest-neighbour index (it
 * holds every vector) nor with an eviction policy (a deleted row must not be read back before its deletion
 * is compacted). Other tables stay wholly in memory. */
bool kb_table_cacheable(const kb_table_config_t *cfg);

/* Attaches the cache (before the table is shared; a cacheable table only): from now on a key missing from
 * memory is looked for in storage, and kb_table_cache_shrink may free clean rows. */
void kb_table_set_cache(kb_table_t *self, kb_cache_t *cache);
bool kb_table_cached(const kb_table_t *self);

/* Start-up of a cached table: it holds `rows` rows in all (most only in storage) and new rows get ids
 * above max_row_id. */
void kb_table_set_stored(kb_table_t *self, uint64_t rows, int64_t max_row_id);

/* While the cache is over its budget, frees clean rows of this table (CLOCK, kb_cache.h) until it is under
 * 15/16 of it or none is left to free. Does nothing without a cache or while another thread shrinks it. */
void kb_table_cache_shrink(kb_table_t *self);

#endif
