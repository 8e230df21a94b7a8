/* Sharded client: one logical knowledge bank served by N kb-server processes (`kb-server --shard i/N`).
 *
 * A kb_cluster_t holds one kb_client_t per shard. The endpoint list "tcp://a:1,tcp://b:2,..." is in shard
 * order: the i-th endpoint serves shard i of N. A key belongs to shard carls_shard_of(key, len, N) and to no
 * other (a sharded server refuses keys of other shards, so a list in the wrong order fails loudly instead of
 * scattering data). With a single endpoint every call sends one request (keys in the caller's order) to
 * that server. This is the client's one request API: kb_client (the transport under it) only sends,
 * resends and receives; a program holding a kb_client_t makes its requests on a one-shard cluster over it
 * (kb_cluster_over).
 *
 * How each operation spreads over the shards:
 *   - create_table, drop_table, checkpoint: sent to every shard (in parallel). Not atomic across shards: when
 *     some shard fails the others may have applied it; last_error names the first shard that failed, and a
 *     retry with if_not_exists / if_exists converges.
 *   - list_tables: every shard answers; the list is shard 0's (names and configs) with each table's `rows`
 *     summed over the shards.
 *   - lookup, lookup_ex, put, push_gradients, feature_get, feature_put, import_rows: keys are split by shard, every
 *     sub-request is sent before any answer is awaited (the shards work in parallel), and the answers are
 *     put back in the caller's key order. A write that fails on one shard may have been applied on others:
 *     re-running a put is harmless (it sets the same values), re-running push_gradients pushes the rows of
 *     the shards that succeeded twice. kb_cluster_failed_shard() says which shard failed.
 *   - knn by vector: every shard answers its own top-k and the lists are merged by score in the direction
 *     of the table's metric (higher first for inner product and cosine, lower first for L2). With a Flat
 *     index the merged answer equals a single server's holding every row. The metric comes from the table's
 *     config (list_tables), cached per table name; kb_cluster_forget_tables() drops the cache.
 *   - knn by key: the key's current value is read from its owning shard (a no_create lookup, which applies
 *     the key's pending gradients and counts as a use of it), then every shard is asked by vector. With
 *     exclude_self the query key is dropped from the merged answer (each shard is asked for k+1).
 *   - sample: see kb_cluster_sample.
 *   - stats and scan: per shard (the caller picks the shard).
 *
 * Timeouts: each shard's client waits timeout_ms per attempt (kb_client.h), counted from when its answer is
 * awaited. Answers are awaited shard after shard, so healthy shards cost one round trip together, but a call
 * that meets k unresponsive shards takes up to k times the timeout before it fails.
 *
 * Threading: like kb_client_t, one cluster is used from one thread at a time.
 *
 * Return convention: as kb_client: 0 on success, a negative KB_CLIENT_E* code on failure, with
 * kb_cluster_last_error() describing it and, for KB_CLIENT_ESTATUS, kb_cluster_last_status() giving the
 * status as the protobuf enum (test the enum, never the text). With more than one shard the text starts
 * with "shard I (ENDPOINT): ", naming the first shard that failed. */
#ifndef KB_CLUSTER_H
#define KB_CLUSTER_H

#include "kb_client.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct kb_cluster kb_cluster_t;

#define KB_CLUSTER_MAX_SHARDS 1024u

/* Opens one client per endpoint of the comma-separated list (blanks around the commas are ignored), each
 * with opts (may be NULL). Without opts->client_id each client picks its own random id; a given id is
 * shared by every shard's client, which is safe because each server keeps its own duplicate filter. An
 * empty entry, a repeated endpoint or more than KB_CLUSTER_MAX_SHARDS endpoints is refused. Caller owns
 * the result; NULL on failure (logged). */
kb_cluster_t *kb_cluster_new(const char *endpoints, const kb_client_options_t *opts);

/* A one-shard cluster over client, which stays the caller's: kb_cluster_destroy leaves it open, and the
 * caller keeps it alive and uses it from no other thread while the cluster lives. Caller owns the result. */
kb_cluster_t *kb_cluster_over(kb_client_t *client);

