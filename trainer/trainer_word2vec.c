/* trainer word2vec: dictionary-free skip-gram with negative sampling through the knowledge bank
 * (DynamicEmbedding §3.1; tables described in trainer_w2v.h).
 *
 * One batch of about --batch-tokens corpus tokens (whole lines) goes through four stages:
 *   1. count:   the batch's words are looked up in NAME.count. In the trainer's first pass every token is
 *               sent (each occurrence counts one), later passes send each distinct word once with no_create.
 *               Together with it, --pool candidates are drawn from NAME.count by the bank's unigram^0.75
 *               sampler (one `sample` request per batch).
 *   2. lookup:  with the counts, tokens of words the bank has not admitted are dropped, frequent words are
 *               subsampled (word2vec's keep probability sqrt(t/f) + t/f, f = count / tokens counted), and the
 *               distinct kept words are looked up in NAME (input rows) and, with the sampled negatives, in
 *               NAME.out (output rows). Unseen words get their deterministic initial rows from the bank.
 *   3. compute: forward/backward over every (center, context) pair (nn_sgns_cpu), the gradient summed per
 *               distinct word, then pushed to NAME and NAME.out (one request each). The bank applies them
 *               with its optimizer and update policy (lazy average or immediate).
 *   4. finish:  the pushes' acknowledgements are collected.
 * Batches are pipelined with several requests in flight on each shard's client: while batch b is computed,
 * the lookups of b+1 and the count of b+2 are being served, and the pushes of b-1 acknowledged. Batch b+1 thus
 * reads rows that include the pushes of b-1 but not of b (one batch of staleness). Every request goes through
 * kb_cluster's send / wait calls: with a sharded bank (--kb a,b,...) lookups and pushes are split by key over
 * the shards, and the negatives are drawn by each shard's mass (a blocking call made when the batch is
 * prepared; with one shard the sample request is in flight like the others).
 *
 * Several trainers (--worker i/n, separate processes) train on separate slices of the corpus and push to the
 * same tables at the same time. */
#include "trainer.h"
#include "progress.h"
#include "trainer_util.h"
#include "trainer_w2v.h"

#include "carls_args.h"
#include "data_text.h"
#include "nn_sgns.h"

#include "kb_cluster.h"
#include "kb_curve_args.h"
#include "log.h"
#include "protocol.h"
#include "util.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define NONE UINT32_MAX
#define SLOTS 4

typedef struct {
    const char *corpus;
    const char *kb;
    const char *table;
    w2v_tables_t tables;
    uint32_t window, negatives, epochs;
    float subsample;
    uint32_t worker, workers;
    uint32_t batch_tokens;
    uint32_t pool;
    int lr_decay;          /* -1: default (linear for sgd, none for adagrad); 0 none; 1 linear */
    bool no_count;         /* --no-count: do not count the first pass's tokens in NAME.count */
    uint64_t seed;
    const char *export_path;
    const char *predict;   /* comma-separated words */
    uint32_t predict_k;
    uint32_t predict_eval; /* context-prediction pairs to score */
    bool tokenize_only;
    int timeout_ms, retries;
    kb_curve_args_t curve; /* --curve-key, --curve-server-key */
    const char *metrics;
} s_opts_t;

/* Timings of the whole run. */
typedef struct {
    int64_t wait_us;    /* blocked waiting for the bank's answers */
    int64_t compute_us; /* nn_sgns_cpu */
    int64_t requests;   /* requests sent to the bank's shards */
} s_io_t;

/* One batch in the pipeline. */
typedef struct {
    bool active;
    uint64_t index;          /* batch number (this trainer) */
    uint32_t epoch;
    bool counting;           /* first pass: every token counted */
    size_t tok0, tok1;       /* corpus tokens */
    size_t line0, line1;
    w2v_map_t map;           /* distinct words of the batch (then negative-only words) */
    uint32_t *tok_word;      /* (tok1-tok0) map index of each token */
    uint64_t *freq;          /* (map.n) bank count of each distinct word */
    uint32_t *row;           /* (map.n) output row of each word, NONE when not in the batch's rows */
    kb_key_t *keys;                  /* request keys (count lookup; then output rows' keys) */
    size_t keys_cap;
    uint32_t *tokens, *sent_end;     /* kept tokens (as rows) and sentence ends */
    uint32_t n_tokens, n_sents, n_words, n_out;
    uint32_t *pool;                  /* negative candidates as output rows */
    uint32_t n_pool;
    float *in_vec, *out_vec, *g_in, *g_out;
    size_t cap_in, cap_g_in, cap_out, cap_g_out; /* floats allocated in each */
    /* Requests in flight on the bank's shards (NULL: none); kb_cluster splits each by key over the shards. */
    kb_cluster_pending_t *count_req, *sample_req, *in_req, *out_req, *push_in_req, *push_out_req;
    bool sample_sent, vectors_sent;
    kb_sample_result_t *sample;      /* the negatives drawn; the map points into its keys until the slot's next
                                      * batch */
    double loss;
    uint64_t pairs;
} s_batch_t;

typedef struct {
    s_opts_t o;
    w2v_names_t names;
    data_text_t *text;
    kb_cluster_t *bank;
    s_io_t io;
    size_t line_first, line_end; /* this worker's slice */
    size_t slice_tokens;
    uint64_t tokens_counted;     /* tokens this trainer counted in its first pass */
    uint64_t total_tokens;       /* estimate of the corpus tokens the bank has counted (all workers) */
    uint64_t tokens_done;        /* corpus tokens trained over (all epochs) */
    uint64_t tokens_target;      /* slice_tokens * epochs */
    /* the next batch to prepare */
    uint32_t next_epoch;
    size_t next_line;
    uint64_t next_index;
    s_batch_t slot[SLOTS];
    carls_progress_t progress;
    uint32_t progress_epoch;
    double epoch_loss;
    uint64_t epoch_pairs;
    FILE *metrics;
} s_run_t;

