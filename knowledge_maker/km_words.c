/* kb-maker --task words (see km_words.h). */
#include "km_words.h"
#include "km_watch.h"

#include "data_gcide.h"
#include "data_gcide_bags.h"
#include "data_idf.h"
#include "data_pairs.h"
#include "kb_cluster.h"
#include "log.h"
#include "nn_tower.h"
#include "protocol.h"
#include "util.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define KM_WORDS_CHUNK 2048 /* headwords computed and put per bank round */

typedef struct {
    const km_opts_t *o;
    data_gcide_t *g;
    const char **share;     /* (n_share) this worker's headwords */
    size_t n_share;
    uint32_t *share_idx;    /* (n_share) their indices in g->words */
    kb_cluster_t *kb;
    km_watch_t *watch;
    /* definition bags (checkpoints with "word.defs"): built once, from the trainer's hold-out */
    bool have_bags;
    bool have_vecx;         /* PREFIX.vecx exists (checked on every checkpoint until it does) */
    data_idf_t idf;
    data_gcide_bags_t bags;
    char word[160], gram[160], vec[160], vecx[160];
} s_words_t;

static int s_setup(s_words_t *w, const km_opts_t *o)
{
    char err[1024] = "";
    w->o = o;
    if (!carls_table_name_valid(o->prefix) || strlen(o->prefix) + 6 > 128) {
        LOG_ERROR("--tables '%s': not a usable prefix", o->prefix);
        return -1;
    }
    snprintf(w->word, sizeof w->word, "%s.word", o->prefix);
    snprintf(w->gram, sizeof w->gram, "%s.gram", o->prefix);
    snprintf(w->vec, sizeof w->vec, "%s.vec", o->prefix);
    snprintf(w->vecx, sizeof w->vecx, "%s.vecx", o->prefix);
    int64_t t0 = carls_monotonic_us();
    if (data_pairs_is_spec(o->data) ? data_pairs_load(o->data, &w->g, err, sizeof err) != 0
                                    : data_gcide_load(o->gcide_index, o->gcide_dict, &w->g, err, sizeof err) != 0) {
        LOG_ERROR("%s", err);
        return -1;
    }
    w->share = carls_xmalloc((w->g->n_words / o->workers + 1) * sizeof *w->share);
    w->share_idx = carls_xmalloc((w->g->n_words / o->workers + 1) * sizeof *w->share_idx);
    for (size_t i = o->worker; i < w->g->n_words; i += o->workers) {
        w->share_idx[w->n_share] = (uint32_t)i;
        w->share[w->n_share++] = w->g->words[i];
    }
    /* Patient with the bank: a maker waits across a bank restart (--bank-wait-s) instead of exiting. */
    int timeout_ms = o->bank_timeout_ms > 0 ? o->bank_timeout_ms : 10000;
    kb_client_curve_t keys;
    kb_client_options_t copts = {.timeout_ms = timeout_ms, .retries = (int)((int64_t)o->bank_wait_s * 1000 / timeout_ms)};
    if (kb_curve_args_options(&o->curve, "kb-maker", &keys, &copts) != 0)
        return -1;
    w->kb = kb_cluster_new(o->kb, &copts);
    explicit_bzero(&keys, sizeof keys);
    if (!w->kb)
        return -1;
    w->watch = km_watch_new(o->ckpt_dir, o->poll_ms);
    if (!w->watch)
        return -1;
    LOG_INFO("kb-maker words: worker %u/%u, %zu of %zu headwords (data loaded in %.1f s), tables %s -> %s, "
             "watching %s", o->worker, o->workers, w->n_share, w->g->n_words,
             (double)(carls_monotonic_us() - t0) / 1e6, w->word, w->vec, o->ckpt_dir);
    return 0;
}

static void s_teardown(s_words_t *w)
{
    km_watch_destroy(&w->watch);
    kb_cluster_destroy(&w->kb);
    data_gcide_bags_free(&w->bags);
    data_idf_free(&w->idf);
    free(w->share);
    free(w->share_idx);
    data_gcide_destroy(&w->g);
}

/* Definition bags of the share, left out of them exactly the senses the trainer holds out (it writes its
 * hold-out into the checkpoint directory), with the trainer's IDF weights (from the same training senses). */
static int s_build_bags(s_words_t *w)
{
    char path[4200], err[1024] = "";
    snprintf(path, sizeof path, "%s/%s", w->o->ckpt_dir, NN_TOWER_HOLDOUT_FILE);
    if (data_gcide_holdout_file(w->g, path, err, sizeof err) != 0) {
        LOG_ERROR("the checkpoint's word tower pools definitions, but the trainer's hold-out is unreadable: %s", err);
        return -1;
    }
    data_gcide_idf_build(&w->idf, w->g);
    data_gcide_bags_build(&w->bags, w->g, &w->idf, w->share_idx, w->n_share, NN_TOWER_DEF_SENSES,
                          NN_TOWER_DEF_TOKENS);
    w->have_bags = true;
    LOG_INFO("definition bags: %zu held-out senses left out (%s), %zu words pooled over %zu headwords",
             w->g->n_held_out, path, w->bags.off[w->n_share], w->n_share);
    return 0;
}