/* Closes every client (not a kb_cluster_over one) and frees the cluster; accepts NULL and *self_p == NULL;
 * nulls *self_p. */
void kb_cluster_destroy(kb_cluster_t **self_p);

/* Number of shards (endpoints), >= 1. */
uint32_t kb_cluster_shards(const kb_cluster_t *self);

/* The shard's endpoint as given (trimmed). shard < kb_cluster_shards(). */
const char *kb_cluster_endpoint(const kb_cluster_t *self, uint32_t shard);

/* Requests sent so far by this cluster, over all shards (resends after a timeout not counted). */
uint64_t kb_cluster_requests(const kb_cluster_t *self);

/* The shard owning key: carls_shard_of(key, len, shards). */
uint32_t kb_cluster_shard_of(const kb_cluster_t *self, const void *key, size_t len);

/* Last error text ("" after success). Valid until the next call on the cluster. */
const char *kb_cluster_last_error(const kb_cluster_t *self);

/* The shard whose failure the last error describes, or -1 (success, or an error not tied to one shard,
 * such as bad arguments). */
int kb_cluster_failed_shard(const kb_cluster_t *self);

/* After KB_CLIENT_ESTATUS: the status, as the failed shard's server answered it or as the cluster answers
 * for the whole bank (NOT_FOUND for a table it does not have or a sample with nothing to draw,
 * INVALID_ARGUMENT for knn on a table without an index). STATUS_OK after a success or another failure. */
Carls__StatusCode kb_cluster_last_status(const kb_cluster_t *self);

/* ---- read replicas (docs/REPLICATION.md section 5) --------------------------------------------------- */

/* Reads from followers: with staleness_ms > 0, the reads of a shard with several members ("a|b") -- lookups
 * that create nothing (no_create), knn (its key lookup included), sample, feature_get, scan and list_tables
 * (the table configs those reads look up), also through kb_cluster_call, whose req then carries the
 * bound -- go first to a member the shard's client is not
 * using (the primary, once a write found it), to each such member in turn, with max_staleness_ms =
 * staleness_ms: a follower answers only when it was caught up with its primary at most that long ago. Any
 * other outcome (STATUS_STALE above all, another error, or no answer within one attempt of the failover
 * timeout, opts->failover_timeout_ms or 1000 ms) sends the read on to the shard's own client with the same
 * bound: a primary ignores it, a follower that client is on applies it, so a read never returns data staler
 * than asked (it fails with STALE instead, for instance while the primary is unreachable and the followers
 * have stopped hearing from it). Writes, lookups that create rows and shards of one member are unaffected.
 * 0 turns it off. 0, or KB_CLIENT_EINVAL for a cluster made by kb_cluster_over. */
int kb_cluster_set_read_replicas(kb_cluster_t *self, uint32_t staleness_ms);

/* Reads answered by the member they were sent to first (a follower, unless the shard's client sits on a
 * follower itself: a failover moved it there and no write has moved it back yet, so the member asked first
 * is the primary), and reads that went on to the shard's own client, since the cluster opened. */
void kb_cluster_replica_reads(const kb_cluster_t *self, uint64_t *served, uint64_t *fell_back);

/* ---- tables ---------------------------------------------------------------------------------------- */

/* What the cluster caches about a table (from list_tables). */
typedef struct {
    Carls__TableKind kind;
    uint32_t dim;             /* 0 for feature tables */
    bool has_knn;             /* a nearest-neighbour index is configured */
    Carls__KnnMetric metric;  /* its metric (meaningful when has_knn) */
} kb_cluster_table_t;

/* Creates the table on every shard. cfg is copied into the requests (fields left zero take the server's
 * defaults). */
int kb_cluster_create_table(kb_cluster_t *self, const char *table, const Carls__TableConfig *cfg,
                            bool if_not_exists);

/* Drops the table on every shard. */
int kb_cluster_drop_table(kb_cluster_t *self, const char *table, bool if_exists);

/* Every shard's list, merged: shard 0's answer with each table's rows replaced by the sum over shards.
 * Caller owns *list_out (a Response whose result is table_list; free with carls__response__free_unpacked).
 * Refreshes the table cache. */
