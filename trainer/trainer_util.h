/* Helpers shared by the trainer's subcommands: option values, device and thread set-up. */
#ifndef TRAINER_UTIL_H
#define TRAINER_UTIL_H

#include "nn_device.h"

/* Parses "256" or "512,256" into widths (at most max), returning how many, or -1 if malformed. */
int trainer_parse_widths(const char *text, int *widths, int max);

/* Parses an int option in [lo, hi]; prints "trainer: --name: ..." and returns -1 when it is not one. */
int trainer_parse_int(const char *name, const char *text, long lo, long hi, int *out);
/* Same for a float in [lo, hi]. */
int trainer_parse_float(const char *name, const char *text, double lo, double hi, float *out);

/* Sets OpenBLAS threads: requested > 0, or else the number of online CPUs. Logs and returns the number. */
int trainer_setup_threads(int requested);

/* Resolves --device (logging the choice); returns 0 and *out, or prints the reason and returns -1. */
int trainer_setup_device(const char *text, nn_device_t *out);

/* mkdir -p: creates dir and its missing parents. Returns 0, or -1 with errno. */
int trainer_mkdirs(const char *dir);

#endif
