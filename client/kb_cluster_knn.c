/* The cluster's nearest neighbours and candidate sampling (contract in kb_cluster.h): every shard answers
 * and the answers are merged (knn by score, sample by the shards' draws), through the fan-out engine
 * (kb_cluster_internal.h). */
#include "kb_cluster.h"
#include "kb_cluster_internal.h"

#include "protocol.h"
#include "util.h"

#include <assert.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ---- nearest neighbours ------------------------------------------------------------------------------ */

void kb_knn_result_destroy(kb_knn_result_t **result_p)
{
    if (!result_p || !*result_p)
        return;
    kb_knn_result_t *r = *result_p;
    free(r->keys);
    free(r->scores);
    free(r->key_bytes);
    free(r);
    *result_p = NULL;
}

/* One candidate answer while merging. */
typedef struct {
    const ProtobufCBinaryData *key;
    float score;
    uint32_t shard; /* tie-break: lower shard, then better rank within it */
    uint32_t rank;
} s_hit_t;

/* qsort order of two hits: the better score first (higher or lower by the metric), then the tie-break. */
static int s_hit_order(const s_hit_t *x, const s_hit_t *y, bool higher_first)
{
    if (x->score != y->score)
        return (higher_first ? x->score > y->score : x->score < y->score) ? -1 : 1;
    if (x->shard != y->shard)
        return x->shard < y->shard ? -1 : 1;
    return x->rank < y->rank ? -1 : x->rank > y->rank;
}

static int s_hit_higher_first(const void *a, const void *b) { return s_hit_order(a, b, true); }

static int s_hit_lower_first(const void *a, const void *b) { return s_hit_order(a, b, false); }

/* Checks a knn answer of shard s: nq * k keys and scores, k as asked. 0 or KB_CLIENT_EMALFORMED (error set). */
static int s_check_knn(kb_cluster_t *self, uint32_t s, const Carls__KnnResult *res, size_t nq, uint32_t k)
{
    if (res->k != k || res->n_keys != nq * k || res->n_scores != nq * k) {
        kb_cluster_shard_errorf(self, s,
                                "knn: the server sent k %u with %zu keys and %zu scores for %zu queries of k %u",
                                res->k, res->n_keys, res->n_scores, nq, k);
        return KB_CLIENT_EMALFORMED;
    }
    return 0;
}

/* Builds a result of nq * k slots from the chosen hits (hits[q * k + r], key NULL for an empty slot). */
static kb_knn_result_t *s_knn_result(size_t nq, uint32_t k, const s_hit_t *hits)
{
    kb_knn_result_t *r = carls_xcalloc(1, sizeof *r);
    r->nq = nq;
    r->k = k;
    size_t slots = nq * k, total = 0;
    r->keys = carls_xcalloc(slots ? slots : 1, sizeof *r->keys);
    r->scores = carls_xcalloc(slots ? slots : 1, sizeof *r->scores);
    for (size_t i = 0; i < slots; i++)
        if (hits[i].key)
            total += hits[i].key->len;
    r->key_bytes = carls_xmalloc(total ? total : 1);
    size_t off = 0;
    for (size_t i = 0; i < slots; i++) {
        if (!hits[i].key || hits[i].key->len == 0)
            continue;
        memcpy(r->key_bytes + off, hits[i].key->data, hits[i].key->len);
        r->keys[i].data = r->key_bytes + off;
        r->keys[i].len = hits[i].key->len;
        r->scores[i] = hits[i].score;
        off += hits[i].key->len;
    }
    return r;
}

/* Asks every shard for its top-k_ask of nq query vectors and merges them into the top k per query (k <=
 * k_ask). When exclude is not NULL, query q never answers exclude[q]. */
