/* The CURVE key options of every client program (kbctl, trainer, kb-maker; docs/SECURITY.md), written once:
 *
 *   --curve-key FILE         this client's secret key file (kb-keygen NAME.key)
 *   --curve-server-key FILE  the bank's public key file (server.pub); every shard of a bank has the same key
 *
 * Both or neither: with neither the client speaks plain TCP. Programs that parse with carls_args add the rows
 * with carls_arg_group(g.rows) and their usage text with KB_CURVE_ARGS_HELP; kbctl, which parses its global
 * options itself, uses the option names below and the same loader. */
#ifndef KB_CURVE_ARGS_H
#define KB_CURVE_ARGS_H

#include "kb_client.h"

#include "carls_args.h"

#define KB_CURVE_ARG_KEY "curve-key"
#define KB_CURVE_ARG_SERVER_KEY "curve-server-key"

/* Usage lines for the two options (26-column layout, as the trainer's and kb-maker's). */
#define KB_CURVE_ARGS_HELP                                                                                          \
    "  --curve-key FILE         encrypt with CURVE: this client's secret key file (kb-keygen NAME.key) ...\n"     \
    "  --curve-server-key FILE  ... and the bank's public key file (server.pub); both or neither\n"

typedef struct {
    const char *key_file;        /* --curve-key, or NULL */
    const char *server_key_file; /* --curve-server-key, or NULL */
    carls_arg_t rows[3];         /* the two rows and the {0} end, pointing at the fields above */
} kb_curve_args_t;

/* Clears g's files and fills its rows (g must stay where it is while the rows are parsed). */
void kb_curve_args(kb_curve_args_t *g);

/* After parsing, before anything is loaded or started: 0 when both options or neither were given, else
 * "PROG: --curve-key and --curve-server-key go together" on stderr and -1 (a usage error). */
int kb_curve_args_check(const kb_curve_args_t *g, const char *prog);

/* When connecting: with neither option sets opts->curve = NULL and returns 0. With both, loads the keys into
 * *keys, sets opts->curve = keys and returns 0 (the caller wipes *keys with explicit_bzero when it is done
 * with them; kb_client_new copies them). With only one of the two, or a key file that does not load, prints
 * "PROG: ..." (naming the option and the file) on stderr and returns -1. */
int kb_curve_args_options(const kb_curve_args_t *g, const char *prog, kb_client_curve_t *keys,
                          kb_client_options_t *opts);

#endif
