/* INI-style experiment configuration (see carls_ini.h). */
#include "carls_ini.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static char *s_trim(char *s)
{
    while (*s && isspace((unsigned char)*s)) {
        s++;
    }
    char *e = s + strlen(s);
    while (e > s && isspace((unsigned char)e[-1])) {
        *--e = '\0';
    }
    return s;
}

static int s_find(const carls_ini_t *ini, const char *key)
{
    for (int i = 0; i < ini->n; i++) {
        if (strcmp(ini->key[i], key) == 0) {
            return i;
        }
    }
    return -1;
}

static int s_put(carls_ini_t *ini, const char *key, const char *value, char *err, size_t errlen)
{
    if (!*key || strlen(key) >= CARLS_INI_KEY || strlen(value) >= CARLS_INI_VALUE) {
        snprintf(err, errlen, "key or value too long or empty: '%s'", key);
        return -1;
    }
    int i = s_find(ini, key);
    if (i < 0) {
        if (ini->n >= CARLS_INI_MAX) {
            snprintf(err, errlen, "more than %d keys", CARLS_INI_MAX);
            return -1;
        }
        i = ini->n++;
        snprintf(ini->key[i], CARLS_INI_KEY, "%s", key);
    }
    snprintf(ini->value[i], CARLS_INI_VALUE, "%s", value);
    return 0;
}

int carls_ini_load(carls_ini_t *ini, const char *path, char *err, size_t errlen)
{
    memset(ini, 0, sizeof *ini);
    FILE *f = fopen(path, "r");
    if (!f) {
        snprintf(err, errlen, "cannot open %s", path);
        return -1;
    }
    char line[2048], section[CARLS_INI_KEY] = "";
    int lineno = 0, rc = 0;
    while (fgets(line, sizeof line, f)) {
        lineno++;
        char *hash = strpbrk(line, "#;");
        if (hash) {
            *hash = '\0';
        }
        char *s = s_trim(line);
        if (!*s) {
            continue;
        }
        if (*s == '[') {
            char *e = strchr(s, ']');
            if (!e || e[1] != '\0' || e - s - 1 >= CARLS_INI_KEY - 1) {
                snprintf(err, errlen, "%s:%d: bad section header", path, lineno);
                rc = -1;
                break;
            }
            *e = '\0';
            snprintf(section, sizeof section, "%s", s_trim(s + 1));
            continue;
        }
        char *eq = strchr(s, '=');
        if (!eq) {
            snprintf(err, errlen, "%s:%d: expected key = value", path, lineno);
            rc = -1;
            break;
        }
        *eq = '\0';
        char key[CARLS_INI_KEY * 2];
        snprintf(key, sizeof key, "%s%s%s", section, *section ? "." : "", s_trim(s));
        char sub[1024];
        if (s_put(ini, key, s_trim(eq + 1), sub, sizeof sub) != 0) {
            snprintf(err, errlen, "%s:%d: %s", path, lineno, sub);
            rc = -1;
            break;
        }
    }
    fclose(f);
    return rc;
}

int carls_ini_set(carls_ini_t *ini, const char *assignment, char *err, size_t errlen)
{
    char buf[CARLS_INI_KEY + CARLS_INI_VALUE + 2];
    if (strlen(assignment) >= sizeof buf) {
        snprintf(err, errlen, "--set %s: too long", assignment);
        return -1;
    }
    snprintf(buf, sizeof buf, "%s", assignment);
    char *eq = strchr(buf, '=');
    if (!eq) {
        snprintf(err, errlen, "--set %s: expected key=value", assignment);
        return -1;
    }
    *eq = '\0';
    const char *key = s_trim(buf), *value = s_trim(eq + 1);
    int i = s_find(ini, key);
    if (i < 0) {
        snprintf(err, errlen, "--set %s: the configuration has no key '%s'", assignment, key);
        return -1;
    }
    snprintf(ini->value[i], CARLS_INI_VALUE, "%s", value);
    ini->overridden[i] = 1;
    return 0;
}

const char *carls_ini_get(const carls_ini_t *ini, const char *key, const char *fallback)
{
    int i = s_find(ini, key);
    return i < 0 ? fallback : ini->value[i];
}

int carls_ini_get_double(const carls_ini_t *ini, const char *key, double fallback, double *out, char *err,
                         size_t errlen)
{
    const char *v = carls_ini_get(ini, key, NULL);
    if (!v) {
        *out = fallback;
        return 0;
    }
    char *end = NULL;
    double d = strtod(v, &end);
    while (end && *end && isspace((unsigned char)*end)) {
        end++;
    }
    if (end == v || *end != '\0') {
        snprintf(err, errlen, "%s = '%s' is not a number", key, v);
        return -1;
    }
    *out = d;
    return 0;
}
