/* kbctl: command-line client of kb-server for people and scripts.
 *
 *   kbctl [--kb ENDPOINT[,ENDPOINT...]] [--timeout-ms N] [--retries N] [--log-level L]
 *         [--curve-key FILE --curve-server-key FILE] VERB [ARGS...]
 *
 * Every verb goes through kb_cluster (client/kb_cluster.h): with one endpoint it talks to that server, with
 * a list "tcp://a:1,tcp://b:2" the i-th endpoint is shard i and keys are routed by carls_shard_of.
 *
 * Text in, text out: rows are "KEY<TAB>v1 v2 ..." lines and feature records "KEY<TAB>label=... ..." lines
 * (formats in kb_rows_text.h), listings are tab-separated, results go to stdout and everything else (errors,
 * summaries, logs) to stderr.
 * Exit status: 0 success, 1 usage or input error (nothing was sent for bad input), 2 server or connection
 * error (timeout, error status, undecodable answer). */
#include "kb_cluster.h"
#include "kb_curve_args.h"
#include "kb_export.h"
#include "kb_rows_text.h"
#include "log.h"
#include "npy.h"
#include "progress.h"
#include "protocol.h"
#include "util.h"

#include <assert.h>
#include <ctype.h>
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

enum {
    S_EXIT_OK = 0,
    S_EXIT_USAGE = 1,  /* bad command line or bad input: nothing was sent */
    S_EXIT_SERVER = 2, /* the server answered with an error, or could not be reached */
};

#define S_DEFAULT_TIMEOUT_MS 5000
#define S_DEFAULT_RETRIES 2
#define S_DEFAULT_BATCH 1000
#define S_MAX_REPORTED_LINES 20 /* invalid input lines reported before "... and K more" */
#define S_PROGRESS_MIN_ROWS 10000 /* put/push-grad print a final progress line from this many rows on */
#define S_DEFAULT_SCAN_PAGE 1000

/* The global options (before the verb), in the order of their G_* index. */
enum { G_KB, G_TIMEOUT_MS, G_RETRIES, G_LOG_LEVEL, G_CURVE_KEY, G_CURVE_SERVER_KEY, G_N };
static const char *const s_global_options[G_N] = {"kb", "timeout-ms", "retries", "log-level", KB_CURVE_ARG_KEY,
                                                  KB_CURVE_ARG_SERVER_KEY};

/* What the global options say. */
typedef struct {
    const char *endpoint;         /* --kb, else $CARLS_KB; NULL if neither. One endpoint or a list */
    int timeout_ms;               /* per attempt */
    int retries;                  /* extra attempts after a timeout */
    kb_curve_args_t curve;        /* --curve-key, --curve-server-key (kb_curve_args.h; set by s_set_global) */
} s_global_t;

/* One option a verb accepts. */
typedef struct {
    const char *name; /* without the leading "--" */
    bool takes_value;
} s_opt_t;

#define S_MAX_VERB_OPTS 32 /* options one verb may declare (create-table has the most) */

typedef struct s_verb s_verb_t;

/* One run of a verb: its command line once parsed, and the connection it opened. */
typedef struct {
    const s_verb_t *verb;
    const char *name;                 /* the verb's name, for messages */
    const s_global_t *g;
    const char *opt[S_MAX_VERB_OPTS]; /* opt[i]: the value of the verb's option i, "" for a flag that was
                                       * given, NULL when absent */
    char **pos;                       /* the positional arguments, n_pos of them */
    int n_pos;
    kb_cluster_t *c;                  /* opened by s_open; s_run_verb closes it after the verb */
} s_call_t;

/* A verb: what its command line looks like (s_run_verb parses and checks it), its help, and what it does. */
struct s_verb {
    const char *name;
    const char *usage;          /* shown by `kbctl VERB --help`: synopsis, then what it does */
    const s_opt_t *opts;        /* the options it accepts, n_opts of them; option i's value is opt[i] */
    size_t n_opts;
    int min_pos, max_pos;       /* how many positional arguments it takes; max_pos -1: any number */
    bool table_arg;             /* its first positional argument, when given, is a table name */
    int (*run)(s_call_t *call); /* returns the exit status */
};

/* ---- enum names --------------------------------------------------------------------------------------
 * On the command line and in listings a proto enum value goes by its name in carls.proto without the
 * prefix, in lower case with '-' for '_': OPT_SGD is "sgd", OUTLIER_NORM_MEDIAN "norm-median",
 * SAMPLE_LOG_UNIFORM "log-uniform" (carls_enum_name, proto/protocol.h). */

typedef ProtobufCEnumDescriptor s_enum_t;

static const s_enum_t *const s_optimizers = &carls__optimizer_kind__descriptor;
static const s_enum_t *const s_updates = &carls__update_policy__descriptor;
static const s_enum_t *const s_inits = &carls__init_kind__descriptor;
static const s_enum_t *const s_outlier_rules = &carls__outlier_rule__descriptor;
static const s_enum_t *const s_kinds = &carls__table_kind__descriptor;
static const s_enum_t *const s_metrics = &carls__knn_metric__descriptor;
static const s_enum_t *const s_admissions = &carls__admission_kind__descriptor;
static const s_enum_t *const s_evictions = &carls__eviction_kind__descriptor;
static const s_enum_t *const s_strategies = &carls__sample_strategy__descriptor;

/* ---- command-line parsing ---------------------------------------------------------------------------- */

static bool s_is_global_option(const char *name)
{
    for (size_t i = 0; i < G_N; i++)
        if (strcmp(name, s_global_options[i]) == 0)
            return true;
    return false;
}

/* The option of opts (n of them) named by the name_len bytes at name, or -1. */
static int s_find_option(const s_opt_t *opts, size_t n, const char *name, size_t name_len)
{
    for (size_t i = 0; i < n; i++)
        if (strlen(opts[i].name) == name_len && strncmp(opts[i].name, name, name_len) == 0)
            return (int)i;
    return -1;
}

enum { S_PARSE_OK = 0, S_PARSE_HELP = 1, S_PARSE_ERROR = -1 };

/* Parses a verb's arguments (argv[0] is the verb) into call->opt and call->pos (room for argc entries):
 * "--name value", "--name=value", flags, "--help", and "--" ending the options. Returns S_PARSE_OK,
 * S_PARSE_HELP, or S_PARSE_ERROR after printing why. */
static int s_parse_args(s_call_t *call, int argc, char **argv)
{
    const char *verb = call->name;
    const s_opt_t *opts = call->verb->opts;
    bool options_done = false;
    for (int i = 1; i < argc; i++) {
        const char *arg = argv[i];
        if (options_done || arg[0] != '-' || arg[1] == '\0') {
            call->pos[call->n_pos++] = argv[i];
            continue;
        }
        if (strcmp(arg, "--") == 0) {
            options_done = true;
            continue;
        }
        if (strcmp(arg, "--help") == 0 || strcmp(arg, "-h") == 0)
            return S_PARSE_HELP;
        if (arg[1] != '-') {
            fprintf(stderr, "kbctl %s: unknown option %s (see kbctl %s --help)\n", verb, arg, verb);
            return S_PARSE_ERROR;
        }
        const char *name = arg + 2;
        const char *eq = strchr(name, '=');
        size_t name_len = eq ? (size_t)(eq - name) : strlen(name);
        int o = s_find_option(opts, call->verb->n_opts, name, name_len);
        if (o < 0) {
            char bare[64];
            snprintf(bare, sizeof bare, "%.*s", (int)(name_len < 63 ? name_len : 63), name);
            if (s_is_global_option(bare))
                fprintf(stderr, "kbctl %s: --%s is a global option: put it before the verb\n", verb, bare);
            else
                fprintf(stderr, "kbctl %s: unknown option --%s (see kbctl %s --help)\n", verb, bare, verb);
            return S_PARSE_ERROR;
        }
        if (!opts[o].takes_value) {
            if (eq) {
                fprintf(stderr, "kbctl %s: --%s takes no value\n", verb, opts[o].name);
                return S_PARSE_ERROR;
            }
            call->opt[o] = "";
        } else if (eq) {
            call->opt[o] = eq + 1;
        } else if (i + 1 < argc) {
            call->opt[o] = argv[++i];
        } else {
            fprintf(stderr, "kbctl %s: --%s needs a value\n", verb, opts[o].name);
            return S_PARSE_ERROR;
        }
    }
    return S_PARSE_OK;
}

/* Parses an option value as an integer in [lo, hi]. 0, or -1 after printing why. verb "" for global
 * options. */
static int s_opt_u64(const char *verb, const char *opt, const char *text, uint64_t lo, uint64_t hi, uint64_t *out)
{
    uint64_t v;
    if (carls_parse_u64(text, &v) != 0 || v < lo || v > hi) {
        fprintf(stderr, "kbctl%s%s: --%s wants a whole number from %llu to %llu, not \"%s\"\n", *verb ? " " : "",
                verb, opt, (unsigned long long)lo, (unsigned long long)hi, text);
        return -1;
    }
    *out = v;
    return 0;
}

/* Parses a float option that must be > 0 (a zero on the wire means "the server's default", so an explicit
 * 0 could not be honoured) and, when below_one, < 1. 0, or -1 after printing why. */
static int s_opt_positive_float(const char *verb, const char *opt, const char *text, bool below_one, float *out)
{
    float v;
    if (carls_parse_float(text, &v) != 0) {
        fprintf(stderr, "kbctl %s: --%s wants a number, not \"%s\"\n", verb, opt, text);
        return -1;
    }
    if (!(v > 0) || (below_one && !(v < 1))) {
        fprintf(stderr, "kbctl %s: --%s must be %s (leave it out for the server's default)\n", verb, opt,
                below_one ? "> 0 and < 1" : "> 0");
        return -1;
    }
    *out = v;
    return 0;
}

static int s_opt_name(const char *verb, const char *opt, const s_enum_t *names, const char *text, int *out)
{
    if (carls_enum_parse(names, text, out) == 0)
        return 0;
    fprintf(stderr, "kbctl %s: --%s: unknown value \"%s\"; one of:", verb, opt, text);
    for (unsigned i = 0; i < names->n_values; i++)
        fprintf(stderr, " %s", carls_enum_name(&names->values[i]).text);
    fputc('\n', stderr);
    return -1;
}

static int s_check_table_name(const char *verb, const char *name)
{
    if (carls_table_name_valid(name))
        return 0;
    fprintf(stderr, "kbctl %s: invalid table name \"%s\" (1..%u characters of A-Z a-z 0-9 _ . -)\n", verb, name,
            CARLS_MAX_TABLE_NAME_BYTES);
    return -1;
}

/* Parses the call's whole-number option i into *out, which keeps its default when the option is absent. 0,
 * or -1 after printing why. */
static int s_opt_count(const s_call_t *call, int i, uint64_t lo, uint64_t hi, uint64_t *out)
{
    const char *text = call->opt[i];
    return text ? s_opt_u64(call->name, call->verb->opts[i].name, text, lo, hi, out) : 0;
}

/* --batch and --page: rows per request, at most what one request may carry. */
static int s_opt_batch(const s_call_t *call, int i, uint64_t *out)
{
    return s_opt_count(call, i, 1, CARLS_DEFAULT_MAX_KEYS_PER_REQUEST, out);
}

/* Parses the call's option i, one of names, into *out, which keeps its default when the option is absent. 0,
 * or -1 after printing why. */
static int s_opt_choice(const s_call_t *call, int i, const s_enum_t *names, int *out)
{
    const char *text = call->opt[i];
    return text ? s_opt_name(call->name, call->verb->opts[i].name, names, text, out) : 0;
}