int kb_cluster_list_tables(kb_cluster_t *self, Carls__Response **list_out);

/* Fills *out with the table's kind, dim and metric, from the cache or, on a miss, from list_tables. A table
 * the bank does not have is KB_CLIENT_ESTATUS ("NOT_FOUND: ..."). */
int kb_cluster_table(kb_cluster_t *self, const char *table, kb_cluster_table_t *out);

/* Forgets every cached table (call it after another client dropped and re-created a table). */
void kb_cluster_forget_tables(kb_cluster_t *self);

/* The table's config with defaults filled in, as shard 0 reports it. Caller owns *cfg_out (free with
 * carls__table_config__free_unpacked(cfg, NULL)). KB_CLIENT_ESTATUS when the table does not exist. */
int kb_cluster_table_config(kb_cluster_t *self, const char *table, Carls__TableConfig **cfg_out);

/* ---- rows -------------------------------------------------------------------------------------------- */

/* The row operations, with the keys split over the shards (see the top of this file). values_out, meta_out
 * and the input rows are in the caller's key order. */

/* Looks up n keys of a table of dimension dim: writes n*dim floats to values_out and, when meta_out is not
 * NULL, n metadata records. Fails with KB_CLIENT_EINVAL if the server's dim differs, and with
 * KB_CLIENT_EMALFORMED if an answer holds another number of values or metadata records than its keys need
 * (nothing is copied). */
int kb_cluster_lookup(kb_cluster_t *self, const char *table, const kb_key_t *keys, size_t n, uint32_t dim,
                      float *values_out, kb_row_meta_t *meta_out);
/* kb_cluster_lookup with the request's no_create flag: when true the server answers unseen keys with their
 * initial value without inserting them (kbctl get --no-create). */
int kb_cluster_lookup_ex(kb_cluster_t *self, const char *table, const kb_key_t *keys, size_t n, uint32_t dim,
                         bool no_create, float *values_out, kb_row_meta_t *meta_out);
/* Writes n rows (n*dim floats) tagged with version. */
int kb_cluster_put(kb_cluster_t *self, const char *table, const kb_key_t *keys, size_t n, uint32_t dim,
                   const float *values, uint64_t version);
/* Pushes n gradient rows (n*dim floats); each row is one gradient. */
int kb_cluster_push_gradients(kb_cluster_t *self, const char *table, const kb_key_t *keys, size_t n,
                              uint32_t dim, const float *gradients);

/* ---- nearest neighbours ------------------------------------------------------------------------------ */

/* Answers to nq queries, k slots each, best first per query. */
typedef struct {
    size_t nq;           /* queries */
    uint32_t k;          /* slots per query */
    kb_key_t *keys;      /* (nq, k); len 0 (data NULL) in slots past the last row found */
    float *scores;       /* (nq, k); the metric's score (L2: squared distance); 0 in empty slots */
    uint8_t *key_bytes;  /* private: storage the keys point into */
} kb_knn_result_t;

/* Frees a result; accepts NULL and *result_p == NULL; nulls *result_p. */
void kb_knn_result_destroy(kb_knn_result_t **result_p);

/* Top-k rows for each of nq query vectors (queries: nq * dim floats; dim must be the table's). k is
 * 1..4096. Caller owns *out. */
int kb_cluster_knn(kb_cluster_t *self, const char *table, const float *queries, size_t nq, uint32_t dim,
                   uint32_t k, kb_knn_result_t **out);

/* Top-k rows near each query key's current value; with exclude_self a query key never answers itself.
 * Caller owns *out. */
int kb_cluster_knn_by_key(kb_cluster_t *self, const char *table, const kb_key_t *keys, size_t nq, uint32_t k,
                          bool exclude_self, kb_knn_result_t **out);

/* ---- candidate sampling ------------------------------------------------------------------------------ */