static void s_usage(FILE *out)
{
    fprintf(out,
            "usage: trainer word2vec --corpus FILE|DIR|kjv --kb ENDPOINT --table NAME [options]\n"
            "Skip-gram with negative sampling whose vocabulary lives in the knowledge bank: every word's input\n"
            "and output vectors are rows of NAME and NAME.out keyed by the word; NAME.count counts the words.\n"
            "  --corpus FILE|DIR|kjv    UTF-8 plain text (one sentence per line); a directory: every file in it\n"
            "                           and its subdirectories, by path (names starting with . skipped); or the\n"
            "                           King James Bible from Debian's bible-kjv (verse references stripped).\n"
            "                           Words: runs of letters, apostrophes and non-ASCII bytes, ASCII\n"
            "                           lowercased, outer apostrophes dropped; anything else splits words\n"
            "                           (--tokenize-only prints them)\n"
            "  --kb ENDPOINTS           kb-server endpoint, or the comma-separated list of a sharded bank's\n"
            "                           endpoints in shard order (default $CARLS_KB or tcp://127.0.0.1:7070)\n"
            "  --table NAME             base name of the tables (default words)\n"
            "  --dim D                  vector size (default 100)\n"
            "  --window W               context window half-width, sampled 1..W per center (default 5)\n"
            "  --negatives K            negatives per (center, context) pair (default 5)\n"
            "  --epochs E               passes over this worker's slice (default 15; 0: no training)\n"
            "  --subsample T            subsampling threshold of frequent words (default 1e-3; 0: off)\n"
            "  --min-count N            admission: a word is trained once the bank has counted it N times\n"
            "                           (default 5)\n"
            "  --admission bloom|frequency|none  NAME.count's admission policy (default bloom: rare words get\n"
            "                           no row at all; frequency: kept in memory, never persisted)\n"
            "  --worker I/N             train on slice I of N of the corpus (default 0/1)\n"
            "  --batch-tokens N         corpus tokens per batch (default 8192 / N of --worker I/N, at least\n"
            "                           1024: the trainers together push about 8192 tokens' gradients per round)\n"
            "  --pool N                 negatives drawn from the bank per batch; each pair picks its K\n"
            "                           negatives uniformly from them (default batch-tokens / 2)\n"
            "  --optimizer adagrad|sgd  server-side optimizer (default adagrad)\n"
            "  --lr LR                  server learning rate (default 0.1 adagrad, 0.025 sgd)\n"
            "  --lr-decay linear|none   scale pushed gradients by 1 - progress (default: linear for sgd,\n"
            "                           none for adagrad)\n"
            "  --update lazy|immediate  bank update policy (default lazy)\n"
            "  --max-age-ms MS          lazy: apply pending gradients after MS ms (default 100)\n"
            "  --max-pending N          lazy: or once N have gathered (default 16)\n"
            "  --knn-spec SPEC          FAISS index of NAME (cosine) and NAME.out (inner product);\n"
            "                           none for no index (default Flat)\n"
            "  --no-count               do not count tokens in NAME.count (a trainer resuming a run)\n"
            "  --seed S                 window, subsampling and sampling seed (default 1)\n"
            "  --export FILE            after training, write NAME as a word2vec text file (most frequent first)\n"
            "  --predict W1,W2,...      after training, print the top-k context words predicted for each word:\n"
            "                           NAME.out's rows by inner product with the word's NAME row (bank knn)\n"
            "  --predict-k K            (default 10)\n"
            "  --predict-eval N         score N (center, context) pairs of the slice: share whose context is in\n"
            "                           the top-k predicted, against always predicting the k most frequent words\n"
            "  --tokenize-only          print the corpus as the trainer tokenizes it (one line per sentence)\n"
            "  --metrics FILE           CSV: one row per epoch\n"
            "  --kb-timeout-ms MS       per-attempt request timeout (default 10000)\n"
            "  --kb-retries N           resends after a timeout, e.g. across a bank restart (default 60)\n"
            KB_CURVE_ARGS_HELP
            "  --log-level LEVEL        debug|info|warn|error\n");
}

/* --worker I/N into the s_opts_t out. */
static int s_arg_worker(const char *prog, const char *name, const char *text, void *out)
{
    s_opts_t *o = out;
    return carls_args_part_value(prog, name, text, 1024, &o->worker, &o->workers);
}

/* Parses the options. 0 to run, 1 when --help was answered, -1 on bad usage (reported). */
static int s_parse(int argc, char **argv, s_opts_t *o)
{
    *o = (s_opts_t){
        .kb = getenv("CARLS_KB") ? getenv("CARLS_KB") : "tcp://127.0.0.1:7070",
        .table = "words",
        .tables = {.dim = 100, .adagrad = true, .lr = -1, .lazy = true, .max_age_ms = 100, .max_pending = 16,
                   .admission = W2V_ADMIT_BLOOM, .min_count = 5, .knn_spec = "Flat"},
        .window = 5,
        .negatives = 5,
        .epochs = 15,
        .subsample = 1e-3f,
        .worker = 0,
        .workers = 1,
        .batch_tokens = 0,
        .pool = 0,
        .lr_decay = -1,
        .seed = 1,
        .predict_k = 10,
        .timeout_ms = 10000,
        .retries = 60,
    };
    kb_curve_args(&o->curve);
    int admission = W2V_ADMIT_BLOOM, seed = 1;
    const carls_arg_t args[] = {
        carls_arg_string("corpus", &o->corpus),
        carls_arg_string("kb", &o->kb),
        carls_arg_group(o->curve.rows),
        carls_arg_string("table", &o->table),
        carls_arg_u32("dim", &o->tables.dim, 1, W2V_MAX_DIM),
        carls_arg_u32("window", &o->window, 1, W2V_MAX_WINDOW),
        carls_arg_u32("negatives", &o->negatives, 0, W2V_MAX_NEGATIVES),
        carls_arg_u32("epochs", &o->epochs, 0, 100000),
        carls_arg_float("subsample", &o->subsample, 0.0, 1.0),
        carls_arg_u32("min-count", &o->tables.min_count, 1, 255),
        /* the order of w2v_admission_t */
        carls_arg_choice("admission", &admission, (const char *const[]){"bloom", "frequency", "none", NULL}),
        carls_arg_custom("worker", o, s_arg_worker),
        carls_arg_u32("batch-tokens", &o->batch_tokens, 16, 90000),
        carls_arg_u32("pool", &o->pool, 1, 90000),
        carls_arg_either("optimizer", &o->tables.adagrad, (const char *const[]){"adagrad", "sgd", NULL}),
        carls_arg_float("lr", &o->tables.lr, 1e-9, 100.0),
        carls_arg_choice("lr-decay", &o->lr_decay, (const char *const[]){"none", "linear", NULL}),
        carls_arg_either("update", &o->tables.lazy, (const char *const[]){"lazy", "immediate", NULL}),
        carls_arg_u32("max-age-ms", &o->tables.max_age_ms, 1, 3600000),
        carls_arg_u32("max-pending", &o->tables.max_pending, 1, 1024),
        carls_arg_string("knn-spec", &o->tables.knn_spec),
        carls_arg_set("no-count", &o->no_count),
        carls_arg_int("seed", &seed, 0, 2147483647),
        carls_arg_string("export", &o->export_path),
        carls_arg_string("predict", &o->predict),
        carls_arg_u32("predict-k", &o->predict_k, 1, CARLS_MAX_KNN_K),
        carls_arg_u32("predict-eval", &o->predict_eval, 1, 20000),
        carls_arg_set("tokenize-only", &o->tokenize_only),
        carls_arg_string("metrics", &o->metrics),
        carls_arg_int("kb-timeout-ms", &o->timeout_ms, 100, 3600000),
        carls_arg_int("kb-retries", &o->retries, 0, 100000),
        carls_arg_log_level(),
        {0},
    };
    int rc = carls_args_parse("trainer word2vec", argc, argv, args, s_usage);
    if (rc != 0)
        return rc;
    if (kb_curve_args_check(&o->curve, "trainer word2vec") != 0)
        return -1;
    o->tables.admission = (w2v_admission_t)admission;
    o->seed = (uint64_t)seed;
    if (!o->corpus && (o->epochs > 0 || o->tokenize_only || o->predict_eval)) {
        fprintf(stderr, "trainer word2vec: --corpus FILE|DIR|kjv is required\n");
        return -1;
    }
    if (o->tables.lr < 0)
        o->tables.lr = o->tables.adagrad ? 0.1f : 0.025f;
    /* n trainers push n batches per round: keep the tokens per round at 8192, as one trainer's batch (larger
     * rounds are larger effective minibatches, measured to hurt quality: docs/EXPERIMENTS.md). */
    if (o->batch_tokens == 0)
        o->batch_tokens = 8192 / o->workers > 1024 ? 8192 / o->workers : 1024;
    if (o->pool == 0)
        o->pool = o->batch_tokens / 2;
    if (o->lr_decay < 0)
        o->lr_decay = o->tables.adagrad ? 0 : 1;
    if (o->tables.admission == W2V_ADMIT_NONE)
        o->tables.min_count = 1;
    return 0;
}