/* ---- talking to the server --------------------------------------------------------------------------- */

/* Opens the connection to the bank (one endpoint or the list of shards) into call->c. Exit status: usage for
 * no endpoint or unreadable key files, server when no connection could be opened. */
static int s_open(s_call_t *call)
{
    const s_global_t *g = call->g;
    if (!g->endpoint || !*g->endpoint) {
        fprintf(stderr, "kbctl: no server given: use --kb ENDPOINT (e.g. tcp://127.0.0.1:7000, or a comma-separated "
                        "list of shards) or set CARLS_KB\n");
        return S_EXIT_USAGE;
    }
    kb_client_curve_t keys;
    kb_client_options_t opts = {.timeout_ms = g->timeout_ms, .retries = g->retries};
    if (kb_curve_args_options(&g->curve, "kbctl", &keys, &opts) != 0)
        return S_EXIT_USAGE;
    call->c = kb_cluster_new(g->endpoint, &opts);
    explicit_bzero(&keys, sizeof keys);
    if (!call->c) {
        fprintf(stderr, "kbctl: cannot open a connection to %s\n", g->endpoint);
        return S_EXIT_SERVER;
    }
    return S_EXIT_OK;
}

/* Prints a failed call's error and returns the exit status for it. */
static int s_fail(const s_call_t *call, int rc)
{
    fprintf(stderr, "kbctl %s: %s\n", call->name, kb_cluster_last_error(call->c));
    return rc == KB_CLIENT_EINVAL ? S_EXIT_USAGE : S_EXIT_SERVER;
}

/* Looks table `name` up (kind, dim, index) into *info. Exit status (a missing table is a server error). */
static int s_table_info(const s_call_t *call, const char *name, kb_cluster_table_t *info)
{
    int rc = kb_cluster_table(call->c, name, info);
    if (rc == 0)
        return S_EXIT_OK;
    if (rc == KB_CLIENT_ESTATUS && kb_cluster_last_status(call->c) == CARLS__STATUS_CODE__STATUS_NOT_FOUND) {
        fprintf(stderr, "kbctl %s: no table named \"%s\" on the server\n", call->name, name);
        return S_EXIT_SERVER;
    }
    return s_fail(call, rc);
}

/* Finds table `name` and returns its dimension in *dim; a feature table is a usage error. Exit status. */
static int s_table_dim(const s_call_t *call, const char *name, uint32_t *dim)
{
    kb_cluster_table_t info;
    int st = s_table_info(call, name, &info);
    if (st != S_EXIT_OK)
        return st;
    *dim = info.dim;
    if (info.kind != CARLS__TABLE_KIND__TABLE_EMBEDDING || info.dim == 0) {
        fprintf(stderr, "kbctl %s: table \"%s\" has no dimension (not an embedding table)\n", call->name, name);
        return S_EXIT_USAGE;
    }
    return S_EXIT_OK;
}

/* Checks that table is a feature table. Exit status. */
static int s_need_feature_table(const s_call_t *call, const char *table)
{
    kb_cluster_table_t info;
    int st = s_table_info(call, table, &info);
    if (st == S_EXIT_OK && info.kind != CARLS__TABLE_KIND__TABLE_FEATURE) {
        fprintf(stderr, "kbctl %s: table \"%s\" is not a feature table (use get/put for embeddings)\n", call->name,
                table);
        st = S_EXIT_USAGE;
    }
    return st;
}

/* Opens the connection and finds embedding table `table`'s dimension. Exit status. */
static int s_open_embedding_table(s_call_t *call, const char *table, uint32_t *dim)
{
    int st = s_open(call);
    return st != S_EXIT_OK ? st : s_table_dim(call, table, dim);
}

/* Opens the connection and checks that `table` is a feature table. Exit status. */
static int s_open_feature_table(s_call_t *call, const char *table)
{
    int st = s_open(call);
    return st != S_EXIT_OK ? st : s_need_feature_table(call, table);
}

/* ---- keys and rows in, results out ------------------------------------------------------------------- */

/* Adds the key in `text` to keyset; on a bad key prints "WHAT NUMBER: why" (just "WHAT: why" for number 0)
 * and returns -1. */
static int s_add_key_arg(const s_call_t *call, kb_rows_t *keyset, const char *text, const char *what, int number)
{
    char err[256];
    if (kb_rows_parse_key_line(keyset, text, strlen(text), err, sizeof err) == 0)
        return 0;
    if (number > 0)
        fprintf(stderr, "kbctl %s: %s %d: %s\n", call->name, what, number, err);
    else
        fprintf(stderr, "kbctl %s: %s: %s\n", call->name, what, err);
    return -1;
}

/* The keys in texts[0..n) as a new key set; NULL after printing why (keys are numbered from 1 as `what`). */
static kb_rows_t *s_key_args(const s_call_t *call, char **texts, int n, const char *what)
{
    kb_rows_t *keyset = kb_rows_new(0);
    for (int i = 0; i < n; i++) {
        if (s_add_key_arg(call, keyset, texts[i], what, i + 1) != 0) {
            kb_rows_destroy(&keyset);
            return NULL;
        }
    }
    return keyset;
}

/* Reads the keys to act on: the positional arguments from index `first` on, else one per line from stdin.
 * Every key is checked before anything is sent. Returns the set, or NULL after printing why. */
static kb_rows_t *s_read_keys(const s_call_t *call, int first)
{
    if (call->n_pos > first)
        return s_key_args(call, call->pos + first, call->n_pos - first, "key argument");
    kb_rows_t *keyset = kb_rows_new(0);
    if (kb_rows_read(keyset, stdin, stderr, S_MAX_REPORTED_LINES, NULL) != 0) {
        fprintf(stderr, "kbctl %s: invalid keys on stdin; nothing was sent\n", call->name);
        kb_rows_destroy(&keyset);
        return NULL;
    }
    return keyset;
}

/* Reports input on stdin that was refused before anything was sent: `bad` invalid lines (detail, "" or
 * " (...)", says more), or a read error when bad is 0. Returns S_EXIT_USAGE. */
static int s_refuse_stdin(const s_call_t *call, size_t bad, const char *detail)
{
    if (bad > 0)
        fprintf(stderr, "kbctl %s: %zu invalid line%s on stdin%s; nothing was sent\n", call->name, bad,
                bad == 1 ? "" : "s", detail);
    else
        fprintf(stderr, "kbctl %s: cannot read stdin; nothing was sent\n", call->name);
    return S_EXIT_USAGE;
}

/* Walks a key set in requests of at most `size` keys: after each s_batch_next, keys[0..n) are the set's keys
 * first..first+n-1. */
typedef struct {
    const kb_rows_t *set;
    size_t size;    /* keys per request */
    kb_key_t *keys; /* room for size keys */
    size_t first, n;
} s_batch_t;

static s_batch_t s_batch_start(const kb_rows_t *set, uint64_t size)
{
    return (s_batch_t){.set = set, .size = (size_t)size, .keys = carls_xmalloc((size_t)size * sizeof(kb_key_t))};
}

/* Moves on to the next batch; false when the set is done. */
static bool s_batch_next(s_batch_t *b)
{
    b->first += b->n;
    size_t left = b->set->n - b->first;
    b->n = left < b->size ? left : b->size;
    for (size_t i = 0; i < b->n; i++)
        b->keys[i] = kb_rows_key(b->set, b->first + i);
    return b->n > 0;
}

static void s_batch_end(s_batch_t *b)
{
    free(b->keys);
    b->keys = NULL;
}

/* Reports that writing batch b of `what` ("rows", "records") failed after the batches before it went
 * through. Exit status. */
static int s_batch_failed(const s_call_t *call, int rc, const s_batch_t *b, const char *what)
{
    fprintf(stderr, "kbctl %s: %s %zu..%zu: %s (%zu of %zu %s were sent before)\n", call->name, what, b->first + 1,
            b->first + b->n, kb_cluster_last_error(call->c), b->first, b->set->n, what);
    return rc == KB_CLIENT_EINVAL ? S_EXIT_USAGE : S_EXIT_SERVER;
}

/* Prints KEY<TAB>NUMBER, the number formatted as get formats values; the caller ends the line. */
static void s_print_key_number(const kb_key_t *key, float value)
{
    char num[KB_ROWS_FLOAT_CHARS];
    fwrite(key->data, 1, key->len, stdout);
    kb_rows_format_float(value, num, sizeof num);
    printf("\t%s", num);
}

/* Heads shard s's block of output when there are several shards. */
static void s_print_shard_header(const kb_cluster_t *c, uint32_t s)
{
    if (kb_cluster_shards(c) > 1)
        printf("%sshard %u %s\n", s ? "\n" : "", s, kb_cluster_endpoint(c, s));
}

/* Each verb below comes as its help text (what `kbctl VERB --help` prints), the options it accepts (an enum
 * naming their indices in s_call_t.opt) and the function that runs it; s_verbs at the end lists them. */

/* ---- create-table, list-tables, drop-table ----------------------------------------------------------- */

static const char s_create_table_usage[] =
    "usage: kbctl create-table NAME --dim D [options] | NAME --kind feature [options]\n"
    "Creates a table on every shard. Options left out take the server's defaults.\n"
    "  --kind embedding|feature     vectors (default) or feature records (neighbours, labels, bytes)\n"
    "  --dim D                      values per row (required for embedding tables)\n"
    "  --optimizer sgd|momentum|adagrad|adam\n"
    "  --lr X  --momentum X  --beta1 X  --beta2 X  --epsilon X  --initial-accumulator X\n"
    "  --update lazy|immediate      apply pushed gradients lazily (averaged) or one by one\n"
    "  --max-age-ms N  --max-pending N (1..1024)\n"
    "  --outlier-rule norm-median|none  --outlier-threshold X  --outlier-min-count N\n"
    "  --init zeros|uniform|normal  --init-scale X  --seed N\n"
    "  --knn SPEC                   nearest-neighbour index: a FAISS factory string (Flat, IVF256,Flat, HNSW32)\n"
    "  --metric ip|l2|cosine  --nprobe N (IVF)  --ef-search N (HNSW)\n"
    "  --admission all|frequency|bloom  --min-frequency N  --bloom-bits-log2 N  --bloom-hashes N\n"
    "  --eviction none|lru|oldest  --max-rows N\n"
    "  --if-not-exists              succeed without change when the table exists with the same config\n"
    "Only --admission, --eviction and their options apply to feature tables.\n";

