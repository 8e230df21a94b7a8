/* Nearest-neighbour index of one table over the FAISS C API; the contracts are in kb_knn.h.
 *
 * State (all guarded by self->lock unless noted):
 *   copy     - the truth: every vector by id (dense arrays + id -> slot map). Cosine vectors are stored
 *              normalized.
 *   index    - the FAISS index (NULL while not ready). Invariant for non-removable kinds (HNSW):
 *              ids in the index == ids in the copy  UNION  pending ids; an id whose index vector differs from
 *              the copy's (moved) or is gone from the copy (removed) is in `pending`. For removable kinds
 *              the index always equals the copy and pending is empty.
 *   changed  - only while a build runs: every id touched since the build's snapshot, mapped to whether it
 *              was in the snapshot (= in the copy just before its first change). At the swap these are
 *              replayed onto the new index, so nothing done during the build is lost.
 * Lock order: build_mu, then lock; worker_mu is never held while taking either. */
#include "kb_knn.h"

#include "kb_memory.h"

#include <assert.h>
#include <errno.h>
#include <math.h>
#include <omp.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <faiss/c_api/AutoTune_c.h>
#include <faiss/c_api/IndexIVF_c.h>
#include <faiss/c_api/Index_c.h>
#include <faiss/c_api/MetaIndexes_c.h>
#include <faiss/c_api/error_c.h>
#include <faiss/c_api/impl/AuxIndexStructures_c.h>
#include <faiss/c_api/index_factory_c.h>
#include <faiss/c_api/utils/distances_c.h>

#include "log.h"
#include "util.h"

/* OpenBLAS's own entry point (declared in its cblas.h, which we avoid including: the name cblas.h is shared
 * by every BLAS and the include directory differs between Debian's OpenBLAS variants). */
void openblas_set_num_threads(int num_threads);

#define KB_KNN_MAX_DIM 65536u
#define KB_KNN_MAX_SPEC 256u
#define KB_KNN_DEFAULT_EF 256u
#define KB_KNN_DEFAULT_EF_CONSTRUCTION 80u
#define KB_KNN_DEFAULT_MIN_PENDING 256u
#define KB_KNN_DEFAULT_FRACTION 0.05f
/* FAISS's k-means warns below 39 training points per centroid; 256 centroids is an 8-bit PQ/SQ codebook. */
#define KB_KNN_POINTS_PER_CENTROID 39u
/* ... and samples at most 256 per centroid (FAISS's max_points_per_centroid): training on more buys nothing. */
#define KB_KNN_MAX_POINTS_PER_CENTROID 256u
/* A trained index is retrained when the table has grown this many times over what it was trained on. */
#define KB_KNN_RETRAIN_GROWTH 2u
#define KB_KNN_GENERIC_CENTROIDS 256u
/* Pause after a failed background build before trying again, so a persistent FAISS error cannot spin. */
#define KB_KNN_RETRY_MS 1000

/* ---------------------------------------------------------------------------------------------------- */
/* int64 -> int64 hash map: open addressing, linear probing, backward-shift deletion (no tombstones).
 * Keys are row ids (>= 0), so -1 marks an empty slot. */

typedef struct {
    int64_t *keys; /* cap slots; -1 = empty */
    int64_t *vals; /* cap slots */
    size_t cap;    /* power of two, or 0 before the first put */
    size_t count;  /* occupied slots */
} knn_map_t;

/* The slot where key's probe sequence starts. m->cap > 0. */
static size_t s_map_home(const knn_map_t *m, int64_t key)
{
    /* splitmix64's finalizer: row ids are often sequential, and must not cluster. */
    uint64_t z = (uint64_t)key + 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    return (size_t)z & (m->cap - 1);
}

/* Slot holding key, or SIZE_MAX. */
static size_t s_map_find(const knn_map_t *m, int64_t key)
{
    if (m->cap == 0) {
        return SIZE_MAX;
    }
    size_t mask = m->cap - 1;
    for (size_t i = s_map_home(m, key);; i = (i + 1) & mask) {
        if (m->keys[i] == key) {
            return i;
        }
        if (m->keys[i] == -1) {
            return SIZE_MAX;
        }
    }
}

/* Whether key is present; its value goes to *val when val is not NULL. */
static bool s_map_get(const knn_map_t *m, int64_t key, int64_t *val)
{
    size_t i = s_map_find(m, key);
    if (i == SIZE_MAX) {
        return false;
    }
    if (val) {
        *val = m->vals[i];
    }
    return true;
}

static void s_map_put(knn_map_t *m, int64_t key, int64_t val);

/* Doubles the capacity (load factor stays <= 1/2, which keeps probe sequences short). */
static void s_map_grow(knn_map_t *m)
{
    knn_map_t old = *m;
    m->cap = old.cap ? old.cap * 2 : 16;
    m->count = 0;
    m->keys = carls_xmalloc(m->cap * sizeof(int64_t));
    m->vals = carls_xmalloc(m->cap * sizeof(int64_t));
    memset(m->keys, 0xff, m->cap * sizeof(int64_t)); /* all -1 */
    for (size_t i = 0; i < old.cap; i++) {
        if (old.keys[i] != -1) {
            s_map_put(m, old.keys[i], old.vals[i]);
        }
    }
    free(old.keys);
    free(old.vals);
}

/* Inserts or overwrites key -> val. */
static void s_map_put(knn_map_t *m, int64_t key, int64_t val)
{
    if ((m->count + 1) * 2 > m->cap) {
        s_map_grow(m);
    }
    size_t mask = m->cap - 1;
    size_t i = s_map_home(m, key);
    while (m->keys[i] != -1 && m->keys[i] != key) {
        i = (i + 1) & mask;
    }
    if (m->keys[i] == -1) {
        m->count++;
    }
    m->keys[i] = key;
    m->vals[i] = val;
}

/* Removes key; returns whether it was there. Later entries of the probe run are shifted back so that
 * lookups never need tombstones. */
static bool s_map_del(knn_map_t *m, int64_t key)
{
    size_t i = s_map_find(m, key);
    if (i == SIZE_MAX) {
        return false;
    }
    size_t mask = m->cap - 1;
    size_t j = i;
    for (;;) {
        j = (j + 1) & mask;
        if (m->keys[j] == -1) {
            break;
        }
        size_t home = s_map_home(m, m->keys[j]);
        /* The entry at j may stay only if its home lies cyclically in (i, j]. */
        bool stays = (i <= j) ? (i < home && home <= j) : (i < home || home <= j);
        if (!stays) {
            m->keys[i] = m->keys[j];
            m->vals[i] = m->vals[j];
            i = j;
        }
    }
    m->keys[i] = -1;
    m->count--;
    return true;
}

/* Empties the map; a large table is freed rather than wiped so that a burst does not pin memory. */
static void s_map_clear(knn_map_t *m)
{
    if (m->cap > 4096) {
        free(m->keys);
        free(m->vals);
        memset(m, 0, sizeof(*m));
        return;
    }
    if (m->cap) {
        memset(m->keys, 0xff, m->cap * sizeof(int64_t));
    }
    m->count = 0;
}

