/* Stage times of a run (see carls_stages.h). */
#include "carls_stages.h"

#include "files.h"

#include <math.h>
#include <stdbool.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Whether one of the first n stages has key. */
static bool s_has_key(const carls_stages_t *s, int n, const char *key)
{
    for (int k = 0; k < n; k++) {
        if (strcmp(s->key[k], key) == 0) {
            return true;
        }
    }
    return false;
}

void carls_stages_add(carls_stages_t *s, const char *key, double seconds, const char *fmt, ...)
{
    if (s->n >= CARLS_STAGES_MAX) {
        return;
    }
    const int i = s->n;
    /* JSON object keys must be unique: a key used before gets a number. */
    snprintf(s->key[i], sizeof s->key[i], "%.30s", key);
    for (int uses = 2; s_has_key(s, i, s->key[i]); uses++) {
        snprintf(s->key[i], sizeof s->key[i], "%.28s_%d", key, uses);
    }
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(s->name[i], sizeof s->name[i], fmt, ap);
    va_end(ap);
    s->seconds[i] = seconds > 0 && isfinite(seconds) ? seconds : 0.0;
    s->n++;
}

double carls_stages_sum(const carls_stages_t *s)
{
    double sum = 0;
    for (int i = 0; i < s->n; i++) {
        sum += s->seconds[i];
    }
    return sum;
}

/* The value of column `name` on the last data row of a CSV with a header (the trainer's metrics.csv), or -1. */
static double s_last_csv_value(const char *path, const char *name)
{
    FILE *f = fopen(path, "r");
    if (!f) {
        return -1;
    }
    char line[4096], last[4096] = "";
    int col = -1;
    if (fgets(line, sizeof line, f)) {
        line[strcspn(line, "\r\n")] = '\0';
        int c = 0;
        char *save = NULL;
        for (char *h = strtok_r(line, ",", &save); h; h = strtok_r(NULL, ",", &save), c++) {
            col = strcmp(h, name) == 0 ? c : col;
        }
    }
    while (fgets(line, sizeof line, f)) {
        if (line[0] >= '0' && line[0] <= '9') {
            memcpy(last, line, sizeof last);
        }
    }
    fclose(f);
    if (col < 0 || !*last) {
        return -1;
    }
    const char *field = last;
    for (int c = 0; c < col && field; c++) {
        field = strchr(field, ',');
        field = field ? field + 1 : NULL;
    }
    char *end = NULL;
    const double v = field ? strtod(field, &end) : -1;
    return field && end != field && isfinite(v) ? v : -1;
}

/* The number after `before` on the last line of log that holds it ("... in 2.5 s"), or -1. */
static double s_last_log_number(const char *log, const char *needle, const char *before)
{
    FILE *f = fopen(log, "r");
    if (!f) {
        return -1;
    }
    char line[4096];
    double v = -1;
    while (fgets(line, sizeof line, f)) {
        const char *at = strstr(line, needle);
        const char *num = at ? strstr(at, before) : NULL;
        if (num) {
            char *end = NULL;
            const double x = strtod(num + strlen(before), &end);
            v = end != num + strlen(before) && isfinite(x) && x >= 0 ? x : v;
        }
    }
    fclose(f);
    return v;
}

/* At most `left` of x (x < 0: unknown, 0); left shrinks by what is taken. */
static double s_take(double x, double *left)
{
    const double t = x < 0 ? 0 : x < *left ? x : *left;
    *left -= t;
    return t;
}

void carls_stages_trainer(carls_stages_t *s, double wall, const char *experiment, const carls_result_t *res,
                          const char *metrics_csv, const char *trainer_log)
{
    double left = wall > 0 ? wall : 0;
    if (strcmp(experiment, "twotower") == 0) {
        const double *steps = carls_result_get(res, "train_steps"), *sps = carls_result_get(res, "train_steps_per_s");
        const double *from = carls_result_get(res, "resumed_from_step");
        const double trained = steps ? *steps - (from ? *from : 0) : 0;
        const double train = s_take(trained > 0 && sps && *sps > 0 ? trained / *sps : 0, &left);
        const double waited = s_last_log_number(trainer_log, "trainer: every word vector is from step", "waited ");
        /* The evaluation's own clock starts before that wait. */
        const double ranked = s_last_log_number(trainer_log, "trainer: evaluated ", " headwords in ");
        const double wait = s_take(waited, &left);
        const double eval = s_take(ranked < 0 ? -1 : waited > 0 ? ranked - waited : ranked, &left);
        carls_stages_add(s, "trainer_startup", left, "trainer start-up and exit: data, lexical index, tables, "
                         "final checkpoint");
        carls_stages_add(s, "training", train, "training: the two towers' steps (makers beside them)");
        carls_stages_add(s, "final_vectors", wait, "waiting for the makers' word vectors of the final checkpoint");
        carls_stages_add(s, "evaluation", eval, "evaluation: the held-out definitions ranked");
        return;
    }
    const double *train_s = carls_result_get(res, "train_seconds");
    const double from_first_step = s_take(s_last_csv_value(metrics_csv, "elapsed_s"), &left);
    double in_loop = from_first_step;
    const double train = s_take(train_s ? *train_s : 0, &in_loop);
    carls_stages_add(s, "trainer_startup", left, "trainer start-up and exit: data, model, step-0 checkpoint");
    carls_stages_add(s, "training", train, "training: the trainer's steps, bank waits included (makers beside "
                     "them)");
    carls_stages_add(s, "evaluation", in_loop, "evaluation: the evaluations and checkpoints between steps");
}