enum {
    CT_DIM, CT_OPTIMIZER, CT_LR, CT_MOMENTUM, CT_BETA1, CT_BETA2, CT_EPSILON, CT_ACCUMULATOR, CT_UPDATE,
    CT_MAX_AGE, CT_MAX_PENDING, CT_OUTLIER_THRESHOLD, CT_OUTLIER_RULE, CT_OUTLIER_MIN, CT_INIT, CT_INIT_SCALE,
    CT_SEED, CT_IF_NOT_EXISTS, CT_KIND, CT_KNN, CT_METRIC, CT_NPROBE, CT_EF_SEARCH, CT_ADMISSION, CT_MIN_FREQ,
    CT_BLOOM_BITS, CT_BLOOM_HASHES, CT_EVICTION, CT_MAX_ROWS, CT_N
};
static const s_opt_t s_create_table_opts[CT_N] = {
    [CT_DIM] = {"dim", true},
    [CT_OPTIMIZER] = {"optimizer", true},
    [CT_LR] = {"lr", true},
    [CT_MOMENTUM] = {"momentum", true},
    [CT_BETA1] = {"beta1", true},
    [CT_BETA2] = {"beta2", true},
    [CT_EPSILON] = {"epsilon", true},
    [CT_ACCUMULATOR] = {"initial-accumulator", true},
    [CT_UPDATE] = {"update", true},
    [CT_MAX_AGE] = {"max-age-ms", true},
    [CT_MAX_PENDING] = {"max-pending", true},
    [CT_OUTLIER_THRESHOLD] = {"outlier-threshold", true},
    [CT_OUTLIER_RULE] = {"outlier-rule", true},
    [CT_OUTLIER_MIN] = {"outlier-min-count", true},
    [CT_INIT] = {"init", true},
    [CT_INIT_SCALE] = {"init-scale", true},
    [CT_SEED] = {"seed", true},
    [CT_IF_NOT_EXISTS] = {"if-not-exists", false},
    [CT_KIND] = {"kind", true},
    [CT_KNN] = {"knn", true},
    [CT_METRIC] = {"metric", true},
    [CT_NPROBE] = {"nprobe", true},
    [CT_EF_SEARCH] = {"ef-search", true},
    [CT_ADMISSION] = {"admission", true},
    [CT_MIN_FREQ] = {"min-frequency", true},
    [CT_BLOOM_BITS] = {"bloom-bits-log2", true},
    [CT_BLOOM_HASHES] = {"bloom-hashes", true},
    [CT_EVICTION] = {"eviction", true},
    [CT_MAX_ROWS] = {"max-rows", true},
};

/* The config create-table sends: cfg points into the parts it uses. */
typedef struct {
    Carls__TableConfig cfg;
    Carls__OptimizerConfig opt;
    Carls__LazyUpdateConfig lazy;
    Carls__KnnConfig knn;
    Carls__AdmissionConfig adm;
    Carls__EvictionConfig ev;
} s_new_table_t;

/* --kind, and which options it rules out: feature tables hold records, not vectors, so the vector options
 * cannot apply (the server would refuse dim and knn; the optimizer ones would be silently meaningless),
 * and an embedding table needs --dim. 0, or -1 after printing why. */
static int s_create_kind(const s_call_t *call, s_new_table_t *t)
{
    int kind = CARLS__TABLE_KIND__TABLE_EMBEDDING;
    if (s_opt_choice(call, CT_KIND, s_kinds, &kind) != 0)
        return -1;
    t->cfg.kind = (Carls__TableKind)kind;
    if (kind == CARLS__TABLE_KIND__TABLE_EMBEDDING) {
        if (!call->opt[CT_DIM]) {
            fprintf(stderr, "kbctl %s: --dim is required\n", call->name);
            return -1;
        }
        t->cfg.optimizer = &t->opt;
        t->cfg.lazy = &t->lazy;
        return 0;
    }
    static const int vector_only[] = {CT_DIM,        CT_OPTIMIZER,         CT_LR,           CT_MOMENTUM,
                                      CT_BETA1,      CT_BETA2,             CT_EPSILON,      CT_ACCUMULATOR,
                                      CT_UPDATE,     CT_MAX_AGE,           CT_MAX_PENDING,  CT_OUTLIER_THRESHOLD,
                                      CT_OUTLIER_RULE, CT_OUTLIER_MIN,     CT_INIT,         CT_INIT_SCALE,
                                      CT_SEED,       CT_KNN,               CT_METRIC,       CT_NPROBE,
                                      CT_EF_SEARCH};
    for (size_t i = 0; i < sizeof vector_only / sizeof vector_only[0]; i++) {
        if (call->opt[vector_only[i]]) {
            fprintf(stderr, "kbctl %s: --%s does not apply to a feature table\n", call->name,
                    s_create_table_opts[vector_only[i]].name);
            return -1;
        }
    }
    return 0;
}

/* --dim and the named choices of an embedding table (optimizer, update policy, outlier rule, init). 0, or
 * -1 after printing why. */
static int s_create_choices(const s_call_t *call, s_new_table_t *t)
{
    uint64_t dim = 0;
    if (s_opt_count(call, CT_DIM, 1, UINT32_MAX, &dim) != 0)
        return -1;
    t->cfg.dim = (uint32_t)dim;
    int optimizer = t->opt.kind, update = t->lazy.policy, outlier_rule = t->lazy.outlier_rule, init = t->cfg.init;
    if (s_opt_choice(call, CT_OPTIMIZER, s_optimizers, &optimizer) != 0 ||
        s_opt_choice(call, CT_UPDATE, s_updates, &update) != 0 ||
        s_opt_choice(call, CT_OUTLIER_RULE, s_outlier_rules, &outlier_rule) != 0 ||
        s_opt_choice(call, CT_INIT, s_inits, &init) != 0)
        return -1;
    t->opt.kind = (Carls__OptimizerKind)optimizer;
    t->lazy.policy = (Carls__UpdatePolicy)update;
    t->lazy.outlier_rule = (Carls__OutlierRule)outlier_rule;
    t->cfg.init = (Carls__InitKind)init;
    return 0;
}

/* The numeric options: floats > 0 (some also < 1) and whole numbers in a range. 0, or -1 after printing
 * why. */
static int s_create_numbers(const s_call_t *call, s_new_table_t *t)
{
    const struct {
        int o;
        float *dst;
        bool below_one;
    } floats[] = {
        {CT_LR, &t->opt.learning_rate, false},     {CT_MOMENTUM, &t->opt.momentum, true},
        {CT_BETA1, &t->opt.beta1, true},           {CT_BETA2, &t->opt.beta2, true},
        {CT_EPSILON, &t->opt.epsilon, false},      {CT_ACCUMULATOR, &t->opt.initial_accumulator, false},
        {CT_OUTLIER_THRESHOLD, &t->lazy.outlier_threshold, false}, {CT_INIT_SCALE, &t->cfg.init_scale, false},
    };
    for (size_t i = 0; i < sizeof floats / sizeof floats[0]; i++) {
        const char *text = call->opt[floats[i].o];
        if (text && s_opt_positive_float(call->name, s_create_table_opts[floats[i].o].name, text,
                                         floats[i].below_one, floats[i].dst) != 0)
            return -1;
    }
    /* The destination is a u32 or a u64 field. */
    const struct {
        int o;
        uint64_t lo, hi;
        uint32_t *dst32;
        uint64_t *dst64;
    } ints[] = {
        {CT_MAX_AGE, 1, UINT32_MAX, &t->lazy.max_age_ms, NULL},
        {CT_MAX_PENDING, 1, CARLS_MAX_PENDING_LIMIT, &t->lazy.max_pending, NULL},
        {CT_OUTLIER_MIN, 1, UINT32_MAX, &t->lazy.outlier_min_count, NULL},
        {CT_SEED, 0, UINT64_MAX, NULL, &t->cfg.init_seed},
        {CT_NPROBE, 1, UINT32_MAX, &t->knn.nprobe, NULL},
        {CT_EF_SEARCH, 1, UINT32_MAX, &t->knn.ef_search, NULL},
        {CT_MIN_FREQ, 1, UINT32_MAX, &t->adm.min_frequency, NULL},
        {CT_BLOOM_BITS, 1, 30, &t->adm.bloom_bits_log2, NULL},
        {CT_BLOOM_HASHES, 1, 64, &t->adm.bloom_hashes, NULL},
        {CT_MAX_ROWS, 1, UINT64_MAX, NULL, &t->ev.max_rows},
    };
    for (size_t i = 0; i < sizeof ints / sizeof ints[0]; i++) {
        uint64_t u;
        if (!call->opt[ints[i].o])
            continue;
        if (s_opt_count(call, ints[i].o, ints[i].lo, ints[i].hi, &u) != 0)
            return -1;
        if (ints[i].dst32)
            *ints[i].dst32 = (uint32_t)u;
        else
            *ints[i].dst64 = u;
    }
    return 0;
}

/* The nearest-neighbour index: --knn names it; the other index options only make sense with it. 0, or -1
 * after printing why. */
static int s_create_index(const s_call_t *call, s_new_table_t *t)
{
    const char *spec = call->opt[CT_KNN];
    if (!spec) {
        if (call->opt[CT_METRIC] || call->opt[CT_NPROBE] || call->opt[CT_EF_SEARCH]) {
            fprintf(stderr, "kbctl %s: --metric, --nprobe and --ef-search need --knn SPEC\n", call->name);
            return -1;
        }
        return 0;
    }
    if (!*spec) {
        fprintf(stderr, "kbctl %s: --knn wants a FAISS index spec such as Flat, IVF256,Flat or HNSW32\n",
                call->name);
        return -1;
    }
    t->knn.spec = (char *)spec;
    int metric = t->knn.metric;
    if (s_opt_choice(call, CT_METRIC, s_metrics, &metric) != 0)
        return -1;
    t->knn.metric = (Carls__KnnMetric)metric;
    t->cfg.knn = &t->knn;
    return 0;
}

/* Admission and eviction, each with the options that go with it. 0, or -1 after printing why. */
static int s_create_admission_eviction(const s_call_t *call, s_new_table_t *t)
{
    int admission = t->adm.kind, eviction = t->ev.kind;
    if (s_opt_choice(call, CT_ADMISSION, s_admissions, &admission) != 0)
        return -1;
    t->adm.kind = (Carls__AdmissionKind)admission;
    if ((call->opt[CT_MIN_FREQ] && admission == CARLS__ADMISSION_KIND__ADMIT_ALL) ||
        ((call->opt[CT_BLOOM_BITS] || call->opt[CT_BLOOM_HASHES]) &&
         admission != CARLS__ADMISSION_KIND__ADMIT_BLOOM)) {
        fprintf(stderr, "kbctl %s: --min-frequency needs --admission frequency|bloom; --bloom-bits-log2 and "
                        "--bloom-hashes need --admission bloom\n", call->name);
        return -1;
    }
    if (call->opt[CT_ADMISSION])
        t->cfg.admission = &t->adm;
    if (s_opt_choice(call, CT_EVICTION, s_evictions, &eviction) != 0)
        return -1;
    t->ev.kind = (Carls__EvictionKind)eviction;
    if ((eviction != CARLS__EVICTION_KIND__EVICT_NONE) != (call->opt[CT_MAX_ROWS] != NULL)) {
        fprintf(stderr, "kbctl %s: --eviction lru|oldest and --max-rows N go together\n", call->name);
        return -1;
    }
    if (call->opt[CT_EVICTION])
        t->cfg.eviction = &t->ev;
    return 0;
}

static int s_create_table(s_call_t *call)
{
    const char *name = call->pos[0];
    s_new_table_t t = {CARLS__TABLE_CONFIG__INIT,  CARLS__OPTIMIZER_CONFIG__INIT, CARLS__LAZY_UPDATE_CONFIG__INIT,
                       CARLS__KNN_CONFIG__INIT,    CARLS__ADMISSION_CONFIG__INIT, CARLS__EVICTION_CONFIG__INIT};
    if (s_create_kind(call, &t) != 0 || s_create_choices(call, &t) != 0 || s_create_numbers(call, &t) != 0 ||
        s_create_index(call, &t) != 0 || s_create_admission_eviction(call, &t) != 0)
        return S_EXIT_USAGE;
    int st = s_open(call);
    if (st != S_EXIT_OK)
        return st;
    bool if_not_exists = call->opt[CT_IF_NOT_EXISTS] != NULL;
    int rc = kb_cluster_create_table(call->c, name, &t.cfg, if_not_exists);
    if (rc != 0)
        return s_fail(call, rc);
    const char *done = if_not_exists ? "created or found" : "created";
    if (t.cfg.kind == CARLS__TABLE_KIND__TABLE_FEATURE)
        fprintf(stderr, "%s feature table %s\n", done, name);
    else
        fprintf(stderr, "%s table %s (dim %u, %s, %s%s%s)\n", done, name, t.cfg.dim,
                carls_enum_name_of(s_optimizers, t.opt.kind).text, carls_enum_name_of(s_updates, t.lazy.policy).text,
                t.cfg.knn ? ", knn " : "", t.cfg.knn ? t.knn.spec : "");
    return S_EXIT_OK;
}

