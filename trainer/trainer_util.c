/* Shared helpers of the trainer's subcommands (see trainer_util.h). */
#include "trainer_util.h"

#include "log.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int trainer_parse_widths(const char *text, int *widths, int max)
{
    int n = 0;
    const char *p = text;
    while (*p) {
        char *end = NULL;
        errno = 0;
        long v = strtol(p, &end, 10);
        if (end == p || errno || v < 1 || v > 65536 || n == max) {
            return -1;
        }
        widths[n++] = (int)v;
        if (*end == ',') {
            end++;
            if (!*end) {
                return -1;
            }
        } else if (*end) {
            return -1;
        }
        p = end;
    }
    return n > 0 ? n : -1;
}

int trainer_parse_int(const char *name, const char *text, long lo, long hi, int *out)
{
    char *end = NULL;
    errno = 0;
    long v = strtol(text, &end, 10);
    if (end == text || *end || errno || v < lo || v > hi) {
        fprintf(stderr, "trainer: --%s: '%s' is not an integer in %ld..%ld\n", name, text, lo, hi);
        return -1;
    }
    *out = (int)v;
    return 0;
}

int trainer_parse_float(const char *name, const char *text, double lo, double hi, float *out)
{
    char *end = NULL;
    errno = 0;
    double v = strtod(text, &end);
    if (end == text || *end || errno || !(v >= lo && v <= hi)) {
        fprintf(stderr, "trainer: --%s: '%s' is not a number in [%g, %g]\n", name, text, lo, hi);
        return -1;
    }
    *out = (float)v;
    return 0;
}

int trainer_parse_flag(const char *name, const char *text, bool *out)
{
    int v = 0;
    if (trainer_parse_int(name, text, 0, 1, &v) != 0)
        return -1;
    *out = v == 1;
    return 0;
}

int trainer_parse_choice(const char *name, const char *text, const char *first, const char *second, bool *is_first)
{
    if (strcmp(text, first) != 0 && strcmp(text, second) != 0) {
        fprintf(stderr, "trainer: --%s: '%s' is not %s or %s\n", name, text, first, second);
        return -1;
    }
    *is_first = strcmp(text, first) == 0;
    return 0;
}

int trainer_setup_threads(int requested)
{
    int n = requested > 0 ? requested : TRAINER_DEFAULT_THREADS;
    int got = nn_cpu_set_threads(n);
    LOG_INFO("OpenBLAS threads: %d", got);
    return got;
}

int trainer_setup_device(const char *text, nn_device_t *out)
{
    nn_device_t requested;
    if (nn_device_parse(text, &requested) != 0) {
        fprintf(stderr, "trainer: --device: '%s' is not auto, cpu or cuda\n", text);
        return -1;
    }
    char err[512];
    if (nn_device_resolve(requested, out, err, sizeof err) != 0) {
        fprintf(stderr, "trainer: %s\n", err);
        return -1;
    }
    LOG_INFO("device: %s", nn_device_name(*out));
    return 0;
}