/* Frees the map's arrays and leaves it empty and reusable. */
static void s_map_free(knn_map_t *m)
{
    free(m->keys);
    free(m->vals);
    memset(m, 0, sizeof(*m));
}

/* ---------------------------------------------------------------------------------------------------- */

struct kb_knn {
    /* Fixed at creation. */
    char spec[KB_KNN_MAX_SPEC];  /* index-factory string */
    kb_knn_metric_t metric;
    FaissMetricType faiss_metric; /* ip and cosine: METRIC_INNER_PRODUCT; l2: METRIC_L2 */
    uint32_t dim;
    bool higher_better;           /* ip, cosine */
    bool removable;               /* the index kind supports remove_ids */
    bool trainable;               /* the index kind needs training */
    uint64_t train_min;           /* vectors needed before training */
    uint64_t train_max;           /* k-means samples no more than this: retraining stops once trained on it */
    uint32_t nprobe;              /* 0: not an IVF index (or leave FAISS's default) */
    uint32_t ef_search;
    uint32_t ef_construction;
    uint32_t rebuild_min_pending;
    float rebuild_fraction;
    bool background;
    uint64_t index_vector_bytes;  /* memory estimate: bytes the FAISS index takes per vector ... */
    uint64_t index_fixed_bytes;   /* ... and once built (centroids, codebooks) */

    pthread_rwlock_t lock; /* searches: shared; updates, snapshot and swap: exclusive */

    /* The copy (under lock). */
    int64_t *ids;    /* (cap) row id per slot */
    float *vecs;     /* (cap, dim) vector per slot */
    size_t count;    /* slots in use */
    size_t cap;      /* slots allocated */
    knn_map_t slot;  /* id -> slot */

    /* The index (under lock). */
    FaissIndex *index;  /* NULL while not ready */
    uint64_t trained_on; /* trainable kinds: vectors the index's centroids were trained on */
    knn_map_t pending;  /* non-removable kinds: ids whose index entry is stale (value unused) */
    bool building;      /* a build has taken its snapshot and not swapped yet */
    knn_map_t changed;  /* while building: id -> 1 if it was in the snapshot, 0 if not */

    /* Statistics (under lock). */
    uint64_t rebuilds;
    uint64_t failed_builds;
    int64_t last_build_ms;
    int64_t last_build_duration_ms;

    pthread_mutex_t build_mu; /* one build at a time (worker or kb_knn_rebuild) */

    /* Background worker. */
    pthread_mutex_t worker_mu; /* guards wake and stop */
    pthread_cond_t worker_cond;
    bool wake;                 /* a build may be due */
    bool stop;                 /* kb_knn_destroy is waiting for the worker to exit */
    bool worker_started;
    pthread_t worker;
};

/* ---------------------------------------------------------------------------------------------------- */
/* Threads. */

static atomic_int s_omp_threads;   /* 0 until kb_knn_set_threads or the first kb_knn_new */
static pthread_once_t s_threads_once = PTHREAD_ONCE_INIT;

void kb_knn_set_threads(int omp_threads, int blas_threads)
{
    if (omp_threads <= 0) {
        long cores = sysconf(_SC_NPROCESSORS_ONLN);
        omp_threads = cores > 0 ? (int)cores : 1;
    }
    if (blas_threads <= 0) {
        blas_threads = 1;
    }
    atomic_store(&s_omp_threads, omp_threads);
    openblas_set_num_threads(blas_threads);
    LOG_DEBUG("kb_knn: %d OpenMP threads per calling thread, %d OpenBLAS threads", omp_threads, blas_threads);
}

/* pthread_once body: the default thread settings unless kb_knn_set_threads came first. */
static void s_threads_default(void)
{
    if (atomic_load(&s_omp_threads) == 0) {
        kb_knn_set_threads(0, 0);
    }
}

/* OpenMP's thread count is per calling thread (a thread the server made with pthread_create starts from the
 * process default), so every entry point applies ours before FAISS can start a parallel region. */
static void s_apply_threads(void)
{
    int n = atomic_load(&s_omp_threads);
    if (n > 0 && omp_get_max_threads() != n) {
        omp_set_num_threads(n);
    }
}

/* ---------------------------------------------------------------------------------------------------- */
/* Small helpers. */

/* The last FAISS error of this thread, never NULL (for logs). */
static const char *s_faiss_error(void)
{
    const char *e = faiss_get_last_error();
    return e ? e : "unknown FAISS error";
}

/* The last FAISS error without the "Error in <function> at <file>.cpp:<line>: " that FAISS puts first:
 * the rest names the problem, which is what a user who typed a spec needs to read. */
static const char *s_faiss_message(void)
{
    const char *e = s_faiss_error();
    const char *at = strstr(e, ".cpp:");
    if (!at) {
        return e;
    }
    at += 5;
    while (*at >= '0' && *at <= '9') {
        at++;
    }
    return strncmp(at, ": ", 2) == 0 ? at + 2 : e;
}

/* Whether all n values are finite: NaN or Inf would poison distances and, in HNSW, the graph. */
static bool s_finite(const float *v, size_t n) { return carls_first_nonfinite(v, n) == n; }

/* Scales v to unit L2 norm; a zero vector is left as it is (it has no direction). */
static void s_normalize(float *v, uint32_t dim)
{
    double ss = 0.0;
    for (uint32_t i = 0; i < dim; i++) {
        ss += (double)v[i] * v[i];
    }
    if (ss > 0.0) {
        float inv = (float)(1.0 / sqrt(ss));
        for (uint32_t i = 0; i < dim; i++) {
            v[i] *= inv;
        }
    }
}

/* The n vectors as the index takes them: vecs itself, or under the cosine metric a normalized copy in
 * *normed (which the caller frees; NULL otherwise). */
static const float *s_metric_input(const kb_knn_t *self, const float *vecs, size_t n, float **normed)
{
    *normed = NULL;
    if (self->metric != KB_KNN_METRIC_COSINE) {
        return vecs;
    }
    *normed = carls_xmalloc(n * self->dim * sizeof(float));
    memcpy(*normed, vecs, n * self->dim * sizeof(float));
    for (size_t i = 0; i < n; i++) {
        s_normalize(*normed + i * self->dim, self->dim);
    }
    return *normed;
}

/* The way in for n vectors a caller gives (to store or to search for): NULL (and *normed NULL) when one of
 * their values is not finite; otherwise s_metric_input's answer, with FAISS's thread count set for the
 * work that follows. */
static const float *s_caller_input(const kb_knn_t *self, const float *vecs, size_t n, float **normed)
{
    *normed = NULL;
    if (!s_finite(vecs, n * self->dim)) {
        return NULL;
    }
    const float *use = s_metric_input(self, vecs, n, normed);
    s_apply_threads();
    return use;
}

/* The score FAISS would give: inner product, or squared L2 distance. */
static float s_score(const kb_knn_t *self, const float *a, const float *b)
{
    float acc = 0.0f;
    if (self->faiss_metric == METRIC_L2) {
        for (uint32_t i = 0; i < self->dim; i++) {
            float d = a[i] - b[i];
            acc += d * d;
        }
    } else {
        for (uint32_t i = 0; i < self->dim; i++) {
            acc += a[i] * b[i];
        }
    }
    return acc;
}