static const char s_list_tables_usage[] =
    "usage: kbctl list-tables\n"
    "One line per table, tab-separated: name, dim, rows, optimizer, update policy. With several shards the\n"
    "tables are shard 0's and rows are summed over the shards.\n";

static int s_list_tables(s_call_t *call)
{
    int st = s_open(call);
    if (st != S_EXIT_OK)
        return st;
    Carls__Response *resp = NULL;
    int rc = kb_cluster_list_tables(call->c, &resp);
    if (rc != 0)
        return s_fail(call, rc);
    for (size_t i = 0; i < resp->table_list->n_tables; i++) {
        const Carls__TableInfo *t = resp->table_list->tables[i];
        const Carls__TableConfig *cfg = t->config;
        printf("%s\t%u\t%llu\t%s\t%s\n", t->name ? t->name : "", cfg ? cfg->dim : 0, (unsigned long long)t->rows,
               carls_enum_name_of(s_optimizers, (cfg && cfg->optimizer) ? (int)cfg->optimizer->kind : 0).text,
               carls_enum_name_of(s_updates, (cfg && cfg->lazy) ? (int)cfg->lazy->policy : 0).text);
    }
    carls__response__free_unpacked(resp, NULL);
    return S_EXIT_OK;
}

static const char s_drop_table_usage[] =
    "usage: kbctl drop-table NAME [--if-exists]\n"
    "Deletes a table and its rows. --if-exists: succeed when there is no such table.\n";

enum { DT_IF_EXISTS, DT_N };
static const s_opt_t s_drop_table_opts[DT_N] = {[DT_IF_EXISTS] = {"if-exists", false}};

static int s_drop_table(s_call_t *call)
{
    int st = s_open(call);
    if (st != S_EXIT_OK)
        return st;
    int rc = kb_cluster_drop_table(call->c, call->pos[0], call->opt[DT_IF_EXISTS] != NULL);
    if (rc != 0)
        return s_fail(call, rc);
    fprintf(stderr, "dropped table %s\n", call->pos[0]);
    return S_EXIT_OK;
}

/* ---- rows: put, push-grad, get ----------------------------------------------------------------------- */

static const char s_put_usage[] =
    "usage: kbctl put TABLE [--version N] [--batch N] < rows\n"
    "       kbctl put TABLE --npy VALUES.npy --keys KEYS.txt [--version N] [--batch N]\n"
    "Writes rows read from stdin, one per line: KEY, a TAB, then dim numbers separated by spaces or TABs.\n"
    "Every line is checked first (dim numbers, all finite, non-empty key); with any invalid line nothing\n"
    "is sent and the exit status is 1. Rows go in batches of --batch (default 1000) rows per request,\n"
    "tagged with --version (default 0). Prints \"put N rows into TABLE\" to stderr.\n"
    "With --npy, the values are a NumPy array of shape (N, dim) (float32, float64 or integers) and the keys\n"
    "the N lines of KEYS.txt (one key a line, the whole line, as `get` reads keys); both files are read and\n"
    "checked whole first (shape, NaN and infinities, key count), errors name the file and the row or line.\n";

static const char s_push_grad_usage[] =
    "usage: kbctl push-grad TABLE [--batch N] [--npy GRADS.npy --keys KEYS.txt] < gradients\n"
    "Pushes gradient rows read from stdin (same format and checks as put, --npy too); each row is one\n"
    "gradient.\n";

enum { W_BATCH, W_NPY, W_KEYS, W_VERSION, W_N };
static const s_opt_t s_put_opts[W_N] = {[W_BATCH] = {"batch", true},
                                        [W_NPY] = {"npy", true},
                                        [W_KEYS] = {"keys", true},
                                        [W_VERSION] = {"version", true}};
static const s_opt_t s_push_grad_opts[W_N - 1] = {
    [W_BATCH] = {"batch", true}, [W_NPY] = {"npy", true}, [W_KEYS] = {"keys", true}}; /* a gradient has no version */

/* Rows from a NumPy file of values and a text file of keys (one a line), both read and checked whole:
 * the array must be (N, dim) (dim 0: any width, which *dim_out receives) without NaN or infinities, the keys
 * file N valid key lines. NULL after printing why, naming the file and the row or line. */
static kb_rows_t *s_npy_rows(const s_call_t *call, const char *npy_path, const char *keys_path, uint32_t dim,
                             uint32_t *dim_out)
{
    FILE *kf = fopen(keys_path, "r");
    if (!kf) {
        fprintf(stderr, "kbctl %s: cannot open %s: %s; nothing was sent\n", call->name, keys_path, strerror(errno));
        return NULL;
    }
    /* One key a line, blank lines included (they would shift every key after them): each line must be a key. */
    kb_rows_t *keys = kb_rows_new(0), *rows = NULL;
    size_t bad = 0, lineno = 0, cap = 0;
    char *line = NULL, why[256];
    ssize_t len;
    while ((len = getline(&line, &cap, kf)) != -1) {
        lineno++;
        if (len > 0 && line[len - 1] == '\n')
            len--;
        if (kb_rows_parse_key_line(keys, line, (size_t)len, why, sizeof why) != 0 && ++bad <= S_MAX_REPORTED_LINES)
            fprintf(stderr, "%s: line %zu: %s\n", keys_path, lineno, why);
    }
    int rc = bad || ferror(kf) ? -1 : 0;
    free(line);
    fclose(kf);
    carls_npy_t a;
    float *x = NULL;
    char err[768];
    if (rc != 0) {
        fprintf(stderr, "kbctl %s: %s: %zu invalid key line%s (above); nothing was sent\n", call->name, keys_path,
                bad, bad == 1 ? "" : "s");
    } else if (carls_npy_read(npy_path, &a, err, sizeof err) != 0) {
        fprintf(stderr, "kbctl %s: %s; nothing was sent\n", call->name, err);
        rc = -1;
    } else {
        if (a.ndim != 2 || a.cols == 0 || a.cols > UINT32_MAX)
            snprintf(err, sizeof err, "%s: values must have shape (N, dim); this is %s(%llu%s)", npy_path,
                     a.ndim == 2 ? "" : "1-d ", (unsigned long long)a.rows, a.ndim == 2 ? ", 0" : ",");
        else if (dim && a.cols != dim)
            snprintf(err, sizeof err, "%s has %llu values a row; the table has dim %u", npy_path,
                     (unsigned long long)a.cols, dim);
        else if (a.rows != keys->n)
            snprintf(err, sizeof err, "%s has %llu rows but %s has %zu keys", npy_path, (unsigned long long)a.rows,
                     keys_path, keys->n);
        else if (carls_npy_to_f32(&a, npy_path, &x, err, sizeof err) == 0)
            err[0] = '\0';
        if (err[0]) {
            fprintf(stderr, "kbctl %s: %s; nothing was sent\n", call->name, err);
            rc = -1;
        } else {
            *dim_out = (uint32_t)a.cols;
            rows = kb_rows_new((uint32_t)a.cols);
            for (size_t i = 0; i < keys->n; i++) {
                kb_key_t k = kb_rows_key(keys, i);
                kb_rows_append(rows, k.data, k.len, x + i * a.cols);
            }
        }
        carls_npy_free(&a);
    }
    free(x);
    kb_rows_destroy(&keys);
    return rows;
}

/* Sends rows to table in batches of `batch` (put with version, or push-grad), showing progress. Exit status. */
static int s_send_rows(s_call_t *call, const char *table, const kb_rows_t *rows, uint64_t batch, bool gradients,
                       uint64_t version)
{
    const uint32_t dim = rows->dim;
    carls_progress_t progress;
    carls_progress_start_units(&progress, gradients ? "push-grad" : "put", (int64_t)rows->n, "rows");
    int st = S_EXIT_OK;
    s_batch_t b = s_batch_start(rows, batch);
    while (st == S_EXIT_OK && s_batch_next(&b)) {
        const float *values = rows->values + b.first * dim;
        int rc = gradients ? kb_cluster_push_gradients(call->c, table, b.keys, b.n, dim, values)
                           : kb_cluster_put(call->c, table, b.keys, b.n, dim, values, version);
        if (rc != 0) {
            carls_progress_clear(&progress);
            st = s_batch_failed(call, rc, &b, "rows");
        } else {
            carls_progress_add(&progress, (int64_t)b.n);
        }
    }
    if (st == S_EXIT_OK && rows->n >= S_PROGRESS_MIN_ROWS)
        carls_progress_finish(&progress, NULL);
    else
        carls_progress_clear(&progress);
    s_batch_end(&b);
    return st;
}

/* put and push-grad: read and check every row (stdin, or --npy and --keys), then send them in batches. */
static int s_write_rows(s_call_t *call, bool gradients)
{
    const char *table = call->pos[0];
    uint64_t batch = S_DEFAULT_BATCH, version = 0;
    if (s_opt_batch(call, W_BATCH, &batch) != 0 ||
        (!gradients && s_opt_count(call, W_VERSION, 0, UINT64_MAX, &version) != 0))
        return S_EXIT_USAGE;
    const char *npy = call->opt[W_NPY], *keys = call->opt[W_KEYS];
    if ((npy == NULL) != (keys == NULL)) {
        fprintf(stderr, "kbctl %s: --npy VALUES.npy and --keys KEYS.txt go together\n", call->name);
        return S_EXIT_USAGE;
    }
    uint32_t dim = 0;
    int st = s_open_embedding_table(call, table, &dim);
    if (st != S_EXIT_OK)
        return st;
    kb_rows_t *rows = NULL;
    if (npy) {
        rows = s_npy_rows(call, npy, keys, dim, &dim);
        if (!rows)
            return S_EXIT_USAGE;
    } else {
        rows = kb_rows_new(dim);
        size_t bad = 0;
        if (kb_rows_read(rows, stdin, stderr, S_MAX_REPORTED_LINES, &bad) != 0) {
            char detail[CARLS_MAX_TABLE_NAME_BYTES + 48];
            snprintf(detail, sizeof detail, " (table %s has dim %u)", table, dim);
            kb_rows_destroy(&rows);
            return s_refuse_stdin(call, bad, detail);
        }
    }
    st = s_send_rows(call, table, rows, batch, gradients, version);
    size_t n = rows->n;
    if (st == S_EXIT_OK && gradients)
        fprintf(stderr, "pushed %zu gradient row%s to %s\n", n, n == 1 ? "" : "s", table);
    else if (st == S_EXIT_OK)
        fprintf(stderr, "put %zu row%s into %s\n", n, n == 1 ? "" : "s", table);
    kb_rows_destroy(&rows);
    return st;
}

static int s_put(s_call_t *call) { return s_write_rows(call, false); }

static int s_push_grad(s_call_t *call) { return s_write_rows(call, true); }

