/* kbctl: command-line client of kb-server for people and scripts.
 *
 *   kbctl [--kb ENDPOINT[,ENDPOINT...]] [--timeout-ms N] [--retries N] [--log-level L]
 *         [--curve-key FILE --curve-server-key FILE] VERB [ARGS...]
 *
 * Every verb goes through kb_cluster (common/kb_cluster.h): with one endpoint it talks to that server, with
 * a list "tcp://a:1,tcp://b:2" the i-th endpoint is shard i and keys are routed by carls_shard_of.
 *
 * Text in, text out: rows are "KEY<TAB>v1 v2 ..." lines and feature records "KEY<TAB>label=... ..." lines
 * (formats in kb_rows_text.h), listings are tab-separated, results go to stdout and everything else (errors,
 * summaries, logs) to stderr.
 * Exit status: 0 success, 1 usage or input error (nothing was sent for bad input), 2 server or connection
 * error (timeout, error status, undecodable answer). */
#include "kb_cluster.h"
#include "kb_export.h"
#include "kb_rows_text.h"
#include "log.h"
#include "protocol.h"
#include "util.h"

#include <errno.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

enum {
    S_EXIT_OK = 0,
    S_EXIT_USAGE = 1,  /* bad command line or bad input: nothing was sent */
    S_EXIT_SERVER = 2, /* the server answered with an error, or could not be reached */
};

#define S_DEFAULT_TIMEOUT_MS 5000
#define S_DEFAULT_RETRIES 2
#define S_DEFAULT_BATCH 1000
#define S_MAX_REPORTED_LINES 20 /* invalid input lines reported before "... and K more" */
#define S_DEFAULT_SCAN_PAGE 1000
#define S_MAX_K 4096

/* Options that come before the verb. */
typedef struct {
    const char *endpoint;         /* --kb, else $CARLS_KB; NULL if neither. One endpoint or a list */
    int timeout_ms;               /* per attempt */
    int retries;                  /* extra attempts after a timeout */
    const char *curve_key;        /* --curve-key: this client's secret key file, or NULL */
    const char *curve_server_key; /* --curve-server-key: the servers' public key file, or NULL */
} s_global_t;

typedef struct s_verb s_verb_t;
struct s_verb {
    const char *name;
    const char *usage; /* shown by `kbctl VERB --help`: synopsis, then what it does */
    int (*run)(const s_verb_t *verb, const s_global_t *g, int argc, char **argv); /* argv[0] is the verb */
};

/* ---- enum names (what the proto enums are called on the command line and in listings) ---------------- */

typedef struct {
    const char *name;
    int value;
} s_name_t;

static const s_name_t s_optimizers[] = {
    {"sgd", CARLS__OPTIMIZER_KIND__OPT_SGD},
    {"momentum", CARLS__OPTIMIZER_KIND__OPT_MOMENTUM},
    {"adagrad", CARLS__OPTIMIZER_KIND__OPT_ADAGRAD},
    {"adam", CARLS__OPTIMIZER_KIND__OPT_ADAM},
    {NULL, 0},
};
static const s_name_t s_updates[] = {
    {"lazy", CARLS__UPDATE_POLICY__UPDATE_LAZY},
    {"immediate", CARLS__UPDATE_POLICY__UPDATE_IMMEDIATE},
    {NULL, 0},
};
static const s_name_t s_inits[] = {
    {"zeros", CARLS__INIT_KIND__INIT_ZEROS},
    {"uniform", CARLS__INIT_KIND__INIT_UNIFORM},
    {"normal", CARLS__INIT_KIND__INIT_NORMAL},
    {NULL, 0},
};
static const s_name_t s_outlier_rules[] = {
    {"norm-median", CARLS__OUTLIER_RULE__OUTLIER_NORM_MEDIAN},
    {"none", CARLS__OUTLIER_RULE__OUTLIER_NONE},
    {NULL, 0},
};
static const s_name_t s_kinds[] = {
    {"embedding", CARLS__TABLE_KIND__TABLE_EMBEDDING},
    {"feature", CARLS__TABLE_KIND__TABLE_FEATURE},
    {NULL, 0},
};
static const s_name_t s_metrics[] = {
    {"ip", CARLS__KNN_METRIC__METRIC_IP},
    {"l2", CARLS__KNN_METRIC__METRIC_L2},
    {"cosine", CARLS__KNN_METRIC__METRIC_COSINE},
    {NULL, 0},
};
static const s_name_t s_admissions[] = {
    {"all", CARLS__ADMISSION_KIND__ADMIT_ALL},
    {"frequency", CARLS__ADMISSION_KIND__ADMIT_FREQUENCY},
    {"bloom", CARLS__ADMISSION_KIND__ADMIT_BLOOM},
    {NULL, 0},
};
static const s_name_t s_evictions[] = {
    {"none", CARLS__EVICTION_KIND__EVICT_NONE},
    {"lru", CARLS__EVICTION_KIND__EVICT_LRU},
    {"oldest", CARLS__EVICTION_KIND__EVICT_OLDEST},
    {NULL, 0},
};
static const s_name_t s_strategies[] = {
    {"uniform", CARLS__SAMPLE_STRATEGY__SAMPLE_UNIFORM},
    {"log-uniform", CARLS__SAMPLE_STRATEGY__SAMPLE_LOG_UNIFORM},
    {"unigram", CARLS__SAMPLE_STRATEGY__SAMPLE_UNIGRAM},
    {NULL, 0},
};

static int s_name_parse(const s_name_t *names, const char *text, int *out)
{
    for (const s_name_t *n = names; n->name; n++) {
        if (strcmp(n->name, text) == 0) {
            *out = n->value;
            return 0;
        }
    }
    return -1;
}

static const char *s_name_of(const s_name_t *names, int value)
{
    for (const s_name_t *n = names; n->name; n++)
        if (n->value == value)
            return n->name;
    return "unknown";
}

/* ---- command-line parsing ---------------------------------------------------------------------------- */

/* One option a verb accepts. */
typedef struct {
    const char *name;  /* without the leading "--" */
    bool takes_value;
    const char *value; /* set by s_parse_args: the value, or "" for a flag that was given; NULL if absent */
} s_opt_t;

enum { S_PARSE_OK = 0, S_PARSE_HELP = 1, S_PARSE_ERROR = -1 };

static bool s_is_global_option(const char *name)
{
    static const char *globals[] = {"kb", "timeout-ms", "retries", "log-level", "curve-key", "curve-server-key"};
    for (size_t i = 0; i < sizeof globals / sizeof globals[0]; i++)
        if (strcmp(name, globals[i]) == 0)
            return true;
    return false;
}

/* Parses a verb's arguments (argv[0] is the verb): "--name value", "--name=value", flags, "--help", and
 * "--" ending the options. Positional arguments are collected in pos (room for argc entries). Returns
 * S_PARSE_OK, S_PARSE_HELP, or S_PARSE_ERROR after printing why. */