static int s_knn_merge(kb_cluster_t *self, const char *table, const float *queries, size_t nq, uint32_t dim,
                       uint32_t k, uint32_t k_ask, bool higher_first, const kb_key_t *exclude,
                       kb_knn_result_t **out)
{
    Carls__Knn op = CARLS__KNN__INIT;
    op.vectors = (float *)queries;
    op.n_vectors = nq * dim;
    op.k = k_ask;
    kb_cluster_fan_t fan;
    s_hit_t *cand = NULL, *chosen = NULL;
    int rc = kb_cluster_to_all(self, &fan, table, CARLS__REQUEST__OP_KNN, &op, CARLS__RESPONSE__RESULT_KNN);
    Carls__Response **resps = fan.resps;
    if (rc != 0)
        goto cleanup;
    for (uint32_t s = 0; s < self->n; s++) {
        rc = s_check_knn(self, s, resps[s]->knn, nq, k_ask);
        if (rc != 0)
            goto cleanup;
    }
    cand = carls_xmalloc((size_t)self->n * k_ask * sizeof *cand);
    chosen = carls_xcalloc(nq * k, sizeof *chosen);
    for (size_t q = 0; q < nq; q++) {
        size_t nc = 0;
        for (uint32_t s = 0; s < self->n; s++) {
            const Carls__KnnResult *res = resps[s]->knn;
            for (uint32_t r = 0; r < k_ask; r++) {
                const ProtobufCBinaryData *key = &res->keys[q * k_ask + r];
                if (key->len == 0)
                    continue; /* the shard has fewer rows than k */
                if (exclude && key->len == exclude[q].len && memcmp(key->data, exclude[q].data, key->len) == 0)
                    continue;
                cand[nc++] = (s_hit_t){key, res->scores[q * k_ask + r], s, r};
            }
        }
        qsort(cand, nc, sizeof *cand, higher_first ? s_hit_higher_first : s_hit_lower_first);
        for (size_t r = 0; r < k && r < nc; r++)
            chosen[q * k + r] = cand[r];
    }
    *out = s_knn_result(nq, k, chosen);
cleanup:
    free(cand);
    free(chosen);
    kb_cluster_fan_free(self, &fan);
    return rc;
}

/* The single-shard pass-through: one knn request as given, its answer converted. */
static int s_knn_single(kb_cluster_t *self, const char *table, const float *queries, size_t nq, uint32_t dim,
                        const kb_key_t *keys, uint32_t k, bool exclude, kb_knn_result_t **out)
{
    kb_cluster_fan_t fan;
    kb_cluster_fan_init(self, &fan, table, CARLS__RESPONSE__RESULT_KNN);
    ProtobufCBinaryData *wire = NULL;
    if (keys) {
        wire = carls_xmalloc(nq * sizeof *wire);
        for (size_t i = 0; i < nq; i++) {
            wire[i].data = (uint8_t *)keys[i].data;
            wire[i].len = keys[i].len;
        }
    }
    Carls__Knn *op = &kb_cluster_fan_request(&fan, 0, CARLS__REQUEST__OP_KNN, wire, keys ? nq : 0)->knn;
    if (keys) {
        op->exclude_query = exclude;
    } else {
        op->vectors = (float *)queries;
        op->n_vectors = nq * dim;
    }
    op->k = k;
    s_hit_t *hits = NULL;
    int rc = kb_cluster_fan_run(self, &fan);
    if (rc != 0)
        goto cleanup;
    const Carls__KnnResult *res = fan.resps[0]->knn;
    rc = s_check_knn(self, 0, res, nq, k);
    if (rc != 0)
        goto cleanup;
    hits = carls_xcalloc(nq * k, sizeof *hits);
    for (size_t i = 0; i < nq * k; i++)
        if (res->keys[i].len > 0)
            hits[i] = (s_hit_t){&res->keys[i], res->scores[i], 0, 0};
    *out = s_knn_result(nq, k, hits);
cleanup:
    free(hits);
    kb_cluster_fan_free(self, &fan);
    free(wire);
    return rc;
}