static const char s_get_usage[] =
    "usage: kbctl get TABLE [--meta] [--no-create] [--batch N] [KEY...]\n"
    "Looks up the keys given (or one key per line on stdin when none are given) and prints one line per\n"
    "key: KEY, a TAB, the values separated by single spaces, each as \"%g\" when that reads back to the\n"
    "same float and as \"%.9g\" otherwise, so the printed values read back exactly.\n"
    "  --meta       adds TAB-separated columns: version, updated_at_ms, frequency\n"
    "  --no-create  do not insert unseen keys (they still show their initial value)\n";

/* get's options; get-feature takes the first two (a feature lookup creates nothing). */
enum { GET_META, GET_BATCH, GET_NO_CREATE, GET_N };
static const s_opt_t s_get_opts[GET_N] = {
    [GET_META] = {"meta", false},
    [GET_BATCH] = {"batch", true},
    [GET_NO_CREATE] = {"no-create", false},
};

/* get's lookups: the keys in batches of `batch`, one output line per key. Exit status. */
static int s_get_rows(s_call_t *call, const kb_rows_t *keyset, uint64_t batch, uint32_t dim)
{
    bool meta = call->opt[GET_META] != NULL, no_create = call->opt[GET_NO_CREATE] != NULL;
    float *values = carls_xmalloc((size_t)batch * dim * sizeof *values);
    kb_row_meta_t *metas = meta ? carls_xmalloc((size_t)batch * sizeof *metas) : NULL;
    s_batch_t b = s_batch_start(keyset, batch);
    int st = S_EXIT_OK;
    while (st == S_EXIT_OK && s_batch_next(&b)) {
        int rc = kb_cluster_lookup_ex(call->c, call->pos[0], b.keys, b.n, dim, no_create, values, metas);
        if (rc != 0) {
            st = s_fail(call, rc);
            break;
        }
        for (size_t i = 0; i < b.n; i++) {
            kb_rows_write_row(stdout, b.keys[i].data, b.keys[i].len, values + i * dim, dim);
            if (meta)
                printf("\t%llu\t%lld\t%llu", (unsigned long long)metas[i].version,
                       (long long)metas[i].updated_at_ms, (unsigned long long)metas[i].frequency);
            putchar('\n');
        }
    }
    s_batch_end(&b);
    free(values);
    free(metas);
    return st;
}

/* ---- feature records: put-feature, get-feature (and the lookup it shares with get) --------------------- */

static const char s_put_feature_usage[] =
    "usage: kbctl put-feature TABLE [--batch N] < lines\n"
    "Replaces feature records read from stdin, one per line:\n"
    "  KEY<TAB>label=3 confidence=0.9 version=2 neighbors=a:0.5,b:0.25 data=00ff\n"
    "Fields (any order, each optional): label=INT or flabel=FLOAT, confidence=X, version=N,\n"
    "neighbors=KEY:WEIGHT,... and data=HEX. Keys (the line's and the neighbours') are percent-encoded:\n"
    "bytes outside ! .. ~ and each of % , : = are written %XX. updated_at_ms= is accepted and ignored;\n"
    "found=false lines (from get-feature) are skipped. Every line is checked first; with any invalid line\n"
    "nothing is sent. So `kbctl get-feature T ... | kbctl put-feature T2` copies records.\n";

enum { PF_BATCH, PF_N };
static const s_opt_t s_put_feature_opts[PF_N] = {[PF_BATCH] = {"batch", true}};

static int s_put_feature(s_call_t *call)
{
    const char *table = call->pos[0];
    uint64_t batch = S_DEFAULT_BATCH;
    if (s_opt_batch(call, PF_BATCH, &batch) != 0)
        return S_EXIT_USAGE;
    int st = s_open_feature_table(call, table);
    if (st != S_EXIT_OK)
        return st;
    kb_feature_rows_t *rows = kb_feature_rows_new();
    size_t bad = 0;
    if (kb_feature_rows_read(rows, stdin, stderr, S_MAX_REPORTED_LINES, &bad) != 0) {
        kb_feature_rows_destroy(&rows);
        return s_refuse_stdin(call, bad, "");
    }
    s_batch_t b = s_batch_start(rows->keys, batch);
    while (st == S_EXIT_OK && s_batch_next(&b)) {
        int rc = kb_cluster_feature_put(call->c, table, b.keys, b.n,
                                        (const Carls__FeatureRecord *const *)rows->records + b.first);
        if (rc != 0)
            st = s_batch_failed(call, rc, &b, "records");
    }
    if (st == S_EXIT_OK) {
        size_t n = rows->keys->n;
        fprintf(stderr, "put %zu record%s into %s", n, n == 1 ? "" : "s", table);
        if (rows->skipped)
            fprintf(stderr, " (skipped %zu found=false line%s)", rows->skipped, rows->skipped == 1 ? "" : "s");
        fputc('\n', stderr);
    }
    s_batch_end(&b);
    kb_feature_rows_destroy(&rows);
    return st;
}

static const char s_get_feature_usage[] =
    "usage: kbctl get-feature TABLE [--meta] [--batch N] [KEY...]\n"
    "Prints the records of the keys given (as they are, not encoded), or of one key per line on stdin, in the\n"
    "put-feature line format; a key without a record prints KEY<TAB>found=false. --meta adds\n"
    "updated_at_ms=N (the server's time of the last put).\n";

static const s_opt_t s_get_feature_opts[GET_NO_CREATE] = {[GET_META] = {"meta", false}, [GET_BATCH] = {"batch", true}};

/* get-feature's requests: the keys in batches of `batch`, one output line per key. Exit status. */
static int s_get_records(s_call_t *call, const kb_rows_t *keyset, uint64_t batch)
{
    s_batch_t b = s_batch_start(keyset, batch);
    int st = S_EXIT_OK;
    while (st == S_EXIT_OK && s_batch_next(&b)) {
        kb_feature_result_t *res = NULL;
        int rc = kb_cluster_feature_get(call->c, call->pos[0], b.keys, b.n, &res);
        if (rc != 0) {
            st = s_fail(call, rc);
            break;
        }
        for (size_t i = 0; i < b.n; i++) {
            kb_feature_write_line(stdout, b.keys[i].data, b.keys[i].len, res->records[i], call->opt[GET_META] != NULL);
            putchar('\n');
        }
        kb_feature_result_destroy(&res);
    }
    s_batch_end(&b);
    return st;
}

/* get and get-feature: checks every key (the arguments, else stdin) before it looks them up in batches of
 * --batch and prints one line per key. */
static int s_look_up(s_call_t *call, bool feature)
{
    uint64_t batch = S_DEFAULT_BATCH;
    if (s_opt_batch(call, GET_BATCH, &batch) != 0)
        return S_EXIT_USAGE;
    kb_rows_t *keyset = s_read_keys(call, 1);
    if (!keyset)
        return S_EXIT_USAGE;
    const char *table = call->pos[0];
    uint32_t dim = 0;
    int st = feature ? s_open_feature_table(call, table) : s_open_embedding_table(call, table, &dim);
    if (st == S_EXIT_OK)
        st = feature ? s_get_records(call, keyset, batch) : s_get_rows(call, keyset, batch, dim);
    kb_rows_destroy(&keyset);
    return st;
}

static int s_get(s_call_t *call) { return s_look_up(call, false); }

static int s_get_feature(s_call_t *call) { return s_look_up(call, true); }

/* ---- stats, checkpoint ------------------------------------------------------------------------------- */

/* Prints one "LABEL OP: count N, p50 X us, p99 Y us, max Z us" line per operation. */
static void s_print_latencies(const char *label, Carls__LatencySummary *const *ops, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        const Carls__LatencySummary *l = ops[i];
        printf("%s %s: count %llu, p50 %.1f us, p99 %.1f us, max %.1f us\n", label, l->op ? l->op : "",
               (unsigned long long)l->count, l->p50_us, l->p99_us, l->max_us);
    }
}

/* Prints one server's stats block (what `kbctl stats` shows for one shard). */
static void s_print_stats(const Carls__StatsResult *s)
{
    printf("server\n");
    printf("uptime_ms: %llu\n", (unsigned long long)s->uptime_ms);
    printf("threads: %u\n", s->threads);
    printf("durability: %s\n", s->durability ? s->durability : "");
    printf("requests: %llu\n", (unsigned long long)s->requests);
    printf("errors: %llu\n", (unsigned long long)s->errors);
    printf("malformed_frames: %llu\n", (unsigned long long)s->malformed_frames);
    printf("duplicate_writes: %llu\n", (unsigned long long)s->duplicate_writes);
    printf("commits: %llu\n", (unsigned long long)s->commits);
    printf("committed_epoch: %llu\n", (unsigned long long)s->committed_epoch);
    printf("commit_failures: %llu\n", (unsigned long long)s->commit_failures);
    printf("rows_written: %llu\n", (unsigned long long)s->rows_written);
    printf("frequencies_written: %llu\n", (unsigned long long)s->frequencies_written);
    printf("journal_bytes: %llu\n", (unsigned long long)s->journal_bytes);
    printf("compactions: %llu\n", (unsigned long long)s->compactions);
    printf("compacted_epoch: %llu\n", (unsigned long long)s->compacted_epoch);
    printf("compaction_queue_rows: %llu\n", (unsigned long long)s->compaction_queue_rows);
    printf("compaction_queue_bytes: %llu\n", (unsigned long long)s->compaction_queue_bytes);
    printf("compacting: %s\n", s->compacting ? "yes" : "no");
    printf("compaction_rows_skipped: %llu\n", (unsigned long long)s->compaction_rows_skipped);
    printf("compactions_without_pending: %llu\n", (unsigned long long)s->compactions_without_pending);
    if (s->cache_bytes) { /* kb-server --cache-bytes (docs/STATE.md) */
        printf("cache_bytes: %llu\n", (unsigned long long)s->cache_bytes);
        printf("cache_resident_bytes: %llu\n", (unsigned long long)s->cache_resident_bytes);
        printf("cache_reads: %llu\n", (unsigned long long)s->cache_reads);
        printf("cache_loads: %llu\n", (unsigned long long)s->cache_loads);
        printf("cache_evictions: %llu\n", (unsigned long long)s->cache_evictions);
    }
    printf("memory_bytes: %llu\n", (unsigned long long)s->memory_bytes);
    printf("memory_limit: %llu%s\n", (unsigned long long)s->memory_limit, s->memory_limit ? "" : " (unlimited)");
    printf("memory_refusals: %llu\n", (unsigned long long)s->memory_refusals);
    printf("memory_refused_rows: %llu\n", (unsigned long long)s->memory_refused_rows);
    printf("rss_bytes: %llu\n", (unsigned long long)s->rss_bytes);
    s_print_latencies("latency", s->latency, s->n_latency);
    for (size_t i = 0; i < s->n_tables; i++) {
        const Carls__TableStats *t = s->tables[i];
        printf("\ntable %s\n", t->name ? t->name : "");
        printf("dim: %u\n", t->dim);
        printf("rows: %llu\n", (unsigned long long)t->rows);
        printf("lookups: %llu\n", (unsigned long long)t->lookups);
        printf("puts: %llu\n", (unsigned long long)t->puts);
        printf("pending_keys: %llu\n", (unsigned long long)t->pending_keys);
        printf("pending_gradients: %llu\n", (unsigned long long)t->pending_gradients);
        printf("gradients_received: %llu\n", (unsigned long long)t->gradients_received);
        printf("gradients_applied: %llu\n", (unsigned long long)t->gradients_applied);
        printf("outliers_dropped: %llu\n", (unsigned long long)t->outliers_dropped);
        printf("updates_applied: %llu\n", (unsigned long long)t->updates_applied);
        printf("applied_on_lookup: %llu\n", (unsigned long long)t->applied_on_lookup);
        printf("applied_on_age: %llu\n", (unsigned long long)t->applied_on_age);
        printf("applied_on_count: %llu\n", (unsigned long long)t->applied_on_count);
        printf("kind: %s\n", carls_enum_name_of(s_kinds, (int)t->kind).text);
        printf("not_admitted: %llu\n", (unsigned long long)t->not_admitted);
        printf("not_persisted: %llu\n", (unsigned long long)t->not_persisted);
        printf("evictions: %llu\n", (unsigned long long)t->evictions);
        printf("knn_ready: %s\n", t->knn_ready ? "true" : "false");
        printf("knn_count: %llu\n", (unsigned long long)t->knn_count);
        printf("knn_indexed: %llu\n", (unsigned long long)t->knn_indexed);
        printf("knn_pending: %llu\n", (unsigned long long)t->knn_pending);
        printf("knn_rebuilds: %llu\n", (unsigned long long)t->knn_rebuilds);
        printf("bytes: %llu\n", (unsigned long long)t->bytes);
        printf("request_errors: %llu\n", (unsigned long long)t->request_errors);
        printf("memory_refusals: %llu\n", (unsigned long long)t->memory_refusals);
        printf("memory_refused_rows: %llu\n", (unsigned long long)t->memory_refused_rows);
        s_print_latencies("requests", t->requests, t->n_requests);
    }
}