static int s_parse_args(const char *verb, int argc, char **argv, s_opt_t *opts, size_t n_opts, char **pos,
                        int *n_pos)
{
    *n_pos = 0;
    bool options_done = false;
    for (int i = 1; i < argc; i++) {
        const char *arg = argv[i];
        if (options_done || arg[0] != '-' || arg[1] == '\0') {
            pos[(*n_pos)++] = argv[i];
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
        s_opt_t *opt = NULL;
        for (size_t j = 0; j < n_opts; j++)
            if (strlen(opts[j].name) == name_len && strncmp(opts[j].name, name, name_len) == 0)
                opt = &opts[j];
        if (!opt) {
            char bare[64];
            snprintf(bare, sizeof bare, "%.*s", (int)(name_len < 63 ? name_len : 63), name);
            if (s_is_global_option(bare))
                fprintf(stderr, "kbctl %s: --%s is a global option: put it before the verb\n", verb, bare);
            else
                fprintf(stderr, "kbctl %s: unknown option --%s (see kbctl %s --help)\n", verb, bare, verb);
            return S_PARSE_ERROR;
        }
        if (!opt->takes_value) {
            if (eq) {
                fprintf(stderr, "kbctl %s: --%s takes no value\n", verb, opt->name);
                return S_PARSE_ERROR;
            }
            opt->value = "";
        } else if (eq) {
            opt->value = eq + 1;
        } else if (i + 1 < argc) {
            opt->value = argv[++i];
        } else {
            fprintf(stderr, "kbctl %s: --%s needs a value\n", verb, opt->name);
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

static int s_opt_name(const char *verb, const char *opt, const s_name_t *names, const char *text, int *out)
{
    if (s_name_parse(names, text, out) == 0)
        return 0;
    fprintf(stderr, "kbctl %s: --%s: unknown value \"%s\"; one of:", verb, opt, text);
    for (const s_name_t *n = names; n->name; n++)
        fprintf(stderr, " %s", n->name);
    fputc('\n', stderr);
    return -1;
}

static int s_check_table_name(const char *verb, const char *name)
{
    if (carls_table_name_valid(name) == 0)
        return 0;
    fprintf(stderr, "kbctl %s: invalid table name \"%s\" (1..%u characters of A-Z a-z 0-9 _ . -)\n", verb, name,
            CARLS_MAX_TABLE_NAME_BYTES);
    return -1;
}

/* ---- talking to the server --------------------------------------------------------------------------- */

/* Loads the CURVE key files named by the global options into *keys. 0, or -1 after printing why. */
static int s_load_curve(const s_global_t *g, kb_client_curve_t *keys)
{
    char err[512];
    if (kb_client_curve_load(g->curve_key, g->curve_server_key, keys, err, sizeof err) != 0) {
        fprintf(stderr, "kbctl: CURVE keys: %s\n", err);
        return -1;
    }
    return 0;
}

/* Opens the cluster (one or more endpoints). NULL after printing why; *status_out then holds the exit
 * status (usage for unreadable key files or a malformed endpoint list, server otherwise). */
static kb_cluster_t *s_connect_st(const s_global_t *g, int *status_out)
{
    kb_client_curve_t keys;
    kb_client_options_t opts = {.timeout_ms = g->timeout_ms, .retries = g->retries};
    *status_out = S_EXIT_USAGE;
    if (g->curve_key) {
        if (s_load_curve(g, &keys) != 0)
            return NULL;
        opts.curve = &keys;
    }
    kb_cluster_t *c = kb_cluster_new(g->endpoint, &opts);
    explicit_bzero(&keys, sizeof keys);
    if (!c) {
        fprintf(stderr, "kbctl: cannot open a connection to %s\n", g->endpoint);
        *status_out = S_EXIT_SERVER;
    }
    return c;
}

/* Prints a failed call's error and returns the exit status for it. */
static int s_fail(const char *verb, const kb_cluster_t *c, int rc)
{
    fprintf(stderr, "kbctl %s: %s\n", verb, kb_cluster_last_error(c));
    return rc == KB_CLIENT_EINVAL ? S_EXIT_USAGE : S_EXIT_SERVER;
}

/* Looks table `name` up (kind, dim, index) into *info. Exit status (a missing table is a server error). */
static int s_table_info(const char *verb, kb_cluster_t *c, const char *name, kb_cluster_table_t *info)
{
    int rc = kb_cluster_table(c, name, info);
    if (rc == 0)
        return S_EXIT_OK;
    if (rc == KB_CLIENT_ESTATUS && kb_cluster_last_status(c) == CARLS__STATUS_CODE__STATUS_NOT_FOUND) {
        fprintf(stderr, "kbctl %s: no table named \"%s\" on the server\n", verb, name);
        return S_EXIT_SERVER;
    }
    return s_fail(verb, c, rc);
}

/* Finds table `name` and returns its dimension in *dim; a feature table is a usage error. Exit status. */
static int s_table_dim(const char *verb, kb_cluster_t *c, const char *name, uint32_t *dim)
{
    kb_cluster_table_t info;
    int st = s_table_info(verb, c, name, &info);
    if (st != S_EXIT_OK)
        return st;
    *dim = info.dim;
    if (info.kind != CARLS__TABLE_KIND__TABLE_EMBEDDING || info.dim == 0) {
        fprintf(stderr, "kbctl %s: table \"%s\" has no dimension (not an embedding table)\n", verb, name);
        return S_EXIT_USAGE;
    }
    return S_EXIT_OK;
}

static void s_print_usage(const s_verb_t *verb) { fputs(verb->usage, stdout); }

/* Common start of a verb: parse its options; handles --help and usage errors. Returns -1 to go on, or the
 * exit status to return now. */
static int s_begin(const s_verb_t *verb, int argc, char **argv, s_opt_t *opts, size_t n_opts, char **pos,
                   int *n_pos, int min_pos, int max_pos)
{
    int p = s_parse_args(verb->name, argc, argv, opts, n_opts, pos, n_pos);
    if (p == S_PARSE_HELP) {
        s_print_usage(verb);
        return S_EXIT_OK;
    }
    if (p == S_PARSE_ERROR)
        return S_EXIT_USAGE;
    if (*n_pos < min_pos || (max_pos >= 0 && *n_pos > max_pos)) {
        fprintf(stderr, "kbctl %s: wrong number of arguments\n", verb->name);
        fputs(verb->usage, stderr);
        return S_EXIT_USAGE;
    }
    return -1;
}

static int s_need_endpoint(const s_global_t *g)
{
    if (g->endpoint && *g->endpoint)
        return 0;
    fprintf(stderr, "kbctl: no server given: use --kb ENDPOINT (e.g. tcp://127.0.0.1:7000, or a comma-separated "
                    "list of shards) or set CARLS_KB\n");
    return -1;
}

/* Reads the keys to act on: from the positional arguments from index `first` on, else one per line from
 * stdin. Every key is checked before anything is sent. Returns the set, or NULL after printing why. */
static kb_rows_t *s_read_keys(const char *verb, char **pos, int n_pos, int first)
{
    kb_rows_t *keyset = kb_rows_new(0);
    char err[256];
    if (n_pos > first) {
        for (int i = first; i < n_pos; i++) {
            if (kb_rows_parse_key_line(keyset, pos[i], strlen(pos[i]), err, sizeof err) != 0) {
                fprintf(stderr, "kbctl %s: key argument %d: %s\n", verb, i - first + 1, err);
                kb_rows_destroy(&keyset);
                return NULL;
            }
        }
    } else if (kb_rows_read(keyset, stdin, stderr, S_MAX_REPORTED_LINES, NULL) != 0) {
        fprintf(stderr, "kbctl %s: invalid keys on stdin; nothing was sent\n", verb);
        kb_rows_destroy(&keyset);
        return NULL;
    }
    return keyset;
}

/* ---- verbs ------------------------------------------------------------------------------------------- */

static int s_create_table(const s_verb_t *verb, const s_global_t *g, int argc, char **argv)
{
    enum {
        O_DIM, O_OPT, O_LR, O_MOMENTUM, O_BETA1, O_BETA2, O_EPS, O_ACC, O_UPDATE, O_MAX_AGE, O_MAX_PENDING,
        O_OUT_THR, O_OUT_RULE, O_OUT_MIN, O_INIT, O_INIT_SCALE, O_SEED, O_IF_NOT_EXISTS, O_KIND, O_KNN, O_METRIC,
        O_NPROBE, O_EF, O_ADMISSION, O_MIN_FREQ, O_BLOOM_BITS, O_BLOOM_HASHES, O_EVICTION, O_MAX_ROWS, O_N
    };
    s_opt_t opts[O_N] = {
        [O_DIM] = {"dim", true, NULL},
        [O_OPT] = {"optimizer", true, NULL},
        [O_LR] = {"lr", true, NULL},
        [O_MOMENTUM] = {"momentum", true, NULL},
        [O_BETA1] = {"beta1", true, NULL},
        [O_BETA2] = {"beta2", true, NULL},
        [O_EPS] = {"epsilon", true, NULL},
        [O_ACC] = {"initial-accumulator", true, NULL},
        [O_UPDATE] = {"update", true, NULL},
        [O_MAX_AGE] = {"max-age-ms", true, NULL},
        [O_MAX_PENDING] = {"max-pending", true, NULL},
        [O_OUT_THR] = {"outlier-threshold", true, NULL},
        [O_OUT_RULE] = {"outlier-rule", true, NULL},
        [O_OUT_MIN] = {"outlier-min-count", true, NULL},
        [O_INIT] = {"init", true, NULL},
        [O_INIT_SCALE] = {"init-scale", true, NULL},
        [O_SEED] = {"seed", true, NULL},
        [O_IF_NOT_EXISTS] = {"if-not-exists", false, NULL},
        [O_KIND] = {"kind", true, NULL},
        [O_KNN] = {"knn", true, NULL},
        [O_METRIC] = {"metric", true, NULL},
        [O_NPROBE] = {"nprobe", true, NULL},
        [O_EF] = {"ef-search", true, NULL},
        [O_ADMISSION] = {"admission", true, NULL},
        [O_MIN_FREQ] = {"min-frequency", true, NULL},
        [O_BLOOM_BITS] = {"bloom-bits-log2", true, NULL},
        [O_BLOOM_HASHES] = {"bloom-hashes", true, NULL},
        [O_EVICTION] = {"eviction", true, NULL},
        [O_MAX_ROWS] = {"max-rows", true, NULL},
    };
    char *pos[argc];
    int n_pos;
    int st = s_begin(verb, argc, argv, opts, O_N, pos, &n_pos, 1, 1);
    if (st >= 0)
        return st;
    const char *v = verb->name;
    const char *name = pos[0];
    if (s_check_table_name(v, name) != 0)
        return S_EXIT_USAGE;
    int e;
    bool feature = false;
    if (opts[O_KIND].value) {
        if (s_opt_name(v, "kind", s_kinds, opts[O_KIND].value, &e) != 0)
            return S_EXIT_USAGE;
        feature = e == CARLS__TABLE_KIND__TABLE_FEATURE;
    }
    if (feature) {
        /* Feature tables hold records, not vectors: the vector options cannot apply (the server would
         * refuse dim and knn; the optimizer ones would be silently meaningless). */
        static const int vector_only[] = {O_DIM,     O_OPT,         O_LR,       O_MOMENTUM, O_BETA1,   O_BETA2,
                                          O_EPS,     O_ACC,         O_UPDATE,   O_MAX_AGE,  O_MAX_PENDING,
                                          O_OUT_THR, O_OUT_RULE,    O_OUT_MIN,  O_INIT,     O_INIT_SCALE,
                                          O_SEED,    O_KNN,         O_METRIC,   O_NPROBE,   O_EF};
        for (size_t i = 0; i < sizeof vector_only / sizeof vector_only[0]; i++) {
            if (opts[vector_only[i]].value) {
                fprintf(stderr, "kbctl %s: --%s does not apply to a feature table\n", v, opts[vector_only[i]].name);
                return S_EXIT_USAGE;
            }
        }
    } else if (!opts[O_DIM].value) {
        fprintf(stderr, "kbctl %s: --dim is required\n", v);
        return S_EXIT_USAGE;
    }

    Carls__OptimizerConfig opt = CARLS__OPTIMIZER_CONFIG__INIT;
    Carls__LazyUpdateConfig lazy = CARLS__LAZY_UPDATE_CONFIG__INIT;
    Carls__KnnConfig knn = CARLS__KNN_CONFIG__INIT;
    Carls__AdmissionConfig adm = CARLS__ADMISSION_CONFIG__INIT;
    Carls__EvictionConfig ev = CARLS__EVICTION_CONFIG__INIT;
    Carls__TableConfig cfg = CARLS__TABLE_CONFIG__INIT;
    cfg.kind = feature ? CARLS__TABLE_KIND__TABLE_FEATURE : CARLS__TABLE_KIND__TABLE_EMBEDDING;
    if (!feature) {
        cfg.optimizer = &opt;
        cfg.lazy = &lazy;
    }
    uint64_t u;
    if (!feature) {
        if (s_opt_u64(v, "dim", opts[O_DIM].value, 1, UINT32_MAX, &u) != 0)
            return S_EXIT_USAGE;
        cfg.dim = (uint32_t)u;
    }
    if (opts[O_OPT].value) {
        if (s_opt_name(v, "optimizer", s_optimizers, opts[O_OPT].value, &e) != 0)
            return S_EXIT_USAGE;
        opt.kind = (Carls__OptimizerKind)e;
    }
    if (opts[O_UPDATE].value) {
        if (s_opt_name(v, "update", s_updates, opts[O_UPDATE].value, &e) != 0)
            return S_EXIT_USAGE;
        lazy.policy = (Carls__UpdatePolicy)e;
    }
    if (opts[O_OUT_RULE].value) {
        if (s_opt_name(v, "outlier-rule", s_outlier_rules, opts[O_OUT_RULE].value, &e) != 0)
            return S_EXIT_USAGE;
        lazy.outlier_rule = (Carls__OutlierRule)e;
    }
    if (opts[O_INIT].value) {
        if (s_opt_name(v, "init", s_inits, opts[O_INIT].value, &e) != 0)
            return S_EXIT_USAGE;
        cfg.init = (Carls__InitKind)e;
    }
    /* Floats: (option, destination, must be below one). */
    struct {
        int o;
        float *dst;
        bool below_one;
    } floats[] = {
        {O_LR, &opt.learning_rate, false},     {O_MOMENTUM, &opt.momentum, true},
        {O_BETA1, &opt.beta1, true},           {O_BETA2, &opt.beta2, true},
        {O_EPS, &opt.epsilon, false},          {O_ACC, &opt.initial_accumulator, false},
        {O_OUT_THR, &lazy.outlier_threshold, false}, {O_INIT_SCALE, &cfg.init_scale, false},
    };
    for (size_t i = 0; i < sizeof floats / sizeof floats[0]; i++) {
        const s_opt_t *o = &opts[floats[i].o];
        if (o->value && s_opt_positive_float(v, o->name, o->value, floats[i].below_one, floats[i].dst) != 0)
            return S_EXIT_USAGE;
    }
    /* Whole numbers: (option, lowest, highest, destination as u32 or u64). */
    struct {
        int o;
        uint64_t lo, hi;
        uint32_t *dst32;
        uint64_t *dst64;
    } ints[] = {
        {O_MAX_AGE, 1, UINT32_MAX, &lazy.max_age_ms, NULL},
        {O_MAX_PENDING, 1, CARLS_MAX_PENDING_LIMIT, &lazy.max_pending, NULL},
        {O_OUT_MIN, 1, UINT32_MAX, &lazy.outlier_min_count, NULL},
        {O_SEED, 0, UINT64_MAX, NULL, &cfg.init_seed},
        {O_NPROBE, 1, UINT32_MAX, &knn.nprobe, NULL},
        {O_EF, 1, UINT32_MAX, &knn.ef_search, NULL},
        {O_MIN_FREQ, 1, UINT32_MAX, &adm.min_frequency, NULL},
        {O_BLOOM_BITS, 1, 30, &adm.bloom_bits_log2, NULL},
        {O_BLOOM_HASHES, 1, 64, &adm.bloom_hashes, NULL},
        {O_MAX_ROWS, 1, UINT64_MAX, NULL, &ev.max_rows},
    };
    for (size_t i = 0; i < sizeof ints / sizeof ints[0]; i++) {
        const s_opt_t *o = &opts[ints[i].o];
        if (!o->value)
            continue;
        if (s_opt_u64(v, o->name, o->value, ints[i].lo, ints[i].hi, &u) != 0)
            return S_EXIT_USAGE;
        if (ints[i].dst32)
            *ints[i].dst32 = (uint32_t)u;
        else
            *ints[i].dst64 = u;
    }

    /* Nearest-neighbour index: --knn names it; the other index options only make sense with it. */
    if (opts[O_KNN].value) {
        if (!*opts[O_KNN].value) {
            fprintf(stderr, "kbctl %s: --knn wants a FAISS index spec such as Flat, IVF256,Flat or HNSW32\n", v);
            return S_EXIT_USAGE;
        }
        knn.spec = (char *)opts[O_KNN].value;
        if (opts[O_METRIC].value) {
            if (s_opt_name(v, "metric", s_metrics, opts[O_METRIC].value, &e) != 0)
                return S_EXIT_USAGE;
            knn.metric = (Carls__KnnMetric)e;
        }
        cfg.knn = &knn;
    } else if (opts[O_METRIC].value || opts[O_NPROBE].value || opts[O_EF].value) {
        fprintf(stderr, "kbctl %s: --metric, --nprobe and --ef-search need --knn SPEC\n", v);
        return S_EXIT_USAGE;
    }
    if (opts[O_ADMISSION].value) {
        if (s_opt_name(v, "admission", s_admissions, opts[O_ADMISSION].value, &e) != 0)
            return S_EXIT_USAGE;
        adm.kind = (Carls__AdmissionKind)e;
    }
    if ((opts[O_MIN_FREQ].value && adm.kind == CARLS__ADMISSION_KIND__ADMIT_ALL) ||
        ((opts[O_BLOOM_BITS].value || opts[O_BLOOM_HASHES].value) && adm.kind != CARLS__ADMISSION_KIND__ADMIT_BLOOM)) {
        fprintf(stderr, "kbctl %s: --min-frequency needs --admission frequency|bloom; --bloom-bits-log2 and "
                        "--bloom-hashes need --admission bloom\n", v);
        return S_EXIT_USAGE;
    }
    if (opts[O_ADMISSION].value)
        cfg.admission = &adm;
    if (opts[O_EVICTION].value) {
        if (s_opt_name(v, "eviction", s_evictions, opts[O_EVICTION].value, &e) != 0)
            return S_EXIT_USAGE;
        ev.kind = (Carls__EvictionKind)e;
    }
    if ((ev.kind != CARLS__EVICTION_KIND__EVICT_NONE) != (opts[O_MAX_ROWS].value != NULL)) {
        fprintf(stderr, "kbctl %s: --eviction lru|oldest and --max-rows N go together\n", v);
        return S_EXIT_USAGE;
    }
    if (opts[O_EVICTION].value)
        cfg.eviction = &ev;
    if (s_need_endpoint(g) != 0)
        return S_EXIT_USAGE;

    kb_cluster_t *c = s_connect_st(g, &st);
    if (!c)
        return st;
    bool if_not_exists = opts[O_IF_NOT_EXISTS].value != NULL;
    int rc = kb_cluster_create_table(c, name, &cfg, if_not_exists);
    if (rc == 0 && feature)
        fprintf(stderr, "%s feature table %s\n", if_not_exists ? "created or found" : "created", name);
    else if (rc == 0)
        fprintf(stderr, "%s table %s (dim %u, %s, %s%s%s)\n", if_not_exists ? "created or found" : "created", name,
                cfg.dim, s_name_of(s_optimizers, opt.kind), s_name_of(s_updates, lazy.policy),
                cfg.knn ? ", knn " : "", cfg.knn ? knn.spec : "");
    st = rc == 0 ? S_EXIT_OK : s_fail(v, c, rc);
    kb_cluster_destroy(&c);
    return st;
}

static int s_drop_table(const s_verb_t *verb, const s_global_t *g, int argc, char **argv)
{
    s_opt_t opts[] = {{"if-exists", false, NULL}};
    char *pos[argc];
    int n_pos;
    int st = s_begin(verb, argc, argv, opts, 1, pos, &n_pos, 1, 1);
    if (st >= 0)
        return st;
    if (s_check_table_name(verb->name, pos[0]) != 0 || s_need_endpoint(g) != 0)
        return S_EXIT_USAGE;
    kb_cluster_t *c = s_connect_st(g, &st);
    if (!c)
        return st;
    int rc = kb_cluster_drop_table(c, pos[0], opts[0].value != NULL);
    if (rc == 0)
        fprintf(stderr, "dropped table %s\n", pos[0]);
    st = rc == 0 ? S_EXIT_OK : s_fail(verb->name, c, rc);
    kb_cluster_destroy(&c);
    return st;
}

static int s_list_tables(const s_verb_t *verb, const s_global_t *g, int argc, char **argv)
{
    char *pos[argc];
    int n_pos;
    int st = s_begin(verb, argc, argv, NULL, 0, pos, &n_pos, 0, 0);
    if (st >= 0)
        return st;
    if (s_need_endpoint(g) != 0)
        return S_EXIT_USAGE;
    kb_cluster_t *c = s_connect_st(g, &st);
    if (!c)
        return st;
    Carls__Response *resp = NULL;
    int rc = kb_cluster_list_tables(c, &resp);
    if (rc != 0) {
        st = s_fail(verb->name, c, rc);
        goto cleanup;
    }
    for (size_t i = 0; i < resp->table_list->n_tables; i++) {
        const Carls__TableInfo *t = resp->table_list->tables[i];
        const Carls__TableConfig *cfg = t->config;
        printf("%s\t%u\t%llu\t%s\t%s\n", t->name ? t->name : "", cfg ? cfg->dim : 0, (unsigned long long)t->rows,
               s_name_of(s_optimizers, (cfg && cfg->optimizer) ? (int)cfg->optimizer->kind : 0),
               s_name_of(s_updates, (cfg && cfg->lazy) ? (int)cfg->lazy->policy : 0));
    }
    st = S_EXIT_OK;
cleanup:
    if (resp)
        carls__response__free_unpacked(resp, NULL);
    kb_cluster_destroy(&c);
    return st;
}

/* put and push-grad: read and check every row on stdin, then send them in batches. */
static int s_write_rows(const s_verb_t *verb, const s_global_t *g, int argc, char **argv, bool gradients)
{
    s_opt_t opts[] = {{"batch", true, NULL}, {"version", true, NULL}};
    size_t n_opts = gradients ? 1 : 2; /* push-grad has no --version */
    char *pos[argc];
    int n_pos;
    int st = s_begin(verb, argc, argv, opts, n_opts, pos, &n_pos, 1, 1);
    if (st >= 0)
        return st;
    const char *v = verb->name, *table = pos[0];
    uint64_t batch = S_DEFAULT_BATCH, version = 0;
    if (opts[0].value && s_opt_u64(v, "batch", opts[0].value, 1, CARLS_DEFAULT_MAX_KEYS_PER_REQUEST, &batch) != 0)
        return S_EXIT_USAGE;
    if (!gradients && opts[1].value && s_opt_u64(v, "version", opts[1].value, 0, UINT64_MAX, &version) != 0)
        return S_EXIT_USAGE;
    if (s_check_table_name(v, table) != 0 || s_need_endpoint(g) != 0)
        return S_EXIT_USAGE;

    kb_rows_t *rows = NULL;
    kb_key_t *keys = NULL;
    kb_cluster_t *c = s_connect_st(g, &st);
    if (!c)
        return st;
    uint32_t dim = 0;
    st = s_table_dim(v, c, table, &dim);
    if (st != S_EXIT_OK)
        goto cleanup;
    rows = kb_rows_new(dim);
    size_t bad = 0;
    if (kb_rows_read(rows, stdin, stderr, S_MAX_REPORTED_LINES, &bad) != 0) {
        if (bad > 0)
            fprintf(stderr, "kbctl %s: %zu invalid line%s on stdin (table %s has dim %u); nothing was sent\n", v,
                    bad, bad == 1 ? "" : "s", table, dim);
        else
            fprintf(stderr, "kbctl %s: cannot read stdin; nothing was sent\n", v);
        st = S_EXIT_USAGE;
        goto cleanup;
    }
    keys = carls_xmalloc((size_t)batch * sizeof *keys);
    size_t done = 0;
    while (done < rows->n) {
        size_t k = rows->n - done < batch ? rows->n - done : (size_t)batch;
        for (size_t i = 0; i < k; i++)
            keys[i] = kb_rows_key(rows, done + i);
        const float *vals = rows->values + done * dim;
        int rc = gradients ? kb_cluster_push_gradients(c, table, keys, k, dim, vals)
                           : kb_cluster_put(c, table, keys, k, dim, vals, version);
        if (rc != 0) {
            fprintf(stderr, "kbctl %s: rows %zu..%zu: %s (%zu of %zu rows were sent before)\n", v, done + 1,
                    done + k, kb_cluster_last_error(c), done, rows->n);
            st = rc == KB_CLIENT_EINVAL ? S_EXIT_USAGE : S_EXIT_SERVER;
            goto cleanup;
        }
        done += k;
    }
    if (gradients)
        fprintf(stderr, "pushed %zu gradient row%s to %s\n", done, done == 1 ? "" : "s", table);
    else
        fprintf(stderr, "put %zu row%s into %s\n", done, done == 1 ? "" : "s", table);
    st = S_EXIT_OK;
cleanup:
    free(keys);
    kb_rows_destroy(&rows);
    kb_cluster_destroy(&c);
    return st;
}

static int s_put(const s_verb_t *verb, const s_global_t *g, int argc, char **argv)
{
    return s_write_rows(verb, g, argc, argv, false);
}

static int s_push_grad(const s_verb_t *verb, const s_global_t *g, int argc, char **argv)
{
    return s_write_rows(verb, g, argc, argv, true);
}

static int s_get(const s_verb_t *verb, const s_global_t *g, int argc, char **argv)
{
    s_opt_t opts[] = {{"meta", false, NULL}, {"no-create", false, NULL}, {"batch", true, NULL}};
    char *pos[argc];
    int n_pos;
    int st = s_begin(verb, argc, argv, opts, 3, pos, &n_pos, 1, -1);
    if (st >= 0)
        return st;
    const char *v = verb->name, *table = pos[0];
    bool meta = opts[0].value != NULL, no_create = opts[1].value != NULL;
    uint64_t batch = S_DEFAULT_BATCH;
    if (opts[2].value && s_opt_u64(v, "batch", opts[2].value, 1, CARLS_DEFAULT_MAX_KEYS_PER_REQUEST, &batch) != 0)
        return S_EXIT_USAGE;
    if (s_check_table_name(v, table) != 0)
        return S_EXIT_USAGE;

    /* Keys from the arguments, else one per line from stdin; all checked before anything is sent. */
    kb_rows_t *keyset = s_read_keys(v, pos, n_pos, 1);
    kb_key_t *keys = NULL;
    float *values = NULL;
    kb_row_meta_t *metas = NULL;
    kb_cluster_t *c = NULL;
    if (!keyset)
        return S_EXIT_USAGE;
    if (s_need_endpoint(g) != 0) {
        st = S_EXIT_USAGE;
        goto cleanup;
    }
    c = s_connect_st(g, &st);
    if (!c)
        goto cleanup;
    uint32_t dim = 0;
    st = s_table_dim(v, c, table, &dim);
    if (st != S_EXIT_OK)
        goto cleanup;
    keys = carls_xmalloc((size_t)batch * sizeof *keys);
    values = carls_xmalloc((size_t)batch * dim * sizeof *values);
    metas = meta ? carls_xmalloc((size_t)batch * sizeof *metas) : NULL;
    for (size_t done = 0; done < keyset->n;) {
        size_t k = keyset->n - done < batch ? keyset->n - done : (size_t)batch;
        for (size_t i = 0; i < k; i++)
            keys[i] = kb_rows_key(keyset, done + i);
        int rc = kb_cluster_lookup_ex(c, table, keys, k, dim, no_create, values, metas);
        if (rc != 0) {
            st = s_fail(v, c, rc);
            goto cleanup;
        }
        for (size_t i = 0; i < k; i++) {
            kb_rows_write_row(stdout, keys[i].data, keys[i].len, values + i * dim, dim);
            if (meta)
                printf("\t%llu\t%lld\t%llu", (unsigned long long)metas[i].version,
                       (long long)metas[i].updated_at_ms, (unsigned long long)metas[i].frequency);
            putchar('\n');
        }
        done += k;
    }
    st = S_EXIT_OK;
cleanup:
    free(keys);
    free(values);
    free(metas);
    kb_rows_destroy(&keyset);
    kb_cluster_destroy(&c);
    return st;
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
    printf("memory_bytes: %llu\n", (unsigned long long)s->memory_bytes);
    printf("memory_limit: %llu%s\n", (unsigned long long)s->memory_limit, s->memory_limit ? "" : " (unlimited)");
    printf("memory_refusals: %llu\n", (unsigned long long)s->memory_refusals);
    printf("memory_refused_rows: %llu\n", (unsigned long long)s->memory_refused_rows);
    printf("rss_bytes: %llu\n", (unsigned long long)s->rss_bytes);
    for (size_t i = 0; i < s->n_latency; i++) {
        const Carls__LatencySummary *l = s->latency[i];
        printf("latency %s: count %llu, p50 %.1f us, p99 %.1f us, max %.1f us\n", l->op ? l->op : "",
               (unsigned long long)l->count, l->p50_us, l->p99_us, l->max_us);
    }
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
        printf("kind: %s\n", s_name_of(s_kinds, (int)t->kind));
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
        for (size_t j = 0; j < t->n_requests; j++) {
            const Carls__LatencySummary *l = t->requests[j];
            printf("requests %s: count %llu, p50 %.1f us, p99 %.1f us, max %.1f us\n", l->op ? l->op : "",
                   (unsigned long long)l->count, l->p50_us, l->p99_us, l->max_us);
        }
    }
}

static int s_stats(const s_verb_t *verb, const s_global_t *g, int argc, char **argv)
{
    char *pos[argc];
    int n_pos;
    int st = s_begin(verb, argc, argv, NULL, 0, pos, &n_pos, 0, 1);
    if (st >= 0)
        return st;
    const char *table = n_pos ? pos[0] : NULL;
    if ((table && s_check_table_name(verb->name, table) != 0) || s_need_endpoint(g) != 0)
        return S_EXIT_USAGE;
    kb_cluster_t *c = s_connect_st(g, &st);
    if (!c)
        return st;
    uint32_t shards = kb_cluster_shards(c);
    st = S_EXIT_OK;
    for (uint32_t s = 0; s < shards && st == S_EXIT_OK; s++) {
        Carls__Response *resp = NULL;
        int rc = kb_cluster_stats(c, s, table, &resp);
        if (rc != 0) {
            st = s_fail(verb->name, c, rc);
            break;
        }
        /* Several shards: one block per shard, each headed by its index and endpoint. */
        if (shards > 1)
            printf("%sshard %u %s\n", s ? "\n" : "", s, kb_cluster_endpoint(c, s));
        s_print_stats(resp->stats);
        carls__response__free_unpacked(resp, NULL);
    }
    kb_cluster_destroy(&c);
    return st;
}

static int s_checkpoint(const s_verb_t *verb, const s_global_t *g, int argc, char **argv)
{
    char *pos[argc];
    int n_pos;
    int st = s_begin(verb, argc, argv, NULL, 0, pos, &n_pos, 0, 0);
    if (st >= 0)
        return st;
    if (s_need_endpoint(g) != 0)
        return S_EXIT_USAGE;
    kb_cluster_t *c = s_connect_st(g, &st);
    if (!c)
        return st;
    uint32_t shards = kb_cluster_shards(c);
    Carls__CheckpointResult *res = carls_xcalloc(shards, sizeof *res);
    int rc = kb_cluster_checkpoint(c, res);
    if (rc != 0) {
        st = s_fail(verb->name, c, rc);
    } else {
        for (uint32_t s = 0; s < shards; s++) {
            if (shards > 1)
                printf("%sshard %u %s\n", s ? "\n" : "", s, kb_cluster_endpoint(c, s));
            printf("committed_epoch: %llu\nrows: %llu\n", (unsigned long long)res[s].committed_epoch,
                   (unsigned long long)res[s].rows);
        }
        st = S_EXIT_OK;
    }
    free(res);
    kb_cluster_destroy(&c);
    return st;
}

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

static int s_knn(const s_verb_t *verb, const s_global_t *g, int argc, char **argv)
{
    enum { O_K, O_KEY, O_EXCLUDE, O_VECTOR, O_N };
    s_opt_t opts[O_N] = {
        [O_K] = {"k", true, NULL},
        [O_KEY] = {"key", true, NULL},
        [O_EXCLUDE] = {"exclude-self", false, NULL},
        [O_VECTOR] = {"vector", true, NULL},
    };
    char *pos[argc];
    int n_pos;
    int st = s_begin(verb, argc, argv, opts, O_N, pos, &n_pos, 1, 1);
    if (st >= 0)
        return st;
    const char *v = verb->name, *table = pos[0];
    uint64_t k = 10;
    if (opts[O_K].value && s_opt_u64(v, "k", opts[O_K].value, 1, S_MAX_K, &k) != 0)
        return S_EXIT_USAGE;
    if (!opts[O_KEY].value == !opts[O_VECTOR].value) {
        fprintf(stderr, "kbctl %s: give exactly one of --key KEY and --vector \"v1 v2 ...\"\n", v);
        return S_EXIT_USAGE;
    }
    if (opts[O_EXCLUDE].value && !opts[O_KEY].value) {
        fprintf(stderr, "kbctl %s: --exclude-self goes with --key\n", v);
        return S_EXIT_USAGE;
    }
    char err[256];
    kb_rows_t *keyset = kb_rows_new(0);
    if (opts[O_KEY].value &&
        kb_rows_parse_key_line(keyset, opts[O_KEY].value, strlen(opts[O_KEY].value), err, sizeof err) != 0) {
        fprintf(stderr, "kbctl %s: --key: %s\n", v, err);
        kb_rows_destroy(&keyset);
        return S_EXIT_USAGE;
    }
    if (s_check_table_name(v, table) != 0 || s_need_endpoint(g) != 0) {
        kb_rows_destroy(&keyset);
        return S_EXIT_USAGE;
    }
    float *query = NULL;
    kb_knn_result_t *res = NULL;
    kb_cluster_t *c = s_connect_st(g, &st);
    if (!c)
        goto cleanup;
    int rc;
    if (opts[O_VECTOR].value) {
        uint32_t dim;
        st = s_table_dim(v, c, table, &dim);
        if (st != S_EXIT_OK)
            goto cleanup;
        query = s_parse_vector(v, opts[O_VECTOR].value, dim);
        if (!query) {
            st = S_EXIT_USAGE;
            goto cleanup;
        }
        rc = kb_cluster_knn(c, table, query, 1, dim, (uint32_t)k, &res);
    } else {
        kb_key_t key = kb_rows_key(keyset, 0);
        rc = kb_cluster_knn_by_key(c, table, &key, 1, (uint32_t)k, opts[O_EXCLUDE].value != NULL, &res);
    }
    if (rc != 0) {
        st = s_fail(v, c, rc);
        goto cleanup;
    }
    char num[KB_ROWS_FLOAT_CHARS];
    for (uint32_t r = 0; r < res->k; r++) {
        if (res->keys[r].len == 0)
            break; /* fewer rows than k */
        fwrite(res->keys[r].data, 1, res->keys[r].len, stdout);
        kb_rows_format_float(res->scores[r], num, sizeof num);
        printf("\t%s\n", num);
    }
    st = S_EXIT_OK;
cleanup:
    kb_knn_result_destroy(&res);
    free(query);
    kb_rows_destroy(&keyset);
    kb_cluster_destroy(&c);
    return st;
}

static int s_sample(const s_verb_t *verb, const s_global_t *g, int argc, char **argv)
{
    enum { O_NN, O_STRATEGY, O_SEED, O_N };
    s_opt_t opts[O_N] = {
        [O_NN] = {"n", true, NULL},
        [O_STRATEGY] = {"strategy", true, NULL},
        [O_SEED] = {"seed", true, NULL},
    };
    char *pos[argc];
    int n_pos;
    int st = s_begin(verb, argc, argv, opts, O_N, pos, &n_pos, 1, -1);
    if (st >= 0)
        return st;
    const char *v = verb->name, *table = pos[0];
    uint64_t n = 0, seed = 0;
    int strategy = CARLS__SAMPLE_STRATEGY__SAMPLE_UNIFORM;
    if (!opts[O_NN].value) {
        fprintf(stderr, "kbctl %s: --n is required (candidates to draw; 0 for the positives' probabilities only)\n", v);
        return S_EXIT_USAGE;
    }
    if (s_opt_u64(v, "n", opts[O_NN].value, 0, CARLS_DEFAULT_MAX_KEYS_PER_REQUEST, &n) != 0)
        return S_EXIT_USAGE;
    if (opts[O_STRATEGY].value && s_opt_name(v, "strategy", s_strategies, opts[O_STRATEGY].value, &strategy) != 0)
        return S_EXIT_USAGE;
    if (opts[O_SEED].value && s_opt_u64(v, "seed", opts[O_SEED].value, 0, UINT64_MAX, &seed) != 0)
        return S_EXIT_USAGE;
    if (s_check_table_name(v, table) != 0 || s_need_endpoint(g) != 0)
        return S_EXIT_USAGE;
    /* Positives come from the arguments only (stdin is not read: a sample needs no input). */
    kb_rows_t *positives = kb_rows_new(0);
    char err[256];
    for (int i = 1; i < n_pos; i++) {
        if (kb_rows_parse_key_line(positives, pos[i], strlen(pos[i]), err, sizeof err) != 0) {
            fprintf(stderr, "kbctl %s: positive %d: %s\n", v, i, err);
            kb_rows_destroy(&positives);
            return S_EXIT_USAGE;
        }
    }
    kb_key_t *keys = carls_xcalloc(positives->n ? positives->n : 1, sizeof *keys);
    for (size_t i = 0; i < positives->n; i++)
        keys[i] = kb_rows_key(positives, i);
    kb_sample_result_t *res = NULL;
    kb_cluster_t *c = s_connect_st(g, &st);
    if (!c)
        goto cleanup;
    int rc = kb_cluster_sample(c, table, keys, positives->n, (uint32_t)n, (Carls__SampleStrategy)strategy, seed,
                               &res);
    if (rc != 0) {
        st = s_fail(v, c, rc);
        goto cleanup;
    }
    char num[KB_ROWS_FLOAT_CHARS];
    for (size_t i = 0; i < res->n; i++) {
        fwrite(res->keys[i].data, 1, res->keys[i].len, stdout);
        kb_rows_format_float(res->probabilities[i], num, sizeof num);
        printf("\t%s\t%s\n", num, res->is_positive[i] ? "positive" : "sampled");
    }
    st = S_EXIT_OK;
cleanup:
    kb_sample_result_destroy(&res);
    free(keys);
    kb_rows_destroy(&positives);
    kb_cluster_destroy(&c);
    return st;
}

/* Checks that table is a feature table. Exit status. */
static int s_need_feature_table(const char *verb, kb_cluster_t *c, const char *table)
{
    kb_cluster_table_t info;
    int st = s_table_info(verb, c, table, &info);
    if (st == S_EXIT_OK && info.kind != CARLS__TABLE_KIND__TABLE_FEATURE) {
        fprintf(stderr, "kbctl %s: table \"%s\" is not a feature table (use get/put for embeddings)\n", verb, table);
        st = S_EXIT_USAGE;
    }
    return st;
}

static int s_put_feature(const s_verb_t *verb, const s_global_t *g, int argc, char **argv)
{
    s_opt_t opts[] = {{"batch", true, NULL}};
    char *pos[argc];
    int n_pos;
    int st = s_begin(verb, argc, argv, opts, 1, pos, &n_pos, 1, 1);
    if (st >= 0)
        return st;
    const char *v = verb->name, *table = pos[0];
    uint64_t batch = S_DEFAULT_BATCH;
    if (opts[0].value && s_opt_u64(v, "batch", opts[0].value, 1, CARLS_DEFAULT_MAX_KEYS_PER_REQUEST, &batch) != 0)
        return S_EXIT_USAGE;
    if (s_check_table_name(v, table) != 0 || s_need_endpoint(g) != 0)
        return S_EXIT_USAGE;
    kb_feature_rows_t *rows = NULL;
    kb_key_t *keys = NULL;
    kb_cluster_t *c = s_connect_st(g, &st);
    if (!c)
        return st;
    st = s_need_feature_table(v, c, table);
    if (st != S_EXIT_OK)
        goto cleanup;
    rows = kb_feature_rows_new();
    size_t bad = 0;
    if (kb_feature_rows_read(rows, stdin, stderr, S_MAX_REPORTED_LINES, &bad) != 0) {
        if (bad > 0)
            fprintf(stderr, "kbctl %s: %zu invalid line%s on stdin; nothing was sent\n", v, bad, bad == 1 ? "" : "s");
        else
            fprintf(stderr, "kbctl %s: cannot read stdin; nothing was sent\n", v);
        st = S_EXIT_USAGE;
        goto cleanup;
    }
    size_t n = rows->keys->n;
    keys = carls_xmalloc((size_t)batch * sizeof *keys);
    for (size_t done = 0; done < n;) {
        size_t k = n - done < batch ? n - done : (size_t)batch;
        for (size_t i = 0; i < k; i++)
            keys[i] = kb_rows_key(rows->keys, done + i);
        int rc = kb_cluster_feature_put(c, table, keys, k, (const Carls__FeatureRecord *const *)rows->records + done);
        if (rc != 0) {
            fprintf(stderr, "kbctl %s: records %zu..%zu: %s (%zu of %zu records were sent before)\n", v, done + 1,
                    done + k, kb_cluster_last_error(c), done, n);
            st = rc == KB_CLIENT_EINVAL ? S_EXIT_USAGE : S_EXIT_SERVER;
            goto cleanup;
        }
        done += k;
    }
    fprintf(stderr, "put %zu record%s into %s", n, n == 1 ? "" : "s", table);
    if (rows->skipped)
        fprintf(stderr, " (skipped %zu found=false line%s)", rows->skipped, rows->skipped == 1 ? "" : "s");
    fputc('\n', stderr);
    st = S_EXIT_OK;
cleanup:
    free(keys);
    kb_feature_rows_destroy(&rows);
    kb_cluster_destroy(&c);
    return st;
}

static int s_get_feature(const s_verb_t *verb, const s_global_t *g, int argc, char **argv)
{
    s_opt_t opts[] = {{"meta", false, NULL}, {"batch", true, NULL}};
    char *pos[argc];
    int n_pos;
    int st = s_begin(verb, argc, argv, opts, 2, pos, &n_pos, 1, -1);
    if (st >= 0)
        return st;
    const char *v = verb->name, *table = pos[0];
    bool meta = opts[0].value != NULL;
    uint64_t batch = S_DEFAULT_BATCH;
    if (opts[1].value && s_opt_u64(v, "batch", opts[1].value, 1, CARLS_DEFAULT_MAX_KEYS_PER_REQUEST, &batch) != 0)
        return S_EXIT_USAGE;
    if (s_check_table_name(v, table) != 0)
        return S_EXIT_USAGE;
    kb_rows_t *keyset = s_read_keys(v, pos, n_pos, 1);
    if (!keyset)
        return S_EXIT_USAGE;
    kb_key_t *keys = NULL;
    kb_cluster_t *c = NULL;
    if (s_need_endpoint(g) != 0) {
        st = S_EXIT_USAGE;
        goto cleanup;
    }
    c = s_connect_st(g, &st);
    if (!c)
        goto cleanup;
    st = s_need_feature_table(v, c, table);
    if (st != S_EXIT_OK)
        goto cleanup;
    keys = carls_xmalloc((size_t)batch * sizeof *keys);
    for (size_t done = 0; done < keyset->n;) {
        size_t k = keyset->n - done < batch ? keyset->n - done : (size_t)batch;
        for (size_t i = 0; i < k; i++)
            keys[i] = kb_rows_key(keyset, done + i);
        kb_feature_result_t *res = NULL;
        int rc = kb_cluster_feature_get(c, table, keys, k, &res);
        if (rc != 0) {
            st = s_fail(v, c, rc);
            goto cleanup;
        }
        for (size_t i = 0; i < k; i++) {
            kb_feature_write_line(stdout, keys[i].data, keys[i].len, res->records[i], meta);
            putchar('\n');
        }
        kb_feature_result_destroy(&res);
        done += k;
    }
    st = S_EXIT_OK;
cleanup:
    free(keys);
    kb_rows_destroy(&keyset);
    kb_cluster_destroy(&c);
    return st;
}

/* Exit status for a kb_export_* / kb_import_table failure: the bank's fault or the file's. */
static int s_export_status(int rc)
{
    return rc == KB_EXPORT_EBANK ? S_EXIT_SERVER : S_EXIT_USAGE;
}

static int s_export(const s_verb_t *verb, const s_global_t *g, int argc, char **argv)
{
    s_opt_t opts[] = {{"force", false, NULL}, {"page", true, NULL}};
    char *pos[argc];
    int n_pos;
    int st = s_begin(verb, argc, argv, opts, 2, pos, &n_pos, 2, 2);
    if (st >= 0)
        return st;
    const char *v = verb->name, *table = pos[0], *path = pos[1];
    uint64_t page = S_DEFAULT_SCAN_PAGE;
    if (opts[1].value && s_opt_u64(v, "page", opts[1].value, 1, CARLS_DEFAULT_MAX_KEYS_PER_REQUEST, &page) != 0)
        return S_EXIT_USAGE;
    if (s_check_table_name(v, table) != 0 || s_need_endpoint(g) != 0)
        return S_EXIT_USAGE;
    struct stat sb;
    if (!opts[0].value && stat(path, &sb) == 0) {
        fprintf(stderr, "kbctl %s: %s exists; --force replaces it\n", v, path);
        return S_EXIT_USAGE;
    }
    kb_cluster_t *c = s_connect_st(g, &st);
    if (!c)
        return st;
    char err[768];
    uint64_t rows = 0;
    int rc = kb_export_table(c, table, path, (uint32_t)page, &rows, err, sizeof err);
    if (rc != 0) {
        fprintf(stderr, "kbctl %s: %s\n", v, err);
        st = s_export_status(rc);
    } else {
        fprintf(stderr, "exported %llu row%s of %s to %s\n", (unsigned long long)rows, rows == 1 ? "" : "s", table,
                path);
        st = S_EXIT_OK;
    }
    kb_cluster_destroy(&c);
    return st;
}

static int s_import(const s_verb_t *verb, const s_global_t *g, int argc, char **argv)
{
    s_opt_t opts[] = {{"batch", true, NULL}};
    char *pos[argc];
    int n_pos;
    int st = s_begin(verb, argc, argv, opts, 1, pos, &n_pos, 2, 2);
    if (st >= 0)
        return st;
    const char *v = verb->name, *table = pos[0], *path = pos[1];
    uint64_t batch = S_DEFAULT_BATCH;
    if (opts[0].value && s_opt_u64(v, "batch", opts[0].value, 1, CARLS_DEFAULT_MAX_KEYS_PER_REQUEST, &batch) != 0)
        return S_EXIT_USAGE;
    if (s_check_table_name(v, table) != 0 || s_need_endpoint(g) != 0)
        return S_EXIT_USAGE;
    char err[768];
    /* Verified here first as well, so a bad file is refused before any connection is opened. */
    kb_export_reader_t *r = NULL;
    int rc = kb_export_reader_open(path, &r, err, sizeof err);
    if (rc != 0) {
        fprintf(stderr, "kbctl %s: refusing %s: %s; nothing was imported\n", v, path, err);
        return S_EXIT_USAGE;
    }
    char from[CARLS_MAX_TABLE_NAME_BYTES + 1];
    snprintf(from, sizeof from, "%s", kb_export_reader_table(r));
    uint64_t in_file = kb_export_reader_rows(r);
    kb_export_reader_destroy(&r);
    kb_cluster_t *c = s_connect_st(g, &st);
    if (!c)
        return st;
    uint64_t rows = 0;
    rc = kb_import_table(c, table, path, (size_t)batch, &rows, err, sizeof err);
    if (rc != 0) {
        fprintf(stderr, "kbctl %s: %s (%llu of %llu rows were imported)\n", v, err, (unsigned long long)rows,
                (unsigned long long)in_file);
        st = s_export_status(rc);
    } else {
        fprintf(stderr, "imported %llu row%s into %s (exported from table %s)\n", (unsigned long long)rows,
                rows == 1 ? "" : "s", table, from);
        st = S_EXIT_OK;
    }
    kb_cluster_destroy(&c);
    return st;
}

static const s_verb_t s_verbs[] = {
    {"create-table",
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
     "Only --admission, --eviction and their options apply to feature tables.\n",
     s_create_table},
    {"list-tables",
     "usage: kbctl list-tables\n"
     "One line per table, tab-separated: name, dim, rows, optimizer, update policy. With several shards the\n"
     "tables are shard 0's and rows are summed over the shards.\n",
     s_list_tables},
    {"drop-table",
     "usage: kbctl drop-table NAME [--if-exists]\n"
     "Deletes a table and its rows. --if-exists: succeed when there is no such table.\n",
     s_drop_table},
    {"put",
     "usage: kbctl put TABLE [--version N] [--batch N] < rows\n"
     "Writes rows read from stdin, one per line: KEY, a TAB, then dim numbers separated by spaces or TABs.\n"
     "Every line is checked first (dim numbers, all finite, non-empty key); with any invalid line nothing\n"
     "is sent and the exit status is 1. Rows go in batches of --batch (default 1000) rows per request,\n"
     "tagged with --version (default 0). Prints \"put N rows into TABLE\" to stderr.\n",
     s_put},
    {"push-grad",
     "usage: kbctl push-grad TABLE [--batch N] < gradients\n"
     "Pushes gradient rows read from stdin (same format and checks as put); each row is one gradient.\n",
     s_push_grad},
    {"get",
     "usage: kbctl get TABLE [--meta] [--no-create] [--batch N] [KEY...]\n"
     "Looks up the keys given (or one key per line on stdin when none are given) and prints one line per\n"
     "key: KEY, a TAB, the values separated by single spaces, each as \"%g\" when that reads back to the\n"
     "same float and as \"%.9g\" otherwise, so the printed values read back exactly.\n"
     "  --meta       adds TAB-separated columns: version, updated_at_ms, frequency\n"
     "  --no-create  do not insert unseen keys (they still show their initial value)\n",
     s_get},
    {"knn",
     "usage: kbctl knn TABLE --k K (--key KEY [--exclude-self] | --vector \"v1 v2 ...\")\n"
     "Nearest neighbours (K, default 10, at most 4096) of a key's current value or of a vector of the table's\n"
     "dim, through the table's index: one line per row found, best first, KEY<TAB>SCORE (score formatted as\n"
     "get formats numbers; L2 scores are squared distances, lower is nearer; ip and cosine, higher is nearer).\n"
     "--exclude-self leaves the query key out. With several shards every shard is asked and the answers merged.\n",
     s_knn},
    {"sample",
     "usage: kbctl sample TABLE --n N [--strategy uniform|log-uniform|unigram] [--seed S] [POSITIVE...]\n"
     "Draws N candidates (with replacement; default strategy uniform) and prints the positives first, then the\n"
     "candidates: KEY<TAB>PROBABILITY<TAB>positive|sampled, where PROBABILITY is the chance that one draw picks\n"
     "the key. A seed (not 0) makes the draw repeatable. With several shards the draws are split over the\n"
     "shards by their mass: exact for uniform and unigram, an approximation for log-uniform (ranks are\n"
     "per shard).\n",
     s_sample},
    {"put-feature",
     "usage: kbctl put-feature TABLE [--batch N] < lines\n"
     "Replaces feature records read from stdin, one per line:\n"
     "  KEY<TAB>label=3 confidence=0.9 version=2 neighbors=a:0.5,b:0.25 data=00ff\n"
     "Fields (any order, each optional): label=INT or flabel=FLOAT, confidence=X, version=N,\n"
     "neighbors=KEY:WEIGHT,... and data=HEX. Keys (the line's and the neighbours') are percent-encoded:\n"
     "bytes outside ! .. ~ and each of % , : = are written %XX. updated_at_ms= is accepted and ignored;\n"
     "found=false lines (from get-feature) are skipped. Every line is checked first; with any invalid line\n"
     "nothing is sent. So `kbctl get-feature T ... | kbctl put-feature T2` copies records.\n",
     s_put_feature},
    {"get-feature",
     "usage: kbctl get-feature TABLE [--meta] [--batch N] [KEY...]\n"
     "Prints the records of the keys given (as they are, not encoded), or of one key per line on stdin, in the\n"
     "put-feature line format; a key without a record prints KEY<TAB>found=false. --meta adds\n"
     "updated_at_ms=N (the server's time of the last put).\n",
     s_get_feature},
    {"export",
     "usage: kbctl export TABLE FILE [--force] [--page N]\n"
     "Writes the table (config and every row of every shard, read with scan pages of N rows, default 1000)\n"
     "to FILE: a self-checking snapshot (magic, version, CRC-32) written to a temporary name, fsynced and\n"
     "renamed, mode 0600. It carries keys, values or feature records, versions and frequencies; not optimizer\n"
     "state or pending gradients. An existing FILE is replaced only with --force. A table that is written\n"
     "meanwhile is exported as the scan finds it (not a point-in-time snapshot).\n",
     s_export},
    {"import",
     "usage: kbctl import TABLE FILE [--batch N]\n"
     "Verifies FILE completely (format, sizes, checksum) and refuses it, importing nothing, when anything is\n"
     "wrong; then creates TABLE with the file's config unless it exists with that config, and writes the rows\n"
     "(values with their versions, or feature records) in batches of N routed by the current shard count, so\n"
     "a file exported from one shard imports into three. Frequencies are not restored (the protocol cannot\n"
     "set them): imported rows count as written by put. Existing rows with other keys stay.\n",
     s_import},
    {"stats",
     "usage: kbctl stats [TABLE]\n"
     "Prints server-wide counters, latency percentiles per operation, then one block per table (or only\n"
     "TABLE): \"key: value\" lines, blocks separated by a blank line. With several shards, each shard's\n"
     "output follows a line \"shard I ENDPOINT\".\n",
     s_stats},
    {"checkpoint",
     "usage: kbctl checkpoint\n"
     "Asks every server to commit everything and checkpoint its database; prints committed_epoch and rows\n"
     "(per shard, after a \"shard I ENDPOINT\" line, when there are several).\n",
     s_checkpoint},
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
            "  --curve-key FILE  encrypt with CURVE: this client's secret key file (kb-keygen NAME.key) ...\n"
            "  --curve-server-key FILE  ... and the servers' public key file (server.pub); see docs/SECURITY.md\n"
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

int main(int argc, char **argv)
{
    carls_log_set_level(CARLS_LOG_WARN);
    carls_log_init_from_env();
    s_global_t g = {getenv("CARLS_KB"), S_DEFAULT_TIMEOUT_MS, S_DEFAULT_RETRIES, NULL, NULL};

    int i = 1;
    for (; i < argc && argv[i][0] == '-'; i++) {
        const char *arg = argv[i];
        if (strcmp(arg, "--help") == 0 || strcmp(arg, "-h") == 0) {
            s_usage(stdout);
            return S_EXIT_OK;
        }
        const char *eq = strchr(arg, '=');
        size_t name_len = eq ? (size_t)(eq - arg) : strlen(arg);
        const char *names[] = {"--kb", "--timeout-ms", "--retries", "--log-level", "--curve-key",
                               "--curve-server-key"};
        int which = -1;
        for (int j = 0; j < 6; j++)
            if (strlen(names[j]) == name_len && strncmp(arg, names[j], name_len) == 0)
                which = j;
        if (which < 0) {
            fprintf(stderr, "kbctl: unknown option %s (see kbctl --help)\n", arg);
            return S_EXIT_USAGE;
        }
        const char *value = eq ? eq + 1 : (i + 1 < argc ? argv[++i] : NULL);
        if (!value) {
            fprintf(stderr, "kbctl: %s needs a value\n", names[which]);
            return S_EXIT_USAGE;
        }
        uint64_t u;
        carls_log_level_t level;
        switch (which) {
        case 0:
            g.endpoint = value;
            break;
        case 1:
            if (s_opt_u64("", "timeout-ms", value, 1, 24u * 3600 * 1000, &u) != 0)
                return S_EXIT_USAGE;
            g.timeout_ms = (int)u;
            break;
        case 2:
            if (s_opt_u64("", "retries", value, 0, 1000, &u) != 0)
                return S_EXIT_USAGE;
            g.retries = (int)u;
            break;
        case 4:
            g.curve_key = value;
            break;
        case 5:
            g.curve_server_key = value;
            break;
        default:
            if (carls_log_parse_level(value, &level) != 0) {
                fprintf(stderr, "kbctl: --log-level: unknown level \"%s\" (debug, info, warn, error, off)\n", value);
                return S_EXIT_USAGE;
            }
            carls_log_set_level(level);
            break;
        }
    }
    if (i == argc) {
        s_usage(stderr);
        return S_EXIT_USAGE;
    }
    if (!g.curve_key != !g.curve_server_key) {
        fprintf(stderr, "kbctl: --curve-key and --curve-server-key go together\n");
        return S_EXIT_USAGE;
    }
    const s_verb_t *verb = NULL;
    for (size_t j = 0; j < S_N_VERBS; j++)
        if (strcmp(argv[i], s_verbs[j].name) == 0)
            verb = &s_verbs[j];
    if (!verb) {
        fprintf(stderr, "kbctl: unknown verb \"%s\" (see kbctl --help)\n", argv[i]);
        return S_EXIT_USAGE;
    }
    int st = verb->run(verb, &g, argc - i, argv + i);
    /* A result that did not reach stdout (full disk, closed pipe) is a failure too. */
    if (fflush(stdout) != 0 || ferror(stdout)) {
        fprintf(stderr, "kbctl %s: cannot write the output\n", verb->name);
        if (st == S_EXIT_OK)
            st = S_EXIT_USAGE;
    }
    return st;
}
