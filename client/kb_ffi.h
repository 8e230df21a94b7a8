/* The client API of the shared library libcarls_client.so, in plain C types: for callers through a foreign-
 * function interface (the Python package `carls` in python/, over cffi) and for C programs outside this
 * tree (pkg-config carls-client). It exports these functions and nothing else; programs built in this tree
 * link the static carls_client and call kb_cluster (kb_cluster.h) directly. This header needs no other.
 *
 * One kb_ffi_t is a client of one bank: one kb-server, or several serving the shards of one bank (a
 * kb_cluster_t inside). Like the cluster, one handle is used from one thread at a time.
 *
 * Return convention: 0, or a negative KB_FFI_E* code (the same numbers as kb_client.h's KB_CLIENT_E*).
 * kb_ffi_last_error() then says why and, for KB_FFI_ESTATUS, kb_ffi_last_status() is the server's status as
 * its number in carls.proto's StatusCode (kb_ffi_status_name names it). Pointers a call hands back (result
 * keys, JSON text) stay valid until the next call on the handle.
 *
 * Keys. A call taking keys gets n of them as (data, data_len, ends, n): with ends, key i is the bytes
 * data[ends[i-1] .. ends[i]) (ends[-1] taken as 0) and ends[n-1] must be data_len; with ends NULL, the n keys
 * are data split at NUL bytes (exactly n - 1 of them), the cheap form for keys without NULs. Arrays of
 * values are row-major float32, n * dim of them. Enum values (strategy, settings) go by their names as
 * kbctl spells them: carls.proto's names without the prefix, lower case, '-' for '_' ("sgd", "log-uniform").
 *
 * Result keys. kb_ffi_knn, kb_ffi_knn_by_key and kb_ffi_sample leave the keys they answer in the handle:
 * kb_ffi_result_keys gives them joined by single NUL bytes (data, len bytes, NUL-terminated) with ends[i] the
 * end of key i (key i starts one byte after the end of key i - 1), and whether any key holds a NUL itself
 * (then only ends separates them). An empty slot of a knn answer is an empty key. */
#ifndef KB_FFI_H
#define KB_FFI_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct kb_ffi kb_ffi_t;

enum {
    KB_FFI_OK = 0,
    KB_FFI_ETIMEOUT = -1,   /* no answer after every retry: the bank is down or unreachable */
    KB_FFI_ESTATUS = -2,    /* the server answered with a non-OK status (kb_ffi_last_status) */
    KB_FFI_EINVAL = -3,     /* the call's arguments are wrong (caught before sending) */
    KB_FFI_EIO = -4,        /* ZeroMQ failure, or an answer in another protocol version */
    KB_FFI_EMALFORMED = -5, /* an answer that does not decode or does not fit the request */
};

/* Connects to the bank at endpoints: "tcp://host:port", or a comma-separated list of them in shard order
 * (kb_cluster.h); a shard replicated on several servers is its members joined by '|' ("tcp://a:1|tcp://b:2",
 * kb_client.h: the client follows the shard's primary). timeout_ms per attempt (0: 5000), retries after a timeout (negative: 0). With key_file and
 * server_key_file (both or neither; NULL or "" for neither) every connection is CURVE-encrypted
 * (docs/SECURITY.md). Caller owns the result (kb_ffi_close); NULL on failure, with the reason in err. */
kb_ffi_t *kb_ffi_open(const char *endpoints, int timeout_ms, int retries, const char *key_file,
                      const char *server_key_file, char *err, size_t errlen);

/* The process-wide threshold of the library's log lines on stderr (kb_client's warnings when it resends after a
 * timeout, ...): "debug", "info", "warn", "error" or "off". kb_ffi_open first reads $CARLS_LOG_LEVEL, as the
 * programs do. 0, or KB_FFI_EINVAL for another name. */
int kb_ffi_log_level(const char *level);

/* Closes every connection and frees the handle; accepts NULL and *self_p == NULL; nulls *self_p. */
void kb_ffi_close(kb_ffi_t **self_p);

/* Why the last call failed ("" after a success). */
const char *kb_ffi_last_error(const kb_ffi_t *self);

/* After KB_FFI_ESTATUS: the server's status (carls.proto StatusCode); 0 (OK) otherwise. */
int kb_ffi_last_status(const kb_ffi_t *self);

/* The status's short name ("NOT_FOUND", "UNAVAILABLE", ...), "UNKNOWN" for a number no status has. */
const char *kb_ffi_status_name(int status);

/* Number of shards (endpoints). */
uint32_t kb_ffi_shards(const kb_ffi_t *self);

/* Reads from followers within staleness_ms (kb_cluster_set_read_replicas; 0: off): lookups that create
 * nothing, knn, sample, feature reads and the table list of a replicated shard go to a follower caught up with its primary at
 * most that long ago, else to the primary. */
void kb_ffi_set_read_replicas(kb_ffi_t *self, uint32_t staleness_ms);

/* ---- tables ---------------------------------------------------------------------------------------------- */

/* Creates table on every shard with the config that settings describes: lines "PATH=VALUE", PATH a field of
 * carls.proto's TableConfig, dotted into its messages ("dim=8", "optimizer.kind=adam",
 * "optimizer.learning_rate=0.1", "lazy.policy=immediate", "knn.spec=Flat"); VALUE a number in the field's
 * range, an enum value's name, true/false, or text. Fields left out take the server's defaults. A path or
 * value that does not fit is KB_FFI_EINVAL naming it (nothing sent). settings may be NULL or "". */
int kb_ffi_create_table(kb_ffi_t *self, const char *table, const char *settings, bool if_not_exists);

int kb_ffi_drop_table(kb_ffi_t *self, const char *table, bool if_exists);