/* ---------------------------------------------------------------------------------------------------- */
/* Top-k selection into caller storage: a heap whose root is the worst kept entry; ties go to the lower id
 * so that answers are deterministic. */

typedef struct {
    float *scores;  /* (k) */
    int64_t *ids;   /* (k) */
    uint32_t k;
    uint32_t n;     /* entries kept */
    bool higher;    /* higher scores are better */
} knn_topk_t;

/* Whether (sa, ia) ranks before (sb, ib). */
static bool s_better(const knn_topk_t *t, float sa, int64_t ia, float sb, int64_t ib)
{
    if (sa != sb) {
        return t->higher ? sa > sb : sa < sb;
    }
    return ia < ib;
}

/* Swaps entries a and b. */
static void s_topk_swap(knn_topk_t *t, uint32_t a, uint32_t b)
{
    float s = t->scores[a];
    int64_t i = t->ids[a];
    t->scores[a] = t->scores[b];
    t->ids[a] = t->ids[b];
    t->scores[b] = s;
    t->ids[b] = i;
}

/* Restores the heap below node i among the first n entries. */
static void s_topk_down(knn_topk_t *t, uint32_t i, uint32_t n)
{
    for (;;) {
        uint32_t l = 2 * i + 1, r = l + 1, worst = i;
        if (l < n && s_better(t, t->scores[worst], t->ids[worst], t->scores[l], t->ids[l])) {
            worst = l;
        }
        if (r < n && s_better(t, t->scores[worst], t->ids[worst], t->scores[r], t->ids[r])) {
            worst = r;
        }
        if (worst == i) {
            return;
        }
        s_topk_swap(t, i, worst);
        i = worst;
    }
}

/* Offers a candidate: kept if fewer than k are held or it beats the worst held (which it replaces). */
static void s_topk_push(knn_topk_t *t, int64_t id, float score)
{
    if (t->n < t->k) {
        uint32_t i = t->n++;
        t->scores[i] = score;
        t->ids[i] = id;
        while (i > 0) {
            uint32_t p = (i - 1) / 2;
            if (!s_better(t, t->scores[p], t->ids[p], t->scores[i], t->ids[i])) {
                break;
            }
            s_topk_swap(t, p, i);
            i = p;
        }
    } else if (t->k > 0 && s_better(t, score, id, t->scores[0], t->ids[0])) {
        t->scores[0] = score;
        t->ids[0] = id;
        s_topk_down(t, 0, t->n);
    }
}

/* Sorts the kept entries best first and pads the row to k with id -1 and the worst possible score. */
static void s_topk_finish(knn_topk_t *t)
{
    for (uint32_t n = t->n; n > 1; n--) {
        s_topk_swap(t, 0, n - 1); /* the worst goes to the back */
        s_topk_down(t, 0, n - 1);
    }
    for (uint32_t i = t->n; i < t->k; i++) {
        t->ids[i] = -1;
        t->scores[i] = t->higher ? -INFINITY : INFINITY;
    }
}

/* ---------------------------------------------------------------------------------------------------- */
/* The copy. */

/* Inserts or replaces id's vector (already normalized for cosine). */
static void s_copy_put(kb_knn_t *self, int64_t id, const float *vec)
{
    int64_t slot;
    if (!s_map_get(&self->slot, id, &slot)) {
        if (self->count == self->cap) {
            self->cap = self->cap ? self->cap * 2 : 64;
            self->ids = carls_xrealloc(self->ids, self->cap * sizeof(int64_t));
            self->vecs = carls_xrealloc(self->vecs, self->cap * self->dim * sizeof(float));
        }
        slot = (int64_t)self->count++;
        self->ids[slot] = id;
        s_map_put(&self->slot, id, slot);
    }
    memcpy(self->vecs + (size_t)slot * self->dim, vec, self->dim * sizeof(float));
}

/* Removes id; returns whether it was there. The last slot moves into the hole to keep the arrays dense. */
static bool s_copy_del(kb_knn_t *self, int64_t id)
{
    int64_t slot;
    if (!s_map_get(&self->slot, id, &slot)) {
        return false;
    }
    size_t last = self->count - 1;
    if ((size_t)slot != last) {
        self->ids[slot] = self->ids[last];
        memcpy(self->vecs + (size_t)slot * self->dim, self->vecs + last * self->dim, self->dim * sizeof(float));
        s_map_put(&self->slot, self->ids[slot], slot);
    }
    s_map_del(&self->slot, id);
    self->count--;
    return true;
}

/* id's vector in the copy, or NULL. Valid until the copy next changes. */
static const float *s_copy_vec(const kb_knn_t *self, int64_t id)
{
    int64_t slot;
    if (!s_map_get(&self->slot, id, &slot)) {
        return NULL;
    }
    return self->vecs + (size_t)slot * self->dim;
}

/* ---------------------------------------------------------------------------------------------------- */
/* FAISS index creation. */

/* Creates an empty index of self's spec, with search parameters set and ids of our own (IndexIDMap
 * around kinds that cannot take ids, e.g. Flat and HNSW; IVF stores ids itself). err may be NULL. */
static int s_index_create(const kb_knn_t *self, FaissIndex **out, uint32_t *nlist_out, char *err, size_t errlen)
{
    FaissIndex *base = NULL;
    FaissParameterSpace *ps = NULL;
    int rc = 0;
    *out = NULL;
    if (faiss_index_factory(&base, (int)self->dim, self->spec, self->faiss_metric) != 0) {
        if (err) {
            snprintf(err, errlen, "bad index spec '%s': %s", self->spec, s_faiss_message());
        }
        rc = -EINVAL;
        goto cleanup;
    }
    if (faiss_ParameterSpace_new(&ps) != 0) {
        rc = -EIO;
        goto cleanup;
    }
    FaissIndexIVF *ivf = faiss_IndexIVF_cast(base);
    uint32_t nlist = ivf ? (uint32_t)faiss_IndexIVF_nlist(ivf) : 0;
    if (nlist_out) {
        *nlist_out = nlist;
    }
    uint32_t nprobe = self->nprobe;
    if (nprobe == 0 && nlist > 0) {
        nprobe = (nlist + 7) / 8;
    }
    /* These parameters exist only on some kinds: a failure just means "not this kind". */
    if (nprobe > 0) {
        (void)faiss_ParameterSpace_set_index_parameter(ps, base, "nprobe", (double)nprobe);
    }
    (void)faiss_ParameterSpace_set_index_parameter(ps, base, "efSearch", (double)self->ef_search);
    (void)faiss_ParameterSpace_set_index_parameter(ps, base, "efConstruction", (double)self->ef_construction);

    if (ivf || faiss_IndexIDMap_cast(base)) {
        *out = base;
    } else {
        FaissIndexIDMap *idmap = NULL;
        if (faiss_IndexIDMap_new(&idmap, base) != 0) {
            if (err) {
                snprintf(err, errlen, "index spec '%s': cannot map ids: %s", self->spec, s_faiss_error());
            }
            rc = -EIO;
            goto cleanup;
        }
        faiss_IndexIDMap_set_own_fields(idmap, 1); /* freeing the map frees base */
        *out = (FaissIndex *)idmap;
    }
    base = NULL;
cleanup:
    if (ps) {
        faiss_ParameterSpace_free(ps);
    }
    if (base) {
        faiss_Index_free(base);
    }
    return rc;
}