/* ---- requests ---- */

static int s_fail_kb(s_run_t *r, const char *what)
{
    LOG_ERROR("word2vec: %s: %s", what, kb_cluster_last_error(r->bank));
    return -1;
}

/* Sends a lookup of n keys of a table of dim (nothing for none: *req stays NULL). */
static int s_lookup_send(s_run_t *r, kb_cluster_pending_t **req, const char *table, const kb_key_t *keys, size_t n,
                         uint32_t dim, bool no_create)
{
    *req = NULL;
    if (n == 0)
        return 0;
    if (kb_cluster_lookup_send(r->bank, table, keys, n, dim, no_create, req) != 0)
        return s_fail_kb(r, "sending a lookup");
    return 0;
}

/* Logs a failed wait; a table the bank does not have (any more) gets its own explanation. */
static int s_fail_wait(s_run_t *r, int rc, const char *what)
{
    if (rc == KB_CLIENT_ESTATUS && kb_cluster_last_status(r->bank) == CARLS__STATUS_CODE__STATUS_NOT_FOUND)
        LOG_ERROR("word2vec: a table is missing from the bank: dropped, or lost in a crash within its "
                  "durability interval; run the trainer again (it re-creates the tables)");
    return s_fail_kb(r, what);
}

/* Waits for a lookup: values (may be NULL) and metadata (may be NULL) in the caller's key order. */
static int s_wait_lookup(s_run_t *r, kb_cluster_pending_t **req, float *values, kb_row_meta_t *meta,
                         const char *what)
{
    if (!*req)
        return 0;
    int64_t t0 = carls_monotonic_us();
    int rc = kb_cluster_lookup_wait(r->bank, req, values, meta);
    r->io.wait_us += carls_monotonic_us() - t0;
    return rc == 0 ? 0 : s_fail_wait(r, rc, what);
}

/* Waits for a count lookup of n keys and writes each key's count (its row's frequency) to freq. */
static int s_wait_counts(s_run_t *r, kb_cluster_pending_t **req, size_t n, uint64_t *freq, const char *what)
{
    kb_row_meta_t *meta = carls_xmalloc((n ? n : 1) * sizeof *meta);
    int rc = s_wait_lookup(r, req, NULL, meta, what);
    for (size_t i = 0; rc == 0 && i < n; i++)
        freq[i] = meta[i].frequency;
    free(meta);
    return rc;
}

/* Waits for a push's acknowledgements (nothing when none was sent). */
static int s_wait_push(s_run_t *r, kb_cluster_pending_t **req, const char *what)
{
    if (!*req)
        return 0;
    int64_t t0 = carls_monotonic_us();
    int rc = kb_cluster_push_gradients_wait(r->bank, req);
    r->io.wait_us += carls_monotonic_us() - t0;
    return rc == 0 ? 0 : s_fail_wait(r, rc, what);
}

/* Whether a failed sample only means that the count table has nothing to draw from yet (a fresh bank's
 * first batch): the batch's own tokens stand in (see s_lookup_stage). */
static bool s_nothing_to_draw(s_run_t *r, int rc)
{
    return rc == KB_CLIENT_ESTATUS && kb_cluster_last_status(r->bank) == CARLS__STATUS_CODE__STATUS_NOT_FOUND;
}

/* ---- the pipeline ---- */

static void s_keys_reserve(s_batch_t *b, size_t n)
{
    if (n > b->keys_cap) {
        b->keys_cap = n;
        b->keys = carls_xrealloc(b->keys, n * sizeof *b->keys);
    }
}

static void s_vec_reserve(float **p, size_t *cap, size_t n)
{
    if (n > *cap) {
        *cap = n;
        *p = carls_xrealloc(*p, n * sizeof(float));
    }
}

/* Stage 1: takes the next lines into slot b, maps the batch's words, sends the count lookup and the
 * negative sampling request. Leaves b inactive when the trainer's passes are done. */
static int s_prepare(s_run_t *r, s_batch_t *b)
{
    b->active = false;
    if (r->next_line >= r->line_end) {
        r->next_epoch++;
        r->next_line = r->line_first;
    }
    if (r->next_epoch >= r->o.epochs || r->line_first >= r->line_end)
        return 0;
    const data_text_t *t = r->text;
    b->active = true;
    b->index = r->next_index++;
    b->epoch = r->next_epoch;
    b->counting = !r->o.no_count && b->epoch == 0;
    b->line0 = r->next_line;
    size_t l = b->line0;
    while (l < r->line_end && t->line_start[l] - t->line_start[b->line0] < r->o.batch_tokens)
        l++;
    b->line1 = l;
    r->next_line = l;
    b->tok0 = t->line_start[b->line0];
    b->tok1 = t->line_start[b->line1];
    size_t n = b->tok1 - b->tok0;
    b->tok_word = carls_xrealloc(b->tok_word, n * sizeof *b->tok_word);
    w2v_map_clear(&b->map);
    for (size_t i = 0; i < n; i++) {
        size_t k = b->tok0 + i;
        b->tok_word[i] = w2v_map_put(&b->map, data_text_token(t, k), t->tok_len[k]);
    }
    /* Counting pass: every occurrence; later: each distinct word once, without creating rows. */
    size_t nk = b->counting ? n : b->map.n;
    s_keys_reserve(b, nk);
    for (size_t i = 0; i < nk; i++) {
        uint32_t w = b->counting ? b->tok_word[i] : (uint32_t)i;
        b->keys[i].data = b->map.key[w];
        b->keys[i].len = b->map.len[w];
    }
    if (s_lookup_send(r, &b->count_req, r->names.count, b->keys, nk, 1, !b->counting) != 0)
        return -1;
    b->sample_sent = false;
    kb_sample_result_destroy(&b->sample); /* the last batch of this slot is done with it (the map is cleared) */
    if (r->o.negatives > 0) {
        uint64_t st = r->o.seed * 0x9e3779b97f4a7c15ULL + (uint64_t)r->o.worker * 1000003ULL + b->index;
        uint64_t seed = carls_splitmix64(&st);
        /* With one shard the request is in flight until s_lookup_stage; with several the cluster splits the
         * draws by each shard's mass here (a blocking call). */
        int64_t t0 = carls_monotonic_us();
        int src = kb_cluster_sample_send(r->bank, r->names.count, NULL, 0, r->o.pool,
                                         CARLS__SAMPLE_STRATEGY__SAMPLE_UNIGRAM, seed ? seed : 1, &b->sample_req);
        r->io.wait_us += carls_monotonic_us() - t0;
        if (src != 0 && !s_nothing_to_draw(r, src))
            return s_fail_kb(r, "sampling negatives");
        b->sample_sent = true;
    }
    b->vectors_sent = false;
    return 0;
}

/* The row of a word for this batch's output, appending negative-only words. */
static uint32_t s_out_row(s_batch_t *b, uint32_t w)
{
    if (b->row[w] == NONE) {
        b->row[w] = b->n_out++;
        b->keys[b->row[w]].data = b->map.key[w];
        b->keys[b->row[w]].len = b->map.len[w];
    }
    return b->row[w];
}

