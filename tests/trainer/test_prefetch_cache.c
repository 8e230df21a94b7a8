/* The prefetcher's neighbour-row cache and its per-item aggregates (trainer_prefetch.h), against a real
 * kb-server:
 *   - the aggregates (weighted mean, mean square, weight sum, counters) and trainer_fetch_graph_term equal
 *     what the neighbours' rows themselves give (a second prefetcher that copies rows, no cache);
 *   - a cached row is not read again before refresh_batches batches: a new version written meanwhile is seen
 *     only after that, and then by every item that has the row as a neighbour;
 *   - rows no maker wrote are counted missing, rows older than max_staleness at the batch's step stale, and
 *     neither contributes. */
#include "maker_testlib.h"
#include "server_harness.h"

#include "prefetch_bank.h"
#include "trainer_prefetch.h"

#include <math.h>
#include <string.h>

#define S_N 60       /* items */
#define S_WRITTEN 50 /* items with an embedding; the rest are missing */
#define S_K 6
#define S_E 8
#define S_B 10
#define S_REFRESH 3
#define S_MAX_AGE 20

static float s_value(uint32_t item, int e, int generation)
{
    return sinf(0.37f * (float)item + (float)e) + (float)generation;
}

/* Submits the batch 0..S_B-1 for step and waits for it. */
static const trainer_fetch_t *s_batch(trainer_prefetch_t *pf, uint64_t step)
{
    uint32_t items[S_B];
    for (int i = 0; i < S_B; i++) {
        items[i] = (uint32_t)i;
    }
    MT_CHECK(trainer_prefetch_submit(pf, items, S_B, step) == 0, "submit");
    const trainer_fetch_t *f = trainer_prefetch_wait(pf, NULL);
    MT_CHECK(f->rc == 0, "fetch failed: %s", f->err);
    return f;
}

/* What the aggregates of batch `agg` should be, from the rows of batch `rows` (same items, rows copied). */
typedef struct {
    float mean[S_B * S_E], sq[S_B], wsum[S_B];
    int64_t used, missing;
} s_expect_t;

static void s_expect(const trainer_fetch_t *rows, s_expect_t *x)
{
    memset(x, 0, sizeof *x);
    for (int i = 0; i < S_B; i++) {
        double wsum = 0, sq = 0, mean[S_E] = {0};
        for (int j = 0; j < S_K; j++) {
            const int s = i * S_K + j;
            if (rows->nbr[s] == TRAINER_NO_ITEM) {
                continue;
            }
            if (!rows->nbr_have[s]) {
                x->missing++;
                continue;
            }
            x->used++;
            if (rows->w[s] <= 0.0f) {
                continue;
            }
            const float *h = rows->nbr_emb + (size_t)s * S_E;
            wsum += rows->w[s];
            for (int e = 0; e < S_E; e++) {
                mean[e] += rows->w[s] * h[e];
                sq += (double)rows->w[s] * h[e] * h[e];
            }
        }
        x->wsum[i] = (float)wsum;
        x->sq[i] = wsum > 0 ? (float)(sq / wsum) : 0.0f;
        for (int e = 0; e < S_E; e++) {
            x->mean[i * S_E + e] = wsum > 0 ? (float)(mean[e] / wsum) : 0.0f;
        }
    }
}

static int s_close(double a, double b)
{
    return fabs(a - b) <= 1e-4 * (1.0 + fabs(b));
}

/* The aggregates of f against x; returns the number of mismatches. */
static int s_check_aggregates(const trainer_fetch_t *f, const s_expect_t *x, const char *what)
{
    int bad = 0;
    for (int i = 0; i < S_B; i++) {
        bad += !s_close(f->agg_wsum[i], x->wsum[i]) || !s_close(f->agg_sq[i], x->sq[i]);
        for (int e = 0; e < S_E; e++) {
            bad += !s_close(f->agg_mean[i * S_E + e], x->mean[i * S_E + e]);
        }
    }
    MT_CHECK(bad == 0, "%s: %d aggregate values differ from the rows'", what, bad);
    MT_CHECK(f->nbr_used == x->used && f->nbr_missing == x->missing && f->nbr_stale == 0,
             "%s: used %lld missing %lld stale %lld, want %lld and %lld and 0", what, (long long)f->nbr_used,
             (long long)f->nbr_missing, (long long)f->nbr_stale, (long long)x->used, (long long)x->missing);
    return bad;
}

/* The bank: several items share neighbours, some of which (S_WRITTEN and above) have no row. */
static uint32_t s_neighbor(uint32_t item, uint32_t j)
{
    return (item * 7 + j * 13 + 1) % S_N;
}

static float s_weight(uint32_t item, uint32_t j)
{
    if (item == 3 && j == 5)
        return 0.0f; /* a zero-weight edge counts as used but adds nothing */
    return 0.5f + 0.25f * (float)j;
}

static float s_value0(uint32_t item, uint32_t c)
{
    return s_value(item, (int)c, 0);
}