typedef struct {
    size_t n;             /* entries: the positives, then the sampled candidates */
    size_t n_positives;   /* the first n_positives entries are the positives, in the caller's order */
    kb_key_t *keys;       /* (n) */
    float *probabilities; /* (n) probability that one draw from the whole bank picks the key */
    bool *is_positive;    /* (n) */
    double mass;          /* total mass over the shards */
    uint64_t rows;        /* rows the samplers drew from, over all shards */
    uint8_t *key_bytes;   /* private: storage the keys point into */
} kb_sample_result_t;

/* Frees a result; accepts NULL and *result_p == NULL; nulls *result_p. */
void kb_sample_result_destroy(kb_sample_result_t **result_p);

/* Draws n candidates (with replacement) by strategy from the whole bank and returns the positives first,
 * then the candidates, each with its per-draw probability (for a sampled-softmax correction log(n * p)).
 *
 * With several shards: every shard is first asked for its mass (a sample of 0 candidates, carrying the
 * positives it owns, whose probabilities it answers). n is split over the shards by a multinomial draw with
 * probabilities mass_s / total (seeded by seed), each shard draws its share (seeded by seed and the shard),
 * and each probability is scaled by mass_s / total; candidates are then shuffled (seeded) so they do not
 * come grouped by shard. What that gives:
 *   - uniform (mass = rows) and unigram (mass = sum of frequency^0.75): exact. The scaled probabilities are
 *     the single-bank ones, and n draws split multinomially by mass, each shard drawing from its own
 *     distribution, have the same law as n independent draws from the whole bank.
 *   - log-uniform: an approximation. Each shard ranks only its own rows by frequency, so a key's
 *     probability follows its rank within its shard, mixed by row counts; this equals the single-bank
 *     Zipfian only when the shards' frequency profiles match. The probabilities returned are the ones the
 *     draws were made with, so the sampled-softmax correction stays consistent.
 * seed 0 picks a random seed (with one shard the server picks it). With one shard the request goes through
 * unchanged. Caller owns *out. A bank with nothing to draw from answers n == 0 with the positives
 * (probability 0) and refuses n > 0 with KB_CLIENT_ESTATUS ("NOT_FOUND: ..."), as a single server does. */
int kb_cluster_sample(kb_cluster_t *self, const char *table, const kb_key_t *positives, size_t n_positives,
                      uint32_t n, Carls__SampleStrategy strategy, uint64_t seed, kb_sample_result_t **out);

/* ---- requests in flight ----------------------------------------------------------------------------- */

/* A lookup, gradient push, sample or feature read whose requests are out on the shards and whose answers
 * are collected later, so that a caller can compute while the shards work: the word2vec trainer keeps the lookups of the
 * next batches and the pushes of the last one in flight while it computes. A *_send call sends one request
 * per shard holding keys (exactly what the blocking call sends) and returns at once; the matching *_wait
 * collects the answers, and the blocking calls above are send + wait. Any number of pendings may be in
 * flight, and they may be waited for in any order. The caller's keys and rows are packed into the requests
 * when sent: they may be reused as soon as *_send returns.
 *
 * A *_send failure has already ended what it sent (*pending_out stays NULL). A *_wait always ends and frees
 * *pending_p (and nulls it), whatever it returns; the error is reported as by the blocking call. A pending
 * given up on is freed with kb_cluster_pending_destroy. */
typedef struct kb_cluster_pending kb_cluster_pending_t;

/* kb_cluster_lookup_ex's requests, sent. Caller owns *pending_out (end it with kb_cluster_lookup_wait). */
int kb_cluster_lookup_send(kb_cluster_t *self, const char *table, const kb_key_t *keys, size_t n, uint32_t dim,
                           bool no_create, kb_cluster_pending_t **pending_out);

/* Collects a lookup_send's answers into the caller's key order, as kb_cluster_lookup_ex: values_out (n * dim
 * floats; may be NULL here when only meta_out is wanted) and meta_out (n records, or NULL). */
int kb_cluster_lookup_wait(kb_cluster_t *self, kb_cluster_pending_t **pending_p, float *values_out,
                           kb_row_meta_t *meta_out);

/* kb_cluster_push_gradients' requests, sent. Caller owns *pending_out (end it with
 * kb_cluster_push_gradients_wait). */