/* Stage 2: counts and negatives in; admission, subsampling, then the vector lookups go out. */
static int s_lookup_stage(s_run_t *r, s_batch_t *b)
{
    size_t n = b->tok1 - b->tok0;
    uint32_t nw = b->map.n;
    b->freq = carls_xrealloc(b->freq, (nw ? nw : 1) * sizeof *b->freq);
    if (b->counting) {
        uint64_t *occ = carls_xmalloc((n ? n : 1) * sizeof *occ);
        if (s_wait_counts(r, &b->count_req, n, occ, "counting words") != 0) {
            free(occ);
            return -1;
        }
        memset(b->freq, 0, nw * sizeof *b->freq);
        for (size_t i = 0; i < n; i++)
            if (occ[i] > b->freq[b->tok_word[i]])
                b->freq[b->tok_word[i]] = occ[i];
        free(occ);
        r->tokens_counted += n;
        r->total_tokens = r->tokens_counted * r->o.workers;
    } else {
        if (s_wait_counts(r, &b->count_req, nw, b->freq, "reading word counts") != 0)
            return -1;
        if (r->total_tokens == 0)
            r->total_tokens = (uint64_t)r->slice_tokens * r->o.workers;
    }

    /* Admission and subsampling: kept tokens, sentence by sentence. */
    uint64_t min_freq = r->o.tables.admission == W2V_ADMIT_FREQUENCY ? r->o.tables.min_count : 1;
    b->row = carls_xrealloc(b->row, (nw ? nw : 1) * sizeof *b->row);
    for (uint32_t w = 0; w < nw; w++)
        b->row[w] = NONE;
    b->tokens = carls_xrealloc(b->tokens, (n ? n : 1) * sizeof *b->tokens);
    b->sent_end = carls_xrealloc(b->sent_end, (b->line1 - b->line0 + 1) * sizeof *b->sent_end);
    s_keys_reserve(b, nw + r->o.pool);
    b->n_tokens = b->n_sents = b->n_words = b->n_out = 0;
    uint64_t rng = r->o.seed * 0xd1b54a32d192ed03ULL ^ ((uint64_t)r->o.worker << 40) ^ b->index;
    double t = r->o.subsample;
    const data_text_t *text = r->text;
    for (size_t l = b->line0; l < b->line1; l++) {
        uint32_t before = b->n_tokens;
        for (size_t k = text->line_start[l]; k < text->line_start[l + 1]; k++) {
            uint32_t w = b->tok_word[k - b->tok0];
            uint64_t f = b->freq[w];
            if (f < min_freq)
                continue;
            if (t > 0 && r->total_tokens > 0) {
                double ratio = t * (double)r->total_tokens / (double)f;
                double keep = sqrt(ratio) + ratio;
                double u = carls_unit_double(&rng);
                if (u >= keep)
                    continue;
            }
            b->tokens[b->n_tokens++] = s_out_row(b, w);
        }
        if (b->n_tokens - before >= 2)
            b->sent_end[b->n_sents++] = b->n_tokens;
        else
            b->n_tokens = before; /* a sentence of one word has no pair */
    }
    b->n_words = b->n_out;

    /* Negatives: the bank's unigram^0.75 draws, as output rows. */
    b->n_pool = 0;
    if (b->sample_sent) {
        if (b->sample_req) {
            int64_t t0 = carls_monotonic_us();
            int src = kb_cluster_sample_wait(r->bank, &b->sample_req, &b->sample);
            r->io.wait_us += carls_monotonic_us() - t0;
            if (src != 0 && !s_nothing_to_draw(r, src))
                return s_fail_kb(r, "sampling negatives");
        }
        b->pool = carls_xrealloc(b->pool, (r->o.pool + n + 1) * sizeof *b->pool);
        if (b->sample) {
            /* The draws: keys, per-draw probabilities, total mass. */
            const kb_sample_result_t *sr = b->sample;
            for (size_t i = 0; i < sr->n; i++) {
                size_t kl = sr->keys[i].len;
                if (sr->is_positive[i] || kl == 0 || kl > DATA_TEXT_MAX_TOKEN)
                    continue;
                /* With frequency admission rows below the cutoff exist (in memory): not negatives. The
                 * count is recovered from the draw probability: p = f^0.75 / mass. */
                if (min_freq > 1 && pow((double)sr->probabilities[i] * sr->mass, 4.0 / 3.0) < (double)min_freq - 0.5)
                    continue;
                uint32_t w = w2v_map_put(&b->map, (const char *)sr->keys[i].data, (uint8_t)kl);
                if (w >= nw) {
                    b->row = carls_xrealloc(b->row, b->map.n * sizeof *b->row);
                    b->row[w] = NONE;
                    nw = b->map.n;
                }
                b->pool[b->n_pool++] = s_out_row(b, w);
            }
        } else {
            /* The count table has nothing to draw yet (the very first batch): the batch's own kept tokens,
             * i.e. negatives by their unigram frequency in this batch. */
            for (uint32_t i = 0; i < b->n_tokens; i++)
                b->pool[b->n_pool++] = b->tokens[i];
        }
    }

    /* Vector lookups: input rows of the kept words, output rows of kept words and negatives. */
    size_t dim = r->o.tables.dim;
    s_vec_reserve(&b->in_vec, &b->cap_in, (size_t)b->n_words * dim + 1);
    s_vec_reserve(&b->g_in, &b->cap_g_in, (size_t)b->n_words * dim + 1);
    s_vec_reserve(&b->out_vec, &b->cap_out, (size_t)b->n_out * dim + 1);
    s_vec_reserve(&b->g_out, &b->cap_g_out, (size_t)b->n_out * dim + 1);
    if (b->n_tokens > 0) {
        if (s_lookup_send(r, &b->in_req, r->names.in, b->keys, b->n_words, r->o.tables.dim, false) != 0 ||
            s_lookup_send(r, &b->out_req, r->names.out, b->keys, b->n_out, r->o.tables.dim, false) != 0)
            return -1;
        b->vectors_sent = true;
    }
    return 0;
}

/* Moves the nonzero gradient rows (and their keys) to the front; returns how many there are. */
static size_t s_compact(kb_key_t *keys, float *g, size_t n, size_t dim)
{
    size_t m = 0;
    for (size_t i = 0; i < n; i++) {
        const float *row = g + i * dim;
        bool nonzero = false;
        for (size_t d = 0; d < dim && !nonzero; d++)
            nonzero = row[d] != 0.0f;
        if (!nonzero)
            continue;
        if (m != i) {
            keys[m] = keys[i];
            memmove(g + m * dim, row, dim * sizeof(float));
        }
        m++;
    }
    return m;
}