void carls_stages_table(const carls_stages_t *s, double total, char *out, size_t len)
{
    size_t used = 0;
    *out = '\0';
    for (int i = 0; i <= s->n && used < len; i++) {
        const int n = i < s->n ? snprintf(out + used, len - used, "| %s | %.1f |\n", s->name[i], s->seconds[i])
                               : snprintf(out + used, len - used, "| total (the whole run) | %.1f |\n", total);
        if (n < 0 || (size_t)n >= len - used) {
            out[used] = '\0'; /* no half row */
            return;
        }
        used += (size_t)n;
    }
}

/* Appends s as a JSON string (quotes, escapes) to buf at *used (len bytes). */
static void s_json_string(char *buf, size_t len, size_t *used, const char *s)
{
    size_t u = *used;
    if (u + 1 < len) {
        buf[u++] = '"';
    }
    for (; *s && u + 8 < len; s++) {
        const unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\') {
            buf[u++] = '\\';
            buf[u++] = (char)c;
        } else if (c < 0x20) {
            u += (size_t)snprintf(buf + u, len - u, "\\u%04x", c);
        } else {
            buf[u++] = (char)c;
        }
    }
    if (u + 1 < len) {
        buf[u++] = '"';
    }
    buf[u < len ? u : len - 1] = '\0';
    *used = u < len ? u : len - 1;
}

/* printf onto buf at *used (len bytes), stopping at its end. */
static void s_append(char *buf, size_t len, size_t *used, const char *fmt, ...) __attribute__((format(printf, 4, 5)));
static void s_append(char *buf, size_t len, size_t *used, const char *fmt, ...)
{
    if (*used + 1 >= len) {
        return;
    }
    va_list ap;
    va_start(ap, fmt);
    const int n = vsnprintf(buf + *used, len - *used, fmt, ap);
    va_end(ap);
    *used = n < 0 ? *used : *used + (size_t)n < len ? *used + (size_t)n : len - 1;
}

int carls_stages_write_json(const char *path, const carls_stages_t *s, double total, const char *run,
                            const char *experiment, int exit_status, char *err, size_t errlen)
{
    const size_t len = 32768; /* CARLS_STAGES_MAX stages of at most ~500 bytes each */
    char *buf = malloc(len);
    if (!buf) {
        snprintf(err, errlen, "%s: out of memory", path);
        return -1;
    }
    size_t used = 0;
    s_append(buf, len, &used, "{\"run\": ");
    s_json_string(buf, len, &used, run);
    s_append(buf, len, &used, ", \"experiment\": ");
    s_json_string(buf, len, &used, experiment);
    s_append(buf, len, &used, ", \"exit_status\": %d, \"total\": %.3f,\n \"stages\": {", exit_status, total);
    for (int i = 0; i < s->n; i++) {
        s_append(buf, len, &used, "%s", i ? ",\n  " : "\n  ");
        s_json_string(buf, len, &used, s->key[i]);
        s_append(buf, len, &used, ": %.3f", s->seconds[i]);
    }
    s_append(buf, len, &used, "},\n \"stage_names\": {");
    for (int i = 0; i < s->n; i++) {
        s_append(buf, len, &used, "%s", i ? ",\n  " : "\n  ");
        s_json_string(buf, len, &used, s->key[i]);
        s_append(buf, len, &used, ": ");
        s_json_string(buf, len, &used, s->name[i]);
    }
    s_append(buf, len, &used, "}}\n");
    const int rc = carls_write_file_atomic(path, buf, used, 0644, 0, err, errlen) == 0 ? 0 : -1;
    free(buf);
    return rc;
}
