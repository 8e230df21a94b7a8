/* trainer twotower's options (see trainer_tt_opts.h). */
#include "trainer_tt_opts.h"
#include "trainer_run_args.h"

#include "carls_args.h"
#include "data_gcide.h"
#include "data_pairs.h"
#include "nn_tower.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void s_usage(FILE *out)
{
    fprintf(out,
            "usage: trainer twotower --kb ENDPOINTS [options]\n"
            "Reverse dictionary on GCIDE (Debian's dict-gcide): a query tower over a definition's words and a word\n"
            "tower over the headword's row and character trigrams, all rows in the knowledge bank (no dictionary),\n"
            "trained with InfoNCE over in-batch negatives plus --kb-negatives M word-tower embeddings fetched from\n"
            "the bank (written by kb-maker --task words from this trainer's checkpoints). Then ranks each held-out\n"
            "definition's headword among all headwords; the last line is the result as key=value pairs.\n"
            "data:\n"
            "  --data gcide             GCIDE (default), or your own pairs:PAIRS.tsv[,CANDIDATES.txt]: one\n"
            "                           QUERY<TAB>DOCUMENT a line (queries split into words as definitions are,\n"
            "                           documents as headwords: trimmed, lowercased, at most 64 bytes), and more\n"
            "                           candidate documents one a line (data/data_pairs.h)\n"
            "  --index FILE --dict FILE GCIDE files (default %s, %s)\n"
            "  --holdout-seed S         hold out one sense of --holdout-count headwords drawn with seed S (default 0)\n"
            "  --holdout-count N        (default 2000)\n"
            "  --holdout-file F         hold out the senses listed in F (headword<TAB>sense number) instead\n"
            "  --write-holdout F        write the hold-out used\n"
            "model and training:\n"
            "  --kb ENDPOINTS           bank shards, comma-separated (default $CARLS_KB or tcp://127.0.0.1:7070)\n"
            "  --table NAME             tables NAME.word, NAME.gram, NAME.vec (default tt)\n"
            "  --dim E                  word and trigram row size (default 128)\n"
            "  --out-dim D              tower output size (default 128)\n"
            "  --hidden H               hidden units of each tower's MLP head: W x + b + V relu(U x + c), V starting\n"
            "                           at zero (default 256; 0: linear heads)\n"
            "  --batch B                pairs per step (default 512)\n"
            "  --epochs N               passes over the training pairs (default 10)\n"
            "  --max-steps N            stop after N steps (0: no limit)\n"
            "  --lr LR                  Adam learning rate of the dense heads (default 0.002)\n"
            "  --emb-lr LR              server-side learning rate of the rows (default 0.01)\n"
            "  --emb-optimizer KIND     adam|adagrad|sgd, server side (default adam)\n"
            "  --init-scale S           rows start uniform in [-S, S] (default 0.1)\n"
            "  --temperature T          softmax temperature over cosines (default 0.1)\n"
            "  --logq 0|1               1: subtract from each candidate's logit the log of how often it is expected\n"
            "                           among a step's candidates (B x its share of training pairs, plus M / headwords\n"
            "                           or M x that share for bank negatives drawn uniformly or as pairs), so the\n"
            "                           sampled loss estimates the softmax over all headwords (default 0)\n"
            "  --token-dropout P        drop each definition word with probability P in training (default 0.3)\n"
            "  --word-defs S            the word tower also pools the words of up to S of the headword's other\n"
            "                           training definitions (makers and the evaluation pool up to %d; default 8;\n"
            "                           0: the headword's row and trigrams only)\n"
            "  --kb-negatives M         extra negatives from the bank's NAME.vec (default 0: in-batch only)\n"
            "  --negatives-every N      fetch new bank negatives every N steps (default 1)\n"
            "  --negatives-sampling uniform|pairs   which headwords: uniform (default): drawn by the bank's sampler;\n"
            "                           pairs: the headwords of M random training pairs, drawn as the batch's are\n"
            "                           (so the bank's rows act as a larger batch); their rows are read by key\n"
            "  --negatives-from inputs|outputs   inputs (default): the makers' pooled word-tower inputs (NAME.vecx)\n"
            "                           through this trainer's current head; outputs: the makers' finished vectors\n"
            "                           (NAME.vec), as old as their checkpoint\n"
            "  --negatives-shift 0|1    1: before the head, move the makers' pooled inputs by how far all\n"
            "                           rows have drifted since: the mean of the batch's headwords' inputs now minus\n"
            "                           the mean of the same headwords' inputs in NAME.vecx (--negatives-from inputs;\n"
            "                           default 0)\n"
            "  --stale-positives P      each of the batch's headwords whose pooled input is in NAME.vecx has it, with\n"
            "                           probability P, as the makers wrote it instead of as it is now (its gradient\n"
            "                           still goes to the current rows), so an input's age does not tell the head\n"
            "                           whether it is a positive or a bank negative (default 0)\n"
            "  --hard-queries Q         hard bank negatives: Q of a step's queries ask the bank's knn over NAME.vec\n"
            "                           (the makers' word vectors) for --hard-k K headwords each (default 0: none)\n"
            "  --hard-k K               (default 32); the positives of the batch are left out\n"
            "  --hard-fresh 0|1         1: the hard negatives' word towers are computed here from their current rows\n"
            "                           (the bank only finds them; their rows get gradients); 0 (default): their\n"
            "                           pooled inputs from NAME.vecx through the current head\n"
            "  --seed S                 (default 1)\n"
            "checkpoints and evaluation:\n"
            "  --ckpt-dir DIR           write checkpoints here (makers watch it)\n"
            "  --ckpt-every N           every N steps (default 100), and after the last step\n"
            "  --keep N                 checkpoints kept in --ckpt-dir (default 3)\n"
            "  --bank-snapshot PREFIX   before each checkpoint, snapshot the bank (every shard at one cut: the rows\n"
            "                           this trainer trains live there) as PREFIX-step<N> and record the name in the\n"
            "                           checkpoint; the newest --keep pairs are kept, older snapshots deleted\n"
            "                           (PREFIX: 1..39 of [A-Za-z0-9_.-])\n"
            "  --resume                 continue from the checkpoint --ckpt-dir/latest names (written by this\n"
            "                           trainer with the same settings; --epochs and --max-steps may differ): heads,\n"
            "                           Adam moments and step, the shuffled training pairs and the position in them,\n"
            "                           the RNG state, the bank negatives held; the bank is what it serves now, so\n"
            "                           restore the checkpoint's snapshot first (kb-server --restore NAME; carls run\n"
            "                           --resume does)\n"
            "  --vectors trainer|makers who writes NAME.vec for the evaluation: this trainer, or makers from the final\n"
            "                           checkpoint (waited for; default trainer)\n"
            "  --wait-fresh-s S         how long to wait for makers (default 600)\n"
            "  --fuse-tfidf L           also rank by cosine + L * lexical score (fused_* results; default 0: off)\n"
            "  --fuse-sweep L1,L2,...   also report the ranking for each fusion weight (tuning on a validation hold-out)\n"
            "  --lexical tfidf|bm25     the lexical score fused: TF-IDF cosine (default) or BM25 scaled so the best\n"
            "                           headword scores 1\n"
            "  --bm25-k1 K --bm25-b B   BM25's parameters (default 1.2, 0.75)\n"
            "  --save-vectors FILE      write the held-out query vectors and every word vector evaluated\n"
            "  --eval-vectors FILE      no bank, no training: evaluate the vectors of FILE (written by --save-vectors\n"
            "                           with the same hold-out and --out-dim) with this run's lexical and fusion options\n"
            "  --knn-check N            also ask the bank's knn (top 100) for N held-out queries (default 200)\n"
            "  --metrics FILE           CSV: one row per 50 steps\n"
            "  --kb-timeout-ms MS       per-attempt request timeout (default 10000)\n"
            "  --kb-retries N           resends after a timeout, e.g. across a bank restart (default 60)\n"
            KB_CURVE_ARGS_HELP
            "  --log-level LEVEL        debug|info|warn|error\n",
            DATA_GCIDE_INDEX, DATA_GCIDE_DICT, NN_TOWER_DEF_SENSES);
}

