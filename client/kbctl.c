/* kbctl: command-line client of kb-server for people and scripts.
 *
 *   kbctl [--kb ENDPOINT[,ENDPOINT...]] [--timeout-ms N] [--retries N] [--log-level L]
 *         [--curve-key FILE --curve-server-key FILE] [--read-replica-ms N] VERB [ARGS...]
 *
 * Every verb goes through kb_cluster (client/kb_cluster.h): with one endpoint it talks to that server, with
 * a list "tcp://a:1,tcp://b:2" the i-th endpoint is shard i and keys are routed by carls_shard_of.
 *
 * Text in, text out: rows are "KEY<TAB>v1 v2 ..." lines and feature records "KEY<TAB>label=... ..." lines
 * (formats in kb_rows_text.h), listings are tab-separated, results go to stdout and everything else (errors,
 * summaries, logs) to stderr.
 * Exit status: 0 success, 1 usage or input error (nothing was sent for bad input), 2 server or connection
 * error (timeout, error status, undecodable answer).
 *
 * This file is the command line: global options, a verb's options and arguments, --help, main. The verbs
 * themselves are in kbctl_admin.c, kbctl_rows.c and kbctl_replica.c (kbctl_verb.h). */
#include "kbctl_verb.h"

#include "kb_cluster.h"
#include "kb_curve_args.h"
#include "log.h"
#include "protocol.h"
#include "util.h"

#include <assert.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define S_DEFAULT_TIMEOUT_MS 5000
#define S_DEFAULT_RETRIES 2

/* The global options (before the verb), in the order of their G_* index. */
enum { G_KB, G_TIMEOUT_MS, G_RETRIES, G_LOG_LEVEL, G_CURVE_KEY, G_CURVE_SERVER_KEY, G_READ_REPLICA_MS, G_N };
static const char *const s_global_options[G_N] = {"kb",           "timeout-ms",           "retries",
                                                  "log-level",    KB_CURVE_ARG_KEY,       KB_CURVE_ARG_SERVER_KEY,
                                                  "read-replica-ms"};

/* ---- command-line parsing ---------------------------------------------------------------------------- */

static bool s_is_global_option(const char *name)
{
    for (size_t i = 0; i < G_N; i++)
        if (strcmp(name, s_global_options[i]) == 0)
            return true;
    return false;
}