/* Removes ids from index (one scan whatever n is). */
static int s_index_remove(FaissIndex *index, size_t n, const int64_t *ids)
{
    FaissIDSelectorBatch *sel = NULL;
    if (n == 0 || faiss_Index_ntotal(index) == 0) {
        return 0;
    }
    if (faiss_IDSelectorBatch_new(&sel, n, ids) != 0) {
        return -EIO;
    }
    size_t removed = 0;
    int frc = faiss_Index_remove_ids(index, (const FaissIDSelector *)sel, &removed);
    faiss_IDSelector_free((FaissIDSelector *)sel);
    return frc == 0 ? 0 : -EIO;
}

/* ---------------------------------------------------------------------------------------------------- */
/* Builds. */

/* Whether the worker should build now. Caller holds lock. */
static bool s_needs_build_locked(const kb_knn_t *self)
{
    if (self->building) {
        return false;
    }
    if (!self->index) {
        return self->trainable ? self->count >= self->train_min : true;
    }
    /* Centroids trained on the first rows fit the table less well as it grows (longer lists to scan, lower
     * recall): retrain each time the table has doubled, until k-means would sample no more rows anyway. */
    if (self->trainable && self->trained_on < self->train_max &&
        self->count >= KB_KNN_RETRAIN_GROWTH * self->trained_on) {
        return true;
    }
    if (!self->removable) {
        double due = (double)self->rebuild_fraction * (double)self->count;
        if (due < self->rebuild_min_pending) {
            due = self->rebuild_min_pending;
        }
        return self->pending.count > 0 && (double)self->pending.count >= due;
    }
    return false;
}

/* Tells the worker (if any) that a build may be due; it re-checks under the lock. */
static void s_wake_worker(kb_knn_t *self)
{
    if (!self->background) {
        return;
    }
    pthread_mutex_lock(&self->worker_mu);
    self->wake = true;
    pthread_cond_signal(&self->worker_cond);
    pthread_mutex_unlock(&self->worker_mu);
}

/* Gathers the copy's vectors of ids[0..n) into a new array (NULL when n == 0). Caller holds lock. */
static float *s_gather(const kb_knn_t *self, size_t n, const int64_t *ids)
{
    if (n == 0) {
        return NULL;
    }
    float *out = carls_xmalloc(n * self->dim * sizeof(float));
    for (size_t i = 0; i < n; i++) {
        const float *v = s_copy_vec(self, ids[i]);
        memcpy(out + i * self->dim, v, self->dim * sizeof(float));
    }
    return out;
}

/* Brings index up to date with the copy for every id in changes, a map id -> flags where indexed_bit says
 * the index held a value for the id before. A removable index drops that value and takes the copy's (none
 * for an id no longer in the copy); a graph (HNSW, not removable) keeps it, so the id goes to pending
 * (searched exactly until the next build), and only ids it never held are added. Caller holds lock
 * exclusively. 0, or -EIO when FAISS failed (the index no longer matches the copy). */
static int s_index_sync(kb_knn_t *self, FaissIndex *index, const knn_map_t *changes, int64_t indexed_bit,
                        knn_map_t *pending)
{
    int64_t *del = carls_xmalloc((changes->count + 1) * sizeof(int64_t));
    int64_t *add = carls_xmalloc((changes->count + 1) * sizeof(int64_t));
    size_t ndel = 0, nadd = 0;
    float *vecs = NULL;
    int rc = 0;
    for (size_t s = 0; s < changes->cap; s++) {
        int64_t id = changes->keys[s];
        if (id == -1) {
            continue;
        }
        bool was_indexed = (changes->vals[s] & indexed_bit) != 0;
        bool in_copy = s_map_get(&self->slot, id, NULL);
        if (self->removable) {
            if (was_indexed) {
                del[ndel++] = id;
            }
            if (in_copy) {
                add[nadd++] = id;
            }
        } else if (was_indexed) {
            s_map_put(pending, id, 1);
        } else if (in_copy) {
            add[nadd++] = id;
        }
    }
    if (s_index_remove(index, ndel, del) != 0) {
        rc = -EIO;
        goto cleanup;
    }
    vecs = s_gather(self, nadd, add);
    if (nadd > 0 && faiss_Index_add_with_ids(index, (idx_t)nadd, vecs, add) != 0) {
        rc = -EIO;
    }
cleanup:
    free(del);
    free(add);
    free(vecs);
    return rc;
}

/* Replays the changes made during a build (self->changed: id -> 1 when the build's snapshot held it) onto
 * the new index and computes its pending set. Caller holds lock exclusively. On failure the new index must
 * be discarded. */
static int s_replay_locked(kb_knn_t *self, FaissIndex *fresh, knn_map_t *pending)
{
    return s_index_sync(self, fresh, &self->changed, 1, pending);
}

/* Builds a new index from a snapshot of the copy and swaps it in. force: build even when not due.
 * Returns 0 (also when nothing was due), -EAGAIN (trainable, too few vectors), -EIO (FAISS failed; the old
 * index stays). */