/* --data: gcide, or pairs:... into the const char * out (NULL for gcide). */
static int s_arg_data(const char *prog, const char *name, const char *text, void *out)
{
    if (data_pairs_is_spec(text)) {
        *(const char **)out = text;
        return 0;
    }
    if (strcmp(text, "gcide") != 0) {
        fprintf(stderr, "%s: --%s: '%s' is not a data set this command knows (gcide, pairs:PAIRS.tsv)\n", prog,
                name, text);
        return -1;
    }
    *(const char **)out = NULL;
    return 0;
}

/* --fuse-sweep W[,W..]: up to 16 fusion weights into the tt_opts_t out. */
static int s_arg_fuse_sweep(const char *prog, const char *name, const char *text, void *out)
{
    tt_opts_t *o = out;
    char *save = NULL, *copy = strdup(text);
    int bad = 0;
    o->n_sweep = 0;
    for (char *tok = strtok_r(copy, ",", &save); tok && !bad; tok = strtok_r(NULL, ",", &save)) {
        if (o->n_sweep == 16)
            bad = -1;
        else
            bad = carls_args_float_value(prog, name, tok, 0.0, 1000.0, &o->fuse_sweep[o->n_sweep++]);
    }
    free(copy);
    if (bad)
        fprintf(stderr, "%s: --%s: at most 16 weights in [0, 1000]\n", prog, name);
    return bad;
}