int kb_cluster_push_gradients_send(kb_cluster_t *self, const char *table, const kb_key_t *keys, size_t n,
                                   uint32_t dim, const float *gradients, kb_cluster_pending_t **pending_out);

/* Collects a push_gradients_send's acknowledgements. */
int kb_cluster_push_gradients_wait(kb_cluster_t *self, kb_cluster_pending_t **pending_p);

/* kb_cluster_sample, sent. With one shard its one request is in flight until kb_cluster_sample_wait; with
 * several, the draws are made here (the second round depends on the first round's answers) and the wait
 * only hands the result over. A failure may thus show at either call. Caller owns *pending_out. */
int kb_cluster_sample_send(kb_cluster_t *self, const char *table, const kb_key_t *positives, size_t n_positives,
                           uint32_t n, Carls__SampleStrategy strategy, uint64_t seed,
                           kb_cluster_pending_t **pending_out);

/* Collects a sample_send's result, as kb_cluster_sample. Caller owns *out. */
int kb_cluster_sample_wait(kb_cluster_t *self, kb_cluster_pending_t **pending_p, kb_sample_result_t **out);

/* Gives up on a pending without waiting: its requests are cancelled (answers that still come are dropped).
 * Accepts NULL and *pending_p == NULL; nulls *pending_p. self must be the cluster that sent it. */
void kb_cluster_pending_destroy(kb_cluster_t *self, kb_cluster_pending_t **pending_p);

/* ---- feature records --------------------------------------------------------------------------------- */

typedef struct {
    size_t n;                               /* one record per requested key, in the caller's order */
    const Carls__FeatureRecord **records;   /* (n); records[i]->found says whether key i has one */
    Carls__Response **responses;            /* private: the shards' answers the records live in */
    size_t n_responses;
} kb_feature_result_t;

/* Frees a result; accepts NULL and *result_p == NULL; nulls *result_p. */
void kb_feature_result_destroy(kb_feature_result_t **result_p);

/* Records of n keys of a feature table. Caller owns *out. */
int kb_cluster_feature_get(kb_cluster_t *self, const char *table, const kb_key_t *keys, size_t n,
                           kb_feature_result_t **out);

/* kb_cluster_feature_get's requests, sent (see "requests in flight" above): the graph trainer's prefetcher
 * keeps a batch's neighbour-list and pseudo-label reads in flight together. Caller owns *pending_out (end it
 * with kb_cluster_feature_get_wait). */
int kb_cluster_feature_get_send(kb_cluster_t *self, const char *table, const kb_key_t *keys, size_t n,
                                kb_cluster_pending_t **pending_out);

/* Collects a feature_get_send's answers, as kb_cluster_feature_get. Caller owns *out. */
int kb_cluster_feature_get_wait(kb_cluster_t *self, kb_cluster_pending_t **pending_p, kb_feature_result_t **out);

/* Replaces the records of n keys (records[i] for keys[i]; the server stamps updated_at_ms). */
int kb_cluster_feature_put(kb_cluster_t *self, const char *table, const kb_key_t *keys, size_t n,
                           const Carls__FeatureRecord *const *records);

/* ---- rows with their whole state (import) -------------------------------------------------------------- */

/* One row as a scan answers it with its whole state (docs/STATE.md "Export and import"). */
typedef struct {
    kb_key_t key;
    const float *values;                /* embedding tables: dim floats; NULL for feature tables */
    const float *opt_state;             /* opt_floats floats (NULL when opt_floats is 0) */
    uint64_t opt_steps, version, frequency;
    int64_t updated_at_ms;
    uint32_t pending_count;             /* pending gradients (lazy embedding tables) */
    const float *pending;               /* pending_count * dim floats, oldest first */
    const Carls__FeatureRecord *record; /* feature tables: the row's record; NULL for embedding tables */
} kb_import_row_t;

/* Creates or replaces n rows of table with their whole state (import_rows), routed by key to their shards
 * in one fan-out like put; a write (exactly once per shard: client id and sequence). opt_floats: optimizer
 * floats per row, the table's or 0 (the servers start each row's state fresh); every row of one call is of
 * the same kind (values, or records). The servers check everything and name the first bad row. */