static int s_build(kb_knn_t *self, bool force)
{
    int64_t *snap_ids = NULL;
    float *snap_vecs = NULL;
    size_t n = 0;
    FaissIndex *fresh = NULL;
    FaissIndex *old = NULL;
    knn_map_t pending = {0};
    int rc = 0;
    char err[256] = "";

    s_apply_threads();
    pthread_mutex_lock(&self->build_mu);
    int64_t t0 = carls_monotonic_ms(); /* after waiting for another build: the duration is this build's */

    /* Snapshot. Exclusive so that no update slips between the copy and the start of change tracking. */
    pthread_rwlock_wrlock(&self->lock);
    if (!force && !s_needs_build_locked(self)) {
        pthread_rwlock_unlock(&self->lock);
        goto cleanup;
    }
    if (self->trainable && (self->count < self->train_min || self->count == 0)) {
        pthread_rwlock_unlock(&self->lock);
        rc = -EAGAIN;
        goto cleanup;
    }
    n = self->count;
    if (n > 0) {
        snap_ids = carls_xmalloc(n * sizeof(int64_t));
        snap_vecs = carls_xmalloc(n * self->dim * sizeof(float));
        memcpy(snap_ids, self->ids, n * sizeof(int64_t));
        memcpy(snap_vecs, self->vecs, n * self->dim * sizeof(float));
    }
    self->building = true;
    s_map_clear(&self->changed);
    pthread_rwlock_unlock(&self->lock);

    /* The slow part, without the lock: searches and updates go on against the old state. */
    if (s_index_create(self, &fresh, NULL, err, sizeof(err)) != 0) {
        LOG_ERROR("kb_knn: rebuild of '%s': %s", self->spec, err);
        rc = -EIO;
    } else if (self->trainable && faiss_Index_train(fresh, (idx_t)n, snap_vecs) != 0) {
        LOG_ERROR("kb_knn: training '%s' on %zu vectors failed: %s", self->spec, n, s_faiss_error());
        rc = -EIO;
    } else if (n > 0 && faiss_Index_add_with_ids(fresh, (idx_t)n, snap_vecs, snap_ids) != 0) {
        LOG_ERROR("kb_knn: adding %zu vectors to '%s' failed: %s", n, self->spec, s_faiss_error());
        rc = -EIO;
    }

    /* Swap. */
    pthread_rwlock_wrlock(&self->lock);
    if (rc == 0 && s_replay_locked(self, fresh, &pending) != 0) {
        LOG_ERROR("kb_knn: replaying changes onto the new '%s' failed: %s", self->spec, s_faiss_error());
        rc = -EIO;
    }
    size_t replayed = self->changed.count;
    if (rc == 0) {
        old = self->index;
        self->index = fresh;
        fresh = NULL;
        knn_map_t tmp = self->pending;
        self->pending = pending;
        pending = tmp; /* the old pending set is freed below */
        self->rebuilds++;
        if (self->trainable) {
            self->trained_on = n;
        }
        self->last_build_ms = carls_wall_ms();
        self->last_build_duration_ms = carls_monotonic_ms() - t0;
    } else {
        self->failed_builds++;
    }
    self->building = false;
    s_map_clear(&self->changed);
    pthread_rwlock_unlock(&self->lock);
    if (rc == 0) {
        LOG_INFO("kb_knn: built '%s' (%s, dim %u) over %zu vectors in %lld ms; %zu changes replayed", self->spec,
                 kb_knn_metric_name(self->metric), self->dim, n, (long long)(carls_monotonic_ms() - t0), replayed);
    }

cleanup:
    pthread_mutex_unlock(&self->build_mu);
    if (old) {
        faiss_Index_free(old); /* no search can hold it: the swap took the lock exclusively */
    }
    if (fresh) {
        faiss_Index_free(fresh);
    }
    s_map_free(&pending);
    free(snap_ids);
    free(snap_vecs);
    return rc;
}

/* The background thread: sleeps until woken, builds when due, and backs off after a failed build
 * so that a persistent FAISS error cannot spin. Exits when stop is set. */
static void *s_worker(void *arg)
{
    kb_knn_t *self = arg;
    int64_t retry_at = 0; /* monotonic ms before which a failed build is not retried */
    for (;;) {
        pthread_mutex_lock(&self->worker_mu);
        while (!self->stop && (!self->wake || carls_monotonic_ms() < retry_at)) {
            if (self->wake) {
                /* A wake-up during the back-off: sleep the rest of it, then look again. */
                int64_t left = retry_at - carls_monotonic_ms();
                struct timespec ts;
                clock_gettime(CLOCK_REALTIME, &ts);
                ts.tv_sec += left / 1000;
                ts.tv_nsec += (long)(left % 1000) * 1000000L;
                if (ts.tv_nsec >= 1000000000L) {
                    ts.tv_sec++;
                    ts.tv_nsec -= 1000000000L;
                }
                pthread_cond_timedwait(&self->worker_cond, &self->worker_mu, &ts);
            } else {
                pthread_cond_wait(&self->worker_cond, &self->worker_mu);
            }
        }
        bool stop = self->stop;
        self->wake = false;
        pthread_mutex_unlock(&self->worker_mu);
        if (stop) {
            break;
        }
        int rc = s_build(self, false);
        retry_at = rc == -EIO ? carls_monotonic_ms() + KB_KNN_RETRY_MS : 0;
        /* Changes made during the build may already call for the next one. */
        pthread_rwlock_rdlock(&self->lock);
        bool again = s_needs_build_locked(self);
        pthread_rwlock_unlock(&self->lock);
        if (again) {
            s_wake_worker(self);
        }
    }
    return NULL;
}

/* ---------------------------------------------------------------------------------------------------- */
/* Public API. */

void kb_knn_config_default(kb_knn_config_t *cfg)
{
    assert(cfg);
    memset(cfg, 0, sizeof(*cfg));
    cfg->spec = "Flat";
    cfg->metric = KB_KNN_METRIC_IP;
    cfg->background = true;
}

/* Each metric's name, for parsing and printing alike. */
static const char *const s_metric_names[] = {
    [KB_KNN_METRIC_IP] = "ip",
    [KB_KNN_METRIC_L2] = "l2",
    [KB_KNN_METRIC_COSINE] = "cosine",
};

#define S_N_METRICS (sizeof s_metric_names / sizeof s_metric_names[0])

int kb_knn_metric_parse(const char *name, kb_knn_metric_t *out)
{
    int m = carls_name_index(name, s_metric_names, (int)S_N_METRICS);
    if (m < 0 || strcmp(name, s_metric_names[m]) != 0) { /* the names in lower case only */
        return -EINVAL;
    }
    *out = (kb_knn_metric_t)m;
    return 0;
}

const char *kb_knn_metric_name(kb_knn_metric_t metric)
{
    return (size_t)metric < S_N_METRICS ? s_metric_names[metric] : "?";
}

/* Parses a decimal number in [lo, hi] at *p and advances past it. */
static bool s_spec_number(const char **p, unsigned long lo, unsigned long hi, unsigned long *out)
{
    if (**p < '0' || **p > '9')
        return false;
    unsigned long v = 0;
    while (**p >= '0' && **p <= '9') {
        v = v * 10 + (unsigned long)(**p - '0');
        if (v > hi)
            return false;
        (*p)++;
    }
    *out = v;
    return v >= lo;
}

/* Parses "PQ<m>" or "PQ<m>x<bits>" at *p for vectors of dim. */
static bool s_spec_pq(const char **p, uint32_t dim)
{
    unsigned long m, bits;
    if (strncmp(*p, "PQ", 2) != 0)
        return false;
    *p += 2;
    if (!s_spec_number(p, 1, dim, &m) || dim % m != 0)
        return false;
    if (**p == 'x') {
        (*p)++;
        if (!s_spec_number(p, 4, 12, &bits))
            return false;
    }
    return true;
}

/* Accepts only index specs whose parameters are known to be safe: FAISS's factory does not validate its
 * numbers and divides by zero (PQ0), aborts, or allocates without bound (IVF20000000) on bad ones, and the
 * spec comes from the network. Grammar: Flat | HNSW<m>[,Flat] | IVF<n>,Flat | IVF<n>,PQ<m>[x<b>] |
 * PQ<m>[x<b>], with 2 <= m(HNSW) <= 256, 1 <= n <= 65536, 1 <= m(PQ) <= dim dividing dim, 4 <= b <= 12. */
