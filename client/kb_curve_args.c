/* The shared CURVE key options (see kb_curve_args.h). */
#include "kb_curve_args.h"

#include <assert.h>
#include <stdio.h>
#include <string.h>

void kb_curve_args(kb_curve_args_t *g)
{
    assert(g);
    g->key_file = NULL;
    g->server_key_file = NULL;
    g->rows[0] = carls_arg_string(KB_CURVE_ARG_KEY, &g->key_file);
    g->rows[1] = carls_arg_string(KB_CURVE_ARG_SERVER_KEY, &g->server_key_file);
    g->rows[2] = (carls_arg_t){0};
}

int kb_curve_args_check(const kb_curve_args_t *g, const char *prog)
{
    assert(g && prog);
    if (!g->key_file != !g->server_key_file) {
        fprintf(stderr, "%s: --%s and --%s go together\n", prog, KB_CURVE_ARG_KEY, KB_CURVE_ARG_SERVER_KEY);
        return -1;
    }
    return 0;
}

int kb_curve_args_options(const kb_curve_args_t *g, const char *prog, kb_client_curve_t *keys,
                          kb_client_options_t *opts)
{
    assert(g && prog && keys && opts);
    opts->curve = NULL;
    if (!g->key_file && !g->server_key_file)
        return 0;
    if (kb_curve_args_check(g, prog) != 0)
        return -1;
    char err[512];
    if (kb_client_curve_load(g->key_file, g->server_key_file, keys, err, sizeof err) != 0) {
        fprintf(stderr, "%s: CURVE keys (--%s %s, --%s %s): %s\n", prog, KB_CURVE_ARG_KEY, g->key_file,
                KB_CURVE_ARG_SERVER_KEY, g->server_key_file, err);
        return -1;
    }
    opts->curve = keys;
    return 0;
}
