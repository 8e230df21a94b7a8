/* Asynchronous neighbour / pseudo-label / embedding fetches for the graph-regularised trainer
 * (see trainer_prefetch.h). */
#include "trainer_prefetch.h"

#include "kb_cluster.h"

#include "log.h"
#include "util.h"

#include <assert.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define S_SLOTS TRAINER_PREFETCH_DEPTH
#define S_KEY 11 /* bytes per item key buffer (carls_item_key) */

struct trainer_prefetch {
    trainer_prefetch_config_t cfg;
    kb_cluster_t *bank;           /* used by the thread only; NULL while the bank is away */
    bool use_curve;               /* connect with `curve` (cfg.curve was set) */
    kb_client_curve_t curve;      /* a copy of *cfg.curve, for every reconnection; wiped on destroy */
    bool away;                    /* the bank is unreachable: batches are skipped, the bank probed */
    int64_t away_since_ms;        /* when it went away (monotonic) */
    int64_t next_probe_ms;        /* when to probe it next */
    uint64_t away_skipped;        /* batches skipped since it went away */
    pthread_t thread;
    pthread_mutex_t mutex;
    pthread_cond_t cond;
    uint64_t submitted, done, taken; /* batches queued, fetched, handed to the caller */
    int stop;                     /* the thread should exit */
    trainer_fetch_t slot[S_SLOTS]; /* batch t lives in slot t % S_SLOTS */
    /* thread scratch */
    kb_key_t *ikeys;              /* (max_batch) the batch's item keys (feature_get) */
    char *key_text;               /* (max(max_batch, max_batch * K), S_KEY) */
    kb_key_t *ukeys;              /* (max_batch * K) keys of the neighbour rows to read from the bank */
    uint32_t *uitems;             /* (max_batch * K) distinct neighbours of the batch */
    uint32_t *uread;              /* (max_batch * K) of those, the ones read from the bank (ukeys) */
    int32_t *pos;                 /* (n_items) item -> index in uitems, -1 (reset after each batch) */
    float *uvals;                 /* (max_batch * K, E) rows read */
    kb_row_meta_t *umeta;         /* (max_batch * K) */
    /* neighbour-row cache, per item (emb_table only) */
    uint64_t batches;             /* batches fetched so far */
    float *row;                   /* (n_items, E) the last row read */
    float *row_sq;                /* (n_items) its squared norm */
    uint64_t *row_ver;            /* (n_items) its version */
    int64_t *row_read_at;         /* (n_items) the batch it was read for; -1: never */
    uint8_t *row_have;            /* (n_items) a maker had written it */
    float *acc;                   /* (E) aggregate scratch */
};

/* Sends a feature_get of the batch's items to table (every shard holding some of them). */
static int s_send_feature_get(trainer_prefetch_t *p, const char *table, trainer_fetch_t *f,
                              kb_cluster_pending_t **pending)
{
    for (int i = 0; i < f->B; i++) {
        char *k = p->key_text + (size_t)i * S_KEY;
        p->ikeys[i].len = carls_item_key(f->items[i], k);
        p->ikeys[i].data = k;
    }
    int rc = kb_cluster_feature_get_send(p->bank, table, p->ikeys, (size_t)f->B, pending);
    if (rc != 0) {
        snprintf(f->err, sizeof f->err, "feature_get %s: %s", table, kb_cluster_last_error(p->bank));
    }
    return rc;
}

/* Waits for a feature_get's answers (records in the batch's order). A table the bank does not have yet is not
 * a failure: *res stays NULL and 0 is returned. Caller frees *res. */
static int s_wait_features(trainer_prefetch_t *p, kb_cluster_pending_t **pending, kb_feature_result_t **res,
                           trainer_fetch_t *f, const char *table)
{
    int rc = kb_cluster_feature_get_wait(p->bank, pending, res);
    if (rc == KB_CLIENT_ESTATUS && kb_cluster_last_status(p->bank) == CARLS__STATUS_CODE__STATUS_NOT_FOUND) {
        return 0; /* no maker wrote it yet */
    }
    if (rc != 0) {
        snprintf(f->err, sizeof f->err, "feature_get %s: %s", table, kb_cluster_last_error(p->bank));
    }
    return rc;
}