static int s_spec_check(const char *spec, uint32_t dim, char *err, size_t errlen)
{
    const char *p = spec;
    unsigned long v;
    bool ok = false;
    if (strcmp(p, "Flat") == 0) {
        ok = true;
    } else if (strncmp(p, "HNSW", 4) == 0) {
        p += 4;
        ok = s_spec_number(&p, 2, 256, &v) && (*p == '\0' || strcmp(p, ",Flat") == 0);
    } else if (strncmp(p, "IVF", 3) == 0) {
        p += 3;
        ok = s_spec_number(&p, 1, 65536, &v) && *p == ',';
        if (ok) {
            p++;
            ok = strcmp(p, "Flat") == 0 || (s_spec_pq(&p, dim) && *p == '\0');
        }
    } else {
        ok = s_spec_pq(&p, dim) && *p == '\0';
    }
    if (!ok) {
        snprintf(err, errlen,
                 "index spec '%s' is not accepted: use Flat, HNSW<m> (2..256), IVF<n>,Flat (n 1..65536), "
                 "IVF<n>,PQ<m>[x<bits>] or PQ<m>[x<bits>] (m divides dim %u, bits 4..12)",
                 spec, dim);
        return -EINVAL;
    }
    return 0;
}

/* What the index of an accepted spec takes in memory, per vector and once (kb_knn_memory): the stored
 * vector (4 bytes a dimension; PQ: its code) plus 8 bytes of id (IDMap or the inverted list), HNSW<m> 2m
 * level-0 links and about 1/m of that again above, at 4 bytes each, plus its level and offset; IVF: nlist
 * centroids and the lists' spare capacity; PQ: its codebooks (2^bits centroids of the whole dimension). */
static void s_index_cost(const char *spec, uint32_t dim, uint64_t *per_vector, uint64_t *fixed)
{
    const char *p = spec;
    unsigned long v = 0, m = 0, bits = 8;
    *per_vector = (uint64_t)dim * 4 + 8;
    *fixed = 0;
    if (strncmp(p, "HNSW", 4) == 0) {
        p += 4;
        if (s_spec_number(&p, 2, 256, &v))
            *per_vector += 8ull * v + 8ull * v / (v - 1) + 16;
        return;
    }
    bool ivf = strncmp(p, "IVF", 3) == 0;
    if (ivf) {
        p += 3;
        if (s_spec_number(&p, 1, 65536, &v))
            *fixed += (uint64_t)v * dim * 4;
        if (*p == ',')
            p++;
    }
    if (strncmp(p, "PQ", 2) == 0) {
        p += 2;
        if (s_spec_number(&p, 1, dim, &m) && *p == 'x') {
            p++;
            if (!s_spec_number(&p, 4, 12, &bits))
                bits = 8;
        }
        *per_vector = (m * bits + 7) / 8 + 8;
        *fixed += (1ull << bits) * dim * 4;
    }
    /* Inverted lists are vectors grown by doubling: half as much again on average. */
    if (ivf)
        *per_vector += *per_vector / 2;
}

int kb_knn_new(const kb_knn_config_t *cfg, kb_knn_t **out, char *err, size_t errlen)
{
    kb_knn_t *self = NULL;
    FaissIndex *probe = NULL;
    char local_err[256] = "";
    uint32_t nlist = 0;
    int rc = 0;
    assert(cfg && out);
    *out = NULL;
    if (!err) {
        err = local_err;
        errlen = sizeof(local_err);
    }
    if (errlen > 0) {
        err[0] = '\0';
    }
    pthread_once(&s_threads_once, s_threads_default);
    s_apply_threads();

    if (!cfg->spec || cfg->spec[0] == '\0' || strlen(cfg->spec) >= KB_KNN_MAX_SPEC) {
        snprintf(err, errlen, "index spec missing or longer than %u bytes", KB_KNN_MAX_SPEC - 1);
        return -EINVAL;
    }
    if (cfg->dim == 0 || cfg->dim > KB_KNN_MAX_DIM) {
        snprintf(err, errlen, "dim %u out of range 1..%u", cfg->dim, KB_KNN_MAX_DIM);
        return -EINVAL;
    }
    if (cfg->metric != KB_KNN_METRIC_IP && cfg->metric != KB_KNN_METRIC_L2 && cfg->metric != KB_KNN_METRIC_COSINE) {
        snprintf(err, errlen, "unknown metric %d", (int)cfg->metric);
        return -EINVAL;
    }
    rc = s_spec_check(cfg->spec, cfg->dim, err, errlen);
    if (rc != 0)
        return rc;
    if (!(cfg->rebuild_fraction >= 0.0f && cfg->rebuild_fraction <= 1.0f)) {
        snprintf(err, errlen, "rebuild_fraction %g out of range 0..1", (double)cfg->rebuild_fraction);
        return -EINVAL;
    }

    self = carls_xcalloc(1, sizeof(*self));
    snprintf(self->spec, sizeof(self->spec), "%s", cfg->spec);
    self->metric = cfg->metric;
    self->faiss_metric = cfg->metric == KB_KNN_METRIC_L2 ? METRIC_L2 : METRIC_INNER_PRODUCT;
    self->higher_better = cfg->metric != KB_KNN_METRIC_L2;
    self->dim = cfg->dim;
    self->nprobe = cfg->nprobe;
    self->ef_search = cfg->ef_search ? cfg->ef_search : KB_KNN_DEFAULT_EF;
    self->ef_construction = cfg->ef_construction ? cfg->ef_construction : KB_KNN_DEFAULT_EF_CONSTRUCTION;
    self->rebuild_min_pending = cfg->rebuild_min_pending ? cfg->rebuild_min_pending : KB_KNN_DEFAULT_MIN_PENDING;
    self->rebuild_fraction = cfg->rebuild_fraction > 0.0f ? cfg->rebuild_fraction : KB_KNN_DEFAULT_FRACTION;
    self->background = cfg->background;
    s_index_cost(self->spec, self->dim, &self->index_vector_bytes, &self->index_fixed_bytes);
    pthread_rwlock_init(&self->lock, NULL);
    pthread_mutex_init(&self->build_mu, NULL);
    pthread_mutex_init(&self->worker_mu, NULL);
    pthread_cond_init(&self->worker_cond, NULL);

    /* Learn what this kind of index can do from an empty one: whether it is trained already, and whether
     * it supports removal (FAISS throws "not implemented" for HNSW; an empty index removes nothing). */
    rc = s_index_create(self, &probe, &nlist, err, errlen);
    if (rc != 0) {
        goto cleanup;
    }
    self->trainable = !faiss_Index_is_trained(probe);
    {
        FaissIDSelectorBatch *sel = NULL;
        int64_t any = 0;
        if (faiss_IDSelectorBatch_new(&sel, 1, &any) != 0) {
            snprintf(err, errlen, "FAISS: %s", s_faiss_error());
            rc = -EIO;
            goto cleanup;
        }
        size_t removed = 0;
        self->removable = faiss_Index_remove_ids(probe, (const FaissIDSelector *)sel, &removed) == 0;
        faiss_IDSelector_free((FaissIDSelector *)sel);
    }
    if (self->trainable) {
        uint64_t centroids = nlist > 0 ? nlist : KB_KNN_GENERIC_CENTROIDS;
        self->train_min = cfg->train_min ? cfg->train_min : KB_KNN_POINTS_PER_CENTROID * centroids;
        if (nlist > 0 && self->train_min < nlist) {
            self->train_min = nlist; /* k-means cannot make more centroids than points */
        }
        self->train_max = KB_KNN_MAX_POINTS_PER_CENTROID * centroids;
        faiss_Index_free(probe); /* a trained one replaces it at the first build */
    } else {
        self->index = probe; /* ready at once, empty */
    }
    probe = NULL;

    if (self->background) {
        if (pthread_create(&self->worker, NULL, s_worker, self) != 0) {
            snprintf(err, errlen, "cannot start the rebuild thread");
            rc = -EAGAIN;
            goto cleanup;
        }
        pthread_setname_np(self->worker, "kb-knn-build");
        self->worker_started = true;
    }
    LOG_DEBUG("kb_knn: new '%s' %s dim %u: %s, %s", self->spec, kb_knn_metric_name(self->metric), self->dim,
              self->removable ? "removable" : "rebuilt on change",
              self->trainable ? "trained on first build" : "no training");
    *out = self;
    self = NULL;
cleanup:
    if (probe) {
        faiss_Index_free(probe);
    }
    if (self) {
        kb_knn_destroy(&self);
    }
    return rc;
}

