/* Helpers shared by the trainer's subcommands: option values, device and thread set-up. */
#ifndef TRAINER_UTIL_H
#define TRAINER_UTIL_H

#include "nn_device.h"

#include <stdbool.h>

/* Parses "256" or "512,256" into widths (at most max), returning how many, or -1 if malformed. */
int trainer_parse_widths(const char *text, int *widths, int max);

/* Parses an int option in [lo, hi]; prints "trainer: --name: ..." and returns -1 when it is not one. */
int trainer_parse_int(const char *name, const char *text, long lo, long hi, int *out);
/* Same for a float in [lo, hi]. */
int trainer_parse_float(const char *name, const char *text, double lo, double hi, float *out);
/* A 0|1 option: *out = the value; prints as trainer_parse_int and returns -1 for anything else. */
int trainer_parse_flag(const char *name, const char *text, bool *out);
/* An option with two values: *is_first = (text is first); prints "trainer: --name: 'text' is not first or
 * second" and returns -1 (leaving *is_first) when it is neither. */
int trainer_parse_choice(const char *name, const char *text, const char *first, const char *second, bool *is_first);

/* Sets OpenBLAS threads: requested when > 0, else TRAINER_DEFAULT_THREADS. Logs and returns the number.
 *
 * Why 1 by default: the training loop's GEMMs are small (a batch of 128 rows: about 1 ms each), OpenBLAS
 * splits them over threads for little or no gain (measured on the 2-core development machine: 0.7-1.1x for
 * the layer GEMMs, 3x slower for the 10-column classifier GEMM), the element-wise half of a step runs on one
 * thread anyway, and in a CARLS run the other core is wanted by the knowledge bank and the makers. Idle
 * waiting OpenBLAS threads also spin in sched_yield, which shows up as system time. See docs/BENCHMARKS.md. */
#define TRAINER_DEFAULT_THREADS 1
int trainer_setup_threads(int requested);

/* Resolves --device (logging the choice); returns 0 and *out, or prints the reason and returns -1. */
int trainer_setup_device(const char *text, nn_device_t *out);


#endif