/* Checks k and the table (an embedding table with an index); *info gets its description. */
static int s_knn_args(kb_cluster_t *self, const char *table, size_t nq, uint32_t k, kb_cluster_table_t *info)
{
    if (!table || !*table) {
        kb_cluster_set_error(self, "knn: no table name");
        return KB_CLIENT_EINVAL;
    }
    if (nq == 0) {
        kb_cluster_set_error(self, "knn: no queries");
        return KB_CLIENT_EINVAL;
    }
    if (k == 0 || k > CARLS_MAX_KNN_K) {
        kb_cluster_set_error(self, "knn: k must be in 1..%u, got %u", CARLS_MAX_KNN_K, k);
        return KB_CLIENT_EINVAL;
    }
    if (nq > SIZE_MAX / CARLS_MAX_KNN_K / self->n / sizeof(s_hit_t)) {
        kb_cluster_set_error(self, "knn: %zu queries are too many", nq);
        return KB_CLIENT_EINVAL;
    }
    if (!info)
        return 0;
    int rc = kb_cluster_table(self, table, info);
    if (rc != 0)
        return rc;
    if (info->kind != CARLS__TABLE_KIND__TABLE_EMBEDDING || !info->has_knn) {
        /* What every shard would answer, so it reads the same as the single-server error. */
        return kb_cluster_status_error(self, CARLS__STATUS_CODE__STATUS_INVALID_ARGUMENT,
                                       "table '%s' has no nearest-neighbour index (create it with a knn spec)", table);
    }
    return 0;
}

static bool s_higher_first(Carls__KnnMetric metric) { return metric != CARLS__KNN_METRIC__METRIC_L2; }

int kb_cluster_knn(kb_cluster_t *self, const char *table, const float *queries, size_t nq, uint32_t dim,
                   uint32_t k, kb_knn_result_t **out)
{
    assert(self && out);
    kb_cluster_clear_error(self);
    *out = NULL;
    if (!queries || dim == 0 || (nq > 0 && SIZE_MAX / dim / sizeof(float) < nq)) {
        kb_cluster_set_error(self, "knn: no query vectors, or dim 0");
        return KB_CLIENT_EINVAL;
    }
    kb_cluster_table_t info;
    int rc = s_knn_args(self, table, nq, k, self->n == 1 ? NULL : &info);
    if (rc != 0)
        return rc;
    if (self->n == 1)
        return s_knn_single(self, table, queries, nq, dim, NULL, k, false, out);
    if (info.dim != dim) {
        kb_cluster_set_error(self, "knn in %s: the table has dim %u, the caller's queries have %u", table, info.dim,
                             dim);
        return KB_CLIENT_EINVAL;
    }
    return s_knn_merge(self, table, queries, nq, dim, k, k, s_higher_first(info.metric), NULL, out);
}

int kb_cluster_knn_by_key(kb_cluster_t *self, const char *table, const kb_key_t *keys, size_t nq, uint32_t k,
                          bool exclude_self, kb_knn_result_t **out)
{
    assert(self && out);
    kb_cluster_clear_error(self);
    *out = NULL;
    if (!keys) {
        kb_cluster_set_error(self, "knn: no query keys");
        return KB_CLIENT_EINVAL;
    }
    for (size_t i = 0; i < nq; i++) {
        if (keys[i].len == 0 || !keys[i].data) {
            kb_cluster_set_error(self, "knn: query key %zu is empty", i);
            return KB_CLIENT_EINVAL;
        }
    }
    kb_cluster_table_t info;
    int rc = s_knn_args(self, table, nq, k, self->n == 1 ? NULL : &info);
    if (rc != 0)
        return rc;
    if (self->n == 1)
        return s_knn_single(self, table, NULL, nq, 0, keys, k, exclude_self, out);
    /* The owning shards give the keys' current values; then it is a query by vector. */
    float *vecs = carls_xmalloc(nq * info.dim * sizeof *vecs);
    rc = kb_cluster_lookup_ex(self, table, keys, nq, info.dim, true, vecs, NULL);
    if (rc == 0) {
        /* The query key itself may take one of a shard's k places: ask for one more so k remain. */
        uint32_t k_ask = exclude_self && k < CARLS_MAX_KNN_K ? k + 1 : k;
        rc = s_knn_merge(self, table, vecs, nq, info.dim, k, k_ask, s_higher_first(info.metric),
                         exclude_self ? keys : NULL, out);
    }
    free(vecs);
    return rc;
}

