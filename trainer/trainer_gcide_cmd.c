/* trainer gcide-tfidf: loads the GCIDE reverse dictionary (data_gcide.h), holds out definitions, and ranks
 * every headword for each held-out definition with the TF-IDF baseline (trainer_tfidf.h). The numbers a
 * trained model (trainer twotower) has to beat. */
#include "trainer.h"
#include "trainer_rank.h"
#include "trainer_tfidf.h"

#include "carls_args.h"
#include "data_gcide.h"
#include "log.h"
#include "util.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    const char *index, *dict;     /* NULL: the Debian paths */
    uint64_t seed;
    bool seeded;                  /* --holdout-seed was given */
    const char *holdout_file;     /* instead of the seed */
    int count;                    /* headwords to hold a definition out for */
    const char *write_holdout;
    bool stats;
} s_opts_t;

static void s_usage(FILE *out)
{
    fprintf(out,
            "usage: trainer gcide-tfidf [options]\n"
            "Reverse dictionary on GCIDE (Debian package dict-gcide): holds out one definition of each of\n"
            "--holdout-count headwords and ranks every headword for it by TF-IDF cosine against the headwords'\n"
            "training definitions. Prints the parse statistics, then (last line) r1 r10 r100 median_rank mrr n.\n"
            "  --index F            dictd index (default " DATA_GCIDE_INDEX ")\n"
            "  --dict F             dictionary, dictzip or plain (default " DATA_GCIDE_DICT ")\n"
            "  --holdout-seed S     draw the held-out definitions with seed S (default 0)\n"
            "  --holdout-file F     hold out the 'headword<TAB>sense number' lines of F instead\n"
            "  --holdout-count N    headwords to hold a definition out for (default 2000)\n"
            "  --write-holdout F    write the hold-out in the format --holdout-file reads\n"
            "  --stats              more parse statistics (articles, dropped senses, senses per headword)\n");
}

/* --holdout-seed S: the s_opts_t out's seed, and it was given (it excludes --holdout-file). */
static int s_arg_seed(const char *prog, const char *name, const char *text, void *out)
{
    s_opts_t *o = out;
    if (carls_parse_u64(text, &o->seed) != 0) {
        fprintf(stderr, "%s: --%s: '%s' is not a number\n", prog, name, text);
        return -1;
    }
    o->seeded = true;
    return 0;
}

/* Parses the options; returns 0, 1 after --help, or 2 on bad usage. */
static int s_parse(int argc, char **argv, s_opts_t *o)
{
    *o = (s_opts_t){.count = 2000};
    const carls_arg_t args[] = {
        carls_arg_string("index", &o->index),
        carls_arg_string("dict", &o->dict),
        carls_arg_custom("holdout-seed", o, s_arg_seed),
        carls_arg_string("holdout-file", &o->holdout_file),
        carls_arg_int("holdout-count", &o->count, 1, 1000000),
        carls_arg_string("write-holdout", &o->write_holdout),
        carls_arg_set("stats", &o->stats),
        {0},
    };
    const int rc = carls_args_parse("trainer gcide-tfidf", argc, argv, args, s_usage);
    if (rc != 0) {
        return rc > 0 ? 1 : 2;
    }
    if (o->seeded && o->holdout_file) {
        fprintf(stderr, "trainer: --holdout-seed and --holdout-file exclude each other\n");
        s_usage(stderr);
        return 2;
    }
    return 0;
}

/* The histogram of senses per headword (1, 2, ..., 9, 10+) and the longest. */
static void s_print_detail(const data_gcide_t *g)
{
    const data_gcide_stats_t *st = &g->stats;
    printf("gcide_detail index_lines=%zu articles=%zu senses_parsed=%zu senses_masked_empty=%zu tokens=%zu\n",
           st->index_lines, st->articles, st->senses_parsed, st->senses_masked_empty, g->text->n_tokens);
    size_t hist[11] = {0}, most = 0, most_w = 0;
    for (size_t w = 0; w < g->n_words; w++) {
        size_t n = g->word_first_sense[w + 1] - g->word_first_sense[w];
        hist[n < 10 ? n : 10]++;
        if (n > most) {
            most = n;
            most_w = w;
        }
    }
    printf("gcide_senses_per_headword");
    for (int k = 1; k <= 10; k++)
        printf(" %s%d=%zu", k == 10 ? ">=" : "", k, hist[k]);
    printf(" most=%zu(%s)\n", most, g->n_words ? g->words[most_w] : "");
}

/* Ranks the truth for every held-out sense; fills m. Returns 0, or -1 when nothing is held out. */
static int s_evaluate(const data_gcide_t *g, rank_metrics_t *m)
{
    int64_t t0 = carls_monotonic_us();
    tfidf_t *t = NULL;
    tfidf_build(g, &t);
    int64_t t1 = carls_monotonic_us();
    float *scores = carls_xmalloc((g->n_words ? g->n_words : 1) * sizeof *scores);
    uint32_t *ranks = carls_xmalloc((g->n_held_out ? g->n_held_out : 1) * sizeof *ranks);
    size_t n = 0;
    for (size_t s = 0; s < g->n_senses; s++) {
        if (!g->senses[s].held_out)
            continue;
        tfidf_scores(t, g, s, scores);
        ranks[n++] = rank_of_truth(scores, g->n_words, g->senses[s].word);
    }
    int64_t t2 = carls_monotonic_us();
    printf("tfidf terms=%zu build_s=%.2f score_s=%.2f queries=%zu\n", tfidf_n_terms(t), (double)(t1 - t0) / 1e6,
           (double)(t2 - t1) / 1e6, n);
    rank_metrics(ranks, n, m);
    free(scores);
    free(ranks);
    tfidf_destroy(&t);
    return n ? 0 : -1;
}

int trainer_gcide_tfidf_main(int argc, char **argv)
{
    s_opts_t o;
    int prc = s_parse(argc, argv, &o);
    if (prc)
        return prc == 1 ? 0 : 2;
    char err[1024];
    data_gcide_t *g = NULL;
    if (data_gcide_load(o.index, o.dict, &g, err, sizeof err) != 0) {
        LOG_ERROR("gcide-tfidf: %s", err);
        return 1;
    }
    int rc = 1;
    int hrc = o.holdout_file ? data_gcide_holdout_file(g, o.holdout_file, err, sizeof err)
                             : data_gcide_holdout_seed(g, o.seed, (size_t)o.count, err, sizeof err);
    if (hrc != 0) {
        LOG_ERROR("gcide-tfidf: %s", err);
        goto cleanup;
    }
    if (o.write_holdout && data_gcide_holdout_write(g, o.write_holdout) != 0) {
        LOG_ERROR("gcide-tfidf: writing %s: %s", o.write_holdout, strerror(errno));
        goto cleanup;
    }
    const data_gcide_stats_t *st = &g->stats;
    printf("gcide headwords=%zu senses=%zu training_pairs=%zu held_out=%zu headword_in_definition=%.4f "
           "load_s=%.2f\n",
           g->n_words, g->n_senses, g->n_senses - g->n_held_out, g->n_held_out,
           st->senses_parsed ? (double)st->senses_with_headword / (double)st->senses_parsed : 0.0,
           st->load_ms / 1000.0);
    if (o.stats)
        s_print_detail(g);
    rank_metrics_t m;
    if (s_evaluate(g, &m) != 0) {
        LOG_ERROR("gcide-tfidf: no held-out definitions to rank");
        goto cleanup;
    }
    rank_metrics_print(stdout, NULL, &m);
    rc = 0;
cleanup:
    data_gcide_destroy(&g);
    return rc;
}
