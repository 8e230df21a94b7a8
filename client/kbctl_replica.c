/* kbctl's verb for replicated shards (docs/REPLICATION.md): `kbctl replica status|promote|fence|set`, the
 * replica operation (carls.proto op 25, answered by ReplicaResult) sent to the one member of a shard that
 * --kb names (kbctl_verb.h). */
#include "kbctl_verb.h"

#include "kb_cluster.h"
#include "kb_json.h"
#include "protocol.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char s_replica_usage[] =
    "usage: kbctl replica status|promote|fence|set [--term T] [--min-replicas K] [--json]\n"
    "Asks one member of a replicated shard (--kb names it: one endpoint, not a list) about its replication,\n"
    "or changes it (docs/REPLICATION.md):\n"
    "  kbctl replica status                       its role (primary, follower, standby or deposed), term,\n"
    "                                             epochs and min replicas; a primary's replication endpoint,\n"
    "                                             its followers; a follower's primary\n"
    "  kbctl replica promote --term T [--min-replicas K]\n"
    "                                             a follower or standby becomes the primary of term T (above\n"
    "                                             its own), acknowledging writes once K followers have them\n"
    "                                             (default 0; K needs --durability sync)\n"
    "  kbctl replica fence --term T               raises its term to T (at least its own): a primary stops\n"
    "                                             accepting writes, a follower applies nothing older\n"
    "  kbctl replica set --min-replicas K         a primary acknowledges a write once K followers applied it\n"
    "                                             (0: without waiting for any)\n"
    "Each prints the member's status as it answers (after the change) to stdout: \"key: value\" lines, then\n"
    "one line per follower of a primary, \"follower: MEMBER acked_epoch=N lag_ms=N live=yes|no\"; with --json\n"
    "one JSON object instead (the ReplicaResult message, fields under their carls.proto names). A refusal\n"
    "(a term not above the member's, a promote of a primary, a server that does not replicate) prints the\n"
    "server's status and text and exits 2.\n";

enum { RP_TERM, RP_MIN_REPLICAS, RP_JSON, RP_N };
static const kbctl_opt_t s_replica_opts[RP_N] = {
    [RP_TERM] = {"term", true},
    [RP_MIN_REPLICAS] = {"min-replicas", true},
    [RP_JSON] = {"json", false},
};

/* How an action takes an option. */
typedef enum { S_NO, S_OPTIONAL, S_REQUIRED } s_takes_t;

/* The actions: the name on the command line, the wire action, which options go with it and the word stderr
 * says after it succeeded (NULL for status). */
static const struct {
    const char *name;
    Carls__ReplicaAction action;
    s_takes_t term, min_replicas;
    const char *done;
} s_actions[] = {
    {"status", CARLS__REPLICA_ACTION__REPLICA_STATUS, S_NO, S_NO, NULL},
    {"promote", CARLS__REPLICA_ACTION__REPLICA_PROMOTE, S_REQUIRED, S_OPTIONAL, "promoted"},
    {"fence", CARLS__REPLICA_ACTION__REPLICA_FENCE, S_REQUIRED, S_NO, "fenced"},
    {"set", CARLS__REPLICA_ACTION__REPLICA_SET_MIN_REPLICAS, S_NO, S_REQUIRED, "changed"},
};
#define S_N_ACTIONS KBCTL_COUNT(s_actions)

/* Checks that option o is given as the action wants it. 0, or -1 after printing why. */
static int s_check_takes(const kbctl_call_t *call, int o, s_takes_t takes, const char *goes_with)
{
    const char *opt = s_replica_opts[o].name;
    if (takes == S_REQUIRED && !call->opt[o]) {
        fprintf(stderr, "kbctl %s: --%s is required\n", call->name, opt);
        return -1;
    }
    if (takes == S_NO && call->opt[o]) {
        fprintf(stderr, "kbctl %s: --%s goes with %s\n", call->name, opt, goes_with);
        return -1;
    }
    return 0;
}

/* A text field of the answer, "-" when empty. */
static const char *s_text(const char *s) { return s && *s ? s : "-"; }

