/* kbctl's verbs share these: option values (whole numbers, wire enum names) and the connection to the bank
 * with the message and exit status of a failed call (kbctl_verb.h). */
#include "kbctl_verb.h"

#include "kb_curve_args.h"
#include "protocol.h"
#include "util.h"

#include <stdio.h>
#include <string.h>

/* Parses an option value as an integer in [lo, hi]. 0, or -1 after printing why. verb "" for global
 * options. */
int kbctl_opt_u64(const char *verb, const char *opt, const char *text, uint64_t lo, uint64_t hi, uint64_t *out)
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

static int s_opt_name(const char *verb, const char *opt, const kbctl_enum_t *names, const char *text, int *out)
{
    if (carls_enum_parse(names, text, out) == 0)
        return 0;
    fprintf(stderr, "kbctl %s: --%s: unknown value \"%s\"; one of:", verb, opt, text);
    for (unsigned i = 0; i < names->n_values; i++)
        fprintf(stderr, " %s", carls_enum_name(&names->values[i]).text);
    fputc('\n', stderr);
    return -1;
}

/* Parses the call's whole-number option i into *out, which keeps its default when the option is absent. 0,
 * or -1 after printing why. */
int kbctl_opt_count(const kbctl_call_t *call, int i, uint64_t lo, uint64_t hi, uint64_t *out)
{
    const char *text = call->opt[i];
    return text ? kbctl_opt_u64(call->name, call->verb->opts[i].name, text, lo, hi, out) : 0;
}

/* Parses the call's option i, one of names, into *out, which keeps its default when the option is absent. 0,
 * or -1 after printing why. */
int kbctl_opt_choice(const kbctl_call_t *call, int i, const kbctl_enum_t *names, int *out)
{
    const char *text = call->opt[i];
    return text ? s_opt_name(call->name, call->verb->opts[i].name, names, text, out) : 0;
}

/* ---- talking to the server --------------------------------------------------------------------------- */

/* Opens the connection to the bank (one endpoint or the list of shards) into call->c. Exit status: usage for
 * no endpoint or unreadable key files, server when no connection could be opened. */
int kbctl_open(kbctl_call_t *call)
{
    const kbctl_global_t *g = call->g;
    if (!g->endpoint || !*g->endpoint) {
        fprintf(stderr, "kbctl: no server given: use --kb ENDPOINT (e.g. tcp://127.0.0.1:7000, or a comma-separated "
                        "list of shards) or set CARLS_KB\n");
        return KBCTL_EXIT_USAGE;
    }
    kb_client_curve_t keys;
    kb_client_options_t opts = {.timeout_ms = g->timeout_ms, .retries = g->retries};
    if (kb_curve_args_options(&g->curve, "kbctl", &keys, &opts) != 0)
        return KBCTL_EXIT_USAGE;
    call->c = kb_cluster_new(g->endpoint, &opts);
    explicit_bzero(&keys, sizeof keys);
    if (!call->c) {
        fprintf(stderr, "kbctl: cannot open a connection to %s\n", g->endpoint);
        return KBCTL_EXIT_SERVER;
    }
    if (g->read_replica_ms)
        kb_cluster_set_read_replicas(call->c, g->read_replica_ms); /* cannot fail on a kb_cluster_new cluster */
    return KBCTL_EXIT_OK;
}

/* Prints a failed call's error and returns the exit status for it. */
int kbctl_fail(const kbctl_call_t *call, int rc)
{
    fprintf(stderr, "kbctl %s: %s\n", call->name, kb_cluster_last_error(call->c));
    return rc == KB_CLIENT_EINVAL ? KBCTL_EXIT_USAGE : KBCTL_EXIT_SERVER;
}

/* Opens the connection and runs fn on call->pos[0]; a failure prints "kbctl VERB: why". Exit status (a failed
 * call is the server's). */
int kbctl_open_and_run_named(kbctl_call_t *call, kbctl_named_fn fn)
{
    int st = kbctl_open(call);
    if (st != KBCTL_EXIT_OK)
        return st;
    char err[1024];
    if (fn(call->c, call->pos[0], err, sizeof err) != 0) {
        fprintf(stderr, "kbctl %s: %s\n", call->name, err);
        return KBCTL_EXIT_SERVER;
    }
    return KBCTL_EXIT_OK;
}