/* Stage 3: vectors in, forward/backward, gradients out. */
static int s_compute_stage(s_run_t *r, s_batch_t *b)
{
    uint32_t dim = r->o.tables.dim;
    b->loss = 0;
    b->pairs = 0;
    if (b->vectors_sent) {
        if (s_wait_lookup(r, &b->in_req, b->in_vec, NULL, "looking up input vectors") != 0 ||
            s_wait_lookup(r, &b->out_req, b->out_vec, NULL, "looking up output vectors") != 0)
            return -1;
        nn_sgns_batch_t nb = {
            .tokens = b->tokens, .sent_end = b->sent_end, .n_sents = b->n_sents, .n_in = b->n_words,
            .n_out = b->n_out, .pool = b->pool, .n_pool = b->n_pool, .dim = dim, .window = r->o.window,
            .negatives = r->o.negatives,
        };
        uint64_t rng = (r->o.seed + 1) * 0xbf58476d1ce4e5b9ULL ^ ((uint64_t)r->o.worker << 48) ^ b->index;
        int64_t t0 = carls_monotonic_us();
        nn_sgns_cpu(&nb, b->in_vec, b->out_vec, b->g_in, b->g_out, &rng, &b->loss, &b->pairs);
        r->io.compute_us += carls_monotonic_us() - t0;
        if (!isfinite(b->loss)) {
            LOG_ERROR("word2vec: the loss is not finite (%g): training diverged; lower --lr", b->loss);
            return -1;
        }
        /* SGD with a decaying rate: the bank's rate is fixed, so the trainer scales what it pushes. */
        if (r->o.lr_decay) {
            double progress = (double)r->tokens_done / (double)(r->tokens_target ? r->tokens_target : 1);
            float scale = (float)(progress < 0.9999 ? 1.0 - progress : 0.0001);
            for (size_t i = 0; i < (size_t)b->n_words * dim; i++)
                b->g_in[i] *= scale;
            for (size_t i = 0; i < (size_t)b->n_out * dim; i++)
                b->g_out[i] *= scale;
        }
        /* Rows never used (pool words no pair drew) carry no gradient: pushing zeros would dilute the
         * lazy average of the rows' real gradients. The input push goes out before the keys are compacted
         * for the output push (a request is packed when it is sent). */
        size_t n_in = s_compact(b->keys, b->g_in, b->n_words, dim);
        if (n_in > 0 && kb_cluster_push_gradients_send(r->bank, r->names.in, b->keys, n_in, dim, b->g_in,
                                                       &b->push_in_req) != 0)
            return s_fail_kb(r, "pushing input gradients");
        /* s_compact may have moved input keys; rebuild the output keys from the map's rows. */
        for (uint32_t w = 0; w < b->map.n; w++) {
            if (b->row[w] != NONE) {
                b->keys[b->row[w]].data = b->map.key[w];
                b->keys[b->row[w]].len = b->map.len[w];
            }
        }
        size_t n_out = s_compact(b->keys, b->g_out, b->n_out, dim);
        if (n_out > 0 && kb_cluster_push_gradients_send(r->bank, r->names.out, b->keys, n_out, dim, b->g_out,
                                                         &b->push_out_req) != 0)
            return s_fail_kb(r, "pushing output gradients");
    }
    r->tokens_done += b->tok1 - b->tok0;
    return 0;
}

/* Stage 4: the pushes' acknowledgements. */
static int s_finish_stage(s_run_t *r, s_batch_t *b)
{
    int rc = s_wait_push(r, &b->push_in_req, "pushing input gradients");
    if (s_wait_push(r, &b->push_out_req, "pushing output gradients") != 0)
        rc = -1;
    return rc;
}

static void s_epoch_end(s_run_t *r)
{
    char extra[160];
    double loss = r->epoch_pairs ? r->epoch_loss / (double)r->epoch_pairs : 0;
    snprintf(extra, sizeof extra, "loss/pair %.4f, %llu pairs", loss, (unsigned long long)r->epoch_pairs);
    double wps = carls_progress_finish(&r->progress, extra);
    /* Prometheus: an epoch is a step, tokens are the items; bank waits are not measured apart here. */
    carls_prom_progress_add(trainer_prom, 1, (uint64_t)r->progress.done,
                            (double)(carls_monotonic_us() - r->progress.start_us) / 1e6, 0);
    carls_prom_progress_set_step(trainer_prom, r->progress_epoch + 1, r->o.epochs);
    if (r->metrics) {
        fprintf(r->metrics, "%u,%zu,%llu,%.6f,%.1f\n", r->progress_epoch + 1, r->slice_tokens,
                (unsigned long long)r->epoch_pairs, loss, wps);
        fflush(r->metrics);
    }
    r->epoch_loss = 0;
    r->epoch_pairs = 0;
}

/* Frees a slot; requests it still has in flight (after an error) are given up. */
static void s_batch_free(s_run_t *r, s_batch_t *b)
{
    w2v_map_free(&b->map);
    free(b->tok_word);
    free(b->freq);
    free(b->row);
    free(b->keys);
    free(b->tokens);
    free(b->sent_end);
    free(b->pool);
    free(b->in_vec);
    free(b->out_vec);
    free(b->g_in);
    free(b->g_out);
    kb_sample_result_destroy(&b->sample);
    kb_cluster_pending_destroy(r->bank, &b->count_req);
    kb_cluster_pending_destroy(r->bank, &b->sample_req);
    kb_cluster_pending_destroy(r->bank, &b->in_req);
    kb_cluster_pending_destroy(r->bank, &b->out_req);
    kb_cluster_pending_destroy(r->bank, &b->push_in_req);
    kb_cluster_pending_destroy(r->bank, &b->push_out_req);
    memset(b, 0, sizeof *b);
}

/* The training loop: the pipeline described at the top of the file. */
static int s_train(s_run_t *r)
{
    for (int i = 0; i < SLOTS; i++)
        w2v_map_init(&r->slot[i].map);
    r->next_epoch = 0;
    r->next_line = r->line_first;
    r->tokens_target = (uint64_t)r->slice_tokens * r->o.epochs;
    uint64_t requests_before = kb_cluster_requests(r->bank);
    int rc = -1;
    char label[64];
    snprintf(label, sizeof label, "epoch 1/%u", r->o.epochs);
    carls_progress_start(&r->progress, label, (int64_t)r->slice_tokens);
    r->progress_epoch = 0;
    if (s_prepare(r, &r->slot[0]) != 0 || (r->slot[0].active && s_lookup_stage(r, &r->slot[0]) != 0) ||
        s_prepare(r, &r->slot[1]) != 0)
        goto cleanup;
    for (uint64_t b = 0; r->slot[b % SLOTS].active; b++) {
        s_batch_t *cur = &r->slot[b % SLOTS];
        s_batch_t *next = &r->slot[(b + 1) % SLOTS];
        s_batch_t *after = &r->slot[(b + 2) % SLOTS];
        s_batch_t *prev = &r->slot[(b + 3) % SLOTS];
        if (next->active && s_lookup_stage(r, next) != 0)
            goto cleanup;
        if (next->active && s_prepare(r, after) != 0)
            goto cleanup;
        if (!next->active)
            after->active = false;
        if (cur->epoch != r->progress_epoch) {
            s_epoch_end(r);
            r->progress_epoch = cur->epoch;
            snprintf(label, sizeof label, "epoch %u/%u", cur->epoch + 1, r->o.epochs);
            carls_progress_start(&r->progress, label, (int64_t)r->slice_tokens);
        }
        if (s_compute_stage(r, cur) != 0)
            goto cleanup;
        r->epoch_loss += cur->loss;
        r->epoch_pairs += cur->pairs;
        carls_progress_update(&r->progress, (int64_t)(cur->tok1 - cur->tok0),
                                cur->pairs ? cur->loss / (double)cur->pairs : 0);
        if (s_finish_stage(r, prev) != 0)
            goto cleanup;
        if (!next->active) {
            if (s_finish_stage(r, cur) != 0)
                goto cleanup;
            break;
        }
    }
    s_epoch_end(r);
    rc = 0;
cleanup:
    for (int i = 0; i < SLOTS; i++)
        s_batch_free(r, &r->slot[i]);
    r->io.requests = (int64_t)(kb_cluster_requests(r->bank) - requests_before);
    return rc;
}

/* ---- export, prediction ---- */

typedef struct {
    char *word;
    uint64_t count;
    float *vec;
} s_row_t;

