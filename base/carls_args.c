/* Table-driven long options (see carls_args.h). */
#include "carls_args.h"

#include "log.h"
#include "util.h"

#include <errno.h>
#include <getopt.h>
#include <stdlib.h>
#include <string.h>

#define S_MAX_OPTIONS 128
#define S_FIRST 256

int carls_args_int_value(const char *prog, const char *name, const char *text, long lo, long hi, int *out)
{
    int64_t v;
    if (carls_parse_i64(text, &v) != 0 || v < lo || v > hi) {
        fprintf(stderr, "%s: --%s: '%s' is not an integer in %ld..%ld\n", prog, name, text, lo, hi);
        return -1;
    }
    *out = (int)v;
    return 0;
}

int carls_args_u32_value(const char *prog, const char *name, const char *text, uint32_t lo, uint32_t hi,
                         uint32_t *out)
{
    uint64_t v;
    if (carls_parse_u64(text, &v) != 0 || v < lo || v > hi) {
        fprintf(stderr, "%s: --%s: '%s' is not an integer in %u..%u\n", prog, name, text, (unsigned)lo,
                (unsigned)hi);
        return -1;
    }
    *out = (uint32_t)v;
    return 0;
}

int carls_args_double_value(const char *prog, const char *name, const char *text, double lo, double hi,
                            double *out)
{
    char *end = NULL;
    errno = 0;
    double v = strtod(text, &end);
    if (end == text || *end || errno || !(v >= lo && v <= hi)) {
        fprintf(stderr, "%s: --%s: '%s' is not a number in [%g, %g]\n", prog, name, text, lo, hi);
        return -1;
    }
    *out = v;
    return 0;
}

int carls_args_float_value(const char *prog, const char *name, const char *text, double lo, double hi, float *out)
{
    double v;
    if (carls_args_double_value(prog, name, text, lo, hi, &v) != 0) {
        return -1;
    }
    *out = (float)v;
    return 0;
}

int carls_args_choice_value(const char *prog, const char *name, const char *text, const char *const *choices, int *out)
{
    int n = 0;
    for (; choices[n]; n++) {
        if (strcmp(text, choices[n]) == 0) {
            *out = n;
            return 0;
        }
    }
    /* "'x' is not a, b or c" */
    fprintf(stderr, "%s: --%s: '%s' is not ", prog, name, text);
    for (int i = 0; i < n; i++) {
        fprintf(stderr, "%s%s", choices[i], i + 2 < n ? ", " : i + 2 == n ? " or " : "\n");
    }
    return -1;
}

int carls_args_part_value(const char *prog, const char *name, const char *text, uint32_t max_n, uint32_t *i,
                          uint32_t *n)
{
    unsigned part, parts;
    char tail;
    if (sscanf(text, "%u/%u%c", &part, &parts, &tail) != 2 || parts < 1 || parts > max_n || part >= parts) {
        fprintf(stderr, "%s: --%s: '%s' is not I/N with 0 <= I < N <= %u\n", prog, name, text, (unsigned)max_n);
        return -1;
    }
    *i = part;
    *n = parts;
    return 0;
}

/* Checks and stores one option's value. Returns 0 or -1 (reported). */
static int s_store(const char *prog, const carls_arg_t *a, const char *text)
{
    switch (a->kind) {
    case CARLS_ARG_STRING:
        *(const char **)a->out = text;
        return 0;
    case CARLS_ARG_INT:
        return carls_args_int_value(prog, a->name, text, (long)a->lo, (long)a->hi, a->out);
    case CARLS_ARG_FLOAT:
        return carls_args_float_value(prog, a->name, text, a->lo, a->hi, a->out);
    case CARLS_ARG_U32:
        return carls_args_u32_value(prog, a->name, text, (uint32_t)a->lo, (uint32_t)a->hi, a->out);
    case CARLS_ARG_DOUBLE:
        return carls_args_double_value(prog, a->name, text, a->lo, a->hi, a->out);
    case CARLS_ARG_U64:
        if (carls_parse_u64(text, a->out) != 0) {
            fprintf(stderr, "%s: --%s: '%s' is not a number\n", prog, a->name, text);
            return -1;
        }
        return 0;
    case CARLS_ARG_BOOL01: {
        int v = 0;
        if (carls_args_int_value(prog, a->name, text, 0, 1, &v) != 0) {
            return -1;
        }
        *(bool *)a->out = v == 1;
        return 0;
    }
    case CARLS_ARG_SET:
        *(bool *)a->out = true;
        return 0;
    case CARLS_ARG_CHOICE:
        return carls_args_choice_value(prog, a->name, text, a->choices, a->out);
    case CARLS_ARG_EITHER: {
        int which = 0;
        if (carls_args_choice_value(prog, a->name, text, a->choices, &which) != 0) {
            return -1;
        }
        *(bool *)a->out = which == 0;
        return 0;
    }
    case CARLS_ARG_LOG_LEVEL:
        return carls_log_level_option(prog, text);
    case CARLS_ARG_CUSTOM:
        return a->parse(prog, a->name, text, a->out);
    case CARLS_ARG_GROUP:
        break; /* opened by s_flatten, never stored */
    }
    return -1;
}

/* Adds table's rows (groups opened) to rows[*n]. */
static void s_flatten(const char *prog, const carls_arg_t *table, const carls_arg_t **rows, int *n)
{
    for (const carls_arg_t *a = table; a->name; a++) {
        if (a->kind == CARLS_ARG_GROUP) {
            s_flatten(prog, a->out, rows, n);
            continue;
        }
        if (*n == S_MAX_OPTIONS) {
            CARLS_FATAL("%s: more than %d options", prog, S_MAX_OPTIONS);
        }
        rows[(*n)++] = a;
    }
}

int carls_args_parse(const char *prog, int argc, char **argv, const carls_arg_t *args, void (*usage)(FILE *out))
{
    const carls_arg_t *rows[S_MAX_OPTIONS];
    int n = 0;
    s_flatten(prog, args, rows, &n);
    /* getopt_long's table: row i returns S_FIRST + i, --help S_FIRST + n (above '?' and every short option);
     * -h is the one short option. */
    struct option longopts[S_MAX_OPTIONS + 2];
    for (int i = 0; i < n; i++) {
        const bool takes_value = rows[i]->kind != CARLS_ARG_SET;
        longopts[i] = (struct option){rows[i]->name, takes_value ? required_argument : no_argument, NULL,
                                      S_FIRST + i};
    }
    longopts[n] = (struct option){"help", no_argument, NULL, S_FIRST + n};
    longopts[n + 1] = (struct option){NULL, 0, NULL, 0};
    optind = 1;
    int c;
    while ((c = getopt_long(argc, argv, "h", longopts, NULL)) != -1) {
        if (c == S_FIRST + n || c == 'h') {
            usage(stdout);
            return 1;
        }
        if (c < S_FIRST || c >= S_FIRST + n) { /* '?': unknown option or missing value */
            usage(stderr);
            return -1;
        }
        if (s_store(prog, rows[c - S_FIRST], optarg) != 0) {
            return -1;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "%s: unexpected argument '%s'\n", prog, argv[optind]);
        return -1;
    }
    return 0;
}