int tt_opts_parse(int argc, char **argv, tt_opts_t *o)
{
    *o = (tt_opts_t){
        .kb = getenv("CARLS_KB") ? getenv("CARLS_KB") : "tcp://127.0.0.1:7070",
        .table = "tt",
        .holdout_count = 2000,
        .E = 128,
        .D = 128,
        .H = 256,
        .batch = 512,
        .epochs = 10,
        .negatives_every = 1,
        .ckpt_every = 100,
        .knn_check = 200,
        .hard_k = 32,
        .lr = 0.002f,
        .emb_lr = 0.01f,
        .temperature = 0.1f,
        .word_defs = 8,
        .token_dropout = 0.3f,
        .wait_fresh_s = 600,
        .init_scale = 0.1f,
        .vectors_from_trainer = true,
        .negatives_from_inputs = true,
        .lexical = {.scheme = TFIDF_COSINE, .k1 = 1.2f, .b = 0.75f},
        .seed = 1,
        .timeout_ms = 10000,
        .retries = 60,
    };
    kb_curve_args(&o->curve);
    trainer_run_args_t run; /* no --device, no --threads: the towers train on the CPU */
    trainer_run_args(&run, &o->ckpt_dir, &o->keep, &o->resume, &o->metrics, NULL, NULL);
    int emb_opt = 0, lexical = 0, sampling = 0; /* indices in the choices below */
    const char *const emb_opts[] = {"adam", "adagrad", "sgd", NULL};
    const Carls__OptimizerKind emb_opt_kinds[] = {CARLS__OPTIMIZER_KIND__OPT_ADAM, CARLS__OPTIMIZER_KIND__OPT_ADAGRAD,
                                                  CARLS__OPTIMIZER_KIND__OPT_SGD};
    const carls_arg_t args[] = {
        carls_arg_custom("data", &o->pairs, s_arg_data),
        carls_arg_string("index", &o->index_path),
        carls_arg_string("dict", &o->dict_path),
        carls_arg_u64("holdout-seed", &o->holdout_seed),
        carls_arg_int("holdout-count", &o->holdout_count, 1, 1000000),
        carls_arg_string("holdout-file", &o->holdout_file),
        carls_arg_string("write-holdout", &o->write_holdout),
        carls_arg_string("kb", &o->kb),
        carls_arg_group(o->curve.rows),
        carls_arg_group(run.rows),
        carls_arg_string("table", &o->table),
        carls_arg_int("dim", &o->E, 2, 4096),
        carls_arg_int("out-dim", &o->D, 2, 4096),
        carls_arg_int("hidden", &o->H, 0, 4096),
        carls_arg_bool01("logq", &o->logq),
        carls_arg_choice("negatives-sampling", &sampling, (const char *const[]){"uniform", "pairs", NULL}),
        carls_arg_bool01("negatives-shift", &o->negatives_shift),
        carls_arg_float("stale-positives", &o->stale_positives, 0.0, 1.0),
        carls_arg_int("batch", &o->batch, 2, TT_MAX_BATCH),
        carls_arg_int("epochs", &o->epochs, 0, 100000),
        carls_arg_int("max-steps", &o->max_steps, 0, 100000000),
        carls_arg_float("lr", &o->lr, 1e-9, 10.0),
        carls_arg_float("emb-lr", &o->emb_lr, 1e-9, 100.0),
        carls_arg_choice("emb-optimizer", &emb_opt, emb_opts),
        carls_arg_float("init-scale", &o->init_scale, 1e-6, 10.0),
        carls_arg_float("temperature", &o->temperature, 1e-3, 10.0),
        carls_arg_float("token-dropout", &o->token_dropout, 0.0, 0.95),
        carls_arg_int("kb-negatives", &o->negatives, 0, TT_MAX_NEGATIVES),
        carls_arg_int("negatives-every", &o->negatives_every, 1, 1000000),
        carls_arg_u64("seed", &o->seed),
        carls_arg_int("ckpt-every", &o->ckpt_every, 1, 100000000),
        carls_arg_string("bank-snapshot", &o->bank_snapshot),
        carls_arg_either("vectors", &o->vectors_from_trainer, (const char *const[]){"trainer", "makers", NULL}),
        carls_arg_int("word-defs", &o->word_defs, 0, 1000),
        carls_arg_custom("fuse-sweep", o, s_arg_fuse_sweep),
        carls_arg_either("negatives-from", &o->negatives_from_inputs,
                         (const char *const[]){"inputs", "outputs", NULL}),
        carls_arg_float("wait-fresh-s", &o->wait_fresh_s, 0.0, 1e6),
        carls_arg_float("fuse-tfidf", &o->fuse_tfidf, 0.0, 1000.0),
        carls_arg_int("knn-check", &o->knn_check, 0, 1000000),
        carls_arg_int("kb-timeout-ms", &o->timeout_ms, 1, 3600000),
        carls_arg_int("kb-retries", &o->retries, 0, 1000000),
        carls_arg_log_level(),
        carls_arg_choice("lexical", &lexical, (const char *const[]){"tfidf", "bm25", NULL}),
        carls_arg_int("hard-queries", &o->hard_queries, 0, TT_MAX_BATCH),
        carls_arg_int("hard-k", &o->hard_k, 1, 1024),
        carls_arg_bool01("hard-fresh", &o->hard_fresh),
        carls_arg_float("bm25-k1", &o->lexical.k1, 0.0, 100.0),
        carls_arg_float("bm25-b", &o->lexical.b, 0.0, 1.0),
        carls_arg_string("save-vectors", &o->save_vectors),
        carls_arg_string("eval-vectors", &o->eval_vectors),
        {0},
    };
    const int rc = carls_args_parse("trainer twotower", argc, argv, args, s_usage);
    if (rc != 0) {
        return rc;
    }
    if (kb_curve_args_check(&o->curve, "trainer twotower") != 0) {
        return -1;
    }
    o->emb_opt = emb_opt_kinds[emb_opt];
    o->lexical.scheme = lexical == 0 ? TFIDF_COSINE : TFIDF_BM25;
    o->negatives_by_pairs = sampling == 1;
    if ((o->resume || o->bank_snapshot) && !o->ckpt_dir) {
        fprintf(stderr, "trainer: --resume and --bank-snapshot need --ckpt-dir (the checkpoints)\n");
        return -1;
    }
    if (!o->vectors_from_trainer && !o->ckpt_dir) {
        fprintf(stderr, "trainer: --vectors makers needs --ckpt-dir (the makers read the final checkpoint there)\n");
        return -1;
    }
    if (o->hard_queries > 0 && !o->negatives_from_inputs && !o->hard_fresh) {
        fprintf(stderr, "trainer: --hard-queries needs --negatives-from inputs\n");
        return -1;
    }
    if ((o->negatives_shift || o->stale_positives > 0) && !o->negatives_from_inputs) {
        fprintf(stderr, "trainer: --negatives-shift and --stale-positives need --negatives-from inputs\n");
        return -1;
    }
    if (o->negatives > 0 && !o->ckpt_dir)
        fprintf(stderr, "trainer: warning: --kb-negatives without --ckpt-dir: no maker can refresh %s.vec\n",
                o->table);
    return 0;
}