static const char s_stats_usage[] =
    "usage: kbctl stats [TABLE]\n"
    "Prints server-wide counters, latency percentiles per operation, then one block per table (or only\n"
    "TABLE): \"key: value\" lines, blocks separated by a blank line. With several shards, each shard's\n"
    "output follows a line \"shard I ENDPOINT\".\n";

static int s_stats(s_call_t *call)
{
    const char *table = call->n_pos ? call->pos[0] : NULL;
    int st = s_open(call);
    if (st != S_EXIT_OK)
        return st;
    for (uint32_t s = 0; s < kb_cluster_shards(call->c); s++) {
        Carls__Response *resp = NULL;
        int rc = kb_cluster_stats(call->c, s, table, &resp);
        if (rc != 0)
            return s_fail(call, rc);
        s_print_shard_header(call->c, s);
        s_print_stats(resp->stats);
        carls__response__free_unpacked(resp, NULL);
    }
    return S_EXIT_OK;
}

static const char s_checkpoint_usage[] =
    "usage: kbctl checkpoint\n"
    "Asks every server to commit everything and checkpoint its database; prints committed_epoch and rows\n"
    "(per shard, after a \"shard I ENDPOINT\" line, when there are several).\n";

static int s_checkpoint(s_call_t *call)
{
    int st = s_open(call);
    if (st != S_EXIT_OK)
        return st;
    uint32_t shards = kb_cluster_shards(call->c);
    Carls__CheckpointResult *res = carls_xcalloc(shards, sizeof *res);
    int rc = kb_cluster_checkpoint(call->c, res);
    if (rc != 0) {
        st = s_fail(call, rc);
    } else {
        for (uint32_t s = 0; s < shards; s++) {
            s_print_shard_header(call->c, s);
            printf("committed_epoch: %llu\nrows: %llu\n", (unsigned long long)res[s].committed_epoch,
                   (unsigned long long)res[s].rows);
        }
    }
    free(res);
    return st;
}

/* ---- knn, sample ------------------------------------------------------------------------------------- */

/* Parses "v1 v2 ..." (blank-separated finite floats) into a new array of exactly dim values. NULL after
 * printing why. */
static float *s_parse_vector(const char *verb, const char *text, uint32_t dim)
{
    kb_rows_t *row = kb_rows_new(dim);
    /* The row parser reads "KEY<TAB>numbers": give it a dummy key so the same checks apply. */
    size_t len = strlen(text);
    char *line = carls_xmalloc(len + 3);
    line[0] = 'q';
    line[1] = '\t';
    memcpy(line + 2, text, len + 1);
    char err[256];
    float *out = NULL;
    if (kb_rows_parse_line(row, line, len + 2, err, sizeof err) != 0) {
        fprintf(stderr, "kbctl %s: --vector: %s\n", verb, err);
    } else {
        out = carls_xmalloc(dim * sizeof *out);
        memcpy(out, row->values, dim * sizeof *out);
    }
    free(line);
    kb_rows_destroy(&row);
    return out;
}

static const char s_knn_usage[] =
    "usage: kbctl knn TABLE --k K (--key KEY [--exclude-self] | --vector \"v1 v2 ...\")\n"
    "Nearest neighbours (K, default 10, at most 4096) of a key's current value or of a vector of the table's\n"
    "dim, through the table's index: one line per row found, best first, KEY<TAB>SCORE (score formatted as\n"
    "get formats numbers; L2 scores are squared distances, lower is nearer; ip and cosine, higher is nearer).\n"
    "--exclude-self leaves the query key out. With several shards every shard is asked and the answers merged.\n";

enum { KNN_K, KNN_KEY, KNN_EXCLUDE_SELF, KNN_VECTOR, KNN_N };
static const s_opt_t s_knn_opts[KNN_N] = {
    [KNN_K] = {"k", true},
    [KNN_KEY] = {"key", true},
    [KNN_EXCLUDE_SELF] = {"exclude-self", false},
    [KNN_VECTOR] = {"vector", true},
};

/* Asks for the k nearest rows of table to the query: the key in keyset, or the vector in --vector. Exit
 * status. */
static int s_knn_query(s_call_t *call, const kb_rows_t *keyset, uint32_t k, kb_knn_result_t **res)
{
    const char *table = call->pos[0], *vector_text = call->opt[KNN_VECTOR];
    int rc;
    if (vector_text) {
        uint32_t dim;
        int st = s_table_dim(call, table, &dim);
        if (st != S_EXIT_OK)
            return st;
        float *query = s_parse_vector(call->name, vector_text, dim);
        if (!query)
            return S_EXIT_USAGE;
        rc = kb_cluster_knn(call->c, table, query, 1, dim, k, res);
        free(query);
    } else {
        kb_key_t key = kb_rows_key(keyset, 0);
        rc = kb_cluster_knn_by_key(call->c, table, &key, 1, k, call->opt[KNN_EXCLUDE_SELF] != NULL, res);
    }
    return rc == 0 ? S_EXIT_OK : s_fail(call, rc);
}

static int s_knn(s_call_t *call)
{
    const char *key_text = call->opt[KNN_KEY];
    uint64_t k = 10;
    if (s_opt_count(call, KNN_K, 1, CARLS_MAX_KNN_K, &k) != 0)
        return S_EXIT_USAGE;
    if (!key_text == !call->opt[KNN_VECTOR]) {
        fprintf(stderr, "kbctl %s: give exactly one of --key KEY and --vector \"v1 v2 ...\"\n", call->name);
        return S_EXIT_USAGE;
    }
    if (call->opt[KNN_EXCLUDE_SELF] && !key_text) {
        fprintf(stderr, "kbctl %s: --exclude-self goes with --key\n", call->name);
        return S_EXIT_USAGE;
    }
    kb_rows_t *keyset = kb_rows_new(0);
    kb_knn_result_t *res = NULL;
    int st = S_EXIT_USAGE;
    if (!key_text || s_add_key_arg(call, keyset, key_text, "--key", 0) == 0)
        st = s_open(call);
    if (st == S_EXIT_OK)
        st = s_knn_query(call, keyset, (uint32_t)k, &res);
    /* Slots past the last row found (fewer rows than k) have empty keys. */
    for (uint32_t r = 0; st == S_EXIT_OK && r < res->k && res->keys[r].len > 0; r++) {
        s_print_key_number(&res->keys[r], res->scores[r]);
        putchar('\n');
    }
    kb_knn_result_destroy(&res);
    kb_rows_destroy(&keyset);
    return st;
}

static const char s_sample_usage[] =
    "usage: kbctl sample TABLE --n N [--strategy uniform|log-uniform|unigram] [--seed S] [POSITIVE...]\n"
    "Draws N candidates (with replacement; default strategy uniform) and prints the positives first, then the\n"
    "candidates: KEY<TAB>PROBABILITY<TAB>positive|sampled, where PROBABILITY is the chance that one draw picks\n"
    "the key. A seed (not 0) makes the draw repeatable. With several shards the draws are split over the\n"
    "shards by their mass: exact for uniform and unigram, an approximation for log-uniform (ranks are\n"
    "per shard).\n";

enum { SAMPLE_N, SAMPLE_STRATEGY, SAMPLE_SEED, SAMPLE_N_OPTS };
static const s_opt_t s_sample_opts[SAMPLE_N_OPTS] = {
    [SAMPLE_N] = {"n", true},
    [SAMPLE_STRATEGY] = {"strategy", true},
    [SAMPLE_SEED] = {"seed", true},
};

static int s_sample(s_call_t *call)
{
    const char *table = call->pos[0];
    uint64_t n = 0, seed = 0;
    int strategy = CARLS__SAMPLE_STRATEGY__SAMPLE_UNIFORM;
    if (!call->opt[SAMPLE_N]) {
        fprintf(stderr, "kbctl %s: --n is required (candidates to draw; 0 for the positives' probabilities only)\n",
                call->name);
        return S_EXIT_USAGE;
    }
    if (s_opt_count(call, SAMPLE_N, 0, CARLS_DEFAULT_MAX_KEYS_PER_REQUEST, &n) != 0 ||
        s_opt_choice(call, SAMPLE_STRATEGY, s_strategies, &strategy) != 0 ||
        s_opt_count(call, SAMPLE_SEED, 0, UINT64_MAX, &seed) != 0)
        return S_EXIT_USAGE;
    /* Positives come from the arguments only (stdin is not read: a sample needs no input). */
    kb_rows_t *positives = s_key_args(call, call->pos + 1, call->n_pos - 1, "positive");
    if (!positives)
        return S_EXIT_USAGE;
    kb_key_t *keys = carls_xcalloc(positives->n ? positives->n : 1, sizeof *keys);
    for (size_t i = 0; i < positives->n; i++)
        keys[i] = kb_rows_key(positives, i);
    kb_sample_result_t *res = NULL;
    int st = s_open(call);
    if (st == S_EXIT_OK) {
        int rc = kb_cluster_sample(call->c, table, keys, positives->n, (uint32_t)n, (Carls__SampleStrategy)strategy,
                                   seed, &res);
        st = rc == 0 ? S_EXIT_OK : s_fail(call, rc);
    }
    for (size_t i = 0; st == S_EXIT_OK && i < res->n; i++) {
        s_print_key_number(&res->keys[i], res->probabilities[i]);
        printf("\t%s\n", res->is_positive[i] ? "positive" : "sampled");
    }
    kb_sample_result_destroy(&res);
    free(keys);
    kb_rows_destroy(&positives);
    return st;
}

/* ---- export, import ---------------------------------------------------------------------------------- */

/* Exit status for a kb_export_* / kb_import_table failure: the bank's fault or the file's. */
static int s_export_status(int rc)
{
    return rc == KB_EXPORT_EBANK ? S_EXIT_SERVER : S_EXIT_USAGE;
}