/* A connection to the bank (every shard) with the configured timeout and no resend (an unanswered request
 * means the bank is away; the batch is skipped rather than waited for). NULL on failure (logged). */
static kb_cluster_t *s_connect(const trainer_prefetch_t *p, int timeout_ms)
{
    kb_client_options_t opts = {.timeout_ms = timeout_ms, .retries = 0, .curve = p->use_curve ? &p->curve : NULL};
    return kb_cluster_new(p->cfg.endpoints, &opts);
}

/* Whether the request that just failed with rc on p->bank means the bank (one of its shards) is unreachable
 * (no answer, a broken connection, a server shutting down), rather than a request it refuses or a broken
 * answer. */
static bool s_unreachable(const trainer_prefetch_t *p, int rc)
{
    return rc == KB_CLIENT_ETIMEOUT || rc == KB_CLIENT_EIO ||
           (rc == KB_CLIENT_ESTATUS && kb_cluster_last_status(p->bank) == CARLS__STATUS_CODE__STATUS_UNAVAILABLE);
}

/* While the bank is away: true when it answers a probe now (it is then connected again). */
static bool s_probe(trainer_prefetch_t *p)
{
    const int64_t now = carls_monotonic_ms();
    if (now < p->next_probe_ms) {
        return false;
    }
    p->next_probe_ms = now + p->cfg.probe_ms;
    kb_cluster_t *probe = s_connect(p, p->cfg.probe_timeout_ms);
    Carls__Response *list = NULL;
    int rc = probe ? kb_cluster_list_tables(probe, &list) : KB_CLIENT_EIO;
    if (list) {
        carls__response__free_unpacked(list, NULL);
    }
    kb_cluster_destroy(&probe);
    if (rc != 0 || !(p->bank = s_connect(p, p->cfg.timeout_ms))) {
        return false;
    }
    LOG_INFO("bank reachable again at %s after %.1f s; %llu batches trained without it", p->cfg.endpoints,
             (double)(carls_monotonic_ms() - p->away_since_ms) / 1000.0, (unsigned long long)p->away_skipped);
    p->away = false;
    return true;
}

/* Reads the batch's distinct neighbours' rows that the cache does not hold fresh enough into the cache, in
 * one no_create lookup (rows no maker wrote are remembered as missing). */
static int s_read_rows(trainer_prefetch_t *p, trainer_fetch_t *f)
{
    const int K = p->cfg.K, E = p->cfg.E, B = f->B;
    const int64_t now = (int64_t)p->batches;
    const int64_t refresh = p->cfg.refresh_batches > 1 ? p->cfg.refresh_batches : 1;
    int U = 0, R = 0;
    for (int i = 0; i < B * K; i++) {
        uint32_t it = f->nbr[i];
        if (it == TRAINER_NO_ITEM || p->pos[it] >= 0) {
            continue;
        }
        p->pos[it] = U;
        p->uitems[U++] = it;
        if (p->row_read_at[it] >= 0 && now - p->row_read_at[it] < refresh) {
            continue;
        }
        char *k = p->key_text + (size_t)R * S_KEY;
        p->ukeys[R].len = carls_item_key(it, k);
        p->ukeys[R].data = k;
        p->uread[R++] = it;
    }
    for (int u = 0; u < U; u++) {
        p->pos[p->uitems[u]] = -1;
    }
    f->distinct = U;
    f->fetched = R;
    if (R == 0) {
        return 0;
    }
    int rc = kb_cluster_lookup_ex(p->bank, p->cfg.emb_table, p->ukeys, (size_t)R, (uint32_t)E, true, p->uvals,
                                  p->umeta);
    if (rc == KB_CLIENT_ESTATUS && kb_cluster_last_status(p->bank) == CARLS__STATUS_CODE__STATUS_NOT_FOUND) {
        rc = 0; /* no maker wrote embeddings yet: every neighbour is missing */
        for (int r = 0; r < R; r++) {
            p->umeta[r].updated_at_ms = 0;
        }
    } else if (rc != 0) {
        snprintf(f->err, sizeof f->err, "lookup %s: %s", p->cfg.emb_table, kb_cluster_last_error(p->bank));
        return rc;
    }
    for (int r = 0; r < R; r++) {
        const uint32_t it = p->uread[r];
        p->row_read_at[it] = now;
        p->row_have[it] = p->umeta[r].updated_at_ms != 0;
        p->row_ver[it] = p->umeta[r].version;
        const float *src = p->uvals + (size_t)r * E;
        float *dst = p->row + (size_t)it * E;
        double sq = 0.0;
        for (int e = 0; e < E; e++) {
            dst[e] = src[e];
            sq += (double)src[e] * src[e];
        }
        p->row_sq[it] = (float)sq;
    }
    return 0;
}