void kb_knn_destroy(kb_knn_t **self_p)
{
    if (!self_p || !*self_p) {
        return;
    }
    kb_knn_t *self = *self_p;
    if (self->worker_started) {
        pthread_mutex_lock(&self->worker_mu);
        self->stop = true;
        pthread_cond_signal(&self->worker_cond);
        pthread_mutex_unlock(&self->worker_mu);
        pthread_join(self->worker, NULL);
    }
    if (self->index) {
        faiss_Index_free(self->index);
    }
    s_map_free(&self->slot);
    s_map_free(&self->pending);
    s_map_free(&self->changed);
    free(self->ids);
    free(self->vecs);
    pthread_cond_destroy(&self->worker_cond);
    pthread_mutex_destroy(&self->worker_mu);
    pthread_mutex_destroy(&self->build_mu);
    pthread_rwlock_destroy(&self->lock);
    free(self);
    *self_p = NULL;
}

/* Applies a batch of upserts (vecs != NULL, already validated and normalized) or removes (vecs == NULL) to
 * the copy and then to the index. Caller holds lock exclusively. */
static int s_apply_locked(kb_knn_t *self, size_t n, const int64_t *ids, const float *vecs, size_t *removed)
{
    /* id -> bit 0: was in the copy before this batch, bit 1: was in the index before this batch. */
    knn_map_t touched = {0};
    size_t nremoved = 0;
    int rc = 0;

    for (size_t i = 0; i < n; i++) {
        int64_t id = ids[i];
        if (!s_map_get(&touched, id, NULL)) {
            bool in_copy = s_map_get(&self->slot, id, NULL);
            bool in_index = self->index && (in_copy || (!self->removable && s_map_get(&self->pending, id, NULL)));
            s_map_put(&touched, id, (in_copy ? 1 : 0) | (in_index ? 2 : 0));
            if (self->building && !s_map_get(&self->changed, id, NULL)) {
                s_map_put(&self->changed, id, in_copy ? 1 : 0);
            }
        }
        if (vecs) {
            s_copy_put(self, id, vecs + i * self->dim);
        } else if (s_copy_del(self, id)) {
            nremoved++;
        }
    }
    if (removed) {
        *removed = nremoved;
    }
    /* Without an index (not ready) the copy is all there is; the first build takes everything. */
    if (self->index) {
        rc = s_index_sync(self, self->index, &touched, 2, &self->pending);
    }
    if (rc != 0) {
        LOG_ERROR("kb_knn: updating %zu ids of '%s' failed: %s", touched.count, self->spec, s_faiss_error());
        /* The index no longer matches the copy: drop it, serve exact brute force, and let a build
         * bring a fresh one. */
        faiss_Index_free(self->index);
        self->index = NULL;
        s_map_clear(&self->pending);
    }
    s_map_free(&touched);
    return rc;
}

/* s_apply_locked under the write lock, then the worker woken when a build is due. */
static int s_apply(kb_knn_t *self, size_t n, const int64_t *ids, const float *vecs, size_t *removed)
{
    pthread_rwlock_wrlock(&self->lock);
    int rc = s_apply_locked(self, n, ids, vecs, removed);
    bool due = s_needs_build_locked(self);
    pthread_rwlock_unlock(&self->lock);
    if (due) {
        s_wake_worker(self);
    }
    return rc;
}

int kb_knn_upsert_batch(kb_knn_t *self, size_t n, const int64_t *ids, const float *vecs)
{
    assert(self);
    if (n == 0) {
        return 0;
    }
    if (!ids || !vecs) {
        return -EINVAL;
    }
    for (size_t i = 0; i < n; i++) {
        if (ids[i] < 0) {
            return -EINVAL;
        }
    }
    float *normed;
    const float *use = s_caller_input(self, vecs, n, &normed);
    if (!use) {
        return -EINVAL;
    }
    int rc = s_apply(self, n, ids, use, NULL);
    free(normed);
    return rc;
}

int kb_knn_upsert(kb_knn_t *self, int64_t id, const float *vec)
{
    return kb_knn_upsert_batch(self, 1, &id, vec);
}

int kb_knn_remove_batch(kb_knn_t *self, size_t n, const int64_t *ids, size_t *removed)
{
    assert(self);
    if (removed) {
        *removed = 0;
    }
    if (n == 0) {
        return 0;
    }
    if (!ids) {
        return -EINVAL;
    }
    s_apply_threads();
    return s_apply(self, n, ids, NULL, removed);
}

int kb_knn_remove(kb_knn_t *self, int64_t id)
{
    size_t removed = 0;
    int rc = kb_knn_remove_batch(self, 1, &id, &removed);
    if (rc == 0 && removed == 0) {
        rc = -ENOENT;
    }
    return rc;
}

/* Exact search of the whole copy for one query. Caller holds lock (shared). */
static void s_search_copy(const kb_knn_t *self, const float *q, int64_t exclude, knn_topk_t *t)
{
    for (size_t i = 0; i < self->count; i++) {
        if (self->ids[i] == exclude) {
            continue;
        }
        s_topk_push(t, self->ids[i], s_score(self, q, self->vecs + i * self->dim));
    }
}

/* Exact search of the pending ids still in the copy (their current values) for one query. Caller holds
 * lock (shared). */
static void s_search_pending(const kb_knn_t *self, const float *q, int64_t exclude, knn_topk_t *t)
{
    for (size_t s = 0; s < self->pending.cap; s++) {
        int64_t id = self->pending.keys[s];
        if (id == -1 || id == exclude) {
            continue;
        }
        const float *v = s_copy_vec(self, id);
        if (v) {
            s_topk_push(t, id, s_score(self, q, v));
        }
    }
}

/* Pushes FAISS's answer for one query (kk entries) into t, skipping -1, the excluded id and stale ids.
 * Returns how many were taken. */
static uint32_t s_take_faiss(const kb_knn_t *self, const idx_t *labels, const float *dist, size_t kk,
                             int64_t exclude, knn_topk_t *t)
{
    uint32_t taken = 0;
    for (size_t j = 0; j < kk; j++) {
        int64_t id = labels[j];
        if (id < 0 || id == exclude) {
            continue;
        }
        if (!self->removable && s_map_get(&self->pending, id, NULL)) {
            continue;
        }
        s_topk_push(t, id, dist[j]);
        taken++;
    }
    return taken;
}