static int s_by_count(const void *a, const void *b)
{
    const s_row_t *x = a, *y = b;
    if (x->count != y->count)
        return x->count > y->count ? -1 : 1;
    return strcmp(x->word, y->word);
}

/* s_export's rows as the scan of NAME hands them over. */
typedef struct {
    uint32_t dim;
    s_row_t *rows;
    size_t n, cap;
    bool bad_dim; /* a page of another dim: the scan stopped there */
} s_export_rows_t;

static bool s_export_page(void *ctx, uint32_t shard, const Carls__ScanResult *sr)
{
    (void)shard;
    s_export_rows_t *er = ctx;
    const uint32_t dim = er->dim;
    if (sr->dim != dim || sr->n_values != sr->n_keys * dim) {
        er->bad_dim = true;
        return false;
    }
    for (size_t i = 0; i < sr->n_keys; i++) {
        if (er->n == er->cap) {
            er->cap = er->cap ? er->cap * 2 : 4096;
            er->rows = carls_xrealloc(er->rows, er->cap * sizeof *er->rows);
        }
        s_row_t *row = &er->rows[er->n++];
        row->word = carls_xmalloc(sr->keys[i].len + 1);
        memcpy(row->word, sr->keys[i].data, sr->keys[i].len);
        row->word[sr->keys[i].len] = '\0';
        row->vec = carls_xmalloc(dim * sizeof(float));
        memcpy(row->vec, sr->values + i * dim, dim * sizeof(float));
        row->count = 0;
    }
    return true;
}

/* Writes NAME's rows as a word2vec text file, most counted words first. */
static int s_export(s_run_t *r, const char *path)
{
    uint32_t dim = r->o.tables.dim;
    int rc = -1;
    s_export_rows_t er = {.dim = dim};
    const int scan_rc = kb_cluster_scan_all(r->bank, r->names.in, 2000, s_export_page, &er);
    s_row_t *rows = er.rows;
    size_t n = er.n;
    if (scan_rc != 0) {
        LOG_ERROR("word2vec: export: scanning %s: %s", r->names.in, kb_cluster_last_error(r->bank));
        goto cleanup;
    }
    if (er.bad_dim) {
        LOG_ERROR("word2vec: export: %s answered a page of another dim", r->names.in);
        goto cleanup;
    }
    /* Word counts from NAME.count, to order the file as word2vec and fastText do. */
    for (size_t i0 = 0; i0 < n; i0 += 50000) {
        size_t m = n - i0 < 50000 ? n - i0 : 50000;
        kb_key_t *keys = carls_xmalloc(m * sizeof *keys);
        kb_row_meta_t *meta = carls_xmalloc(m * sizeof *meta);
        float *vals = carls_xmalloc(m * sizeof *vals);
        for (size_t i = 0; i < m; i++)
            keys[i] = (kb_key_t){rows[i0 + i].word, strlen(rows[i0 + i].word)};
        int lrc = kb_cluster_lookup_ex(r->bank, r->names.count, keys, m, 1, true, vals, meta);
        for (size_t i = 0; lrc == 0 && i < m; i++)
            rows[i0 + i].count = meta[i].frequency;
        free(keys);
        free(meta);
        free(vals);
        if (lrc != 0) {
            LOG_ERROR("word2vec: export: reading counts: %s", kb_cluster_last_error(r->bank));
            goto cleanup;
        }
    }
    qsort(rows, n, sizeof *rows, s_by_count);
    {
        char **words = carls_xmalloc((n ? n : 1) * sizeof *words);
        float *vec = carls_xmalloc((n ? n : 1) * dim * sizeof(float));
        for (size_t i = 0; i < n; i++) {
            words[i] = rows[i].word;
            memcpy(vec + i * dim, rows[i].vec, dim * sizeof(float));
        }
        char err[256];
        rc = w2v_write_vectors(path, (uint32_t)n, dim, words, vec, err, sizeof err);
        if (rc != 0)
            LOG_ERROR("word2vec: export: %s", err);
        else
            LOG_INFO("word2vec: wrote %zu vectors of dim %u to %s", n, dim, path);
        free(words);
        free(vec);
    }
cleanup:
    for (size_t i = 0; i < n; i++) {
        free(rows[i].word);
        free(rows[i].vec);
    }
    free(rows);
    return rc;
}

/* Top-k output (DynamicEmbedding §3.1.2): for query vectors (nq, dim), the output rows with the largest
 * inner product, by the bank's knn over NAME.out (every shard's top-k merged). Caller frees *res. */
static int s_knn_out(s_run_t *r, const float *queries, size_t nq, uint32_t k, kb_knn_result_t **res)
{
    if (kb_cluster_knn(r->bank, r->names.out, queries, nq, r->o.tables.dim, k, res) != 0 || (*res)->k != k) {
        LOG_ERROR("word2vec: knn on %s: %s", r->names.out, kb_cluster_last_error(r->bank));
        kb_knn_result_destroy(res);
        return -1;
    }
    return 0;
}

/* One predicted word. */
typedef struct {
    char word[DATA_TEXT_MAX_TOKEN + 1];
    float score;
} s_pred_t;

/* Top-k predicted context words for nq query (input) vectors q (nq, dim) into out (nq, k; empty words where
 * fewer exist). The bank's knn over NAME.out answers the rows with the largest inner product u.v, the
 * sampled-logit score (DynamicEmbedding §3.1.2). Under negative sampling u.v estimates
 * log P(o|c) - log(K Pn(o)) with Pn the unigram^0.75 noise distribution, so u.v alone ranks by pointwise
 * mutual information and favours rare words. With prior, the bank's top 20k candidates are re-ranked by
 * u.v + log Pn(o) = u.v + 0.75 log count(o) + const (the bias b_a of the paper's eq. 14), counts read from
 * NAME.count: the most probable context words. */
static int s_predict_topk(s_run_t *r, float *q, size_t nq, uint32_t k, bool prior, s_pred_t *out)
{
    uint32_t kk = prior ? (k * 20 < CARLS_MAX_KNN_K ? k * 20 : CARLS_MAX_KNN_K) : k;
    if (kk < k)
        kk = k;
    memset(out, 0, nq * k * sizeof *out);
    int rc = -1;
    for (size_t i0 = 0; i0 < nq; i0 += 200) {
        size_t m = nq - i0 < 200 ? nq - i0 : 200;
        kb_knn_result_t *resp = NULL;
        if (s_knn_out(r, q + i0 * r->o.tables.dim, m, kk, &resp) != 0)
            return -1;
        size_t nc = m * kk;
        float *score = carls_xmalloc(nc * sizeof *score);
        for (size_t j = 0; j < nc; j++)
            score[j] = resp->keys[j].len ? resp->scores[j] : -INFINITY;
        if (prior) {
            kb_key_t *keys = carls_xmalloc(nc * sizeof *keys);
            kb_row_meta_t *meta = carls_xmalloc(nc * sizeof *meta);
            float *vals = carls_xmalloc(nc * sizeof *vals);
            for (size_t j = 0; j < nc; j++)
                keys[j] = (kb_key_t){resp->keys[j].len ? resp->keys[j].data : "-",
                                     resp->keys[j].len ? resp->keys[j].len : 1};
            int lrc = kb_cluster_lookup_ex(r->bank, r->names.count, keys, nc, 1, true, vals, meta);
            for (size_t j = 0; lrc == 0 && j < nc; j++)
                score[j] += 0.75f * logf((float)(meta[j].frequency ? meta[j].frequency : 1));
            free(keys);
            free(meta);
            free(vals);
            if (lrc != 0) {
                LOG_ERROR("word2vec: predict: reading counts: %s", kb_cluster_last_error(r->bank));
                free(score);
                kb_knn_result_destroy(&resp);
                return -1;
            }
        }
        for (size_t i = 0; i < m; i++) {
            s_pred_t *o = out + (i0 + i) * k;
            uint32_t have = 0;
            for (uint32_t j = 0; j < kk; j++) {
                float sc = score[i * kk + j];
                const kb_key_t *key = &resp->keys[i * kk + j];
                if (!key->len || key->len > DATA_TEXT_MAX_TOKEN || (have == k && sc <= o[k - 1].score))
                    continue;
                uint32_t p = have < k ? have++ : k - 1;
                while (p > 0 && o[p - 1].score < sc) {
                    o[p] = o[p - 1];
                    p--;
                }
                memcpy(o[p].word, key->data, key->len);
                o[p].word[key->len] = '\0';
                o[p].score = sc;
            }
        }
        free(score);
        kb_knn_result_destroy(&resp);
    }
    rc = 0;
    return rc;
}