/* Copies each neighbour's cached row to f->nbr_emb. */
static void s_copy_rows(const trainer_prefetch_t *p, trainer_fetch_t *f)
{
    const int E = p->cfg.E;
    for (int s = 0; s < f->B * p->cfg.K; s++) {
        uint32_t it = f->nbr[s];
        if (it != TRAINER_NO_ITEM && p->row_have[it]) {
            f->nbr_have[s] = 1;
            f->nbr_ver[s] = p->row_ver[it];
            memcpy(f->nbr_emb + (size_t)s * E, p->row + (size_t)it * E, sizeof(float) * (size_t)E);
        }
    }
}

/* The neighbour side of the graph term (trainer_prefetch.h): agg_mean, agg_sq, agg_wsum and the counters. */
static void s_aggregate(const trainer_prefetch_t *p, trainer_fetch_t *f)
{
    const int K = p->cfg.K, E = p->cfg.E;
    float *acc = p->acc;
    for (int i = 0; i < f->B; i++) {
        double wsum = 0.0, sq = 0.0;
        memset(acc, 0, sizeof *acc * (size_t)E);
        for (int j = 0; j < K; j++) {
            const int s = i * K + j;
            const uint32_t it = f->nbr[s];
            if (it == TRAINER_NO_ITEM) {
                continue;
            }
            if (!p->row_have[it]) {
                f->nbr_missing++;
                continue;
            }
            const uint64_t ver = p->row_ver[it];
            f->nbr_have[s] = 1;
            f->nbr_ver[s] = ver;
            const uint64_t age = f->step > ver ? f->step - ver : 0;
            if (p->cfg.max_staleness > 0 && age > (uint64_t)p->cfg.max_staleness) {
                f->nbr_stale++;
                continue;
            }
            f->nbr_used++;
            f->staleness_sum += (double)age;
            const float w = f->w[s];
            if (w <= 0.0f) {
                continue;
            }
            wsum += w;
            sq += (double)w * p->row_sq[it];
            const float *h = p->row + (size_t)it * E;
            for (int e = 0; e < E; e++) {
                acc[e] += w * h[e];
            }
        }
        float *mean = f->agg_mean + (size_t)i * E;
        f->agg_wsum[i] = (float)wsum;
        f->agg_sq[i] = wsum > 0.0 ? (float)(sq / wsum) : 0.0f;
        for (int e = 0; e < E; e++) {
            mean[e] = wsum > 0.0 ? (float)((double)acc[e] / wsum) : 0.0f;
        }
    }
}