/* Searches the index for queries (nq, already normalized). Caller holds lock (shared). */
static int s_search_index(const kb_knn_t *self, const float *queries, size_t nq, uint32_t k, const int64_t *exclude,
                          int64_t *out_ids, float *out_scores)
{
    size_t ntotal = (size_t)faiss_Index_ntotal(self->index);
    size_t npend = self->removable ? 0 : self->pending.count;
    size_t nexcl = exclude ? 1 : 0;
    /* Entries FAISS may return that we must drop: the excluded id and stale ids. Ask for a few more than k
     * first; a query that comes up short is asked again with twice as many, up to the worst case. */
    size_t need_max = k + nexcl + npend;
    if (need_max > ntotal) {
        need_max = ntotal;
    }
    size_t extra = npend < k ? npend : k;
    if (extra < 8 && npend > 0) {
        extra = npend < 8 ? npend : 8;
    }
    size_t kk = k + nexcl + extra;
    if (kk > need_max) {
        kk = need_max;
    }
    idx_t *labels = NULL;
    float *dist = NULL;
    int rc = 0;

    if (kk > 0) {
        labels = carls_xmalloc(nq * kk * sizeof(idx_t));
        dist = carls_xmalloc(nq * kk * sizeof(float));
        if (faiss_Index_search(self->index, (idx_t)nq, queries, (idx_t)kk, dist, labels) != 0) {
            LOG_ERROR("kb_knn: search of '%s' failed: %s", self->spec, s_faiss_error());
            rc = -EIO;
            goto cleanup;
        }
    }
    for (size_t q = 0; q < nq; q++) {
        knn_topk_t t = {out_scores + q * k, out_ids + q * k, k, 0, self->higher_better};
        int64_t ex = exclude ? exclude[q] : -1;
        const float *qv = queries + q * self->dim;
        if (kk > 0) {
            uint32_t taken = s_take_faiss(self, labels + q * kk, dist + q * kk, kk, ex, &t);
            size_t kq = kk;
            while (taken < k && kq < need_max) {
                /* Short: too many stale or excluded hits. Search this query alone, wider. */
                kq = kq * 2 < need_max ? kq * 2 : need_max;
                idx_t *l2 = carls_xmalloc(kq * sizeof(idx_t));
                float *d2 = carls_xmalloc(kq * sizeof(float));
                int frc = faiss_Index_search(self->index, 1, qv, (idx_t)kq, d2, l2);
                if (frc == 0) {
                    t.n = 0;
                    taken = s_take_faiss(self, l2, d2, kq, ex, &t);
                }
                free(l2);
                free(d2);
                if (frc != 0) {
                    LOG_ERROR("kb_knn: search of '%s' failed: %s", self->spec, s_faiss_error());
                    rc = -EIO;
                    goto cleanup;
                }
            }
        }
        if (npend > 0) {
            s_search_pending(self, qv, ex, &t);
        }
        s_topk_finish(&t);
    }
cleanup:
    free(labels);
    free(dist);
    return rc;
}

int kb_knn_search(kb_knn_t *self, const float *queries, size_t nq, uint32_t k, const int64_t *exclude,
                  int64_t *out_ids, float *out_scores)
{
    assert(self);
    if (nq == 0) {
        return 0;
    }
    if (!queries || !out_ids || !out_scores || k == 0 || k > KB_KNN_MAX_K) {
        return -EINVAL;
    }
    float *normed;
    const float *use = s_caller_input(self, queries, nq, &normed);
    if (!use) {
        return -EINVAL;
    }
    int rc = 0;
    pthread_rwlock_rdlock(&self->lock);
    if (self->index) {
        rc = s_search_index(self, use, nq, k, exclude, out_ids, out_scores);
    } else {
        /* Not ready (waiting for training, or after a FAISS failure): exact scan of the copy. */
        for (size_t q = 0; q < nq; q++) {
            knn_topk_t t = {out_scores + q * k, out_ids + q * k, k, 0, self->higher_better};
            s_search_copy(self, use + q * self->dim, exclude ? exclude[q] : -1, &t);
            s_topk_finish(&t);
        }
    }
    pthread_rwlock_unlock(&self->lock);
    free(normed);
    return rc;
}

int kb_knn_rebuild(kb_knn_t *self)
{
    assert(self);
    return s_build(self, true);
}

static uint64_t s_map_memory(const knn_map_t *m) { return m->cap ? 2 * kb_memory_chunk(m->cap * 8) : 0; }

/* The memory estimate (kb_knn_memory). Lock held. */
static uint64_t s_memory(const kb_knn_t *self)
{
    uint64_t bytes = kb_memory_chunk(sizeof *self);
    if (self->cap)
        bytes += kb_memory_chunk(self->cap * sizeof *self->ids) + kb_memory_chunk(self->cap * self->dim * sizeof(float));
    bytes += s_map_memory(&self->slot) + s_map_memory(&self->pending) + s_map_memory(&self->changed);
    if (self->index)
        bytes += self->index_fixed_bytes + (uint64_t)faiss_Index_ntotal(self->index) * self->index_vector_bytes;
    return bytes;
}

void kb_knn_get_stats(kb_knn_t *self, kb_knn_stats_t *out)
{
    assert(self && out);
    memset(out, 0, sizeof(*out));
    pthread_rwlock_rdlock(&self->lock);
    out->count = self->count;
    out->indexed = self->index ? (uint64_t)faiss_Index_ntotal(self->index) : 0;
    out->pending = self->index ? (self->removable ? 0 : self->pending.count) : self->count;
    out->rebuilds = self->rebuilds;
    out->failed_builds = self->failed_builds;
    out->last_build_ms = self->last_build_ms;
    out->last_build_duration_ms = self->last_build_duration_ms;
    out->ready = self->index != NULL;
    out->removable = self->removable;
    out->building = self->building;
    out->memory_bytes = s_memory(self);
    pthread_rwlock_unlock(&self->lock);
}

uint64_t kb_knn_vector_bytes(const kb_knn_t *self)
{
    assert(self);
    /* The copy's vector and id, two slots of the id map at its load, and the index's share. */
    return (uint64_t)self->dim * sizeof(float) + 8 + 32 + self->index_vector_bytes;
}

uint64_t kb_knn_memory(kb_knn_t *self)
{
    assert(self);
    pthread_rwlock_rdlock(&self->lock);
    uint64_t bytes = s_memory(self);
    pthread_rwlock_unlock(&self->lock);
    return bytes;
}

#define KB_KNN_FLAT_BATCH 256u /* kb_knn_batch_min */

size_t kb_knn_batch_min(const kb_knn_t *self, size_t nq)
{
    assert(self);
    size_t threshold = (size_t)faiss_get_distance_compute_blas_threshold();
    if (strncmp(self->spec, "Flat", 4) == 0 && nq >= threshold)
        return threshold > KB_KNN_FLAT_BATCH ? threshold : KB_KNN_FLAT_BATCH;
    return 1;
}

uint32_t kb_knn_dim(const kb_knn_t *self)
{
    assert(self);
    return self->dim;
}

kb_knn_metric_t kb_knn_metric(const kb_knn_t *self)
{
    assert(self);
    return self->metric;
}