static int s_predict(s_run_t *r)
{
    uint32_t dim = r->o.tables.dim, k = r->o.predict_k;
    char *list = strdup(r->o.predict);
    kb_key_t keys[256];
    size_t nq = 0;
    for (char *save = NULL, *w = strtok_r(list, ",", &save); w && nq < 256; w = strtok_r(NULL, ",", &save))
        keys[nq++] = (kb_key_t){w, strlen(w)};
    int rc = -1;
    float *q = carls_xmalloc((nq ? nq : 1) * dim * sizeof(float));
    s_pred_t *pred = carls_xmalloc((nq ? nq : 1) * k * sizeof *pred);
    if (nq == 0 || kb_cluster_lookup_ex(r->bank, r->names.in, keys, nq, dim, true, q, NULL) != 0) {
        LOG_ERROR("word2vec: predict: %s", nq ? kb_cluster_last_error(r->bank) : "no words");
        goto cleanup;
    }
    for (int prior = 0; prior < 2; prior++) {
        if (s_predict_topk(r, q, nq, k, prior, pred) != 0)
            goto cleanup;
        for (size_t i = 0; i < nq; i++) {
            printf("predict%s %.*s:", prior ? "+prior" : "", (int)keys[i].len, (const char *)keys[i].data);
            for (uint32_t j = 0; j < k; j++)
                if (pred[i * k + j].word[0])
                    printf(" %s(%.2f)", pred[i * k + j].word, pred[i * k + j].score);
            printf("\n");
        }
    }
    rc = 0;
cleanup:
    free(pred);
    free(q);
    free(list);
    return rc;
}

/* The k most counted words of a scan of NAME.count, most counted first (counts[j] 0 while words[j] is NULL). */
typedef struct {
    char **words;
    uint64_t *counts;
    uint32_t k;
} s_top_counted_t;

static bool s_top_counted_page(void *ctx, uint32_t shard, const Carls__ScanResult *sr)
{
    (void)shard;
    s_top_counted_t *t = ctx;
    const uint32_t k = t->k;
    for (size_t i = 0; i < sr->n_keys; i++) {
        uint64_t f = sr->frequencies[i];
        if (f <= t->counts[k - 1])
            continue;
        uint32_t p = k - 1;
        free(t->words[p]);
        while (p > 0 && t->counts[p - 1] < f) {
            t->counts[p] = t->counts[p - 1];
            t->words[p] = t->words[p - 1];
            p--;
        }
        t->counts[p] = f;
        t->words[p] = strndup((const char *)sr->keys[i].data, sr->keys[i].len);
    }
    return true;
}

/* Context prediction scored on n (center, context) pairs of the slice drawn like training pairs (dynamic
 * window), both words admitted: hit@k of the bank's top-k output rows for the center's input vector (u.v, and
 * u.v + log Pn), against always answering the k most counted words. */
static int s_predict_eval(s_run_t *r)
{
    uint32_t dim = r->o.tables.dim, k = r->o.predict_k, n = r->o.predict_eval;
    const data_text_t *t = r->text;
    uint64_t rng = r->o.seed * 77777ULL + 12345ULL;
    size_t lines = r->line_end - r->line_first;
    kb_key_t *centers = carls_xmalloc(n * sizeof *centers);
    kb_key_t *contexts = carls_xmalloc(n * sizeof *contexts);
    kb_row_meta_t *meta = carls_xmalloc(2 * n * sizeof *meta);
    float *vals = carls_xmalloc(2 * n * sizeof *vals);
    float *q = carls_xmalloc((size_t)n * dim * sizeof(float));
    kb_key_t *both = carls_xmalloc(2 * n * sizeof *both);
    s_pred_t *pred = carls_xmalloc((size_t)n * k * sizeof *pred);
    uint64_t *topf = carls_xcalloc(k, sizeof *topf);
    char **topw = carls_xcalloc(k, sizeof *topw);
    uint32_t m = 0;
    int rc = -1;
    uint64_t min_freq = r->o.tables.admission == W2V_ADMIT_FREQUENCY ? r->o.tables.min_count : 1;
    for (int tries = 0; m < n && tries < 100 && lines > 0; tries++) {
        uint32_t want = n - m;
        for (uint32_t j = 0; j < want; j++) {
            size_t l = r->line_first + carls_splitmix64(&rng) % lines;
            size_t a = t->line_start[l], e = t->line_start[l + 1];
            if (e - a < 2)
                continue;
            size_t i = a + carls_splitmix64(&rng) % (e - a);
            uint32_t half = 1 + (uint32_t)(carls_splitmix64(&rng) % r->o.window);
            size_t lo = i - a > half ? i - half : a, hi = e - 1 - i > half ? i + half : e - 1;
            size_t c = lo + carls_splitmix64(&rng) % (hi - lo + 1);
            if (c == i)
                continue;
            centers[m] = (kb_key_t){data_text_token(t, i), t->tok_len[i]};
            contexts[m] = (kb_key_t){data_text_token(t, c), t->tok_len[c]};
            both[2 * m] = centers[m];
            both[2 * m + 1] = contexts[m];
            m++;
        }
        /* Keep pairs whose both words the count table admitted. */
        if (m > 0 && kb_cluster_lookup_ex(r->bank, r->names.count, both, 2 * (size_t)m, 1, true, vals, meta) != 0) {
            LOG_ERROR("word2vec: predict-eval: %s", kb_cluster_last_error(r->bank));
            goto cleanup;
        }
        uint32_t kept = 0;
        for (uint32_t j = 0; j < m; j++) {
            if (meta[2 * j].frequency >= min_freq && meta[2 * j + 1].frequency >= min_freq) {
                centers[kept] = centers[j];
                contexts[kept] = contexts[j];
                both[2 * kept] = centers[j];
                both[2 * kept + 1] = contexts[j];
                kept++;
            }
        }
        m = kept;
    }
    if (m == 0) {
        LOG_ERROR("word2vec: predict-eval: no pair of admitted words found");
        goto cleanup;
    }
    if (kb_cluster_lookup_ex(r->bank, r->names.in, centers, m, dim, true, q, NULL) != 0) {
        LOG_ERROR("word2vec: predict-eval: %s", kb_cluster_last_error(r->bank));
        goto cleanup;
    }
    uint32_t hits[2] = {0, 0};
    for (int prior = 0; prior < 2; prior++) {
        if (s_predict_topk(r, q, m, k, prior, pred) != 0)
            goto cleanup;
        for (uint32_t i = 0; i < m; i++)
            for (uint32_t j = 0; j < k; j++)
                if (strlen(pred[(size_t)i * k + j].word) == contexts[i].len &&
                    memcmp(pred[(size_t)i * k + j].word, contexts[i].data, contexts[i].len) == 0) {
                    hits[prior]++;
                    break;
                }
    }
    /* Baseline: always the k most counted words (a scan of NAME.count). */
    s_top_counted_t top = {.words = topw, .counts = topf, .k = k};
    if (kb_cluster_scan_all(r->bank, r->names.count, 5000, s_top_counted_page, &top) != 0) {
        LOG_ERROR("word2vec: predict-eval: scanning %s: %s", r->names.count, kb_cluster_last_error(r->bank));
        goto cleanup;
    }
    uint32_t base = 0;
    for (uint32_t i = 0; i < m; i++)
        for (uint32_t j = 0; j < k; j++)
            if (topw[j] && strlen(topw[j]) == contexts[i].len &&
                memcmp(topw[j], contexts[i].data, contexts[i].len) == 0) {
                base++;
                break;
            }
    printf("predict_eval pairs=%u k=%u hit_ip=%.4f hit_ip_prior=%.4f most_frequent_baseline=%.4f\n", m, k,
           (double)hits[0] / m, (double)hits[1] / m, (double)base / m);
    rc = 0;
cleanup:
    for (uint32_t j = 0; j < k; j++)
        free(topw[j]);
    free(topw);
    free(topf);
    free(pred);
    free(centers);
    free(contexts);
    free(meta);
    free(vals);
    free(q);
    free(both);
    return rc;
}

