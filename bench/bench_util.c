/* kb-bench: clocks, the timed runner, results and child processes (see bench.h). */
#include "bench.h"

#include "files.h"
#include "log.h"
#include "util.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

/* ---- options ---- */

bool bench_case_next(const char **p, const char **item, size_t *len)
{
    if (!**p)
        return false;
    const char *end = strchr(*p, ',');
    *item = *p;
    *len = end ? (size_t)(end - *p) : strlen(*p);
    *p += *len + (end ? 1 : 0);
    return true;
}

bool bench_selected(const bench_opts_t *opts, const char *name)
{
    if (!opts->cases || !opts->cases[0])
        return true;
    size_t n = strlen(name), len;
    const char *item;
    for (const char *p = opts->cases; bench_case_next(&p, &item, &len);)
        if (len == n && strncmp(item, name, n) == 0)
            return true;
    return false;
}

/* ---- clocks and random numbers ---- */

double bench_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

uint64_t bench_rand(uint64_t *state) { return carls_splitmix64(state); }

uint32_t bench_rand_below(uint64_t *state, uint32_t n)
{
    return (uint32_t)(((bench_rand(state) >> 32) * (uint64_t)n) >> 32);
}

float bench_normal(uint64_t *state)
{
    double u1 = ((double)(bench_rand(state) >> 11) + 1.0) * (1.0 / 9007199254740993.0);
    double u2 = (double)(bench_rand(state) >> 11) * (1.0 / 9007199254740992.0);
    return (float)(sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
}

size_t bench_key(uint32_t i, char *buf)
{
    /* Fixed width so every key has the same length (10 bytes), for kb and Redis alike. */
    buf[0] = 'k';
    for (int d = 9; d >= 1; d--) {
        buf[d] = (char)('0' + i % 10);
        i /= 10;
    }
    buf[10] = '\0';
    return 10;
}

void bench_value(uint32_t i, uint32_t dim, float *out)
{
    uint64_t state = 0x9e3779b97f4a7c15ULL ^ ((uint64_t)i * 0xbf58476d1ce4e5b9ULL);
    for (uint32_t d = 0; d < dim; d++)
        out[d] = bench_normal(&state) * 0.1f;
}

double bench_load1(void)
{
    double load[1];
    return getloadavg(load, 1) == 1 ? load[0] : -1.0;
}

/* All CPUs' time and its steal part (in a virtual machine: time the hypervisor ran other guests while this
 * one had work), from /proc/stat's first line; ok false where it cannot be read. */
typedef struct {
    unsigned long long total, steal;
    bool ok;
} s_cpu_t;

static s_cpu_t s_read_cpu(void)
{
    s_cpu_t c = {0};
    FILE *f = fopen("/proc/stat", "r");
    if (!f)
        return c;
    unsigned long long v[8] = {0};
    c.ok = fscanf(f, "cpu %llu %llu %llu %llu %llu %llu %llu %llu", &v[0], &v[1], &v[2], &v[3], &v[4], &v[5],
                  &v[6], &v[7]) == 8;
    fclose(f);
    for (int i = 0; i < 8; i++)
        c.total += v[i];
    c.steal = v[7];
    return c;
}

/* Steal as a percentage of all CPU time between two readings, NAN when either failed or none passed. */
static double s_steal_pct(s_cpu_t a, s_cpu_t b)
{
    if (!a.ok || !b.ok || b.total <= a.total)
        return NAN;
    return 100.0 * (double)(b.steal - a.steal) / (double)(b.total - a.total);
}

static s_cpu_t s_run_cpu, s_case_cpu; /* at bench_report_begin; at the current case's bench_progress line */

/* ---- the timed runner ---- */

/* How long past its end a window may be stretched while no request has completed in it (a loaded machine,
 * a slow sync commit): long enough for any commit, short of the smoke test's timeout. */
#define S_STRETCH_MAX_S 30.0

typedef struct {
    const bench_workload_t *w;
    pthread_barrier_t ready;   /* every thread has its state; main then sets the window */
    pthread_barrier_t go;
    double measure_start, measure_end;
    double give_up;            /* measure_end + S_STRETCH_MAX_S */
    atomic_int done_any;       /* some request completed at or after measure_start */
    atomic_int failed;
} s_run_t;

/* One request that completed at or after the window's start. */
typedef struct {
    double done;    /* completion time (bench_now) */
    float lat_us;
    uint64_t units;
} s_op_t;

typedef struct {
    s_run_t *run;
    uint32_t index;
    s_op_t *ops;
    size_t n_ops, cap_ops;
    char error[256];
    bool failed;
} s_thread_t;

static void *s_thread_main(void *arg)
{
    s_thread_t *t = arg;
    s_run_t *run = t->run;
    void *state = run->w->thread_new(run->w->arg, t->index);
    if (!state) {
        snprintf(t->error, sizeof t->error, "thread %u could not start (connection or memory)", t->index);
        t->failed = true;
        atomic_store(&run->failed, 1);
    }
    pthread_barrier_wait(&run->ready);
    pthread_barrier_wait(&run->go);
    uint64_t rng = 0x5eed0000ULL + t->index * 0x9e3779b97f4a7c15ULL;
    while (state && !atomic_load(&run->failed)) {
        double t0 = bench_now();
        /* After the window, start nothing more, unless no request has completed in it yet: then keep going
         * (up to give_up) so that a loaded machine gives a slow figure instead of none. */
        if (t0 >= run->measure_end && (atomic_load(&run->done_any) || t0 >= run->give_up))
            break;
        uint64_t units = 0;
        if (run->w->op(state, &rng, &units, t->error, sizeof t->error) != 0) {
            t->failed = true;
            atomic_store(&run->failed, 1);
            break;
        }
        double t1 = bench_now();
        if (t1 >= run->measure_start) {
            if (t->n_ops == t->cap_ops) {
                t->cap_ops = t->cap_ops ? t->cap_ops * 2 : 4096;
                t->ops = carls_xrealloc(t->ops, t->cap_ops * sizeof *t->ops);
            }
            t->ops[t->n_ops++] = (s_op_t){.done = t1, .lat_us = (float)((t1 - t0) * 1e6), .units = units};
            atomic_store(&run->done_any, 1);
        }
    }
    if (state)
        run->w->thread_free(state);
    return NULL;
}

static int s_cmp_float(const void *a, const void *b)
{
    float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

/* The measured window: the planned one when a request completed in it; else (stretched) from the planned
 * start, or the start of the first request to complete if that was earlier, to that request's completion;
 * else (nothing completed at all) the planned one. */
static void s_window(const s_run_t *run, const s_thread_t *ts, uint32_t threads, double *start, double *end)
{
    const s_op_t *first = NULL;
    for (uint32_t i = 0; i < threads; i++)
        for (size_t k = 0; k < ts[i].n_ops; k++)
            if (!first || ts[i].ops[k].done < first->done)
                first = &ts[i].ops[k];
    *start = run->measure_start;
    *end = run->measure_end;
    if (first && first->done > run->measure_end) {
        double first_start = first->done - first->lat_us * 1e-6;
        *start = first_start < run->measure_start ? first_start : run->measure_start;
        *end = first->done;
    }
}

int bench_run(const bench_workload_t *w, uint32_t threads, double warmup, double seconds, bench_measure_t *out)
{
    memset(out, 0, sizeof *out);
    out->p50_us = out->p99_us = out->mean_us = NAN;
    if (threads == 0)
        threads = 1;
    s_run_t run = {.w = w};
    atomic_init(&run.failed, 0);
    atomic_init(&run.done_any, 0);
    pthread_barrier_init(&run.ready, NULL, threads + 1);
    pthread_barrier_init(&run.go, NULL, threads + 1);
    s_thread_t *ts = carls_xcalloc(threads, sizeof *ts);
    pthread_t *ids = carls_xcalloc(threads, sizeof *ids);
    for (uint32_t i = 0; i < threads; i++) {
        ts[i].run = &run;
        ts[i].index = i;
        if (pthread_create(&ids[i], NULL, s_thread_main, &ts[i]) != 0)
            CARLS_FATAL("cannot start a benchmark thread");
    }
    pthread_barrier_wait(&run.ready);
    run.measure_start = bench_now() + warmup;
    run.measure_end = run.measure_start + seconds;
    run.give_up = run.measure_end + S_STRETCH_MAX_S;
    pthread_barrier_wait(&run.go);
    for (uint32_t i = 0; i < threads; i++)
        pthread_join(ids[i], NULL);
    pthread_barrier_destroy(&run.ready);
    pthread_barrier_destroy(&run.go);

    double start, end;
    s_window(&run, ts, threads, &start, &end);
    size_t n_recorded = 0;
    for (uint32_t i = 0; i < threads; i++)
        n_recorded += ts[i].n_ops;
    float *lat = carls_xmalloc((n_recorded ? n_recorded : 1) * sizeof *lat);
    size_t n_lat = 0;
    double sum = 0;
    for (uint32_t i = 0; i < threads; i++) {
        for (size_t k = 0; k < ts[i].n_ops; k++) {
            if (ts[i].ops[k].done > end)
                continue; /* finished after the window (the request in flight at its end) */
            lat[n_lat++] = ts[i].ops[k].lat_us;
            sum += ts[i].ops[k].lat_us;
            out->units += ts[i].ops[k].units;
        }
        if (ts[i].failed && !out->failed) {
            out->failed = true;
            snprintf(out->error, sizeof out->error, "%s", ts[i].error);
        }
    }
    out->ops = n_lat;
    out->seconds = end - start;
    out->stretched = end > run.measure_end;
    out->rate = (double)out->units / out->seconds;
    out->op_rate = (double)out->ops / out->seconds;
    if (out->stretched)
        LOG_WARN("kb-bench: no request completed in the %.2f s window; it was stretched to %.2f s, until the "
                 "first one did",
                 seconds, out->seconds);
    if (n_lat > 0) {
        qsort(lat, n_lat, sizeof *lat, s_cmp_float);
        /* nearest rank */
        out->p50_us = lat[(size_t)ceil(0.50 * (double)n_lat) - 1];
        out->p99_us = lat[(size_t)ceil(0.99 * (double)n_lat) - 1];
        out->mean_us = sum / (double)n_lat;
    }
    free(lat);
    for (uint32_t i = 0; i < threads; i++)
        free(ts[i].ops);
    free(ts);
    free(ids);
    if (!out->failed && out->ops == 0) {
        out->failed = true;
        snprintf(out->error, sizeof out->error, "no request completed in %.2f s (the window stretched by up to "
                 "%.0f s)", seconds, S_STRETCH_MAX_S);
    }
    return out->failed ? -1 : 0;
}

/* ---- results ---- */

static size_t s_results, s_failed, s_targets, s_targets_met;

/* Every result with a target, for the summary at the end of the table (names are copied: cases build
 * theirs on the stack). */
#define S_MAX_TARGETS 64
typedef struct {
    char name[48];
    char target[16];
    double ratio; /* NAN: the figure or its reference is unavailable */
    double bound; /* the target's bound on the ratio */
    double guard_level; /* > 0: the guard's bound is a third of this (three times it) instead */
    bool lower_is_better;
    bool met;
} s_target_t;
static s_target_t s_target_rows[S_MAX_TARGETS];
static size_t s_n_target_rows;

size_t bench_report_count(void) { return s_results; }

int bench_guard_failures(void)
{
    int failures = 0;
    for (size_t i = 0; i < s_n_target_rows; i++) {
        const s_target_t *t = &s_target_rows[i];
        const double level = t->guard_level > 0 ? t->guard_level : t->bound;
        double floor = t->lower_is_better ? level * 3.0 : level / 3.0;
        bool ok = isfinite(t->ratio) && (t->lower_is_better ? t->ratio <= floor : t->ratio >= floor);
        if (ok)
            continue;
        failures++;
        if (isfinite(t->ratio) && t->guard_level > 0)
            fprintf(stderr, "kb-bench: guard: %s: ratio %.3g to its reference, past the guard's bound %.3g "
                    "(%s the %.3g it is measured at; its target %s): a slowdown\n", t->name, t->ratio, floor,
                    t->lower_is_better ? "three times" : "a third of", t->guard_level, t->target);
        else if (isfinite(t->ratio))
            fprintf(stderr, "kb-bench: guard: %s: ratio %.3g to its reference, past the guard's bound %.3g "
                    "(%s its target %s): a slowdown\n", t->name, t->ratio, floor,
                    t->lower_is_better ? "three times" : "a third of", t->target);
        else
            fprintf(stderr, "kb-bench: guard: %s has no ratio (the figure or its floor was not measured)\n",
                    t->name);
    }
    return failures;
}

static void s_json_string(FILE *f, const char *s)
{
    fputc('"', f);
    for (; s && *s; s++) {
        if (*s == '"' || *s == '\\')
            fprintf(f, "\\%c", *s);
        else if ((unsigned char)*s < 0x20)
            fprintf(f, "\\u%04x", (unsigned)(unsigned char)*s);
        else
            fputc(*s, f);
    }
    fputc('"', f);
}

static void s_json_number(FILE *f, double v)
{
    if (isfinite(v))
        fprintf(f, "%.6g", v);
    else
        fputs("null", f);
}

/* 1234567 -> "1.23M" for people. */
static void s_human(char *buf, size_t len, double v)
{
    if (!isfinite(v))
        snprintf(buf, len, "n/a");
    else if (fabs(v) >= 1e9)
        snprintf(buf, len, "%.3gG", v / 1e9);
    else if (fabs(v) >= 1e6)
        snprintf(buf, len, "%.3gM", v / 1e6);
    else if (fabs(v) >= 1e4)
        snprintf(buf, len, "%.3gk", v / 1e3);
    else
        snprintf(buf, len, "%.4g", v);
}

void bench_report_begin(const bench_opts_t *opts)
{
    s_run_cpu = s_case_cpu = s_read_cpu();
    if (opts->json)
        return;
    printf("%-28s %10s %-9s %-28s %10s %7s  %s\n", "case", "value", "unit", "reference", "ref value", "ratio",
           "target");
}

static double s_ratio(const bench_result_t *r)
{
    return isfinite(r->value) && isfinite(r->reference_value) && r->reference_value != 0
               ? r->value / r->reference_value
               : NAN;
}

/* ---- --repeat: results kept until the end, then each figure's median round ---- */

static bench_result_t *s_kept; /* strings owned (copied: cases build theirs on the stack) */
static size_t s_n_kept, s_kept_cap;

/* The spread of a figure over the rounds, printed with its median round. */
typedef struct {
    uint32_t rounds;   /* rounds with a finite figure */
    bool by_ratio;     /* the median and the spread are of the ratio (else of the value) */
    double min, max;
} s_spread_t;

static char *s_dup_or_null(const char *text)
{
    if (!text)
        return NULL;
    char *copy = strdup(text);
    if (!copy)
        CARLS_FATAL("out of memory");
    return copy;
}

static void s_keep(const bench_result_t *r)
{
    s_kept = carls_grow(s_kept, &s_kept_cap, s_n_kept + 1, sizeof *s_kept);
    bench_result_t *k = &s_kept[s_n_kept++];
    *k = *r;
    k->name = s_dup_or_null(r->name);
    k->unit = s_dup_or_null(r->unit);
    k->reference = s_dup_or_null(r->reference);
    k->target = s_dup_or_null(r->target);
    k->note = s_dup_or_null(r->note);
}

static void s_emit(const bench_opts_t *opts, const bench_result_t *r, const s_spread_t *spread);

static double s_key(const bench_result_t *k, bool by_ratio) { return by_ratio ? s_ratio(k) : k->value; }

/* Prints, in the order figures first appeared, each figure's round with the median ratio (or value, for
 * figures without a reference), with the spread over the rounds; frees what was kept. */
static void s_emit_medians(const bench_opts_t *opts)
{
    bool *done = carls_xcalloc(s_n_kept ? s_n_kept : 1, sizeof *done);
    size_t *idx = carls_xmalloc((s_n_kept ? s_n_kept : 1) * sizeof *idx);
    for (size_t i = 0; i < s_n_kept; i++) {
        if (done[i])
            continue;
        size_t n = 0;
        bool by_ratio = true;
        for (size_t j = i; j < s_n_kept; j++) {
            if (done[j] || strcmp(s_kept[j].name, s_kept[i].name) != 0)
                continue;
            done[j] = true;
            idx[n++] = j;
            by_ratio &= isfinite(s_ratio(&s_kept[j]));
        }
        /* The rounds with a finite figure, sorted by it (insertion sort: a handful of rounds). */
        size_t finite = 0, first = idx[0];
        for (size_t a = 0; a < n; a++) {
            size_t cur = idx[a];
            double key = s_key(&s_kept[cur], by_ratio);
            if (!isfinite(key))
                continue;
            size_t b = finite++;
            while (b > 0 && s_key(&s_kept[idx[b - 1]], by_ratio) > key) {
                idx[b] = idx[b - 1];
                b--;
            }
            idx[b] = cur;
        }
        s_spread_t spread = {.rounds = (uint32_t)finite, .by_ratio = by_ratio};
        size_t pick = first; /* no round has the figure: show the first round's failure */
        if (finite > 0) {
            /* A round that happened, never an average; of two middle rounds the less favourable one. */
            bool lower_better = s_kept[i].lower_is_better && by_ratio;
            pick = idx[finite % 2 == 0 && lower_better ? finite / 2 : (finite - 1) / 2];
            spread.min = s_key(&s_kept[idx[0]], by_ratio);
            spread.max = s_key(&s_kept[idx[finite - 1]], by_ratio);
        }
        s_emit(opts, &s_kept[pick], &spread);
    }
    for (size_t i = 0; i < s_n_kept; i++) {
        bench_result_t *r = &s_kept[i];
        free((char *)r->name);
        free((char *)r->unit);
        free((char *)r->reference);
        free((char *)r->target);
        free((char *)r->note);
    }
    free(s_kept);
    s_kept = NULL;
    s_n_kept = s_kept_cap = 0;
    free(done);
    free(idx);
}

bench_result_t bench_result(const bench_opts_t *opts, const char *name, const char *unit)
{
    bench_result_t r = {.name = name, .unit = unit, .reference = "", .reference_value = NAN, .value = NAN,
                        .p50_us = NAN, .p99_us = NAN, .clients = opts->clients, .batch = opts->batch,
                        .shards = 1, .rows = opts->keys};
    return r;
}

bench_result_t bench_result_vs(const bench_opts_t *opts, const char *name, const char *unit, double value,
                               const char *reference, double reference_value)
{
    bench_result_t r = bench_result(opts, name, unit);
    r.value = value;
    r.reference = reference;
    r.reference_value = reference_value;
    return r;
}

bench_result_t bench_result_of(const bench_opts_t *opts, const char *name, const char *unit,
                               const bench_measure_t *m, const char *reference, double reference_value)
{
    bench_result_t r = bench_result_vs(opts, name, unit, m->rate, reference, reference_value);
    r.p50_us = m->p50_us;
    r.p99_us = m->p99_us;
    return r;
}

void bench_report(const bench_opts_t *opts, const bench_result_t *r)
{
    bench_result_t with_steal = *r;
    with_steal.steal_pct = s_steal_pct(s_case_cpu, s_read_cpu());
    if (opts->repeat > 1)
        s_keep(&with_steal);
    else
        s_emit(opts, &with_steal, NULL);
}

/* Prints one result and counts it for the summary. spread: with --repeat, the figure over the rounds. */
static void s_emit(const bench_opts_t *opts, const bench_result_t *r, const s_spread_t *spread)
{
    double ratio = s_ratio(r);
    bool has_target = r->target != NULL;
    bool met = false;
    if (has_target && isfinite(ratio))
        met = r->lower_is_better ? ratio <= r->target_ratio : ratio >= r->target_ratio;
    s_results++;
    if (!isfinite(r->value))
        s_failed++;
    if (has_target && isfinite(ratio)) {
        s_targets++;
        s_targets_met += met;
    }
    if (has_target && s_n_target_rows < S_MAX_TARGETS) {
        s_target_t *t = &s_target_rows[s_n_target_rows++];
        snprintf(t->name, sizeof t->name, "%s", r->name);
        snprintf(t->target, sizeof t->target, "%s", r->target);
        t->ratio = ratio;
        t->bound = r->target_ratio;
        t->guard_level = r->guard_level;
        t->lower_is_better = r->lower_is_better;
        t->met = met;
    }
    if (opts->json) {
        FILE *f = stdout;
        fputs("{\"case\":", f);
        s_json_string(f, r->name);
        fputs(",\"value\":", f);
        s_json_number(f, r->value);
        fputs(",\"unit\":", f);
        s_json_string(f, r->unit);
        fputs(",\"reference\":", f);
        s_json_string(f, r->reference ? r->reference : "");
        fputs(",\"reference_value\":", f);
        s_json_number(f, r->reference_value);
        fputs(",\"ratio\":", f);
        s_json_number(f, ratio);
        if (has_target) {
            fputs(",\"target\":", f);
            s_json_string(f, r->target);
            fprintf(f, ",\"target_met\":%s", isfinite(ratio) ? (met ? "true" : "false") : "null");
        }
        fputs(",\"p50_us\":", f);
        s_json_number(f, r->p50_us);
        fputs(",\"p99_us\":", f);
        s_json_number(f, r->p99_us);
        fprintf(f, ",\"clients\":%u,\"batch\":%u,\"shards\":%u,\"rows\":%llu,\"dim\":%u,\"load1\":", r->clients,
                r->batch, r->shards, (unsigned long long)r->rows, opts->dim);
        s_json_number(f, bench_load1());
        fputs(",\"steal_pct\":", f);
        s_json_number(f, r->steal_pct);
        fputs(",\"mode\":", f);
        s_json_string(f, opts->mode);
        if (r->note) {
            fputs(",\"note\":", f);
            s_json_string(f, r->note);
        }
        if (spread) {
            fprintf(f, ",\"rounds\":%u,\"of_rounds\":%u,\"%s_min\":", spread->rounds, opts->repeat,
                    spread->by_ratio ? "ratio" : "value");
            s_json_number(f, spread->rounds ? spread->min : NAN);
            fprintf(f, ",\"%s_max\":", spread->by_ratio ? "ratio" : "value");
            s_json_number(f, spread->rounds ? spread->max : NAN);
        }
        fputs("}\n", f);
    } else {
        char v[32], rv[32], ra[32], tg[64];
        s_human(v, sizeof v, r->value);
        s_human(rv, sizeof rv, r->reference_value);
        if (isfinite(ratio))
            snprintf(ra, sizeof ra, "%.2f", ratio);
        else
            snprintf(ra, sizeof ra, "-");
        if (has_target)
            snprintf(tg, sizeof tg, "%s %s", r->target, isfinite(ratio) ? (met ? "met" : "MISSED") : "n/a");
        else
            tg[0] = '\0';
        char rounds[96] = "";
        if (spread && spread->rounds > 0 && spread->by_ratio)
            snprintf(rounds, sizeof rounds, "  [median of %u/%u rounds; ratio %.2f-%.2f]", spread->rounds,
                     opts->repeat, spread->min, spread->max);
        else if (spread && spread->rounds > 0) {
            char lo[32], hi[32];
            s_human(lo, sizeof lo, spread->min);
            s_human(hi, sizeof hi, spread->max);
            snprintf(rounds, sizeof rounds, "  [median of %u/%u rounds; %s-%s]", spread->rounds, opts->repeat, lo,
                     hi);
        }
        printf("%-28s %10s %-9s %-28s %10s %7s  %s%s%s%s\n", r->name, v, r->unit,
               r->reference && r->reference[0] ? r->reference : "-", rv, ra, tg, rounds, r->note ? "  " : "",
               r->note ? r->note : "");
    }
    fflush(stdout);
}

void bench_report_end(const bench_opts_t *opts, double elapsed_s)
{
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    if (opts->repeat > 1)
        s_emit_medians(opts);
    if (opts->json)
        return;
    /* The targets again, together: issue 18's table (figure, ratio, target, met) in one place. */
    printf("\n%-28s %7s  %-7s %s\n", "target", "ratio", "bound", "met");
    for (size_t i = 0; i < s_n_target_rows; i++) {
        const s_target_t *t = &s_target_rows[i];
        char ra[32];
        if (isfinite(t->ratio))
            snprintf(ra, sizeof ra, "%.2f", t->ratio);
        else
            snprintf(ra, sizeof ra, "-");
        printf("%-28s %7s  %-7s %s\n", t->name, ra, t->target,
               isfinite(t->ratio) ? (t->met ? "met" : "MISSED") : "n/a");
    }
    char rounds[48] = "";
    if (opts->repeat > 1)
        snprintf(rounds, sizeof rounds, ", each figure the median of %u rounds", opts->repeat);
    char steal[64] = "";
    double steal_pct = s_steal_pct(s_run_cpu, s_read_cpu());
    if (isfinite(steal_pct))
        snprintf(steal, sizeof steal, ", CPU steal %.1f%%", steal_pct);
    printf("\n%zu results (%zu unavailable or failed); targets: %zu of %zu met%s; %ld cores, load average %.2f%s; "
           "%.0f s in all (%s run)\n",
           s_results, s_failed, s_targets_met, s_targets, rounds, cores, bench_load1(), steal, elapsed_s, opts->mode);
}

void bench_progress(const bench_opts_t *opts, const char *fmt, ...)
{
    s_case_cpu = s_read_cpu(); /* a case begins with its progress line: its results' steal counts from here */
    if (opts->json && !opts->verbose)
        return;
    static double start;
    if (start == 0)
        start = bench_now();
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "kb-bench [%4.0f s, load %.1f]: ", bench_now() - start, bench_load1());
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n");
    va_end(ap);
}

/* ---- child processes ---- */

int bench_make_dir(const bench_opts_t *opts, const char *tag, char *out, size_t outlen)
{
    static atomic_int counter;
    int n = atomic_fetch_add(&counter, 1);
    if ((size_t)snprintf(out, outlen, "%s/%s-%d", opts->data_dir, tag, n) >= outlen)
        return -1;
    if (mkdir(out, 0700) != 0) {
        fprintf(stderr, "kb-bench: cannot create %s: %s\n", out, strerror(errno));
        return -1;
    }
    return 0;
}

pid_t bench_spawn(const char *const *argv, const char *log)
{
    /* Nothing buffered may reach the child (it would be written twice). */
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid < 0)
        return -1;
    if (pid == 0) {
        /* Die with the benchmark (a killed kb-bench must not leave servers behind). */
        prctl(PR_SET_PDEATHSIG, SIGTERM);
        if (getppid() == 1)
            _exit(127);
        int fd = open(log, O_WRONLY | O_CREAT | O_APPEND, 0600);
        if (fd < 0 || dup2(fd, STDOUT_FILENO) < 0 || dup2(fd, STDERR_FILENO) < 0)
            _exit(127);
        close(fd);
        execv(argv[0], (char *const *)argv);
        fprintf(stderr, "execv %s: %s\n", argv[0], strerror(errno));
        _exit(127);
    }
    return pid;
}

