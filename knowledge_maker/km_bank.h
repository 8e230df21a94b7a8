/* The knowledge bank as a knowledge maker sees it: items are training images named by their index
 * (key = the decimal index, e.g. "4711"), and every call takes item indices instead of byte keys.
 *
 * Tables a maker writes (the names come from a prefix, see km_tables_t):
 *   <prefix>.pixels  embedding, dim 784: the images themselves (for the initial pixel graph), knn cosine
 *   <prefix>.emb     embedding, dim E: encoder outputs, version = checkpoint step, knn cosine
 *   <prefix>.graph   feature: each item's neighbour list (keys + similarity weights), version = the step of
 *                    the embeddings it was built from (0 for pixels)
 *   <prefix>.labels  feature: pseudo-label + confidence of unlabelled items, version = checkpoint step
 *
 * One km_bank_t wraps one kb_cluster_t (one endpoint, or a sharded bank's endpoints in shard order) and is
 * used from one thread. Large calls are split into requests of at most KM_BANK_CHUNK rows (per call; the
 * cluster splits each over the shards). Return convention: 0, or a negative KB_CLIENT_E* code with the
 * reason in km_bank_error(). */
#ifndef KM_BANK_H
#define KM_BANK_H

#include "kb_client.h"
#include "util.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define KM_BANK_CHUNK 4096u
#define KM_NO_ITEM CARLS_NO_ITEM /* an empty neighbour slot */
#define KM_TABLE_NAME_MAX 128

typedef struct km_bank km_bank_t;

typedef struct {
    char pixels[KM_TABLE_NAME_MAX];
    char emb[KM_TABLE_NAME_MAX];
    char graph[KM_TABLE_NAME_MAX];
    char labels[KM_TABLE_NAME_MAX];
} km_tables_t;

/* Fills the four table names from prefix ("fmnist" -> "fmnist.pixels", ...). -1 if the prefix is too long. */
int km_tables_init(km_tables_t *t, const char *prefix);

/* carls_item_key and carls_key_item (util.h): an item's key is its decimal index. */
size_t km_item_key(uint32_t item, char *buf);
uint32_t km_key_item(const void *data, size_t len);

/* Connects to the bank. endpoints: one endpoint, or the comma-separated endpoints of a sharded bank in shard
 * order (kb_cluster.h). timeout_ms per attempt (0: 60000), retries 2. curve: CURVE keys (copied), or NULL for
 * plain TCP. NULL on failure (logged). */
km_bank_t *km_bank_new(const char *endpoints, int timeout_ms, const kb_client_curve_t *curve);
void km_bank_destroy(km_bank_t **self_p);
const char *km_bank_error(const km_bank_t *self);
/* True when the last failed call failed because the bank was unreachable: no answer after every attempt, a
 * connection failure, or a server shutting down (UNAVAILABLE). Such a call may succeed when retried after
 * the bank is back (kb-server restarted on the same endpoint); other failures will not. */
bool km_bank_unreachable(const km_bank_t *self);

/* Creates an embedding table of dim with a Flat cosine knn index (if it does not exist with that config). */
int km_bank_create_embedding(km_bank_t *self, const char *table, uint32_t dim);
/* Creates a feature table (if it does not exist). */
int km_bank_create_feature(km_bank_t *self, const char *table);

/* Puts n rows (items (n), values (n, dim)) tagged with version. */
int km_bank_put(km_bank_t *self, const char *table, const uint32_t *items, size_t n, uint32_t dim,
                const float *values, uint64_t version);

/* Reads n rows without creating missing ones: values (n, dim) (may be NULL), versions (n), updated_at_ms (n)
 * (0 = the item was never written). */
int km_bank_lookup(km_bank_t *self, const char *table, const uint32_t *items, size_t n, uint32_t dim,
                   float *values, uint64_t *versions, int64_t *updated_at_ms);

/* Top-k neighbours of each item's current value, itself excluded: nbr (n, k) item indices best first
 * (KM_NO_ITEM where fewer exist or a key is not an item), score (n, k) the metric's score (cosine). */
int km_bank_knn(km_bank_t *self, const char *table, const uint32_t *items, size_t n, uint32_t k, uint32_t *nbr,
                float *score);

/* Writes each item's neighbour list: nbr (n, k) (KM_NO_ITEM slots are left out), weight (n, k). */
int km_bank_put_neighbors(km_bank_t *self, const char *table, const uint32_t *items, size_t n, uint32_t k,
                          const uint32_t *nbr, const float *weight, uint64_t version);

/* Writes each item's label and confidence. */
int km_bank_put_labels(km_bank_t *self, const char *table, const uint32_t *items, size_t n, const int32_t *label,
                       const float *confidence, uint64_t version);

/* Reads neighbour lists: nbr (n, k) and weight (n, k) (slots past an item's list: KM_NO_ITEM and 0),
 * versions (n) (may be NULL). Items without a record get an empty list. */
int km_bank_get_neighbors(km_bank_t *self, const char *table, const uint32_t *items, size_t n, uint32_t k,
                          uint32_t *nbr, float *weight, uint64_t *versions);

/* Reads labels: label (n) (-1 where there is none), confidence (n), versions (n) (may be NULL). */
int km_bank_get_labels(km_bank_t *self, const char *table, const uint32_t *items, size_t n, int32_t *label,
                       float *confidence, uint64_t *versions);

#endif
