/* Long options from a table. Each program's main lists its options once, as rows (name, kind, where the value
 * goes, bounds or choices), and carls_args_parse runs the getopt_long loop, checks every value and prints the
 * messages, so the programs (trainer subcommands, kb-maker, ...) share one parser and one wording:
 *
 *   PROG: --NAME: 'TEXT' is not an integer in LO..HI
 *   PROG: --NAME: 'TEXT' is not a number in [LO, HI]
 *   PROG: --NAME: 'TEXT' is not A, B or C
 *   PROG: unexpected argument 'TEXT'
 *
 * Rows are made by the typed constructors below (so a value's type is checked where the row is written):
 *   const carls_arg_t args[] = {
 *       carls_arg_int("steps", &o->steps, 1, 100000000),
 *       carls_arg_string("ckpt-dir", &o->ckpt_dir),
 *       carls_arg_choice("neighbors-from", &o->nbr_mode, (const char *const[]){"bank", "trainer", NULL}),
 *       carls_arg_either("schedule", &o->cosine, (const char *const[]){"cosine", "constant", NULL}),
 *       carls_arg_log_level(),
 *       carls_arg_group(shared_rows), // a table of options several programs take
 *       {0},
 *   };
 *   int rc = carls_args_parse("trainer graphreg", argc, argv, args, s_usage);
 */
#ifndef CARLS_ARGS_H
#define CARLS_ARGS_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

typedef enum {
    CARLS_ARG_STRING,    /* const char **out: the text as given (it points into argv) */
    CARLS_ARG_INT,       /* int *out: an integer in [lo, hi] */
    CARLS_ARG_FLOAT,     /* float *out: a number in [lo, hi] */
    CARLS_ARG_U64,       /* uint64_t *out: an unsigned 64-bit integer */
    CARLS_ARG_U32,       /* uint32_t *out: an integer in [lo, hi] (for counts and sizes up to UINT32_MAX) */
    CARLS_ARG_DOUBLE,    /* double *out: a number in [lo, hi] */
    CARLS_ARG_BOOL01,    /* bool *out: 0 or 1 */
    CARLS_ARG_SET,       /* no value: bool *out set to true */
    CARLS_ARG_CHOICE,    /* int *out: the index of the text in choices */
    CARLS_ARG_EITHER,    /* bool *out: true for the first of the two choices, false for the second */
    CARLS_ARG_LOG_LEVEL, /* no out: sets the log level (log.h: debug, info, warn, error or off) */
    CARLS_ARG_CUSTOM,    /* parse(prog, name, text, out) checks and stores the value */
    CARLS_ARG_GROUP,     /* no option itself: out is another table ({0}-terminated) whose rows are added here */
} carls_arg_kind_t;

/* One option. A table of them ends with a row whose name is NULL ({0}); --help is always accepted. */
typedef struct {
    const char *name;           /* the long option without its "--" */
    carls_arg_kind_t kind;
    void *out;                  /* where the value goes (its type: see the kind) */
    double lo, hi;              /* INT, U32, FLOAT, DOUBLE: the accepted range */
    const char *const *choices; /* CHOICE, EITHER: the accepted values, NULL-terminated (alive while parsing) */
    /* CARLS_ARG_CUSTOM: stores text's value through out, or prints "PROG: --NAME: ..." and returns -1. */
    int (*parse)(const char *prog, const char *name, const char *text, void *out);
} carls_arg_t;

/* Parses argv[1..argc-1] (argv[0] names the program in getopt's own messages) by the table args. Stores each
 * value as it comes, so defaults are whatever the outputs held before. Returns 0 to run; 1 after --help (usage
 * printed to stdout); -1 on bad usage: an unknown option or a missing value (getopt's message, then usage on
 * stderr), a bad value or a positional argument (one "PROG: ..." line on stderr). */
int carls_args_parse(const char *prog, int argc, char **argv, const carls_arg_t *args, void (*usage)(FILE *out));