/* ---- candidate sampling ------------------------------------------------------------------------------ */

void kb_sample_result_destroy(kb_sample_result_t **result_p)
{
    if (!result_p || !*result_p)
        return;
    kb_sample_result_t *r = *result_p;
    free(r->keys);
    free(r->probabilities);
    free(r->is_positive);
    free(r->key_bytes);
    free(r);
    *result_p = NULL;
}

/* Checks a sample answer: n_pos positives then between 0 and n candidates, one probability and flag per
 * key, flags matching the positions, probabilities finite in [0, 1], mass finite and >= 0. */
static int s_check_sample(kb_cluster_t *self, uint32_t s, const Carls__SampleResult *res, size_t n_pos, uint32_t n)
{
    if (res->n_keys < n_pos || res->n_keys - n_pos > n || res->n_probabilities != res->n_keys ||
        res->n_is_positive != res->n_keys) {
        kb_cluster_shard_errorf(self, s, "sample: the server sent %zu keys, %zu probabilities and %zu flags for %zu "
                                "positives and %u candidates", res->n_keys, res->n_probabilities, res->n_is_positive,
                                n_pos, n);
        return KB_CLIENT_EMALFORMED;
    }
    if (!isfinite(res->mass) || res->mass < 0) {
        kb_cluster_shard_errorf(self, s, "sample: the server sent mass %g", res->mass);
        return KB_CLIENT_EMALFORMED;
    }
    for (size_t i = 0; i < res->n_keys; i++) {
        float p = res->probabilities[i];
        if (res->is_positive[i] != (i < n_pos) || !(p >= 0.0f && p <= 1.0f) || (i >= n_pos && res->keys[i].len == 0)) {
            kb_cluster_shard_errorf(self, s, "sample: entry %zu of the answer is malformed (probability %g, %s)", i,
                                    (double)p, res->is_positive[i] ? "positive" : "candidate");
            return KB_CLIENT_EMALFORMED;
        }
    }
    return 0;
}

/* The seed shard s draws with: a function of the caller's seed and s only, never 0 (0 asks the server to
 * pick one, which would make a seeded sample unrepeatable). */
static uint64_t s_shard_seed(uint64_t seed, uint32_t s)
{
    uint64_t st = seed ^ (0x9e3779b97f4a7c15ull * ((uint64_t)s + 1));
    uint64_t v = carls_splitmix64(&st);
    return v ? v : 1;
}

/* Builds one Sample request per shard in fan: positives of that shard (grouped per sp; sp may be NULL for
 * none), counts[s] candidates (NULL: 0 each), shards with nothing to do skipped unless ask_all. Shard s
 * draws with s_shard_seed(seed, s), or with seed itself when raw_seed (the single-shard pass-through). */
static void s_sample_build(kb_cluster_t *self, kb_cluster_fan_t *fan, const kb_cluster_split_t *sp,
                           const uint32_t *counts, bool ask_all, Carls__SampleStrategy strategy, uint64_t seed,
                           bool raw_seed)
{
    for (uint32_t s = 0; s < self->n; s++) {
        size_t np = sp ? sp->count[s] : 0;
        uint32_t nc = counts ? counts[s] : 0;
        if (!ask_all && np == 0 && nc == 0)
            continue;
        Carls__Sample *op =
            &kb_cluster_fan_request(fan, s, CARLS__REQUEST__OP_SAMPLE, np ? sp->wire + sp->start[s] : NULL, np)->sample;
        op->n = nc;
        op->strategy = strategy;
        op->seed = raw_seed ? seed : s_shard_seed(seed, s);
    }
}

/* Checks every answer of a sample fan-out against its request (s_check_sample). */
static int s_sample_check(kb_cluster_t *self, const kb_cluster_fan_t *fan)
{
    for (uint32_t s = 0; s < self->n; s++) {
        if (!fan->resps[s])
            continue;
        const Carls__Sample *op = &fan->ops[s].sample;
        int rc = s_check_sample(self, s, fan->resps[s]->sample, op->n_positives, op->n);
        if (rc != 0)
            return rc;
    }
    return 0;
}