/* nn_tower_word_vectors' row fetcher over the bank (ctx: the kb_cluster_t). */
static int s_fetch_rows(void *kb, const char *table, const nn_key_t *keys, size_t n, int dim, float *rows)
{
    return kb_cluster_lookup_ex(kb, table, keys, n, (uint32_t)dim, true, rows, NULL);
}

/* Recomputes and puts the share's vectors from one checkpoint. 0, -1 when the bank failed, -2 when the
 * checkpoint is not a two-tower model's. */
static int s_step(s_words_t *w, const carls_ckpt_t *ck, volatile sig_atomic_t *stop)
{
    char err[256];
    nn_tower_head_t head;
    if (nn_tower_from_ckpt(ck, "word", &head, err, sizeof err) != 0) {
        LOG_ERROR("checkpoint step %" PRIu64 ": %s", carls_ckpt_step(ck), err);
        return -2;
    }
    if (head.defs > 0 && !w->have_bags && s_build_bags(w) != 0)
        return -2;
    if (!w->have_vecx) {
        kb_cluster_table_t info;
        kb_cluster_forget_tables(w->kb);
        w->have_vecx = kb_cluster_table(w->kb, w->vecx, &info) == 0 && info.dim == (uint32_t)head.E;
    }
    uint64_t step = carls_ckpt_step(ck);
    int64_t t0 = carls_monotonic_us();
    float *vec = carls_xmalloc((size_t)KM_WORDS_CHUNK * head.D * sizeof(float));
    float *vecx = carls_xmalloc((size_t)KM_WORDS_CHUNK * head.E * sizeof(float));
    kb_key_t *keys = carls_xmalloc(KM_WORDS_CHUNK * sizeof *keys);
    int rc = 0;
    size_t done = 0;
    for (size_t at = 0; at < w->n_share && rc == 0 && !*stop; at += KM_WORDS_CHUNK) {
        size_t n = w->n_share - at < KM_WORDS_CHUNK ? w->n_share - at : KM_WORDS_CHUNK;
        /* The bags of share[at ..]: the same arrays, offsets read from position at. */
        nn_tower_bags_t view = {0};
        if (head.defs > 0)
            view = (nn_tower_bags_t){(const char *const *)w->bags.tok, w->bags.len, w->bags.weight, w->bags.off + at};
        rc = nn_tower_word_vectors(s_fetch_rows, w->kb, w->word, w->gram, w->share + at, n,
                                   head.defs > 0 ? &view : NULL, &head, vec, vecx);
        for (size_t i = 0; i < n && rc == 0; i++)
            keys[i] = (kb_key_t){w->share[at + i], strlen(w->share[at + i])};
        if (rc == 0)
            rc = kb_cluster_put(w->kb, w->vec, keys, n, (uint32_t)head.D, vec, step);
        /* The pooled inputs too, when the trainer made the table (it draws its negatives from it). */
        if (rc == 0 && w->have_vecx)
            rc = kb_cluster_put(w->kb, w->vecx, keys, n, (uint32_t)head.E, vecx, step);
        if (rc != 0)
            LOG_ERROR("step %" PRIu64 ": the bank failed: %s", step, kb_cluster_last_error(w->kb));
        done += rc == 0 ? n : 0;
    }
    double secs = (double)(carls_monotonic_us() - t0) / 1e6;
    uint64_t latest = km_watch_latest_step(w->watch);
    LOG_INFO("kb-maker words %u/%u: step %" PRIu64 ": %zu headwords in %.2f s (%.0f/s); trainer at step %" PRIu64
             " (%" PRIu64 " ahead)",
             w->o->worker, w->o->workers, step, done, secs, (double)done / (secs + 1e-9), latest,
             latest > step ? latest - step : 0);
    free(vec);
    free(vecx);
    free(keys);
    return rc == 0 ? 0 : -1;
}

int km_words_run(const km_opts_t *o, volatile sig_atomic_t *stop)
{
    s_words_t w;
    memset(&w, 0, sizeof w);
    int rc = 1;
    if (s_setup(&w, o) != 0)
        goto out;
    uint64_t done = 0, last = 0;
    while (!*stop) {
        carls_ckpt_t *ck = NULL;
        char path[4200];
        if (km_watch_next(w.watch, -1, stop, &ck, path, sizeof path) != 1)
            break;
        int r = s_step(&w, ck, stop);
        last = carls_ckpt_step(ck);
        carls_ckpt_destroy(&ck);
        /* A bank failure that outlived the client's retries: log it and wait for the next checkpoint rather
         * than leave the fleet one maker short. A bad checkpoint (wrong kind) is fatal: the maker was
         * pointed at the wrong directory. */
        if (r == -2)
            goto out;
        done += r == 0;
        if (o->once)
            break;
    }
    LOG_INFO("kb-maker words worker %u/%u: %" PRIu64 " checkpoints processed (last step %" PRIu64 "), %" PRIu64
             " refused; %s", o->worker, o->workers, done, last, km_watch_refused(w.watch),
             *stop ? "stopped by signal" : "done");
    rc = 0;
out:
    s_teardown(&w);
    return rc;
}