/* Without training (--epochs 0) the tables must exist; their dim replaces --dim. */
static int s_existing_dim(s_run_t *r)
{
    Carls__Response *list = NULL;
    if (kb_cluster_list_tables(r->bank, &list) != 0) {
        LOG_ERROR("word2vec: listing tables: %s", kb_cluster_last_error(r->bank));
        return -1;
    }
    int found = 0;
    for (size_t i = 0; i < list->table_list->n_tables; i++) {
        const Carls__TableInfo *ti = list->table_list->tables[i];
        if (strcmp(ti->name, r->names.in) == 0 && ti->config && ti->config->dim > 0 &&
            ti->config->dim <= W2V_MAX_DIM) {
            r->o.tables.dim = ti->config->dim;
            found |= 1;
        }
        if (strcmp(ti->name, r->names.out) == 0)
            found |= 2;
        if (strcmp(ti->name, r->names.count) == 0)
            found |= 4;
    }
    carls__response__free_unpacked(list, NULL);
    if (found != 7) {
        LOG_ERROR("word2vec: the bank has no tables %s, %s and %s to read", r->names.in, r->names.out,
                  r->names.count);
        return -1;
    }
    return 0;
}

/* Prints the corpus as tokenized, one sentence per line. */
static void s_print_tokens(const data_text_t *t)
{
    for (size_t l = 0; l < t->n_lines; l++) {
        for (size_t k = t->line_start[l]; k < t->line_start[l + 1]; k++)
            printf("%s%.*s", k == t->line_start[l] ? "" : " ", (int)t->tok_len[k], data_text_token(t, k));
        printf("\n");
    }
}

int trainer_word2vec_main(int argc, char **argv)
{
    s_run_t run;
    memset(&run, 0, sizeof run);
    s_run_t *r = &run;
    int prc = s_parse(argc, argv, &r->o);
    if (prc != 0)
        return prc > 0 ? 0 : 2;
    if (w2v_names(r->o.table, &r->names) != 0) {
        fprintf(stderr, "trainer word2vec: --table: '%s' is not a valid table name of at most 120 bytes\n", r->o.table);
        return 2;
    }
    int rc = 1;
    char err[512];
    if (r->o.corpus) {
        int64_t t0 = carls_monotonic_ms();
        if (data_text_load(r->o.corpus, &r->text, err, sizeof err) != 0) {
            LOG_ERROR("word2vec: %s", err);
            return 1;
        }
        if (r->o.tokenize_only) {
            s_print_tokens(r->text);
            data_text_destroy(&r->text);
            return 0;
        }
        data_text_slice(r->text, r->o.worker, r->o.workers, &r->line_first, &r->line_end);
        r->slice_tokens = r->text->line_start[r->line_end] - r->text->line_start[r->line_first];
        LOG_INFO("word2vec: corpus %s: %zu lines, %zu tokens (%lld ms); worker %u/%u trains lines %zu..%zu "
                 "(%zu tokens)",
                 r->o.corpus, r->text->n_lines, r->text->n_tokens, (long long)(carls_monotonic_ms() - t0),
                 r->o.worker, r->o.workers, r->line_first, r->line_end, r->slice_tokens);
    }
    kb_client_curve_t keys;
    kb_client_options_t copts = {.timeout_ms = r->o.timeout_ms, .retries = r->o.retries};
    if (kb_curve_args_options(&r->o.curve, "trainer word2vec", &keys, &copts) != 0)
        goto cleanup;
    r->bank = kb_cluster_new(r->o.kb, &copts);
    explicit_bzero(&keys, sizeof keys);
    if (!r->bank) {
        LOG_ERROR("word2vec: cannot open a client for %s", r->o.kb);
        goto cleanup;
    }
    if (r->o.epochs > 0 && w2v_tables_create(r->bank, &r->names, &r->o.tables) != 0) {
        LOG_ERROR("word2vec: creating tables %s, %s, %s: %s (a table of that name with another config?)",
                  r->names.in, r->names.out, r->names.count, kb_cluster_last_error(r->bank));
        goto cleanup;
    }
    if (r->o.epochs == 0 && s_existing_dim(r) != 0)
        goto cleanup;
    if (r->o.metrics) {
        r->metrics = fopen(r->o.metrics, "w");
        if (!r->metrics) {
            LOG_ERROR("word2vec: cannot write %s", r->o.metrics);
            goto cleanup;
        }
        fprintf(r->metrics, "epoch,tokens,pairs,loss_per_pair,words_per_sec\n");
    }
    if (r->o.epochs > 0 && r->text) {
        int64_t t0 = carls_monotonic_us();
        if (s_train(r) != 0)
            goto cleanup;
        double secs = (double)(carls_monotonic_us() - t0) / 1e6;
        double words = (double)r->slice_tokens * r->o.epochs;
        printf("word2vec worker=%u/%u tokens=%.0f seconds=%.2f words_per_sec=%.0f bank_wait_share=%.3f "
               "compute_share=%.3f requests=%lld\n",
               r->o.worker, r->o.workers, words, secs, words / secs, (double)r->io.wait_us / 1e6 / secs,
               (double)r->io.compute_us / 1e6 / secs, (long long)r->io.requests);
    }
    if (r->o.export_path && s_export(r, r->o.export_path) != 0)
        goto cleanup;
    if (r->o.predict && s_predict(r) != 0)
        goto cleanup;
    if (r->o.predict_eval && r->text && s_predict_eval(r) != 0)
        goto cleanup;
    rc = 0;
cleanup:
    if (r->metrics)
        fclose(r->metrics);
    kb_cluster_destroy(&r->bank);
    data_text_destroy(&r->text);
    fflush(stdout);
    return rc;
}