int bench_kb_start(const bench_opts_t *opts, const char *tag, const char *const *extra, bench_proc_t *out)
{
    memset(out, 0, sizeof *out);
    if (bench_make_dir(opts, tag, out->dir, sizeof out->dir) != 0)
        return -1;
    char db[600], epfile[600], threads[16], knn_threads[16];
    snprintf(db, sizeof db, "%s/db", out->dir);
    snprintf(epfile, sizeof epfile, "%s/endpoint", out->dir);
    snprintf(out->log, sizeof out->log, "%s/server.log", out->dir);
    snprintf(threads, sizeof threads, "%u", opts->server_threads);
    snprintf(knn_threads, sizeof knn_threads, "%u", opts->knn_threads);
    const char *argv[48];
    int argc = 0;
    argv[argc++] = opts->kb_server;
    argv[argc++] = "--listen";
    argv[argc++] = "tcp://127.0.0.1:*";
    argv[argc++] = "--data";
    argv[argc++] = db;
    argv[argc++] = "--endpoint-file";
    argv[argc++] = epfile;
    argv[argc++] = "--threads";
    argv[argc++] = threads;
    argv[argc++] = "--knn-threads";
    argv[argc++] = knn_threads;
    argv[argc++] = "--log-level";
    argv[argc++] = "warn";
    for (int i = 0; extra && extra[i] && argc < 46; i++)
        argv[argc++] = extra[i];
    for (int i = 0; i < opts->n_server_flags && argc < 46; i++)
        argv[argc++] = opts->server_flags[i];
    argv[argc] = NULL;
    out->pid = bench_spawn(argv, out->log);
    if (out->pid < 0) {
        out->pid = 0;
        return -1;
    }
    int status = 0;
    int waited = carls_wait_first_line(epfile, out->pid, 30000, out->endpoint, sizeof out->endpoint, &status);
    if (waited == 0)
        return 0;
    if (waited == -1) {
        fprintf(stderr, "kb-bench: kb-server exited at start (status %d); log in %s\n", status, out->log);
        out->pid = 0;
        return -1;
    }
    fprintf(stderr, "kb-bench: kb-server did not start in 30 s; log in %s\n", out->log);
    bench_proc_stop(opts, out);
    return -1;
}