/* Fetches everything batch f needs. */
static void s_fetch(trainer_prefetch_t *p, trainer_fetch_t *f)
{
    const int K = p->cfg.K, B = f->B;
    int64_t t0 = carls_monotonic_us();
    f->rc = 0;
    f->err[0] = '\0';
    f->distinct = 0;
    f->fetched = 0;
    f->nbr_used = f->nbr_stale = f->nbr_missing = 0;
    f->staleness_sum = 0.0;
    if (f->agg_wsum) {
        memset(f->agg_wsum, 0, sizeof *f->agg_wsum * (size_t)B); /* no graph term unless the fetch works */
    }
    for (int i = 0; i < B; i++) {
        f->plabel[i] = -1;
        f->pconf[i] = 0.0f;
        f->pver[i] = 0;
    }
    for (int i = 0; i < B * K; i++) {
        f->nbr[i] = TRAINER_NO_ITEM;
        f->w[i] = 0.0f;
        f->nbr_have[i] = 0;
        f->nbr_ver[i] = 0;
    }
    if (p->away && !s_probe(p)) {
        p->away_skipped++;
        f->rc = TRAINER_FETCH_SKIPPED;
        snprintf(f->err, sizeof f->err, "the bank is away (probing %s every %d ms)", p->cfg.endpoints,
                 p->cfg.probe_ms);
        f->fetch_ms = (double)(carls_monotonic_us() - t0) / 1e3;
        return;
    }
    /* Both reads in flight together (every shard works on both), then each answer. */
    kb_cluster_pending_t *lpend = NULL, *gpend = NULL;
    kb_feature_result_t *lres = NULL, *gres = NULL;
    int rc = 0;
    if (p->cfg.labels_table) {
        rc = s_send_feature_get(p, p->cfg.labels_table, f, &lpend);
    }
    if (rc == 0 && p->cfg.graph_table) {
        rc = s_send_feature_get(p, p->cfg.graph_table, f, &gpend);
    }
    if (rc == 0 && lpend) {
        rc = s_wait_features(p, &lpend, &lres, f, p->cfg.labels_table);
        for (int i = 0; rc == 0 && lres && i < B; i++) {
            const Carls__FeatureRecord *r = lres->records[i];
            if (r->found && r->label_case == CARLS__FEATURE_RECORD__LABEL_INT_LABEL && r->int_label >= 0) {
                f->plabel[i] = (int32_t)r->int_label;
                f->pconf[i] = r->label_confidence;
                f->pver[i] = r->version;
            }
        }
    }
    if (rc == 0 && gpend) {
        rc = s_wait_features(p, &gpend, &gres, f, p->cfg.graph_table);
        for (int i = 0; rc == 0 && gres && i < B; i++) {
            const Carls__FeatureRecord *r = gres->records[i];
            size_t have = r->found ? r->n_neighbor_keys : 0;
            have = have < r->n_neighbor_weights ? have : r->n_neighbor_weights;
            for (int j = 0; j < K && (size_t)j < have; j++) {
                uint32_t it = carls_key_item(r->neighbor_keys[j].data, r->neighbor_keys[j].len);
                if (it != TRAINER_NO_ITEM && (int64_t)it < p->cfg.n_items) {
                    f->nbr[i * K + j] = it;
                    f->w[i * K + j] = r->neighbor_weights[j];
                }
            }
        }
    }
    kb_cluster_pending_destroy(p->bank, &lpend); /* after a failure: what is still in flight is dropped */
    kb_cluster_pending_destroy(p->bank, &gpend);
    kb_feature_result_destroy(&lres);
    kb_feature_result_destroy(&gres);
    if (rc == 0 && p->cfg.emb_table) {
        rc = s_read_rows(p, f);
        if (rc == 0 && p->cfg.aggregate) {
            s_aggregate(p, f);
        } else if (rc == 0) {
            s_copy_rows(p, f);
        }
    }
    if (rc != 0 && s_unreachable(p, rc)) {
        /* Requests may still be in flight on these connections: dropping them forgets them. */
        kb_cluster_destroy(&p->bank);
        p->away = true;
        p->away_since_ms = carls_monotonic_ms();
        p->next_probe_ms = p->away_since_ms + p->cfg.probe_ms;
        p->away_skipped = 1;
        LOG_WARN("bank unreachable (%s): training on without its neighbours and pseudo-labels, probing it every "
                 "%d ms",
                 f->err, p->cfg.probe_ms);
        rc = TRAINER_FETCH_SKIPPED;
    }
    p->batches++;
    f->rc = rc;
    f->fetch_ms = (double)(carls_monotonic_us() - t0) / 1e3;
}

static void *s_thread(void *arg)
{
    trainer_prefetch_t *p = arg;
    pthread_mutex_lock(&p->mutex);
    for (;;) {
        while (!p->stop && p->done == p->submitted) {
            pthread_cond_wait(&p->cond, &p->mutex);
        }
        if (p->stop) {
            break;
        }
        trainer_fetch_t *f = &p->slot[p->done % S_SLOTS];
        pthread_mutex_unlock(&p->mutex);
        s_fetch(p, f);
        pthread_mutex_lock(&p->mutex);
        p->done++;
        pthread_cond_broadcast(&p->cond);
    }
    pthread_mutex_unlock(&p->mutex);
    return NULL;
}

