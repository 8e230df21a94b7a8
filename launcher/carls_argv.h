/* The launcher's child command lines: an argv under construction in fixed storage (carls_argv_t), filled
 * flag by flag, and checked formatting of paths and names (carls_fmt). What does not fit is a configuration
 * error that CARLS_FATAL names at once. */
#ifndef CARLS_ARGV_H
#define CARLS_ARGV_H

#include <stddef.h>

/* An argv under construction: fixed storage, no allocation. */
typedef struct {
    int n;
    char arg[96][600];
    char *ptr[97];
} carls_argv_t;

/* A numeric option for a child: flag and value, printed as an integer or with %g. */
typedef struct {
    const char *flag;
    double v;
    int is_int;
} carls_argv_num_t;

/* snprintf for paths and names: a result that does not fit is a configuration error caught at once. */
void carls_fmt(char *buf, size_t len, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

void carls_argv_add(carls_argv_t *a, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Copies src into dst, whose ptr[] then point at dst's own strings. */
void carls_argv_copy(carls_argv_t *dst, const carls_argv_t *src);

/* Appends every string of the NULL-terminated list. */
void carls_argv_add_list(carls_argv_t *a, const char *const *list);

/* Appends flag and value when value is not empty (an optional setting left out of the configuration). */
void carls_argv_add_if_set(carls_argv_t *a, const char *flag, const char *value);

void carls_argv_add_nums(carls_argv_t *a, const carls_argv_num_t *nums, size_t n);

#endif
