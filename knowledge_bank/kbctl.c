/* kbctl: command-line client of kb-server for people and scripts.
 *
 *   kbctl [--kb ENDPOINT] [--timeout-ms N] [--retries N] [--log-level L] VERB [ARGS...]
 *
 * Text in, text out: rows are "KEY<TAB>v1 v2 ..." lines (format in kb_rows_text.h), listings are
 * tab-separated, results go to stdout and everything else (errors, summaries, logs) to stderr.
 * Exit status: 0 success, 1 usage or input error (nothing was sent for bad input), 2 server or connection
 * error (timeout, error status, undecodable answer). */
#include "kb_client.h"
#include "kb_rows_text.h"
#include "log.h"
#include "protocol.h"
#include "util.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum {
    S_EXIT_OK = 0,
    S_EXIT_USAGE = 1,  /* bad command line or bad input: nothing was sent */
    S_EXIT_SERVER = 2, /* the server answered with an error, or could not be reached */
};

#define S_DEFAULT_TIMEOUT_MS 5000
#define S_DEFAULT_RETRIES 2
#define S_DEFAULT_BATCH 1000
#define S_MAX_REPORTED_LINES 20 /* invalid input lines reported before "... and K more" */

/* Options that come before the verb. */
typedef struct {
    const char *endpoint; /* --kb, else $CARLS_KB; NULL if neither */
    int timeout_ms;       /* per attempt */
    int retries;          /* extra attempts after a timeout */
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
    static const char *globals[] = {"kb", "timeout-ms", "retries", "log-level"};
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

static kb_client_t *s_connect(const s_global_t *g)
{
    kb_client_options_t opts = {.timeout_ms = g->timeout_ms, .retries = g->retries};
    kb_client_t *c = kb_client_new(g->endpoint, &opts);
    if (!c)
        fprintf(stderr, "kbctl: cannot open a connection to %s\n", g->endpoint);
    return c;
}

/* Prints a failed call's error and returns the exit status for it. */
static int s_fail(const char *verb, const kb_client_t *c, int rc)
{
    fprintf(stderr, "kbctl %s: %s\n", verb, kb_client_last_error(c));
    return rc == KB_CLIENT_EINVAL ? S_EXIT_USAGE : S_EXIT_SERVER;
}

/* Finds table `name` in the server's list and returns its dimension in *dim. Exit status. */
static int s_table_dim(const char *verb, kb_client_t *c, const char *name, uint32_t *dim)
{
    Carls__Response *resp = NULL;
    int rc = kb_client_list_tables(c, &resp);
    if (rc != 0)
        return s_fail(verb, c, rc);
    int status = S_EXIT_SERVER;
    for (size_t i = 0; i < resp->table_list->n_tables; i++) {
        const Carls__TableInfo *t = resp->table_list->tables[i];
        if (t->name && strcmp(t->name, name) == 0) {
            *dim = t->config ? t->config->dim : 0;
            status = S_EXIT_OK;
            break;
        }
    }
    carls__response__free_unpacked(resp, NULL);
    if (status != S_EXIT_OK) {
        fprintf(stderr, "kbctl %s: no table named \"%s\" on the server\n", verb, name);
    } else if (*dim == 0) {
        fprintf(stderr, "kbctl %s: table \"%s\" has no dimension (not an embedding table)\n", verb, name);
        status = S_EXIT_USAGE;
    }
    return status;
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
    fprintf(stderr, "kbctl: no server given: use --kb ENDPOINT (e.g. tcp://127.0.0.1:7000) or set CARLS_KB\n");
    return -1;
}

/* ---- verbs ------------------------------------------------------------------------------------------- */

static int s_create_table(const s_verb_t *verb, const s_global_t *g, int argc, char **argv)
{
    enum {
        O_DIM, O_OPT, O_LR, O_MOMENTUM, O_BETA1, O_BETA2, O_EPS, O_ACC, O_UPDATE, O_MAX_AGE, O_MAX_PENDING,
        O_OUT_THR, O_OUT_RULE, O_OUT_MIN, O_INIT, O_INIT_SCALE, O_SEED, O_IF_NOT_EXISTS, O_N
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
    if (!opts[O_DIM].value) {
        fprintf(stderr, "kbctl %s: --dim is required\n", v);
        return S_EXIT_USAGE;
    }

    Carls__OptimizerConfig opt = CARLS__OPTIMIZER_CONFIG__INIT;
    Carls__LazyUpdateConfig lazy = CARLS__LAZY_UPDATE_CONFIG__INIT;
    Carls__TableConfig cfg = CARLS__TABLE_CONFIG__INIT;
    cfg.kind = CARLS__TABLE_KIND__TABLE_EMBEDDING;
    cfg.optimizer = &opt;
    cfg.lazy = &lazy;
    uint64_t u;
    int e;
    if (s_opt_u64(v, "dim", opts[O_DIM].value, 1, UINT32_MAX, &u) != 0)
        return S_EXIT_USAGE;
    cfg.dim = (uint32_t)u;
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
    if (opts[O_MAX_AGE].value) {
        if (s_opt_u64(v, "max-age-ms", opts[O_MAX_AGE].value, 1, UINT32_MAX, &u) != 0)
            return S_EXIT_USAGE;
        lazy.max_age_ms = (uint32_t)u;
    }
    if (opts[O_MAX_PENDING].value) {
        if (s_opt_u64(v, "max-pending", opts[O_MAX_PENDING].value, 1, CARLS_MAX_PENDING_LIMIT, &u) != 0)
            return S_EXIT_USAGE;
        lazy.max_pending = (uint32_t)u;
    }
    if (opts[O_OUT_MIN].value) {
        if (s_opt_u64(v, "outlier-min-count", opts[O_OUT_MIN].value, 1, UINT32_MAX, &u) != 0)
            return S_EXIT_USAGE;
        lazy.outlier_min_count = (uint32_t)u;
    }
    if (opts[O_SEED].value) {
        if (s_opt_u64(v, "seed", opts[O_SEED].value, 0, UINT64_MAX, &u) != 0)
            return S_EXIT_USAGE;
        cfg.init_seed = u;
    }
    if (s_need_endpoint(g) != 0)
        return S_EXIT_USAGE;

    kb_client_t *c = s_connect(g);
    if (!c)
        return S_EXIT_SERVER;
    bool if_not_exists = opts[O_IF_NOT_EXISTS].value != NULL;
    int rc = kb_client_create_table(c, name, &cfg, if_not_exists);
    if (rc == 0)
        fprintf(stderr, "%s table %s (dim %u, %s, %s)\n", if_not_exists ? "created or found" : "created", name,
                cfg.dim, s_name_of(s_optimizers, opt.kind), s_name_of(s_updates, lazy.policy));
    st = rc == 0 ? S_EXIT_OK : s_fail(v, c, rc);
    kb_client_destroy(&c);
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
    kb_client_t *c = s_connect(g);
    if (!c)
        return S_EXIT_SERVER;
    int rc = kb_client_drop_table(c, pos[0], opts[0].value != NULL);
    if (rc == 0)
        fprintf(stderr, "dropped table %s\n", pos[0]);
    st = rc == 0 ? S_EXIT_OK : s_fail(verb->name, c, rc);
    kb_client_destroy(&c);
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
    kb_client_t *c = s_connect(g);
    if (!c)
        return S_EXIT_SERVER;
    Carls__Response *resp = NULL;
    int rc = kb_client_list_tables(c, &resp);
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
    kb_client_destroy(&c);
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
    kb_client_t *c = s_connect(g);
    if (!c)
        return S_EXIT_SERVER;
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
        int rc = gradients ? kb_client_push_gradients(c, table, keys, k, dim, vals)
                           : kb_client_put(c, table, keys, k, dim, vals, version);
        if (rc != 0) {
            fprintf(stderr, "kbctl %s: rows %zu..%zu: %s (%zu of %zu rows were sent before)\n", v, done + 1,
                    done + k, kb_client_last_error(c), done, rows->n);
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
    kb_client_destroy(&c);
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
    kb_rows_t *keyset = kb_rows_new(0);
    kb_key_t *keys = NULL;
    float *values = NULL;
    kb_row_meta_t *metas = NULL;
    kb_client_t *c = NULL;
    char err[256];
    if (n_pos > 1) {
        for (int i = 1; i < n_pos; i++) {
            if (kb_rows_parse_key_line(keyset, pos[i], strlen(pos[i]), err, sizeof err) != 0) {
                fprintf(stderr, "kbctl %s: key argument %d: %s\n", v, i, err);
                st = S_EXIT_USAGE;
                goto cleanup;
            }
        }
    } else if (kb_rows_read(keyset, stdin, stderr, S_MAX_REPORTED_LINES, NULL) != 0) {
        fprintf(stderr, "kbctl %s: invalid keys on stdin; nothing was sent\n", v);
        st = S_EXIT_USAGE;
        goto cleanup;
    }
    if (s_need_endpoint(g) != 0) {
        st = S_EXIT_USAGE;
        goto cleanup;
    }
    c = s_connect(g);
    if (!c) {
        st = S_EXIT_SERVER;
        goto cleanup;
    }
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
        int rc = kb_client_lookup_ex(c, table, keys, k, dim, no_create, values, metas);
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
    kb_client_destroy(&c);
    return st;
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
    kb_client_t *c = s_connect(g);
    if (!c)
        return S_EXIT_SERVER;
    Carls__Response *resp = NULL;
    int rc = kb_client_stats(c, table, &resp);
    if (rc != 0) {
        st = s_fail(verb->name, c, rc);
        kb_client_destroy(&c);
        return st;
    }
    const Carls__StatsResult *s = resp->stats;
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
    }
    carls__response__free_unpacked(resp, NULL);
    kb_client_destroy(&c);
    return S_EXIT_OK;
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
    kb_client_t *c = s_connect(g);
    if (!c)
        return S_EXIT_SERVER;
    /* The blocking helper drops the result; kbctl shows it, so it makes the call itself. */
    Carls__Checkpoint op = CARLS__CHECKPOINT__INIT;
    Carls__Request req = CARLS__REQUEST__INIT;
    req.op_case = CARLS__REQUEST__OP_CHECKPOINT;
    req.checkpoint = &op;
    Carls__Response *resp = NULL;
    int rc = kb_client_call(c, &req, &resp);
    if (rc == 0 && resp->result_case != CARLS__RESPONSE__RESULT_CHECKPOINT) {
        fprintf(stderr, "kbctl %s: the answer carries no checkpoint result\n", verb->name);
        st = S_EXIT_SERVER;
    } else if (rc != 0) {
        st = s_fail(verb->name, c, rc);
    } else {
        printf("committed_epoch: %llu\nrows: %llu\n", (unsigned long long)resp->checkpoint->committed_epoch,
               (unsigned long long)resp->checkpoint->rows);
        st = S_EXIT_OK;
    }
    if (resp)
        carls__response__free_unpacked(resp, NULL);
    kb_client_destroy(&c);
    return st;
}

static const s_verb_t s_verbs[] = {
    {"create-table",
     "usage: kbctl create-table NAME --dim D [options]\n"
     "Creates an embedding table. Options left out take the server's defaults.\n"
     "  --dim D                      values per row (required)\n"
     "  --optimizer sgd|momentum|adagrad|adam\n"
     "  --lr X  --momentum X  --beta1 X  --beta2 X  --epsilon X  --initial-accumulator X\n"
     "  --update lazy|immediate      apply pushed gradients lazily (averaged) or one by one\n"
     "  --max-age-ms N  --max-pending N (1..1024)\n"
     "  --outlier-rule norm-median|none  --outlier-threshold X  --outlier-min-count N\n"
     "  --init zeros|uniform|normal  --init-scale X  --seed N\n"
     "  --if-not-exists              succeed without change when the table exists\n",
     s_create_table},
    {"list-tables",
     "usage: kbctl list-tables\n"
     "One line per table, tab-separated: name, dim, rows, optimizer, update policy.\n",
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
    {"stats",
     "usage: kbctl stats [TABLE]\n"
     "Prints server-wide counters, latency percentiles per operation, then one block per table (or only\n"
     "TABLE): \"key: value\" lines, blocks separated by a blank line.\n",
     s_stats},
    {"checkpoint",
     "usage: kbctl checkpoint\n"
     "Asks the server to commit everything and checkpoint its database; prints committed_epoch and rows.\n",
     s_checkpoint},
};
#define S_N_VERBS (sizeof s_verbs / sizeof s_verbs[0])

static void s_usage(FILE *out)
{
    fprintf(out,
            "usage: kbctl [--kb ENDPOINT] [--timeout-ms N] [--retries N] [--log-level L] VERB [ARGS...]\n"
            "Command-line client of kb-server. Results go to stdout, errors and summaries to stderr.\n"
            "\n"
            "Global options (before the verb):\n"
            "  --kb ENDPOINT     server, e.g. tcp://127.0.0.1:7000 (default: $CARLS_KB)\n"
            "  --timeout-ms N    wait per attempt (default %d)\n"
            "  --retries N       reconnect and resend this many times after a timeout (default %d)\n"
            "  --log-level L     debug, info, warn, error or off (default warn, or $CARLS_LOG_LEVEL)\n"
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
    s_global_t g = {getenv("CARLS_KB"), S_DEFAULT_TIMEOUT_MS, S_DEFAULT_RETRIES};

    int i = 1;
    for (; i < argc && argv[i][0] == '-'; i++) {
        const char *arg = argv[i];
        if (strcmp(arg, "--help") == 0 || strcmp(arg, "-h") == 0) {
            s_usage(stdout);
            return S_EXIT_OK;
        }
        const char *eq = strchr(arg, '=');
        size_t name_len = eq ? (size_t)(eq - arg) : strlen(arg);
        const char *names[] = {"--kb", "--timeout-ms", "--retries", "--log-level"};
        int which = -1;
        for (int j = 0; j < 4; j++)
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