/* The option of opts (n of them) named by the name_len bytes at name, or -1. */
static int s_find_option(const kbctl_opt_t *opts, size_t n, const char *name, size_t name_len)
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
static int s_parse_args(kbctl_call_t *call, int argc, char **argv)
{
    const char *verb = call->name;
    const kbctl_opt_t *opts = call->verb->opts;
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

static int s_check_table_name(const char *verb, const char *name)
{
    if (carls_table_name_valid(name))
        return 0;
    fprintf(stderr, "kbctl %s: invalid table name \"%s\" (1..%u characters of A-Z a-z 0-9 _ . -)\n", verb, name,
            CARLS_MAX_TABLE_NAME_BYTES);
    return -1;
}

/* ---- the verbs, and main ----------------------------------------------------------------------------- */

static const kbctl_verb_t *const s_verbs[] = {
    &kbctl_verb_create_table,
    &kbctl_verb_list_tables,
    &kbctl_verb_drop_table,
    &kbctl_verb_put,
    &kbctl_verb_push_grad,
    &kbctl_verb_get,
    &kbctl_verb_knn,
    &kbctl_verb_sample,
    &kbctl_verb_put_feature,
    &kbctl_verb_get_feature,
    &kbctl_verb_export,
    &kbctl_verb_import,
    &kbctl_verb_stats,
    &kbctl_verb_checkpoint,
    &kbctl_verb_snapshot,
    &kbctl_verb_snapshots,
    &kbctl_verb_snapshot_delete,
    &kbctl_verb_replica,
};
#define S_N_VERBS (sizeof s_verbs / sizeof s_verbs[0])

static void s_usage(FILE *out)
{
    fprintf(out,
            "usage: kbctl [--kb ENDPOINT[,ENDPOINT...]] [--timeout-ms N] [--retries N] [--log-level L]\n"
            "             [--curve-key FILE --curve-server-key FILE] [--read-replica-ms N] VERB [ARGS...]\n"
            "Command-line client of kb-server. Results go to stdout, errors and summaries to stderr.\n"
            "\n"
            "Global options (before the verb):\n"
            "  --kb ENDPOINTS    server, e.g. tcp://127.0.0.1:7000, or the shards of a sharded bank in shard\n"
            "                    order: tcp://h:7000,tcp://h:7001 (kb-server --shard 0/2, 1/2) (default: $CARLS_KB);\n"
            "                    a replicated shard's members joined by '|': tcp://a:7000|tcp://b:7000\n"
            "  --timeout-ms N    wait per attempt (default %d)\n"
            "  --retries N       reconnect and resend this many times after a timeout (default %d)\n"
            "  --log-level L     debug, info, warn, error or off (default warn, or $CARLS_LOG_LEVEL)\n"
            KB_CURVE_ARGS_HELP
            "                    (docs/SECURITY.md)\n"
            "  --read-replica-ms N  reads of a replicated shard (get --no-create, knn, sample, scan, feature\n"
            "                    reads, list-tables) go to a follower that was caught up with its primary at\n"
            "                    most N ms ago, else to the primary (docs/REPLICATION.md section 5; default 0:\n"
            "                    every request to the shard's primary)\n"
            "  --help            this text; `kbctl VERB --help` describes a verb\n"
            "\n"
            "Verbs:\n",
            S_DEFAULT_TIMEOUT_MS, S_DEFAULT_RETRIES);
    for (size_t i = 0; i < S_N_VERBS; i++) {
        const char *u = s_verbs[i]->usage + strlen("usage: ");
        const char *nl = strchr(u, '\n');
        fprintf(out, "  %.*s\n", (int)(nl - u), u);
    }
    fprintf(out, "\nExit status: 0 success, 1 usage or input error (nothing sent), 2 server or connection error.\n");
}

/* Parses the call's command line as its verb declares it: options, --help, the number of positional
 * arguments and a table name. Returns -1 to go on, or the exit status to return now. */
static int s_parse_call(kbctl_call_t *call, int argc, char **argv)
{
    const kbctl_verb_t *verb = call->verb;
    int p = s_parse_args(call, argc, argv);
    if (p == S_PARSE_HELP) {
        fputs(verb->usage, stdout);
        return KBCTL_EXIT_OK;
    }
    if (p == S_PARSE_ERROR)
        return KBCTL_EXIT_USAGE;
    if (call->n_pos < verb->min_pos || (verb->max_pos >= 0 && call->n_pos > verb->max_pos)) {
        fprintf(stderr, "kbctl %s: wrong number of arguments\n", verb->name);
        fputs(verb->usage, stderr);
        return KBCTL_EXIT_USAGE;
    }
    if (verb->table_arg && call->n_pos > 0 && s_check_table_name(verb->name, call->pos[0]) != 0)
        return KBCTL_EXIT_USAGE;
    return -1;
}

/* Runs a verb (argv[0] is its name): parses its command line, runs it, and closes the connection it opened.
 * Returns the exit status. */
static int s_run_verb(const kbctl_verb_t *verb, const kbctl_global_t *g, int argc, char **argv)
{
    assert(verb->n_opts <= KBCTL_MAX_VERB_OPTS);
    kbctl_call_t call = {.verb = verb, .name = verb->name, .g = g, .pos = carls_xcalloc((size_t)argc, sizeof(char *))};
    int st = s_parse_call(&call, argc, argv);
    if (st < 0)
        st = verb->run(&call);
    kb_cluster_destroy(&call.c);
    free(call.pos);
    return st;
}

/* Sets global option `which` to value. 0, or -1 after printing why. */
static int s_set_global(kbctl_global_t *g, int which, const char *value)
{
    uint64_t u;
    carls_log_level_t level;
    switch (which) {
    case G_KB:
        g->endpoint = value;
        return 0;
    case G_TIMEOUT_MS:
        if (kbctl_opt_u64("", "timeout-ms", value, 1, 24u * 3600 * 1000, &u) != 0)
            return -1;
        g->timeout_ms = (int)u;
        return 0;
    case G_RETRIES:
        if (kbctl_opt_u64("", "retries", value, 0, 1000, &u) != 0)
            return -1;
        g->retries = (int)u;
        return 0;
    case G_CURVE_KEY:
        g->curve.key_file = value;
        return 0;
    case G_CURVE_SERVER_KEY:
        g->curve.server_key_file = value;
        return 0;
    case G_READ_REPLICA_MS:
        if (kbctl_opt_u64("", "read-replica-ms", value, 0, 24u * 3600 * 1000, &u) != 0)
            return -1;
        g->read_replica_ms = (uint32_t)u;
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
static int s_parse_globals(int argc, char **argv, kbctl_global_t *g, int *verb_at)
{
    int i = 1;
    for (; i < argc && argv[i][0] == '-'; i++) {
        const char *arg = argv[i];
        if (strcmp(arg, "--help") == 0 || strcmp(arg, "-h") == 0) {
            s_usage(stdout);
            return KBCTL_EXIT_OK;
        }
        const char *eq = strchr(arg, '=');
        size_t name_len = eq ? (size_t)(eq - arg) : strlen(arg);
        int which = -1;
        for (int j = 0; j < G_N && arg[1] == '-'; j++)
            if (strlen(s_global_options[j]) == name_len - 2 && strncmp(arg + 2, s_global_options[j], name_len - 2) == 0)
                which = j;
        if (which < 0) {
            fprintf(stderr, "kbctl: unknown option %s (see kbctl --help)\n", arg);
            return KBCTL_EXIT_USAGE;
        }
        const char *value = eq ? eq + 1 : (i + 1 < argc ? argv[++i] : NULL);
        if (!value) {
            fprintf(stderr, "kbctl: --%s needs a value\n", s_global_options[which]);
            return KBCTL_EXIT_USAGE;
        }
        if (s_set_global(g, which, value) != 0)
            return KBCTL_EXIT_USAGE;
    }
    if (i == argc) {
        s_usage(stderr);
        return KBCTL_EXIT_USAGE;
    }
    if (kb_curve_args_check(&g->curve, "kbctl") != 0)
        return KBCTL_EXIT_USAGE;
    *verb_at = i;
    return -1;
}

int main(int argc, char **argv)
{
    carls_log_set_level(CARLS_LOG_WARN);
    carls_log_init_from_env();
    kbctl_global_t g = {getenv("CARLS_KB"), S_DEFAULT_TIMEOUT_MS, S_DEFAULT_RETRIES, {0}, 0};
    kb_curve_args(&g.curve);
    int i;
    int st = s_parse_globals(argc, argv, &g, &i);
    if (st >= 0)
        return st;
    const kbctl_verb_t *verb = NULL;
    for (size_t j = 0; j < S_N_VERBS; j++)
        if (strcmp(argv[i], s_verbs[j]->name) == 0)
            verb = s_verbs[j];
    if (!verb) {
        fprintf(stderr, "kbctl: unknown verb \"%s\" (see kbctl --help)\n", argv[i]);
        return KBCTL_EXIT_USAGE;
    }
    st = s_run_verb(verb, &g, argc - i, argv + i);
    /* A result that did not reach stdout (full disk, closed pipe) is a failure too. */
    if (fflush(stdout) != 0 || ferror(stdout)) {
        fprintf(stderr, "kbctl %s: cannot write the output\n", verb->name);
        if (st == KBCTL_EXIT_OK)
            st = KBCTL_EXIT_USAGE;
    }
    return st;
}
