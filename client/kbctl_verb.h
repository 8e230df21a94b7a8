/* kbctl's verbs: what a verb is (its help, options, positional arguments and run function), one run of it
 * (kbctl_call_t), and what the verbs share: option values, the connection to the bank, the message and exit
 * status of a failed call. kbctl.c parses the command line and runs the verb; the verbs live in
 * kbctl_admin.c (tables, stats, checkpoint, snapshots), kbctl_rows.c (rows, features, knn, sample,
 * export and import) and kbctl_replica.c (a member of a replicated shard).
 *
 * Each verb comes as its help text (what `kbctl VERB --help` prints), the options it accepts (an enum naming
 * their indices in kbctl_call_t.opt), the function that runs it, and a kbctl_verb_t naming them, declared
 * below; s_verbs in kbctl.c lists them in the order of `kbctl --help`. */
#ifndef KBCTL_VERB_H
#define KBCTL_VERB_H

#include "kb_cluster.h"
#include "kb_curve_args.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

enum {
    KBCTL_EXIT_OK = 0,
    KBCTL_EXIT_USAGE = 1,  /* bad command line or bad input: nothing was sent */
    KBCTL_EXIT_SERVER = 2, /* the server answered with an error, or could not be reached */
};

/* What the global options say. */
typedef struct {
    const char *endpoint;         /* --kb, else $CARLS_KB; NULL if neither. One endpoint or a list */
    int timeout_ms;               /* per attempt */
    int retries;                  /* extra attempts after a timeout */
    kb_curve_args_t curve;        /* --curve-key, --curve-server-key (kb_curve_args.h; set by s_set_global) */
    uint32_t read_replica_ms;     /* --read-replica-ms: reads from followers within this bound (0: off) */
} kbctl_global_t;

/* One option a verb accepts. */
typedef struct {
    const char *name; /* without the leading "--" */
    bool takes_value;
} kbctl_opt_t;

#define KBCTL_MAX_VERB_OPTS 32 /* options one verb may declare (create-table has the most) */

typedef struct kbctl_verb kbctl_verb_t;

/* One run of a verb: its command line once parsed, and the connection it opened. */
typedef struct {
    const kbctl_verb_t *verb;
    const char *name;                 /* the verb's name, for messages */
    const kbctl_global_t *g;
    const char *opt[KBCTL_MAX_VERB_OPTS]; /* opt[i]: the value of the verb's option i, "" for a flag that was
                                           * given, NULL when absent */
    char **pos;                       /* the positional arguments, n_pos of them */
    int n_pos;
    kb_cluster_t *c;                  /* opened by kbctl_open; s_run_verb closes it after the verb */
} kbctl_call_t;

/* A verb: what its command line looks like (s_run_verb parses and checks it), its help, and what it does. */
struct kbctl_verb {
    const char *name;
    const char *usage;          /* shown by `kbctl VERB --help`: synopsis, then what it does */
    const kbctl_opt_t *opts;    /* the options it accepts, n_opts of them; option i's value is opt[i] */
    size_t n_opts;
    int min_pos, max_pos;       /* how many positional arguments it takes; max_pos -1: any number */
    bool table_arg;             /* its first positional argument, when given, is a table name */
    int (*run)(kbctl_call_t *call); /* returns the exit status */
};

#define KBCTL_COUNT(array) (sizeof array / sizeof array[0])

/* On the command line and in listings a proto enum value goes by its name in carls.proto without the
 * prefix, in lower case with '-' for '_': OPT_SGD is "sgd", OUTLIER_NORM_MEDIAN "norm-median",
 * SAMPLE_LOG_UNIFORM "log-uniform" (carls_enum_name, proto/protocol.h). */
typedef ProtobufCEnumDescriptor kbctl_enum_t;

/* ---- option values ---------------------------------------------------------------------------------- */

/* Parses an option value as an integer in [lo, hi]. 0, or -1 after printing why. verb "" for global
 * options. */
int kbctl_opt_u64(const char *verb, const char *opt, const char *text, uint64_t lo, uint64_t hi, uint64_t *out);

/* Parses the call's whole-number option i into *out, which keeps its default when the option is absent. 0,
 * or -1 after printing why. */
int kbctl_opt_count(const kbctl_call_t *call, int i, uint64_t lo, uint64_t hi, uint64_t *out);

/* Parses the call's option i, one of names, into *out, which keeps its default when the option is absent. 0,
 * or -1 after printing why. */
int kbctl_opt_choice(const kbctl_call_t *call, int i, const kbctl_enum_t *names, int *out);

/* ---- talking to the server -------------------------------------------------------------------------- */

/* Opens the connection to the bank (one endpoint or the list of shards) into call->c. Exit status: usage for
 * no endpoint or unreadable key files, server when no connection could be opened. */
int kbctl_open(kbctl_call_t *call);

/* Prints a failed call's error and returns the exit status for it. */
int kbctl_fail(const kbctl_call_t *call, int rc);

/* A whole-bank call that names one thing (the first positional argument) and reports a failure as text:
 * kb_cluster_snapshot, kb_cluster_snapshot_delete. */
typedef int (*kbctl_named_fn)(kb_cluster_t *c, const char *name, char *err, size_t errlen);

/* Opens the connection and runs fn on call->pos[0]; a failure prints "kbctl VERB: why". Exit status (a failed
 * call is the server's). */
int kbctl_open_and_run_named(kbctl_call_t *call, kbctl_named_fn fn);

/* ---- the verbs -------------------------------------------------------------------------------------- */

/* kbctl_admin.c */
extern const kbctl_verb_t kbctl_verb_create_table, kbctl_verb_list_tables, kbctl_verb_drop_table, kbctl_verb_stats,
    kbctl_verb_checkpoint, kbctl_verb_snapshot, kbctl_verb_snapshots, kbctl_verb_snapshot_delete;
/* kbctl_rows.c */
extern const kbctl_verb_t kbctl_verb_put, kbctl_verb_push_grad, kbctl_verb_get, kbctl_verb_knn, kbctl_verb_sample,
    kbctl_verb_put_feature, kbctl_verb_get_feature, kbctl_verb_export, kbctl_verb_import;
/* kbctl_replica.c */
extern const kbctl_verb_t kbctl_verb_replica;

#endif