static atomic_int s_bad_exits;

int bench_bad_exits(void) { return atomic_load(&s_bad_exits); }

void bench_proc_stop(const bench_opts_t *opts, bench_proc_t *p)
{
    if (p->pid > 0) {
        kill(p->pid, SIGTERM);
        int status = 0;
        double t0 = bench_now(), deadline = t0 + 600.0;
        for (;;) {
            pid_t r = waitpid(p->pid, &status, WNOHANG);
            if (r == p->pid || (r < 0 && errno != EINTR))
                break;
            if (bench_now() > deadline) {
                kill(p->pid, SIGKILL);
                waitpid(p->pid, &status, 0);
                break;
            }
            struct timespec ts = {0, 10 * 1000 * 1000};
            nanosleep(&ts, NULL);
        }
        if (bench_now() - t0 > 10.0)
            bench_progress(opts, "%s took %.0f s to stop", p->endpoint[0] ? p->endpoint : "a child", bench_now() - t0);
        if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
            /* A server that does not stop cleanly (or leaks, under the sanitizers) fails the run. */
            s_bad_exits++;
            fprintf(stderr, "kb-bench: %s did not exit cleanly (status 0x%x; log %s)\n",
                    p->endpoint[0] ? p->endpoint : "child", (unsigned)status, p->log);
        }
        p->pid = 0;
    }
    if (p->dir[0] && !opts->keep_data) {
        char cmd[700];
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", p->dir);
        if (system(cmd) != 0)
            fprintf(stderr, "kb-bench: could not remove %s\n", p->dir);
        p->dir[0] = '\0';
    }
}