/* The table's dim (0 for a feature table) and kind (0 embedding, 1 feature), cached per table name after the
 * first ask; KB_FFI_ESTATUS (NOT_FOUND) when the bank has no such table. */
int kb_ffi_table_info(kb_ffi_t *self, const char *table, uint32_t *dim_out, int *kind_out);

/* Forgets the cached table infos (after another client dropped and re-created a table). */
void kb_ffi_forget_tables(kb_ffi_t *self);

/* Every table as JSON (kb_json.h): carls.proto's TableList, each table's rows summed over the shards. */
int kb_ffi_list_tables_json(kb_ffi_t *self, const char **json_out);

/* The shard's StatsResult as JSON, of table or (NULL or "") of every table. */
int kb_ffi_stats_json(kb_ffi_t *self, uint32_t shard, const char *table, const char **json_out);

/* Checkpoints every shard; *json_out: a JSON array of one CheckpointResult per shard. */
int kb_ffi_checkpoint_json(kb_ffi_t *self, const char **json_out);

/* ---- rows ------------------------------------------------------------------------------------------------- */

/* Looks up n keys (unseen keys get rows, unless no_create) of a table of dimension dim: n * dim floats into
 * values_out and, for each array that is not NULL, n versions, update times (ms) and frequencies. */
int kb_ffi_lookup(kb_ffi_t *self, const char *table, const void *data, size_t data_len, const uint64_t *ends,
                  size_t n, uint32_t dim, bool no_create, float *values_out, uint64_t *versions_out,
                  int64_t *updated_at_ms_out, uint64_t *frequencies_out);

/* Writes n rows (n * dim floats) tagged with version. */
int kb_ffi_put(kb_ffi_t *self, const char *table, const void *data, size_t data_len, const uint64_t *ends,
               size_t n, uint32_t dim, const float *values, uint64_t version);

/* Pushes n gradient rows (n * dim floats); the table's optimizer and update policy apply them. */
int kb_ffi_push_gradients(kb_ffi_t *self, const char *table, const void *data, size_t data_len,
                          const uint64_t *ends, size_t n, uint32_t dim, const float *gradients);

/* Most kb_ffi_push_gradients_send pushes in flight on one handle. */
enum { KB_FFI_MAX_PUSHES = 64 };

/* kb_ffi_push_gradients without waiting for the acknowledgement: the keys and rows are packed into the
 * requests before it returns (the caller may reuse its arrays at once), and the training goes on while the
 * bank applies them. A later request of this handle may be served before the push is applied. When
 * KB_FFI_MAX_PUSHES are in flight it first collects the oldest, and reports that one's failure if it failed
 * (then nothing is sent). */
int kb_ffi_push_gradients_send(kb_ffi_t *self, const char *table, const void *data, size_t data_len,
                               const uint64_t *ends, size_t n, uint32_t dim, const float *gradients);

/* Collects every push in flight (all of them, also after a failure) and reports the first that failed, with
 * its error text and status. 0 when none did or none was in flight. kb_ffi_close drops pushes in flight
 * without waiting: their gradients may or may not have been applied. */
int kb_ffi_wait_pushes(kb_ffi_t *self);

/* Pushes in flight (sent by kb_ffi_push_gradients_send, not collected yet). */
size_t kb_ffi_pushes_in_flight(const kb_ffi_t *self);

/* ---- nearest neighbours, sampling -------------------------------------------------------------------------- */

/* Top-k rows for each of nq query vectors (nq * dim floats): nq * k scores into scores_out, best first per
 * query, and nq * k keys left in the handle (kb_ffi_result_keys). k is 1..4096. */
int kb_ffi_knn(kb_ffi_t *self, const char *table, const float *queries, size_t nq, uint32_t dim, uint32_t k,
               float *scores_out);

/* Top-k rows near each of nq keys' current values, as kb_ffi_knn; with exclude_self a key never answers
 * itself. */
int kb_ffi_knn_by_key(kb_ffi_t *self, const char *table, const void *data, size_t data_len, const uint64_t *ends,
                      size_t nq, uint32_t k, bool exclude_self, float *scores_out);

/* Draws n candidates by strategy ("uniform", "log-uniform", "unigram"; seed 0: random) after the n_pos
 * positives (kb_cluster_sample). *count_out entries (at most cap; n_pos + n unless the bank holds no rows,
 * then n_pos): their probabilities and is_positive flags (1/0) into the arrays, the keys left in the
 * handle, and the bank's mass and rows when those pointers are not NULL. */
int kb_ffi_sample(kb_ffi_t *self, const char *table, const void *data, size_t data_len, const uint64_t *ends,
                  size_t n_pos, uint32_t n, const char *strategy, uint64_t seed, size_t cap, size_t *count_out,
                  float *probabilities_out, uint8_t *is_positive_out, double *mass_out, uint64_t *rows_out);

/* The keys the last successful kb_ffi_knn, kb_ffi_knn_by_key or kb_ffi_sample answered (see the top). */
void kb_ffi_result_keys(const kb_ffi_t *self, const char **data_out, size_t *len_out, const uint64_t **ends_out,
                        size_t *n_out, bool *has_nul_out);

/* ---- feature records ------------------------------------------------------------------------------------------ */

/* The records of n keys of a feature table: a JSON array of n FeatureRecords (kb_json.h), found false for
 * keys without one. */
int kb_ffi_get_features_json(kb_ffi_t *self, const char *table, const void *data, size_t data_len,
                             const uint64_t *ends, size_t n, const char **json_out);

/* Replaces the records of some keys: message is a packed carls.proto FeaturePut (its keys and one record per
 * key), message_len bytes. KB_FFI_EINVAL when it does not decode or the counts differ. */
int kb_ffi_put_features(kb_ffi_t *self, const char *table, const void *message, size_t message_len);

#endif