trainer_prefetch_t *trainer_prefetch_new(const trainer_prefetch_config_t *cfg)
{
    assert(cfg && cfg->K >= 0 && cfg->max_batch >= 1 && cfg->n_items >= 1);
    trainer_prefetch_t *p = carls_xcalloc(1, sizeof *p);
    p->cfg = *cfg;
    p->cfg.timeout_ms = cfg->timeout_ms > 0 ? cfg->timeout_ms : 5000;
    p->cfg.probe_ms = cfg->probe_ms > 0 ? cfg->probe_ms : 250;
    p->cfg.probe_timeout_ms = cfg->probe_timeout_ms > 0 ? cfg->probe_timeout_ms : 200;
    if (cfg->curve) {
        p->use_curve = true;
        p->curve = *cfg->curve;
        p->cfg.curve = NULL; /* the copy above is the one used */
    }
    p->bank = s_connect(p, p->cfg.timeout_ms);
    if (!p->bank) {
        explicit_bzero(&p->curve, sizeof p->curve);
        free(p);
        return NULL;
    }
    const size_t MB = (size_t)cfg->max_batch, K = (size_t)(cfg->K > 0 ? cfg->K : 1);
    const size_t E = (size_t)(cfg->E > 0 ? cfg->E : 1);
    for (int s = 0; s < S_SLOTS; s++) {
        trainer_fetch_t *f = &p->slot[s];
        f->items = carls_xcalloc(MB, sizeof *f->items);
        f->nbr = carls_xcalloc(MB * K, sizeof *f->nbr);
        f->w = carls_xcalloc(MB * K, sizeof *f->w);
        const bool agg = cfg->emb_table && cfg->aggregate;
        f->nbr_emb = cfg->emb_table && !agg ? carls_xcalloc(MB * K * E, sizeof *f->nbr_emb) : NULL;
        f->agg_mean = agg ? carls_xcalloc(MB * E, sizeof *f->agg_mean) : NULL;
        f->agg_sq = agg ? carls_xcalloc(MB, sizeof *f->agg_sq) : NULL;
        f->agg_wsum = agg ? carls_xcalloc(MB, sizeof *f->agg_wsum) : NULL;
        f->nbr_ver = carls_xcalloc(MB * K, sizeof *f->nbr_ver);
        f->nbr_have = carls_xcalloc(MB * K, sizeof *f->nbr_have);
        f->plabel = carls_xcalloc(MB, sizeof *f->plabel);
        f->pconf = carls_xcalloc(MB, sizeof *f->pconf);
        f->pver = carls_xcalloc(MB, sizeof *f->pver);
    }
    p->ikeys = carls_xcalloc(MB, sizeof *p->ikeys);
    p->key_text = carls_xcalloc(MB * K + MB, S_KEY);
    p->ukeys = carls_xcalloc(MB * K, sizeof *p->ukeys);
    p->uitems = carls_xcalloc(MB * K, sizeof *p->uitems);
    p->uread = carls_xcalloc(MB * K, sizeof *p->uread);
    p->pos = carls_xmalloc(sizeof *p->pos * (size_t)cfg->n_items);
    for (int i = 0; i < cfg->n_items; i++) {
        p->pos[i] = -1;
    }
    p->uvals = cfg->emb_table ? carls_xcalloc(MB * K * E, sizeof *p->uvals) : NULL;
    p->umeta = carls_xcalloc(MB * K, sizeof *p->umeta);
    if (cfg->emb_table) {
        const size_t N = (size_t)cfg->n_items;
        p->row = carls_xcalloc(N * E, sizeof *p->row);
        p->row_sq = carls_xcalloc(N, sizeof *p->row_sq);
        p->row_ver = carls_xcalloc(N, sizeof *p->row_ver);
        p->row_read_at = carls_xmalloc(N * sizeof *p->row_read_at);
        for (size_t i = 0; i < N; i++) {
            p->row_read_at[i] = -1;
        }
        p->row_have = carls_xcalloc(N, sizeof *p->row_have);
        p->acc = carls_xcalloc(E, sizeof *p->acc);
    }
    pthread_mutex_init(&p->mutex, NULL);
    pthread_cond_init(&p->cond, NULL);
    if (pthread_create(&p->thread, NULL, s_thread, p) != 0) {
        LOG_ERROR("cannot start the prefetch thread");
        pthread_mutex_destroy(&p->mutex);
        pthread_cond_destroy(&p->cond);
        p->stop = -1; /* no thread to join */
        trainer_prefetch_destroy(&p);
        return NULL;
    }
    return p;
}