/* One round of the sharded sample on an initialised fan: s_sample_build, then every answer, checked. */
static int s_sample_round(kb_cluster_t *self, kb_cluster_fan_t *fan, const kb_cluster_split_t *sp,
                          const uint32_t *counts, bool ask_all, Carls__SampleStrategy strategy, uint64_t seed)
{
    s_sample_build(self, fan, sp, counts, ask_all, strategy, seed, false);
    int rc = kb_cluster_fan_run(self, fan);
    return rc != 0 ? rc : s_sample_check(self, fan);
}

/* Room for a result of n entries whose keys total key_total bytes. */
static kb_sample_result_t *s_sample_alloc(size_t n, size_t key_total)
{
    kb_sample_result_t *r = carls_xcalloc(1, sizeof *r);
    r->keys = carls_xcalloc(n ? n : 1, sizeof *r->keys);
    r->probabilities = carls_xcalloc(n ? n : 1, sizeof *r->probabilities);
    r->is_positive = carls_xcalloc(n ? n : 1, sizeof *r->is_positive);
    r->key_bytes = carls_xmalloc(key_total ? key_total : 1);
    return r;
}

/* Appends one entry to r (room was made by s_sample_alloc); *off is the next free key byte. */
static void s_sample_add(kb_sample_result_t *r, size_t *off, const void *key, size_t len, double p, bool positive)
{
    memcpy(r->key_bytes + *off, key, len);
    r->keys[r->n].data = r->key_bytes + *off;
    r->keys[r->n].len = len;
    r->probabilities[r->n] = (float)p;
    r->is_positive[r->n] = positive;
    r->n++;
    *off += len;
}

/* Checks sample's arguments. 0 or KB_CLIENT_EINVAL (error set). */
static int s_sample_args(kb_cluster_t *self, const char *table, const kb_key_t *positives, size_t n_positives,
                         Carls__SampleStrategy strategy)
{
    if (!table || !*table) {
        kb_cluster_set_error(self, "sample: no table name");
        return KB_CLIENT_EINVAL;
    }
    if (strategy != CARLS__SAMPLE_STRATEGY__SAMPLE_UNIFORM && strategy != CARLS__SAMPLE_STRATEGY__SAMPLE_LOG_UNIFORM &&
        strategy != CARLS__SAMPLE_STRATEGY__SAMPLE_UNIGRAM) {
        kb_cluster_set_error(self, "sample: unknown strategy %d", (int)strategy);
        return KB_CLIENT_EINVAL;
    }
    if (n_positives > 0 && !positives) {
        kb_cluster_set_error(self, "sample: no positive keys");
        return KB_CLIENT_EINVAL;
    }
    return 0;
}

/* The single shard's answer as a result: the entries as they are (scale 1). */
static kb_sample_result_t *s_sample_single_result(const Carls__SampleResult *res, size_t n_positives)
{
    size_t total = 0;
    for (size_t i = 0; i < res->n_keys; i++)
        total += res->keys[i].len;
    kb_sample_result_t *r = s_sample_alloc(res->n_keys, total);
    size_t off = 0;
    for (size_t i = 0; i < res->n_keys; i++)
        s_sample_add(r, &off, res->keys[i].data, res->keys[i].len, res->probabilities[i], res->is_positive[i]);
    r->n_positives = n_positives;
    r->mass = res->mass;
    r->rows = res->rows;
    return r;
}