int kb_cluster_import_rows(kb_cluster_t *self, const char *table, const kb_import_row_t *rows, size_t n,
                           uint32_t dim, uint32_t opt_floats);

/* ---- per shard ----------------------------------------------------------------------------------------- */

/* Sends req, built by the caller (op and its fields; the transport fills the ids), to shard and waits for the
 * answer: 0 with *resp_out (the caller's) carrying result `want`; a failure as the other calls (*resp_out
 * NULL). For an operation without a call of its own here (kbctl replica). */
int kb_cluster_call(kb_cluster_t *self, uint32_t shard, Carls__Request *req, Carls__Response__ResultCase want,
                    Carls__Response **resp_out);

/* The shard's stats (table NULL or "" for every table). Caller owns *stats_out. */
int kb_cluster_stats(kb_cluster_t *self, uint32_t shard, const char *table, Carls__Response **stats_out);

/* Checkpoints every shard (in parallel). per_shard_out, when not NULL, gets kb_cluster_shards() entries:
 * each shard's committed epoch and row count. */
int kb_cluster_checkpoint(kb_cluster_t *self, Carls__CheckpointResult *per_shard_out);

/* One page of the shard's rows with row id > after_row_id (at most limit; 0 means the server's default),
 * checked for consistent sizes (keys, row ids, versions and frequencies per row; dim values per row of an
 * embedding table, one record per row of a feature table; row ids increasing past after_row_id). Caller
 * owns *page_out (result scan); page with the last row id until scan->done. */
int kb_cluster_scan(kb_cluster_t *self, uint32_t shard, const char *table, int64_t after_row_id, uint32_t limit,
                    Carls__Response **page_out);

/* A page of kb_cluster_scan_all: true to go on, false to stop there. */
typedef bool (*kb_cluster_page_fn)(void *ctx, uint32_t shard, const Carls__ScanResult *page);

/* Every row of table, shard by shard, in pages of at most limit rows (kb_cluster_scan's checks) handed to
 * fn(ctx, shard, page); a page with no keys is not handed over. Returns 0 once every page was seen or fn
 * stopped (a caller that stops keeps why in ctx), or the code of the scan that failed (error set). */
int kb_cluster_scan_all(kb_cluster_t *self, const char *table, uint32_t limit, kb_cluster_page_fn fn, void *ctx);

/* ---- snapshots (docs/STATE.md "Snapshots") ------------------------------------------------------------ */

/* Takes snapshot name (1..64 characters of [A-Za-z0-9_.-], not beginning with '.') on every shard, in
 * parallel: each shard stores its part, cut at one epoch of its own, in its own data directory. When some
 * shard fails, the parts the others took are deleted again. A snapshot takes as long as copying the bank:
 * give the clients a timeout that allows it (a resent create waits for the one in progress and answers as
 * it did). 0, or -1 with the first failing shard's error in err (errlen bytes; when the name exists:
 * kb_cluster_last_status() is ALREADY_EXISTS). */
int kb_cluster_snapshot(kb_cluster_t *self, const char *name, char *err, size_t errlen);

/* Deletes snapshot name on every shard. 0, or -1 with err (NOT_FOUND when a shard lacks it; the others
 * have deleted theirs). */
int kb_cluster_snapshot_delete(kb_cluster_t *self, const char *name, char *err, size_t errlen);

/* One snapshot action on every shard (create and delete: name required; list: name ignored, verify checks
 * every file's CRC-32 too). per_shard_out, when not NULL, gets kb_cluster_shards() answers (result
 * snapshot; create and delete: exactly one entry each), which the caller frees with
 * carls__response__free_unpacked. A KB_CLIENT_E* code as the other calls (no clean-up after a partial
 * create: see kb_cluster_snapshot). */
int kb_cluster_snapshot_each(kb_cluster_t *self, Carls__SnapshotAction action, const char *name, bool verify,
                             Carls__Response **per_shard_out);

#endif