/* The value checks on their own, for values inside a custom option ("PROG: --NAME: ..." on failure, -1). */
int carls_args_int_value(const char *prog, const char *name, const char *text, long lo, long hi, int *out);
int carls_args_float_value(const char *prog, const char *name, const char *text, double lo, double hi, float *out);
int carls_args_u32_value(const char *prog, const char *name, const char *text, uint32_t lo, uint32_t hi,
                         uint32_t *out);
int carls_args_double_value(const char *prog, const char *name, const char *text, double lo, double hi,
                            double *out);
int carls_args_choice_value(const char *prog, const char *name, const char *text, const char *const *choices,
                            int *out);
/* "I/N": part I of N (a worker of a fleet, a shard of a bank), 0 <= I < N <= max_n, into *i and *n; or
 * "PROG: --NAME: 'TEXT' is not I/N with 0 <= I < N <= MAX" and -1. */
int carls_args_part_value(const char *prog, const char *name, const char *text, uint32_t max_n, uint32_t *i,
                          uint32_t *n);

/* The rows. */
static inline carls_arg_t carls_arg_string(const char *name, const char **out)
{
    return (carls_arg_t){.name = name, .kind = CARLS_ARG_STRING, .out = out};
}
static inline carls_arg_t carls_arg_int(const char *name, int *out, long lo, long hi)
{
    return (carls_arg_t){.name = name, .kind = CARLS_ARG_INT, .out = out, .lo = (double)lo, .hi = (double)hi};
}
static inline carls_arg_t carls_arg_float(const char *name, float *out, double lo, double hi)
{
    return (carls_arg_t){.name = name, .kind = CARLS_ARG_FLOAT, .out = out, .lo = lo, .hi = hi};
}
static inline carls_arg_t carls_arg_u32(const char *name, uint32_t *out, uint32_t lo, uint32_t hi)
{
    return (carls_arg_t){.name = name, .kind = CARLS_ARG_U32, .out = out, .lo = lo, .hi = hi};
}
static inline carls_arg_t carls_arg_double(const char *name, double *out, double lo, double hi)
{
    return (carls_arg_t){.name = name, .kind = CARLS_ARG_DOUBLE, .out = out, .lo = lo, .hi = hi};
}
static inline carls_arg_t carls_arg_u64(const char *name, uint64_t *out)
{
    return (carls_arg_t){.name = name, .kind = CARLS_ARG_U64, .out = out};
}
static inline carls_arg_t carls_arg_bool01(const char *name, bool *out)
{
    return (carls_arg_t){.name = name, .kind = CARLS_ARG_BOOL01, .out = out};
}
static inline carls_arg_t carls_arg_set(const char *name, bool *out)
{
    return (carls_arg_t){.name = name, .kind = CARLS_ARG_SET, .out = out};
}
static inline carls_arg_t carls_arg_choice(const char *name, int *out, const char *const *choices)
{
    return (carls_arg_t){.name = name, .kind = CARLS_ARG_CHOICE, .out = out, .choices = choices};
}
static inline carls_arg_t carls_arg_either(const char *name, bool *out, const char *const *two_choices)
{
    return (carls_arg_t){.name = name, .kind = CARLS_ARG_EITHER, .out = out, .choices = two_choices};
}
static inline carls_arg_t carls_arg_log_level(void)
{
    return (carls_arg_t){.name = "log-level", .kind = CARLS_ARG_LOG_LEVEL};
}
static inline carls_arg_t carls_arg_group(const carls_arg_t *rows)
{
    return (carls_arg_t){.name = "", .kind = CARLS_ARG_GROUP, .out = (void *)rows};
}
static inline carls_arg_t carls_arg_custom(const char *name, void *out,
                                           int (*parse)(const char *prog, const char *name, const char *text,
                                                        void *out))
{
    return (carls_arg_t){.name = name, .kind = CARLS_ARG_CUSTOM, .out = out, .parse = parse};
}

#endif