int main(void)
{
    test_server_t srv;
    const pt_bank_spec_t spec = {.n = S_N, .k = S_K, .e = S_E, .n_emb = S_WRITTEN,
                                 .neighbor = s_neighbor, .weight = s_weight, .value = s_value0};
    km_bank_t *bank = pt_start_bank(&srv, &spec);
    if (!bank) {
        return 1;
    }

    trainer_prefetch_config_t rows_cfg = {
        .endpoints = srv.endpoint, .graph_table = "t.graph", .emb_table = "t.emb", .K = S_K, .E = S_E,
        .max_batch = S_B, .n_items = S_N, .timeout_ms = 5000,
    };
    trainer_prefetch_config_t agg_cfg = rows_cfg;
    agg_cfg.aggregate = true;
    agg_cfg.refresh_batches = S_REFRESH;
    agg_cfg.max_staleness = S_MAX_AGE;
    trainer_prefetch_t *rows = trainer_prefetch_new(&rows_cfg), *agg = trainer_prefetch_new(&agg_cfg);
    MT_CHECK(rows && agg, "trainer_prefetch_new");
    if (!rows || !agg) {
        return 1;
    }

    /* Batch 0 (step 10): everything read, aggregates equal the rows'. */
    s_expect_t x0, x1;
    const trainer_fetch_t *fr = s_batch(rows, 10);
    s_expect(fr, &x0);
    MT_CHECK(x0.missing > 0 && x0.used > 0, "the graph should reach both written and missing items");
    const trainer_fetch_t *fa = s_batch(agg, 10);
    MT_CHECK(fa->distinct == fr->distinct && fa->fetched == fa->distinct && fa->distinct > 0,
             "first batch: distinct %d (rows %d), read %d", fa->distinct, fr->distinct, fa->fetched);
    s_check_aggregates(fa, &x0, "batch 0");
    MT_CHECK(s_close(fa->staleness_sum, 3.0 * (double)x0.used), "staleness sum %g, want %g", fa->staleness_sum,
             3.0 * (double)x0.used);

    /* The graph term from the aggregates = the sum over the rows. */
    float h[S_B * S_E], dh[S_B * S_E] = {0}, want_dh[S_B * S_E] = {0};
    for (int i = 0; i < S_B * S_E; i++) {
        h[i] = cosf(0.11f * (float)i);
    }
    const float coef = 0.3f;
    double want_graph = 0.0;
    for (int i = 0; i < S_B; i++) {
        for (int j = 0; j < S_K; j++) {
            const int s = i * S_K + j;
            if (fr->nbr[s] == TRAINER_NO_ITEM || !fr->nbr_have[s] || fr->w[s] <= 0.0f || x0.wsum[i] <= 0.0f) {
                continue;
            }
            const double wt = coef * fr->w[s] / x0.wsum[i];
            for (int e = 0; e < S_E; e++) {
                const double d = h[i * S_E + e] - fr->nbr_emb[(size_t)s * S_E + (size_t)e];
                want_graph += wt * d * d;
                want_dh[i * S_E + e] += (float)(2.0 * wt * d);
            }
        }
    }
    const double graph = trainer_fetch_graph_term(fa, h, S_E, coef, dh);
    MT_CHECK(want_graph > 0 && s_close(graph, want_graph), "graph term %g, want %g", graph, want_graph);
    int bad_dh = 0;
    for (int i = 0; i < S_B * S_E; i++) {
        bad_dh += !s_close(dh[i], want_dh[i]);
    }
    MT_CHECK(bad_dh == 0, "%d gradient values differ", bad_dh);

    /* A maker writes a new generation; the cached rows stay in use until refresh_batches batches passed. */
    static uint32_t items[S_N];
    static float emb[S_N * S_E];
    for (uint32_t i = 0; i < S_N; i++) {
        items[i] = i;
        for (int e = 0; e < S_E; e++) {
            emb[i * S_E + (uint32_t)e] = s_value(i, e, 1);
        }
    }
    MT_CHECK(km_bank_put(bank, "t.emb", items, S_WRITTEN, S_E, emb, 9) == 0, "put: %s", km_bank_error(bank));
    for (uint64_t b = 1; b < S_REFRESH; b++) {
        fa = s_batch(agg, 10 + b);
        MT_CHECK(fa->fetched == 0, "batch %llu read %d rows from the bank; the cache should serve them",
                 (unsigned long long)b, fa->fetched);
        s_check_aggregates(fa, &x0, "a batch served from the cache");
    }
    fr = s_batch(rows, 10 + S_REFRESH);
    s_expect(fr, &x1);
    MT_CHECK(!s_close(x1.mean[0], x0.mean[0]), "the new generation should change the rows");
    fa = s_batch(agg, 10 + S_REFRESH);
    MT_CHECK(fa->fetched == fa->distinct, "after %d batches every row is read again (%d of %d)", S_REFRESH,
             fa->fetched, fa->distinct);
    s_check_aggregates(fa, &x1, "after the refresh");
    MT_CHECK(s_close(fa->staleness_sum, (double)(10 + S_REFRESH - 9) * (double)x1.used), "staleness sum %g",
             fa->staleness_sum);

    /* Far later: every row is older than max_staleness, so nothing is used. */
    fa = s_batch(agg, 9 + S_MAX_AGE + 1);
    MT_CHECK(fa->nbr_used == 0 && fa->nbr_stale == x1.used && fa->nbr_missing == x1.missing,
             "stale batch: used %lld stale %lld missing %lld", (long long)fa->nbr_used, (long long)fa->nbr_stale,
             (long long)fa->nbr_missing);
    memset(dh, 0, sizeof dh);
    MT_CHECK(trainer_fetch_graph_term(fa, h, S_E, coef, dh) == 0.0 && dh[0] == 0.0f && dh[S_B * S_E - 1] == 0.0f,
             "stale neighbours contributed to the graph term");

    km_bank_destroy(&bank);
    trainer_prefetch_destroy(&rows);
    trainer_prefetch_destroy(&agg);
    MT_CHECK(test_server_cleanup(&srv) == 0, "kb-server did not shut down cleanly");
    return mt_finish("test_prefetch_cache", NULL);
}