static const char s_export_usage[] =
    "usage: kbctl export TABLE FILE [--force] [--page N]\n"
    "       kbctl export TABLE VALUES.npy --keys KEYS.txt [--force] [--page N]\n"
    "Writes the table (config and every row of every shard, read with scan pages of N rows, default 1000)\n"
    "to FILE: a self-checking snapshot (magic, version, CRC-32) written to a temporary name, fsynced and\n"
    "renamed, mode 0600 (format 2). It carries every row's whole state: keys, values or feature records,\n"
    "versions, frequencies, updated_at, optimizer state and steps, pending gradients -- what training needs\n"
    "to continue exactly. An existing FILE is replaced only with --force. Each row is read whole under its\n"
    "lock, but a table that is written meanwhile is exported as the scan finds it (not one point in time:\n"
    "export from a --read-only server for that; docs/STATE.md).\n"
    "With a FILE ending in .npy and --keys, an embedding table is written as NumPy instead: the values as\n"
    "float32 (N, dim) and the keys one a line in KEYS.txt, in the same order (what `kbctl import` and\n"
    "`kbctl put --npy` read back); a key holding a newline is refused.\n"
    "Progress goes to stderr: a line with the count and rate on a terminal, log lines otherwise.\n";

enum { EX_FORCE, EX_PAGE, EX_KEYS, EX_N };
static const s_opt_t s_export_opts[EX_N] = {
    [EX_FORCE] = {"force", false}, [EX_PAGE] = {"page", true}, [EX_KEYS] = {"keys", true}};

/* Whether path names a NumPy file (ends in ".npy"). */
static bool s_is_npy(const char *path)
{
    size_t n = strlen(path);
    return n > 4 && strcmp(path + n - 4, ".npy") == 0;
}

static int s_export(s_call_t *call)
{
    const char *table = call->pos[0], *path = call->pos[1];
    uint64_t page = S_DEFAULT_SCAN_PAGE;
    if (s_opt_batch(call, EX_PAGE, &page) != 0)
        return S_EXIT_USAGE;
    const char *keys = call->opt[EX_KEYS];
    if (keys && !s_is_npy(path)) {
        fprintf(stderr, "kbctl %s: --keys goes with a FILE ending in .npy\n", call->name);
        return S_EXIT_USAGE;
    }
    if (s_is_npy(path) && !keys) {
        fprintf(stderr, "kbctl %s: a .npy export needs --keys KEYS.txt for the keys\n", call->name);
        return S_EXIT_USAGE;
    }
    struct stat sb;
    if (!call->opt[EX_FORCE] && (stat(path, &sb) == 0 || (keys && stat(keys, &sb) == 0))) {
        fprintf(stderr, "kbctl %s: %s exists; --force replaces it\n", call->name,
                stat(path, &sb) == 0 ? path : keys);
        return S_EXIT_USAGE;
    }
    int st = s_open(call);
    if (st != S_EXIT_OK)
        return st;
    char err[768];
    uint64_t rows = 0;
    carls_progress_t progress = {0};
    int rc = keys ? kb_export_table_npy(call->c, table, path, keys, (uint32_t)page, &rows, &progress, err, sizeof err)
                  : kb_export_table(call->c, table, path, (uint32_t)page, &rows, &progress, err, sizeof err);
    if (rc != 0) {
        if (progress.tty && progress.done > 0)
            fputc('\n', stderr); /* end the progress line */
        fprintf(stderr, "kbctl %s: %s\n", call->name, err);
        return s_export_status(rc);
    }
    fprintf(stderr, "exported %llu row%s of %s to %s%s%s\n", (unsigned long long)rows, rows == 1 ? "" : "s", table,
            path, keys ? " and its keys to " : "", keys ? keys : "");
    return S_EXIT_OK;
}

static const char s_import_usage[] =
    "usage: kbctl import TABLE FILE [--batch N]\n"
    "Verifies FILE completely (format, sizes, checksum) and refuses it, importing nothing, when anything is\n"
    "wrong; then creates TABLE with the file's config unless it exists with that config, and writes the rows\n"
    "(values with their versions, or feature records) in batches of N routed by the current shard count, so\n"
    "a file exported from one shard imports into three. A format-2 file's rows are restored with their whole\n"
    "state (import_rows: frequencies, optimizer state, pending gradients included), so the table trains on\n"
    "as the exported one would; a format-1 file's rows are put (no optimizer state, frequencies not\n"
    "restored). Existing rows with other keys stay.\n"
    "       kbctl import TABLE VALUES.npy --keys KEYS.txt [--batch N]\n"
    "imports an embedding table from NumPy: values (N, dim) float32, float64 or integers, and the N keys one\n"
    "a line; both files are checked whole first (shape, NaN, key count: errors name the file and the row or\n"
    "line) and nothing is sent when anything is wrong; TABLE is created (dim from the file, the server's\n"
    "defaults) unless it exists with that dim; rows are written at version 0.\n"
    "Progress goes to stderr: a line with the rate and the time left on a terminal, log lines otherwise.\n";

enum { IM_BATCH, IM_KEYS, IM_N };
static const s_opt_t s_import_opts[IM_N] = {[IM_BATCH] = {"batch", true}, [IM_KEYS] = {"keys", true}};

/* import TABLE VALUES.npy --keys KEYS.txt: checked whole, the table created if missing, then put. */
static int s_import_npy(s_call_t *call, const char *table, const char *path, uint64_t batch)
{
    uint32_t dim = 0;
    kb_rows_t *rows = s_npy_rows(call, path, call->opt[IM_KEYS], 0, &dim);
    if (!rows)
        return S_EXIT_USAGE;
    int st = s_open(call);
    if (st == S_EXIT_OK) {
        Carls__TableConfig cfg = CARLS__TABLE_CONFIG__INIT;
        cfg.kind = CARLS__TABLE_KIND__TABLE_EMBEDDING;
        cfg.dim = dim;
        int rc = kb_cluster_create_table(call->c, table, &cfg, true);
        if (rc != 0)
            st = s_fail(call, rc);
    }
    uint32_t have = 0;
    if (st == S_EXIT_OK)
        st = s_table_dim(call, table, &have);
    if (st == S_EXIT_OK && have != dim) {
        fprintf(stderr, "kbctl %s: table %s has dim %u, %s has %u values a row; nothing was sent\n", call->name,
                table, have, path, dim);
        st = S_EXIT_USAGE;
    }
    if (st == S_EXIT_OK)
        st = s_send_rows(call, table, rows, batch, false, 0);
    if (st == S_EXIT_OK)
        fprintf(stderr, "imported %zu row%s into %s from %s\n", rows->n, rows->n == 1 ? "" : "s", table, path);
    kb_rows_destroy(&rows);
    return st;
}

static int s_import(s_call_t *call)
{
    const char *table = call->pos[0], *path = call->pos[1];
    uint64_t batch = S_DEFAULT_BATCH;
    if (s_opt_batch(call, IM_BATCH, &batch) != 0)
        return S_EXIT_USAGE;
    if (s_is_npy(path) != (call->opt[IM_KEYS] != NULL)) {
        fprintf(stderr, "kbctl %s: a FILE ending in .npy and --keys KEYS.txt go together\n", call->name);
        return S_EXIT_USAGE;
    }
    if (s_is_npy(path))
        return s_import_npy(call, table, path, batch);
    char err[768];
    /* Verified here first as well, so a bad file is refused before any connection is opened. */
    kb_export_reader_t *r = NULL;
    int rc = kb_export_reader_open(path, &r, err, sizeof err);
    if (rc != 0) {
        fprintf(stderr, "kbctl %s: refusing %s: %s; nothing was imported\n", call->name, path, err);
        return S_EXIT_USAGE;
    }
    char from[CARLS_MAX_TABLE_NAME_BYTES + 1];
    snprintf(from, sizeof from, "%s", kb_export_reader_table(r));
    uint64_t in_file = kb_export_reader_rows(r);
    kb_export_reader_destroy(&r);
    int st = s_open(call);
    if (st != S_EXIT_OK)
        return st;
    uint64_t rows = 0;
    carls_progress_t progress = {0};
    rc = kb_import_table(call->c, table, path, (size_t)batch, &rows, &progress, err, sizeof err);
    if (rc != 0) {
        if (progress.tty && progress.done > 0)
            fputc('\n', stderr); /* end the progress line */
        fprintf(stderr, "kbctl %s: %s (%llu of %llu rows were imported)\n", call->name, err, (unsigned long long)rows,
                (unsigned long long)in_file);
        return s_export_status(rc);
    }
    fprintf(stderr, "imported %llu row%s into %s (exported from table %s)\n", (unsigned long long)rows,
            rows == 1 ? "" : "s", table, from);
    return S_EXIT_OK;
}

/* ---- snapshots (docs/STATE.md "Snapshots") ---------------------------------------------------------- */

/* One snapshot as a tab-separated line: name, time taken (UTC), cut epoch, tables (comma-separated), bytes,
 * and "valid" or "damaged: why". */
static void s_print_snapshot(const Carls__SnapshotInfo *si)
{
    char when[32] = "?";
    time_t secs = (time_t)(si->created_ms / 1000);
    struct tm tm;
    if (gmtime_r(&secs, &tm))
        strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%SZ", &tm);
    printf("%s\t%s\t%llu\t", si->name, when, (unsigned long long)si->cut_epoch);
    for (size_t i = 0; i < si->n_tables; i++)
        printf("%s%s", i ? "," : "", si->tables[i]);
    printf("%s\t%llu\t%s%s\n", si->n_tables ? "" : "-", (unsigned long long)si->bytes,
           si->valid ? "valid" : "damaged: ", si->valid ? "" : si->problem);
}

/* Every shard's answer to a list, printed (only the snapshot `only` when not NULL). */
static void s_print_snapshots(const s_call_t *call, Carls__Response **per_shard, const char *only)
{
    for (uint32_t s = 0; s < kb_cluster_shards(call->c); s++) {
        s_print_shard_header(call->c, s);
        const Carls__SnapshotResult *res = per_shard[s]->snapshot;
        for (size_t i = 0; i < res->n_snapshots; i++)
            if (!only || strcmp(res->snapshots[i]->name, only) == 0)
                s_print_snapshot(res->snapshots[i]);
        carls__response__free_unpacked(per_shard[s], NULL);
    }
}

/* Lists the snapshots of every shard and prints them. Exit status. */
static int s_list_snapshots(s_call_t *call, bool verify, const char *only)
{
    Carls__Response **per_shard = carls_xcalloc(kb_cluster_shards(call->c), sizeof *per_shard);
    int rc = kb_cluster_snapshot_each(call->c, CARLS__SNAPSHOT_ACTION__SNAPSHOT_LIST, NULL, verify, per_shard);
    if (rc == 0)
        s_print_snapshots(call, per_shard, only);
    free(per_shard);
    return rc == 0 ? S_EXIT_OK : s_fail(call, rc);
}

static const char s_snapshot_usage[] =
    "usage: kbctl snapshot NAME\n"
    "Takes snapshot NAME of the whole bank while it serves: every shard copies all its tables (values,\n"
    "versions, optimizer state, pending gradients, use counts) as of one cut into DATA/snapshots/NAME, with\n"
    "a manifest of CRC-32s. Every write acknowledged before the command started is in it; none begun after\n"
    "it returned is. NAME: 1..64 characters of [A-Za-z0-9_.-], not beginning with '.'; an existing NAME is\n"
    "refused. When a shard fails, the parts the others took are deleted again. Prints each shard's snapshot\n"
    "as `kbctl snapshots` does. A large bank takes a while: raise --timeout-ms (a resend waits for the\n"
    "snapshot in progress). Restore with `kb-server --restore NAME` (on every shard, with its --shard).\n";

static int s_snapshot(s_call_t *call)
{
    int st = s_open(call);
    if (st != S_EXIT_OK)
        return st;
    char err[1024];
    if (kb_cluster_snapshot(call->c, call->pos[0], err, sizeof err) != 0) {
        fprintf(stderr, "kbctl %s: %s\n", call->name, err);
        return S_EXIT_SERVER;
    }
    return s_list_snapshots(call, false, call->pos[0]);
}