/* The sample over several shards (see kb_cluster_sample in kb_cluster.h): two rounds, then the merge. */
static int s_sample_sharded(kb_cluster_t *self, const char *table, const kb_key_t *positives, size_t n_positives,
                            uint32_t n, Carls__SampleStrategy strategy, uint64_t seed, kb_sample_result_t **out)
{
    /* The split needs a seed here (one shard would pick its own for 0). */
    while (seed == 0) {
        if (carls_random_bytes(&seed, sizeof seed) != 0) {
            kb_cluster_set_error(self, "sample: cannot read random bytes for a seed");
            return KB_CLIENT_EIO;
        }
    }
    kb_cluster_split_t sp;
    kb_cluster_fan_t round1, round2; /* every shard's mass (and its positives'), then its draws */
    memset(&sp, 0, sizeof sp);
    kb_cluster_fan_init(self, &round1, table, CARLS__RESPONSE__RESULT_SAMPLE);
    kb_cluster_fan_init(self, &round2, table, CARLS__RESPONSE__RESULT_SAMPLE);
    uint32_t *counts = carls_xcalloc(self->n, sizeof *counts);
    size_t *next_pos = carls_xcalloc(self->n, sizeof *next_pos);
    kb_sample_result_t *r = NULL;
    int rc = 0;
    if (n_positives > 0) {
        rc = kb_cluster_split(self, "sample", positives, n_positives, &sp);
        if (rc != 0)
            goto cleanup;
    }

    /* Round 1: every shard's mass, and the probabilities of the positives it owns. */
    rc = s_sample_round(self, &round1, n_positives ? &sp : NULL, NULL, true, strategy, seed);
    if (rc != 0)
        goto cleanup;
    double total = 0;
    uint64_t rows = 0;
    for (uint32_t s = 0; s < self->n; s++) {
        total += round1.resps[s]->sample->mass;
        rows += round1.resps[s]->sample->rows;
    }
    if (n > 0 && !(total > 0)) {
        /* What a single server answers when it has nothing to draw from. */
        rc = kb_cluster_status_error(self, CARLS__STATUS_CODE__STATUS_NOT_FOUND,
                                     "table '%s' has no rows that strategy can draw", table);
        goto cleanup;
    }
    /* The multinomial split of n by mass (shards with no mass get no draws). */
    if (n > 0) {
        uint64_t st = seed;
        for (uint32_t d = 0; d < n; d++) {
            double u = carls_unit_double(&st) * total, acc = 0;
            uint32_t pick = self->n; /* rounding may leave u >= the last sum: the last shard with mass */
            for (uint32_t s = 0; s < self->n; s++) {
                acc += round1.resps[s]->sample->mass;
                if (round1.resps[s]->sample->mass > 0 && u < acc) {
                    pick = s;
                    break;
                }
            }
            if (pick == self->n)
                for (uint32_t s = 0; s < self->n; s++)
                    if (round1.resps[s]->sample->mass > 0)
                        pick = s;
            counts[pick]++;
        }
        /* Round 2: each shard draws its share. */
        rc = s_sample_round(self, &round2, NULL, counts, false, strategy, seed);
        if (rc != 0)
            goto cleanup;
    }

    size_t entries = n_positives, key_total = 0;
    for (size_t i = 0; i < n_positives; i++)
        key_total += positives[i].len;
    for (uint32_t s = 0; s < self->n; s++) {
        if (!round2.resps[s])
            continue;
        const Carls__SampleResult *res = round2.resps[s]->sample;
        entries += res->n_keys;
        for (size_t i = 0; i < res->n_keys; i++)
            key_total += res->keys[i].len;
    }
    r = s_sample_alloc(entries, key_total);
    r->mass = total;
    r->rows = rows;
    r->n_positives = n_positives;
    size_t off = 0;
    /* Positives in the caller's order, each scaled by its owner's share of the total mass. */
    for (size_t i = 0; i < n_positives; i++) {
        uint32_t s = carls_shard_of(positives[i].data, positives[i].len, self->n);
        const Carls__SampleResult *res = round1.resps[s]->sample;
        double p = total > 0 ? res->probabilities[next_pos[s]++] * (res->mass / total) : 0.0;
        s_sample_add(r, &off, positives[i].data, positives[i].len, p, true);
    }
    for (uint32_t s = 0; s < self->n; s++) {
        if (!round2.resps[s])
            continue;
        /* The shard's own mass in this answer: its probabilities are relative to it. */
        const Carls__SampleResult *res = round2.resps[s]->sample;
        for (size_t i = 0; i < res->n_keys; i++)
            s_sample_add(r, &off, res->keys[i].data, res->keys[i].len,
                         res->probabilities[i] * (res->mass / total), false);
    }
    /* Shuffle the candidates (Fisher-Yates, seeded): the draws are exchangeable, so a caller taking a prefix
     * must not get one shard's draws first. */
    uint64_t st = s_shard_seed(seed, self->n);
    for (size_t i = r->n; i > n_positives + 1; i--) {
        size_t j = n_positives + (size_t)(carls_unit_double(&st) * (double)(i - n_positives));
        if (j >= i)
            j = i - 1;
        kb_key_t tk = r->keys[i - 1];
        r->keys[i - 1] = r->keys[j];
        r->keys[j] = tk;
        float tp = r->probabilities[i - 1];
        r->probabilities[i - 1] = r->probabilities[j];
        r->probabilities[j] = tp;
    }
    *out = r;
cleanup:
    kb_cluster_fan_free(self, &round1);
    kb_cluster_fan_free(self, &round2);
    free(counts);
    free(next_pos);
    kb_cluster_split_free(&sp);
    return rc;
}