/* Prints a member's status as "key: value" lines and one line per follower. */
static void s_print_replica(const Carls__ReplicaResult *r)
{
    printf("role: %s\n", s_text(r->role));
    printf("term: %llu\n", (unsigned long long)r->term);
    printf("last_term: %llu\n", (unsigned long long)r->last_term);
    printf("committed_epoch: %llu\n", (unsigned long long)r->committed_epoch);
    printf("durable_epoch: %llu\n", (unsigned long long)r->durable_epoch);
    printf("min_replicas: %u\n", r->min_replicas);
    printf("fenced: %s\n", r->fenced ? "yes" : "no");
    printf("replication_endpoint: %s\n", s_text(r->replication_endpoint));
    printf("primary: %s\n", s_text(r->primary));
    printf("followers: %zu\n", r->n_followers);
    for (size_t i = 0; i < r->n_followers; i++) {
        const Carls__ReplicaFollower *f = r->followers[i];
        printf("follower: %s acked_epoch=%llu lag_ms=%llu live=%s\n", s_text(f->member),
               (unsigned long long)f->acked_epoch, (unsigned long long)f->lag_ms, f->live ? "yes" : "no");
    }
}

/* Builds the action's request from the options (checked first), or returns the exit status of a usage
 * error. -1 to go on. */
static int s_replica_op(const kbctl_call_t *call, size_t a, Carls__Replica *op)
{
    uint64_t term = 0, k = 0;
    if (s_check_takes(call, RP_TERM, s_actions[a].term, "promote and fence") != 0 ||
        s_check_takes(call, RP_MIN_REPLICAS, s_actions[a].min_replicas, "promote and set") != 0 ||
        kbctl_opt_count(call, RP_TERM, 1, UINT64_MAX, &term) != 0 ||
        kbctl_opt_count(call, RP_MIN_REPLICAS, 0, UINT32_MAX, &k) != 0)
        return KBCTL_EXIT_USAGE;
    const char *kb = call->g->endpoint;
    if (kb && strpbrk(kb, ",|")) {
        fprintf(stderr, "kbctl %s: --kb names one member of one shard here, not a list (\"%s\"): ask each member "
                        "on its own\n", call->name, kb);
        return KBCTL_EXIT_USAGE;
    }
    op->action = s_actions[a].action;
    op->term = term;
    op->min_replicas = (uint32_t)k;
    return -1;
}

static int s_replica(kbctl_call_t *call)
{
    size_t a = 0;
    while (a < S_N_ACTIONS && strcmp(call->pos[0], s_actions[a].name) != 0)
        a++;
    if (a == S_N_ACTIONS) {
        fprintf(stderr, "kbctl %s: unknown action \"%s\" (status, promote, fence or set; see kbctl %s --help)\n",
                call->name, call->pos[0], call->name);
        return KBCTL_EXIT_USAGE;
    }
    char name[32]; /* "replica promote": messages name the action */
    snprintf(name, sizeof name, "%s %s", call->name, s_actions[a].name);
    call->name = name;
    Carls__Replica op = CARLS__REPLICA__INIT;
    int st = s_replica_op(call, a, &op);
    if (st >= 0)
        return st;
    st = kbctl_open(call);
    if (st != KBCTL_EXIT_OK)
        return st;
    Carls__Request req = CARLS__REQUEST__INIT;
    req.op_case = CARLS__REQUEST__OP_REPLICA;
    req.replica = &op;
    Carls__Response *resp = NULL;
    int rc = kb_cluster_call(call->c, 0, &req, CARLS__RESPONSE__RESULT_REPLICA, &resp);
    if (rc != 0)
        return kbctl_fail(call, rc);
    const Carls__ReplicaResult *r = resp->replica;
    if (call->opt[RP_JSON]) {
        kb_json_t j = {0};
        kb_json_message(&j, &r->base);
        puts(j.text);
        free(j.text);
    } else {
        s_print_replica(r);
    }
    if (s_actions[a].done)
        fprintf(stderr, "%s %s: %s, term %llu, min replicas %u\n", s_actions[a].done, kb_cluster_endpoint(call->c, 0),
                s_text(r->role), (unsigned long long)r->term, r->min_replicas);
    carls__response__free_unpacked(resp, NULL);
    return KBCTL_EXIT_OK;
}

const kbctl_verb_t kbctl_verb_replica = {"replica", s_replica_usage, s_replica_opts, KBCTL_COUNT(s_replica_opts),
                                         1, 1, false, s_replica};
