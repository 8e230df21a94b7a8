/* Experiment configuration: an INI-style file of `key = value` lines ('#' or ';' start a comment, blank
 * lines and [section] headers are allowed; a key inside a section is "section.key"), plus command-line
 * overrides `--set key=value`. Keys are case-sensitive. An override of a key the file does not define is
 * refused, so a typo cannot silently do nothing. */
#ifndef CARLS_INI_H
#define CARLS_INI_H

#include <stddef.h>

#define CARLS_INI_MAX 256     /* keys */
#define CARLS_INI_KEY 96      /* bytes per key */
#define CARLS_INI_VALUE 512   /* bytes per value */

typedef struct {
    int n;
    char key[CARLS_INI_MAX][CARLS_INI_KEY];
    char value[CARLS_INI_MAX][CARLS_INI_VALUE];
    int overridden[CARLS_INI_MAX]; /* set by --set */
} carls_ini_t;

/* Reads path into *ini (zeroed first). Returns 0, or -1 with the reason (file:line) in err. */
int carls_ini_load(carls_ini_t *ini, const char *path, char *err, size_t errlen);

/* Applies "key=value". Returns 0, or -1 (malformed, or a key the file does not have) with err. */
int carls_ini_set(carls_ini_t *ini, const char *assignment, char *err, size_t errlen);

/* The value of key, or fallback when absent. */
const char *carls_ini_get(const carls_ini_t *ini, const char *key, const char *fallback);
/* As a number (fallback when absent); -1 with err when present but not a number. */
int carls_ini_get_double(const carls_ini_t *ini, const char *key, double fallback, double *out, char *err,
                         size_t errlen);

#endif