int kb_cluster_sample_send(kb_cluster_t *self, const char *table, const kb_key_t *positives, size_t n_positives,
                           uint32_t n, Carls__SampleStrategy strategy, uint64_t seed,
                           kb_cluster_pending_t **pending_out)
{
    assert(self && pending_out);
    kb_cluster_clear_error(self);
    *pending_out = NULL;
    int rc = s_sample_args(self, table, positives, n_positives, strategy);
    if (rc != 0)
        return rc;
    kb_cluster_pending_t *p = kb_cluster_pending_new(self, table, CARLS__RESPONSE__RESULT_SAMPLE);
    if (self->n > 1) {
        /* Round 2 depends on round 1's answers: the draws are made now. */
        rc = s_sample_sharded(self, table, positives, n_positives, n, strategy, seed, &p->sample);
        if (rc != 0) {
            kb_cluster_pending_destroy(self, &p);
            return rc;
        }
        *pending_out = p;
        return 0;
    }
    /* One shard: one request with everything, as given (the server picks a seed for 0). */
    if (n_positives > 0) {
        rc = kb_cluster_split(self, "sample", positives, n_positives, &p->fan.sp);
        if (rc != 0) {
            kb_cluster_pending_destroy(self, &p);
            return rc;
        }
    }
    s_sample_build(self, &p->fan, n_positives ? &p->fan.sp : NULL, &n, true, strategy, seed, true);
    return kb_cluster_pending_send(self, p, pending_out);
}

int kb_cluster_sample_wait(kb_cluster_t *self, kb_cluster_pending_t **pending_p, kb_sample_result_t **out)
{
    assert(self && out && pending_p && *pending_p && (*pending_p)->fan.want == CARLS__RESPONSE__RESULT_SAMPLE);
    kb_cluster_clear_error(self);
    *out = NULL;
    kb_cluster_pending_t *p = *pending_p;
    int rc = 0;
    if (self->n > 1) {
        *out = p->sample;
        p->sample = NULL;
    } else {
        rc = kb_cluster_fan_wait(self, &p->fan);
        if (rc == 0)
            rc = s_sample_check(self, &p->fan);
        if (rc == 0)
            *out = s_sample_single_result(p->fan.resps[0]->sample, p->fan.ops[0].sample.n_positives);
    }
    kb_cluster_pending_destroy(self, pending_p);
    return rc;
}

int kb_cluster_sample(kb_cluster_t *self, const char *table, const kb_key_t *positives, size_t n_positives,
                      uint32_t n, Carls__SampleStrategy strategy, uint64_t seed, kb_sample_result_t **out)
{
    assert(self && out);
    *out = NULL;
    kb_cluster_pending_t *p = NULL;
    int rc = kb_cluster_sample_send(self, table, positives, n_positives, n, strategy, seed, &p);
    return rc != 0 ? rc : kb_cluster_sample_wait(self, &p, out);
}
