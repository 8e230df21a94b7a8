/* Child command lines (see carls_argv.h). */
#include "carls_argv.h"

#include "log.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

void carls_fmt(char *buf, size_t len, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(buf, len, fmt, ap);
    va_end(ap);
    if (n < 0 || (size_t)n >= len) {
        CARLS_FATAL("launcher: a path or name is too long (%d bytes): %s", n, buf);
    }
}

void carls_argv_add(carls_argv_t *a, const char *fmt, ...)
{
    if (a->n >= 96) {
        CARLS_FATAL("launcher: too many arguments");
    }
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(a->arg[a->n], sizeof a->arg[0], fmt, ap);
    va_end(ap);
    if (n < 0 || (size_t)n >= sizeof a->arg[0]) {
        CARLS_FATAL("launcher: an argument is too long (%d bytes; a path under runs_dir?): %s", n, a->arg[a->n]);
    }
    a->ptr[a->n] = a->arg[a->n];
    a->n++;
    a->ptr[a->n] = NULL;
}

void carls_argv_add_list(carls_argv_t *a, const char *const *list)
{
    for (int k = 0; list[k]; k++) {
        carls_argv_add(a, "%s", list[k]);
    }
}

void carls_argv_add_if_set(carls_argv_t *a, const char *flag, const char *value)
{
    if (*value) {
        carls_argv_add(a, "%s", flag);
        carls_argv_add(a, "%s", value);
    }
}

void carls_argv_add_nums(carls_argv_t *a, const carls_argv_num_t *nums, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        carls_argv_add(a, "%s", nums[i].flag);
        if (nums[i].is_int) {
            carls_argv_add(a, "%d", (int)nums[i].v);
        } else {
            carls_argv_add(a, "%g", nums[i].v);
        }
    }
}

void carls_argv_copy(carls_argv_t *dst, const carls_argv_t *src)
{
    *dst = *src;
    for (int k = 0; k < dst->n; k++) {
        dst->ptr[k] = dst->arg[k];
    }
    dst->ptr[dst->n] = NULL;
}