void trainer_prefetch_destroy(trainer_prefetch_t **self_p)
{
    if (!self_p || !*self_p) {
        return;
    }
    trainer_prefetch_t *p = *self_p;
    if (p->stop != -1) {
        pthread_mutex_lock(&p->mutex);
        p->stop = 1;
        pthread_cond_broadcast(&p->cond);
        pthread_mutex_unlock(&p->mutex);
        pthread_join(p->thread, NULL);
        pthread_mutex_destroy(&p->mutex);
        pthread_cond_destroy(&p->cond);
    }
    for (int s = 0; s < S_SLOTS; s++) {
        trainer_fetch_t *f = &p->slot[s];
        free(f->items);
        free(f->nbr);
        free(f->w);
        free(f->nbr_emb);
        free(f->agg_mean);
        free(f->agg_sq);
        free(f->agg_wsum);
        free(f->nbr_ver);
        free(f->nbr_have);
        free(f->plabel);
        free(f->pconf);
        free(f->pver);
    }
    free(p->ikeys);
    free(p->key_text);
    free(p->ukeys);
    free(p->uitems);
    free(p->uread);
    free(p->row);
    free(p->row_sq);
    free(p->row_ver);
    free(p->row_read_at);
    free(p->row_have);
    free(p->acc);
    free(p->pos);
    free(p->uvals);
    free(p->umeta);
    kb_cluster_destroy(&p->bank);
    explicit_bzero(&p->curve, sizeof p->curve);
    free(p);
    *self_p = NULL;
}

int trainer_prefetch_submit(trainer_prefetch_t *self, const uint32_t *items, int B, uint64_t step)
{
    assert(B >= 1 && B <= self->cfg.max_batch);
    pthread_mutex_lock(&self->mutex);
    if (self->submitted - self->taken >= S_SLOTS) {
        pthread_mutex_unlock(&self->mutex);
        assert(!"trainer_prefetch_submit: every result slot is queued or held");
        return -1;
    }
    trainer_fetch_t *f = &self->slot[self->submitted % S_SLOTS];
    f->B = B;
    f->step = step;
    memcpy(f->items, items, sizeof *items * (size_t)B);
    self->submitted++;
    pthread_cond_broadcast(&self->cond);
    pthread_mutex_unlock(&self->mutex);
    return 0;
}

const trainer_fetch_t *trainer_prefetch_wait(trainer_prefetch_t *self, double *wait_ms)
{
    int64_t t0 = carls_monotonic_us();
    pthread_mutex_lock(&self->mutex);
    assert(self->taken < self->submitted);
    while (self->done <= self->taken) {
        pthread_cond_wait(&self->cond, &self->mutex);
    }
    const trainer_fetch_t *f = &self->slot[self->taken % S_SLOTS];
    self->taken++;
    pthread_mutex_unlock(&self->mutex);
    if (wait_ms) {
        *wait_ms = (double)(carls_monotonic_us() - t0) / 1e3;
    }
    return f;
}

double trainer_fetch_graph_term(const trainer_fetch_t *f, const float *h, int E, float coef, float *dh)
{
    double graph = 0.0;
    for (int i = 0; i < f->B; i++) {
        if (f->agg_wsum[i] <= 0.0f) {
            continue;
        }
        const float *hi = h + (size_t)i * E, *mi = f->agg_mean + (size_t)i * E;
        float *gi = dh + (size_t)i * E;
        double hh = 0.0, hm = 0.0;
        for (int e = 0; e < E; e++) {
            hh += (double)hi[e] * hi[e];
            hm += (double)hi[e] * mi[e];
            gi[e] += 2.0f * coef * (hi[e] - mi[e]);
        }
        const double d2 = hh - 2.0 * hm + (double)f->agg_sq[i];
        graph += (double)coef * (d2 > 0.0 ? d2 : 0.0); /* >= 0 exactly; rounding can dip below */
    }
    return graph;
}
