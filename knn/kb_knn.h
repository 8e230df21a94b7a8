/* Nearest-neighbour index of one embedding table, kept in step with the table's rows (DESIGN.md,
 * "Nearest neighbours"). Built on the FAISS C API from an index-factory spec. Only specs whose numbers
 * are bounded are accepted (FAISS's factory divides by zero, aborts or allocates without limit on bad
 * ones, and specs arrive over the network): Flat, HNSW<m>[,Flat] (m 2..256), IVF<n>,Flat (n 1..65536),
 * IVF<n>,PQ<m>[x<bits>] and PQ<m>[x<bits>] (m divides dim, bits 4..12). "Flat", "IVF<nlist>,Flat" and
 * "HNSW<M>" are the tested ones.
 *
 * Rows are identified by their table row id (int64, >= 0; -1 means "no result" in search answers).
 *
 * How the index follows the table
 *   The module keeps its own copy of every vector (id -> vector). That copy is the truth; the FAISS index
 *   is derived from it and may lag:
 *   - Indexes that support removal (Flat, IVF): an upsert is remove + re-add, a remove is a remove, both
 *     applied at once. FAISS removal scans the whole index (O(n) per call), so batch updates with
 *     kb_knn_upsert_batch / kb_knn_remove_batch: one batch costs one scan.
 *   - Indexes without removal (HNSW): a new id is added to the graph at once; a moved or removed id is
 *     recorded as "pending" (the graph still holds its old vector). Searches stay exact with respect to
 *     the copy: hits on pending ids are dropped from the graph's answer and the pending ids' current
 *     vectors are scored by brute force and merged in. When the pending count reaches
 *     max(rebuild_min_pending, rebuild_fraction * count), a rebuild of the whole graph from the copy
 *     starts (in the background thread, or at the next kb_knn_rebuild() call when background is off).
 *     Searches keep using the old graph until the new one is swapped in; changes made during the rebuild
 *     are replayed onto the new graph at the swap.
 *   - Indexes that need training (IVF, PQ...): until the copy holds train_min vectors there is no usable
 *     index and every search is an exact brute-force scan of the copy. Once train_min is reached the index
 *     is trained on all vectors then present and filled (in the background, or by kb_knn_rebuild()), and
 *     from then on it is updated in place like any removable index. As the table grows the centroids are
 *     retrained on everything present each time the count has doubled since the last training (in the
 *     background, or at kb_knn_rebuild()), until the index was trained on 256 vectors per centroid (FAISS's
 *     k-means samples no more); kb_knn_rebuild() retrains at any time (e.g. after a bulk load).
 *     Default train_min: 39 * nlist for IVF (FAISS's own minimum for k-means without a warning: 39
 *     points per centroid), 39 * 256 for other trainable indexes (enough for 8-bit PQ/SQ codebooks).
 *   Memory: the copy costs count * dim * 4 bytes beside whatever the index stores.
 *
 * Metrics and scores
 *   ip: inner product, higher is better. l2: squared Euclidean distance, lower is better. cosine: inner
 *   product of L2-normalized vectors (stored vectors and queries are normalized here; a zero vector stays
 *   zero), higher is better. Answers are best first.
 *
 * Recall
 *   Defaults aim at recall@10 >= 0.9 out of the box. Measured on 5000 clustered vectors of dim 32
 *   (tests/knn/test_kb_knn.c): IVF64,Flat with nprobe 8: 0.99 (l2), 0.98 (ip). HNSW32 with efSearch 256 and
 *   efConstruction 80: 0.99 for l2 and cosine on isotropic Gaussian clusters, the hard case for graphs
 *   (FAISS's defaults, efSearch 16 / efConstruction 40, gave 0.64 / 0.51 there; efConstruction 40 with
 *   efSearch 256 gave 0.92-0.98 for cosine, varying run to run as the parallel build is not
 *   deterministic), and 0.99 on embedding-like data of low intrinsic dimension. A search costs roughly
 *   in proportion to efSearch, a build to efConstruction; lower them where the data allows.
 *
 * Threads
 *   One reader-writer lock per index: searches share it, updates take it exclusively (FAISS indexes are not
 *   safe for an add concurrent with a search). The slow part of a build (training, adding every vector)
 *   runs without the lock; only the snapshot copy and the final swap take it exclusively. A large batch of
 *   new ids into HNSW is inserted under the lock (fine for a bulk load at start-up, before serving).
 *   FAISS parallelizes with OpenMP and calls BLAS (OpenBLAS, itself multi-threaded). With both set to the
 *   core count they multiply: OpenBLAS's threads and OpenMP's spinning threads fight for the same cores,
 *   an order of magnitude slower for Flat (docs/BENCHMARKS.md, "Figures behind the code's choices"). So
 *   kb_knn_set_threads() fixes both: OpenMP threads (default: the number of online cores) and OpenBLAS
 *   threads (default 1: the parallelism comes from OpenMP). OpenMP's thread count is a per-thread setting,
 *   so every kb_knn call applies it to its calling thread. OpenMP's barriers also suffer when the cores are
 *   busy with other work: on a loaded machine, Flat with 2 OpenMP threads ran several times slower than
 *   with 1. With W server threads searching at once, up to W * omp_threads threads run; a server with
 *   several workers, or sharing its machine, should pass omp_threads = 1 (or a small number).
 *
 * Errors: functions return 0 or a negative errno: -EINVAL bad argument (wrong dim, negative id,
 * non-finite value, k == 0...), -ENOENT id not present, -EAGAIN nothing to build yet, -EIO a FAISS call
 * failed (its text is logged). Out of memory aborts (carls_xmalloc). */