enum { SNL_VERIFY, SNL_N };
static const s_opt_t s_snapshots_opts[SNL_N] = {[SNL_VERIFY] = {"verify", false}};

static const char s_snapshots_usage[] =
    "usage: kbctl snapshots [--verify]\n"
    "Lists every shard's snapshots (after a \"shard I ENDPOINT\" line when there are several), one per line:\n"
    "NAME<TAB>TAKEN (UTC)<TAB>CUT EPOCH<TAB>TABLES<TAB>BYTES<TAB>valid, or damaged: WHY (naming the file).\n"
    "Checks each manifest and its files' sizes; --verify also reads every file and checks its CRC-32.\n"
    "A snapshot without a manifest (interrupted while it was taken) is listed as damaged.\n";

static int s_snapshots(s_call_t *call)
{
    int st = s_open(call);
    return st != S_EXIT_OK ? st : s_list_snapshots(call, call->opt[SNL_VERIFY] != NULL, NULL);
}

static const char s_snapshot_delete_usage[] =
    "usage: kbctl snapshot-delete NAME\n"
    "Deletes snapshot NAME (valid or damaged) on every shard. A shard without it answers NOT_FOUND (exit\n"
    "status 2); the others delete theirs.\n";

static int s_snapshot_delete(s_call_t *call)
{
    int st = s_open(call);
    if (st != S_EXIT_OK)
        return st;
    char err[1024];
    if (kb_cluster_snapshot_delete(call->c, call->pos[0], err, sizeof err) != 0) {
        fprintf(stderr, "kbctl %s: %s\n", call->name, err);
        return S_EXIT_SERVER;
    }
    fprintf(stderr, "deleted snapshot %s\n", call->pos[0]);
    return S_EXIT_OK;
}

/* ---- the verbs, and main ----------------------------------------------------------------------------- */

#define S_COUNT(array) (sizeof array / sizeof array[0])

static const s_verb_t s_verbs[] = {
    /* name, usage, options, positional arguments (min, max), TABLE first, run */
    {"create-table", s_create_table_usage, s_create_table_opts, S_COUNT(s_create_table_opts), 1, 1, true,
     s_create_table},
    {"list-tables", s_list_tables_usage, NULL, 0, 0, 0, false, s_list_tables},
    {"drop-table", s_drop_table_usage, s_drop_table_opts, S_COUNT(s_drop_table_opts), 1, 1, true, s_drop_table},
    {"put", s_put_usage, s_put_opts, S_COUNT(s_put_opts), 1, 1, true, s_put},
    {"push-grad", s_push_grad_usage, s_push_grad_opts, S_COUNT(s_push_grad_opts), 1, 1, true, s_push_grad},
    {"get", s_get_usage, s_get_opts, S_COUNT(s_get_opts), 1, -1, true, s_get},
    {"knn", s_knn_usage, s_knn_opts, S_COUNT(s_knn_opts), 1, 1, true, s_knn},
    {"sample", s_sample_usage, s_sample_opts, S_COUNT(s_sample_opts), 1, -1, true, s_sample},
    {"put-feature", s_put_feature_usage, s_put_feature_opts, S_COUNT(s_put_feature_opts), 1, 1, true, s_put_feature},
    {"get-feature", s_get_feature_usage, s_get_feature_opts, S_COUNT(s_get_feature_opts), 1, -1, true, s_get_feature},
    {"export", s_export_usage, s_export_opts, S_COUNT(s_export_opts), 2, 2, true, s_export},
    {"import", s_import_usage, s_import_opts, S_COUNT(s_import_opts), 2, 2, true, s_import},
    {"stats", s_stats_usage, NULL, 0, 0, 1, true, s_stats},
    {"checkpoint", s_checkpoint_usage, NULL, 0, 0, 0, false, s_checkpoint},
    {"snapshot", s_snapshot_usage, NULL, 0, 1, 1, false, s_snapshot},
    {"snapshots", s_snapshots_usage, s_snapshots_opts, S_COUNT(s_snapshots_opts), 0, 0, false, s_snapshots},
    {"snapshot-delete", s_snapshot_delete_usage, NULL, 0, 1, 1, false, s_snapshot_delete},
};
#define S_N_VERBS (sizeof s_verbs / sizeof s_verbs[0])

static void s_usage(FILE *out)
{
    fprintf(out,
            "usage: kbctl [--kb ENDPOINT[,ENDPOINT...]] [--timeout-ms N] [--retries N] [--log-level L]\n"
            "             [--curve-key FILE --curve-server-key FILE] VERB [ARGS...]\n"
            "Command-line client of kb-server. Results go to stdout, errors and summaries to stderr.\n"
            "\n"
            "Global options (before the verb):\n"
            "  --kb ENDPOINTS    server, e.g. tcp://127.0.0.1:7000, or the shards of a sharded bank in shard\n"
            "                    order: tcp://h:7000,tcp://h:7001 (kb-server --shard 0/2, 1/2) (default: $CARLS_KB)\n"
            "  --timeout-ms N    wait per attempt (default %d)\n"
            "  --retries N       reconnect and resend this many times after a timeout (default %d)\n"
            "  --log-level L     debug, info, warn, error or off (default warn, or $CARLS_LOG_LEVEL)\n"
            KB_CURVE_ARGS_HELP
            "                    (docs/SECURITY.md)\n"
            "  --help            this text; `kbctl VERB --help` describes a verb\n"
            "\n"
            "Verbs:\n",
            S_DEFAULT_TIMEOUT_MS, S_DEFAULT_RETRIES);
    for (size_t i = 0; i < S_N_VERBS; i++) {
        const char *u = s_verbs[i].usage + strlen("usage: ");
        const char *nl = strchr(u, '\n');
        fprintf(out, "  %.*s\n", (int)(nl - u), u);
    }
    fprintf(out, "\nExit status: 0 success, 1 usage or input error (nothing sent), 2 server or connection error.\n");
}

/* Parses the call's command line as its verb declares it: options, --help, the number of positional
 * arguments and a table name. Returns -1 to go on, or the exit status to return now. */
static int s_parse_call(s_call_t *call, int argc, char **argv)
{
    const s_verb_t *verb = call->verb;
    int p = s_parse_args(call, argc, argv);
    if (p == S_PARSE_HELP) {
        fputs(verb->usage, stdout);
        return S_EXIT_OK;
    }
    if (p == S_PARSE_ERROR)
        return S_EXIT_USAGE;
    if (call->n_pos < verb->min_pos || (verb->max_pos >= 0 && call->n_pos > verb->max_pos)) {
        fprintf(stderr, "kbctl %s: wrong number of arguments\n", verb->name);
        fputs(verb->usage, stderr);
        return S_EXIT_USAGE;
    }
    if (verb->table_arg && call->n_pos > 0 && s_check_table_name(verb->name, call->pos[0]) != 0)
        return S_EXIT_USAGE;
    return -1;
}

/* Runs a verb (argv[0] is its name): parses its command line, runs it, and closes the connection it opened.
 * Returns the exit status. */
static int s_run_verb(const s_verb_t *verb, const s_global_t *g, int argc, char **argv)
{
    assert(verb->n_opts <= S_MAX_VERB_OPTS);
    s_call_t call = {.verb = verb, .name = verb->name, .g = g, .pos = carls_xcalloc((size_t)argc, sizeof(char *))};
    int st = s_parse_call(&call, argc, argv);
    if (st < 0)
        st = verb->run(&call);
    kb_cluster_destroy(&call.c);
    free(call.pos);
    return st;
}

/* Sets global option `which` to value. 0, or -1 after printing why. */
static int s_set_global(s_global_t *g, int which, const char *value)
{
    uint64_t u;
    carls_log_level_t level;
    switch (which) {
    case G_KB:
        g->endpoint = value;
        return 0;
    case G_TIMEOUT_MS:
        if (s_opt_u64("", "timeout-ms", value, 1, 24u * 3600 * 1000, &u) != 0)
            return -1;
        g->timeout_ms = (int)u;
        return 0;
    case G_RETRIES:
        if (s_opt_u64("", "retries", value, 0, 1000, &u) != 0)
            return -1;
        g->retries = (int)u;
        return 0;
    case G_CURVE_KEY:
        g->curve.key_file = value;
        return 0;
    case G_CURVE_SERVER_KEY:
        g->curve.server_key_file = value;
        return 0;
    default:
        if (carls_log_parse_level(value, &level) != 0) {
            fprintf(stderr, "kbctl: --log-level: unknown level \"%s\" (debug, info, warn, error, off)\n", value);
            return -1;
        }
        carls_log_set_level(level);
        return 0;
    }
}

/* Parses the global options, argv[1] up to the verb, whose index goes to *verb_at. Returns -1 to go on, or
 * the exit status to return now. */
static int s_parse_globals(int argc, char **argv, s_global_t *g, int *verb_at)
{
    int i = 1;
    for (; i < argc && argv[i][0] == '-'; i++) {
        const char *arg = argv[i];
        if (strcmp(arg, "--help") == 0 || strcmp(arg, "-h") == 0) {
            s_usage(stdout);
            return S_EXIT_OK;
        }
        const char *eq = strchr(arg, '=');
        size_t name_len = eq ? (size_t)(eq - arg) : strlen(arg);
        int which = -1;
        for (int j = 0; j < G_N && arg[1] == '-'; j++)
            if (strlen(s_global_options[j]) == name_len - 2 && strncmp(arg + 2, s_global_options[j], name_len - 2) == 0)
                which = j;
        if (which < 0) {
            fprintf(stderr, "kbctl: unknown option %s (see kbctl --help)\n", arg);
            return S_EXIT_USAGE;
        }
        const char *value = eq ? eq + 1 : (i + 1 < argc ? argv[++i] : NULL);
        if (!value) {
            fprintf(stderr, "kbctl: --%s needs a value\n", s_global_options[which]);
            return S_EXIT_USAGE;
        }
        if (s_set_global(g, which, value) != 0)
            return S_EXIT_USAGE;
    }
    if (i == argc) {
        s_usage(stderr);
        return S_EXIT_USAGE;
    }
    if (kb_curve_args_check(&g->curve, "kbctl") != 0)
        return S_EXIT_USAGE;
    *verb_at = i;
    return -1;
}

int main(int argc, char **argv)
{
    carls_log_set_level(CARLS_LOG_WARN);
    carls_log_init_from_env();
    s_global_t g = {getenv("CARLS_KB"), S_DEFAULT_TIMEOUT_MS, S_DEFAULT_RETRIES, {0}};
    kb_curve_args(&g.curve);
    int i;
    int st = s_parse_globals(argc, argv, &g, &i);
    if (st >= 0)
        return st;
    const s_verb_t *verb = NULL;
    for (size_t j = 0; j < S_N_VERBS; j++)
        if (strcmp(argv[i], s_verbs[j].name) == 0)
            verb = &s_verbs[j];
    if (!verb) {
        fprintf(stderr, "kbctl: unknown verb \"%s\" (see kbctl --help)\n", argv[i]);
        return S_EXIT_USAGE;
    }
    st = s_run_verb(verb, &g, argc - i, argv + i);
    /* A result that did not reach stdout (full disk, closed pipe) is a failure too. */
    if (fflush(stdout) != 0 || ferror(stdout)) {
        fprintf(stderr, "kbctl %s: cannot write the output\n", verb->name);
        if (st == S_EXIT_OK)
            st = S_EXIT_USAGE;
    }
    return st;
}