#ifndef KB_KNN_H
#define KB_KNN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef enum {
    KB_KNN_METRIC_IP = 0,     /* inner product, higher first */
    KB_KNN_METRIC_L2 = 1,     /* squared L2 distance, lower first */
    KB_KNN_METRIC_COSINE = 2, /* inner product of normalized vectors, higher first */
} kb_knn_metric_t;

typedef struct {
    const char *spec;          /* FAISS index-factory string, e.g. "Flat", "IVF64,Flat", "HNSW32" (copied) */
    kb_knn_metric_t metric;    /* see above */
    uint32_t dim;              /* vector length, 1..65536 */
    uint32_t nprobe;           /* IVF: inverted lists visited per query; 0 = ceil(nlist / 8) */
    uint32_t ef_search;        /* HNSW: search beam width (efSearch); 0 = 256 (see "Recall") */
    uint32_t ef_construction;  /* HNSW: beam width while inserting (efConstruction); 0 = 80 (FAISS: 40) */
    uint64_t train_min;        /* trainable indexes: vectors needed before training; 0 = default (above) */
    uint32_t rebuild_min_pending; /* HNSW: pending changes before a rebuild, at least; 0 = 256 */
    float rebuild_fraction;    /* HNSW: ... and at least this fraction of the count; 0 = 0.05 */
    bool background;           /* true: a worker thread trains/rebuilds when due; false: kb_knn_rebuild() only */
} kb_knn_config_t;

/* Staleness and size, a consistent snapshot taken under the lock. */
typedef struct {
    uint64_t count;          /* vectors held (the copy) */
    uint64_t indexed;        /* vectors in the FAISS index (ntotal); HNSW counts stale copies too */
    uint64_t pending;        /* changes the index does not reflect yet: HNSW moved/removed ids; untrained: count */
    uint64_t rebuilds;       /* builds completed (first training included) */
    uint64_t failed_builds;  /* builds that failed (FAISS error, logged); the old index stayed in use */
    int64_t last_build_ms;   /* wall clock (ms since epoch) when the last build completed; 0 = never */
    int64_t last_build_duration_ms; /* how long that build took */
    bool ready;              /* a usable index exists; false while an index waits for training (brute force) */
    bool removable;          /* the index supports removal (updated in place) */
    bool building;           /* a build is running now */
    uint64_t memory_bytes;   /* estimated heap bytes: the copy, its maps and the index (kb_knn_memory) */
} kb_knn_stats_t;

typedef struct kb_knn kb_knn_t;

#define KB_KNN_MAX_K 4096u /* neighbours per query, at most */

/* Estimated heap bytes held: the copy (ids and vectors, by capacity), its id maps and the FAISS index
 * (per indexed vector by the spec's kind: vector or code, id, HNSW links; plus IVF centroids and PQ
 * codebooks). A build in progress holds a second copy and index for a while; that is not counted. */
uint64_t kb_knn_memory(kb_knn_t *self);

/* About what one more vector adds to kb_knn_memory (for reserving memory before rows are created). */
uint64_t kb_knn_vector_bytes(const kb_knn_t *self);

/* Fills cfg with the defaults: spec "Flat", metric ip, dim 0 (the caller must set it), zeros elsewhere
 * (meaning the defaults above), background true. */
void kb_knn_config_default(kb_knn_config_t *cfg);

/* Parses "ip", "l2" or "cosine". Returns 0 and sets *out, or -EINVAL. */
int kb_knn_metric_parse(const char *name, kb_knn_metric_t *out);
/* "ip", "l2", "cosine" (or "?"). */
const char *kb_knn_metric_name(kb_knn_metric_t metric);

/* Process-wide thread settings (see "Threads" above). omp_threads <= 0 means the number of online cores;
 * blas_threads <= 0 means 1. Calls OpenBLAS at once; OpenMP's setting is applied by each later kb_knn
 * call in its own thread. Without a call, the defaults apply from the first kb_knn_new(). */
void kb_knn_set_threads(int omp_threads, int blas_threads);

/* Creates an empty index. On failure returns a negative errno, leaves *out NULL and, when err is not
 * NULL, writes a one-line reason into err (errlen bytes, NUL-terminated), e.g. for a spec FAISS cannot
 * parse. With cfg->background a worker thread is started. Caller owns *out (kb_knn_destroy). */
int kb_knn_new(const kb_knn_config_t *cfg, kb_knn_t **out, char *err, size_t errlen);

/* Stops the worker (waiting for a running build to finish), frees everything and sets *self_p to NULL.
 * Accepts NULL and *self_p == NULL. No other call may be running on the index. */
void kb_knn_destroy(kb_knn_t **self_p);

/* Inserts or replaces n vectors: ids[i] (>= 0) gets vecs[i * dim .. +dim]. A repeated id within one batch:
 * the last one wins. Vectors must be finite. Either the whole batch is applied or (on -EINVAL, checked
 * first) none of it. -EIO when FAISS fails: the copy is updated anyway and the index, which no longer
 * matches it, is dropped; searches then scan the copy exactly until the next build (the worker's, or
 * kb_knn_rebuild()) makes a fresh index. */
int kb_knn_upsert_batch(kb_knn_t *self, size_t n, const int64_t *ids, const float *vecs);
/* kb_knn_upsert_batch for one vector. */
int kb_knn_upsert(kb_knn_t *self, int64_t id, const float *vec);

/* Removes n ids; ids not present are skipped. *removed (may be NULL) gets the number actually removed. */
int kb_knn_remove_batch(kb_knn_t *self, size_t n, const int64_t *ids, size_t *removed);
/* Removes one id: 0, or -ENOENT when it is not present. */
int kb_knn_remove(kb_knn_t *self, int64_t id);

/* Top-k search for nq queries (queries: nq * dim floats, row-major; finite). exclude: NULL, or nq ids,
 * exclude[q] being an id never returned for query q (-1: none), e.g. the query's own row.
 * Writes out_ids[nq * k] and out_scores[nq * k]: for query q, out_ids[q * k + j] is its j-th best, best
 * first, with its score (see Metrics). When fewer than k vectors qualify, the rest of the row is id -1
 * with score -INFINITY (ip, cosine) or +INFINITY (l2). k is 1..KB_KNN_MAX_K. Safe to call from many threads. */
int kb_knn_search(kb_knn_t *self, const float *queries, size_t nq, uint32_t k, const int64_t *exclude,
                  int64_t *out_ids, float *out_scores);

/* The fewest queries a slice of a batch of nq queries should carry so that searching the batch in slices
 * costs no more per query than searching it whole. Flat: a search of FAISS's
 * distance_compute_blas_threshold (20) queries or more is one BLAS product of the queries and the stored
 * vectors, whose cost per query falls with its height until about 256 rows and little after; fewer are
 * scanned query by query. So a batch of 20 or more gets max(256, threshold) (a batch under that is not
 * split), a smaller one 1: it is scanned query by query whole or split, and split it runs on several
 * threads. Others: 1. They search query by query (HNSW, PQ), or nearly: IVF64,Flat's centroids go through
 * the same product, but its lists are scanned query by query, at the same cost per query in batches of any
 * size. The measurements: docs/BENCHMARKS.md, "Figures behind the code's choices". */
size_t kb_knn_batch_min(const kb_knn_t *self, size_t nq);

/* Builds a fresh index from the copy now, in the calling thread (training it if the index kind needs
 * training), swaps it in and clears pending changes. Waits for a background build that is running.
 * Use it after a bulk load (e.g. at start-up: kb_knn_upsert_batch of every row, then kb_knn_rebuild).
 * -EAGAIN when the index needs training and the copy holds fewer than train_min vectors (nothing
 * changes; searches stay exact brute force). -EIO when FAISS fails (the old index stays). */
int kb_knn_rebuild(kb_knn_t *self);

/* Copies the current statistics into *out. */
void kb_knn_get_stats(kb_knn_t *self, kb_knn_stats_t *out);

/* Vector length and metric the index was created with. */
uint32_t kb_knn_dim(const kb_knn_t *self);
kb_knn_metric_t kb_knn_metric(const kb_knn_t *self);

#endif
