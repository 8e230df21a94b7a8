/* Smoke test of kb-bench: it runs (with tiny sizes), exits 0, and reports sane numbers: every JSON line
 * parses, has the required fields, every kb figure is a positive finite number, references are present
 * where they cannot be missing (the ZeroMQ echo, in-process FAISS), ratio = value / reference_value, and
 * every target of issue 18's table is reported (with put.sync's Redis appendfsync-always reference).
 * Never how fast anything is. */
#include <ctype.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sys/wait.h>

#include <cmocka.h>
#include "test_main.h"

#define BENCH CARLS_BIN_DIR "/kb-bench"

/* ---- a parser for one flat JSON object (string, number, true/false/null values) ---- */

#define MAX_FIELDS 32

typedef struct {
    char key[32];
    enum { V_STRING, V_NUMBER, V_BOOL, V_NULL } type;
    char str[256];
    double num;
    bool b;
} field_t;

typedef struct {
    field_t f[MAX_FIELDS];
    int n;
} object_t;

static const char *s_ws(const char *p)
{
    while (*p == ' ' || *p == '\t')
        p++;
    return p;
}

/* A JSON string at p (after the quote) into out; returns the position after the closing quote or NULL. */
static const char *s_string(const char *p, char *out, size_t cap)
{
    size_t n = 0;
    while (*p && *p != '"') {
        char c = *p++;
        if (c == '\\') {
            c = *p++;
            if (c == 'u') {
                for (int i = 0; i < 4; i++)
                    if (!isxdigit((unsigned char)*p++))
                        return NULL;
                c = '?';
            } else if (c != '"' && c != '\\' && c != '/') {
                return NULL;
            }
        } else if ((unsigned char)c < 0x20) {
            return NULL;
        }
        if (n + 1 < cap)
            out[n++] = c;
    }
    out[n] = '\0';
    return *p == '"' ? p + 1 : NULL;
}

static bool s_parse(const char *line, object_t *o)
{
    memset(o, 0, sizeof *o);
    const char *p = s_ws(line);
    if (*p++ != '{')
        return false;
    p = s_ws(p);
    if (*p == '}')
        return true;
    for (;;) {
        if (o->n == MAX_FIELDS || *p++ != '"')
            return false;
        field_t *f = &o->f[o->n++];
        if (!(p = s_string(p, f->key, sizeof f->key)))
            return false;
        p = s_ws(p);
        if (*p++ != ':')
            return false;
        p = s_ws(p);
        if (*p == '"') {
            f->type = V_STRING;
            if (!(p = s_string(p + 1, f->str, sizeof f->str)))
                return false;
        } else if (strncmp(p, "true", 4) == 0 || strncmp(p, "false", 5) == 0) {
            f->type = V_BOOL;
            f->b = *p == 't';
            p += f->b ? 4 : 5;
        } else if (strncmp(p, "null", 4) == 0) {
            f->type = V_NULL;
            p += 4;
        } else {
            char *end;
            f->type = V_NUMBER;
            f->num = strtod(p, &end);
            if (end == p || !isfinite(f->num))
                return false;
            p = end;
        }
        p = s_ws(p);
        if (*p == ',') {
            p = s_ws(p + 1);
            continue;
        }
        if (*p++ != '}')
            return false;
        p = s_ws(p);
        return *p == '\0' || *p == '\n';
    }
}

static const field_t *s_get(const object_t *o, const char *key)
{
    for (int i = 0; i < o->n; i++)
        if (strcmp(o->f[i].key, key) == 0)
            return &o->f[i];
    return NULL;
}

/* ---- running kb-bench ---- */

#define MAX_LINES 256

typedef struct {
    object_t obj[MAX_LINES];
    int n;
    int status;
} run_t;

/* Runs kb-bench with args, parsing stdout as JSON lines when json. */
static void s_run(const char *args, bool json, run_t *run, char *text, size_t text_cap)
{
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "%s %s", BENCH, args);
    FILE *p = popen(cmd, "r");
    assert_non_null(p);
    run->n = 0;
    size_t used = 0;
    char line[4096];
    while (fgets(line, sizeof line, p)) {
        if (text && used + strlen(line) + 1 < text_cap) {
            memcpy(text + used, line, strlen(line) + 1);
            used += strlen(line);
        }
        if (!json)
            continue;
        assert_true(run->n < MAX_LINES);
        if (!s_parse(line, &run->obj[run->n]))
            fail_msg("not a flat JSON object: %s", line);
        run->n++;
    }
    int st = pclose(p);
    run->status = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static const object_t *s_case(const run_t *run, const char *name)
{
    for (int i = 0; i < run->n; i++) {
        const field_t *c = s_get(&run->obj[i], "case");
        if (c && c->type == V_STRING && strcmp(c->str, name) == 0)
            return &run->obj[i];
    }
    return NULL;
}

static double s_num(const object_t *o, const char *key)
{
    const field_t *f = s_get(o, key);
    return f && f->type == V_NUMBER ? f->num : NAN;
}

/* The target a row must carry, as text ("<= 1.5"); its target_met is a bool when the ratio is known and null
 * when a reference is unavailable. */
static void s_check_target(const object_t *o, const char *name, const char *target)
{
    if (!o)
        fail_msg("case %s missing", name);
    const field_t *t = s_get(o, "target"), *tm = s_get(o, "target_met"), *ra = s_get(o, "ratio");
    if (!t || t->type != V_STRING || strcmp(t->str, target) != 0)
        fail_msg("%s: target '%s', want '%s'", name, t ? t->str : "(none)", target);
    assert_non_null(tm);
    assert_int_equal(tm->type, ra->type == V_NUMBER ? V_BOOL : V_NULL);
}

/* Issue 18's table: every figure it sets a target for is reported with that target. */
static void s_check_issue_targets(const run_t *run)
{
    static const struct {
        const char *name, *target;
    } targets[] = {
        {"lookup.p50", "<= 1.5"},   {"lookup.throughput", ">= 1.0"}, {"put.sync", ">= 0.5"},
        {"put.sync.vs_redis", ">= 1.0"}, {"mixed.lookup", ">= 0.5"},  {"push.accepted", ">= 0.5"},
    };
    for (size_t i = 0; i < sizeof targets / sizeof *targets; i++)
        s_check_target(s_case(run, targets[i].name), targets[i].name, targets[i].target);
    /* knn against in-process FAISS, each index (not the .load rows, which have no target) */
    int knn = 0;
    for (int i = 0; i < run->n; i++) {
        const char *name = s_get(&run->obj[i], "case")->str;
        size_t len = strlen(name);
        if (strncmp(name, "knn.", 4) == 0 && !(len > 5 && strcmp(name + len - 5, ".load") == 0)) {
            s_check_target(&run->obj[i], name, ">= 0.8");
            knn++;
        }
    }
    assert_int_equal(knn, 3); /* flat, ivf, hnsw at the smoke size */
}

/* The sync puts against Redis with appendonly yes, appendfsync always: the put.sync figure itself, over a
 * Redis reference (its value when redis-server ran, null with a note saying why when it did not). */
static void s_check_put_sync_vs_redis(const object_t *o, const object_t *put_sync)
{
    assert_non_null(o);
    assert_non_null(put_sync);
    assert_string_equal(s_get(o, "unit")->str, "rows/s");
    assert_true(s_num(o, "value") == s_num(put_sync, "value"));
    const char *ref = s_get(o, "reference")->str;
    assert_non_null(strstr(ref, "redis"));
    assert_non_null(strstr(ref, "appendfsync_always"));
    const field_t *rv = s_get(o, "reference_value");
    if (rv->type == V_NULL)
        assert_non_null(strstr(s_get(o, "note")->str, "unavailable"));
    else
        assert_true(rv->num > 0);
}

static void test_smoke_json(void **state)
{
    (void)state;
    static run_t run; /* large */
    static char out[1 << 18];
    s_run("--smoke --json", true, &run, out, sizeof out);
    if (run.status != 0) {
        /* a failed case says why in its "note"; show every line so a failure in CI can be read */
        fprintf(stderr, "kb-bench --smoke --json exited %d; its output:\n%s", run.status, out);
    }
    assert_int_equal(run.status, 0);
    assert_true(run.n >= 20);

    int steal_numbers = 0;
    for (int i = 0; i < run.n; i++) {
        const object_t *o = &run.obj[i];
        const field_t *c = s_get(o, "case"), *v = s_get(o, "value"), *u = s_get(o, "unit");
        const field_t *ref = s_get(o, "reference"), *rv = s_get(o, "reference_value"), *ra = s_get(o, "ratio");
        assert_non_null(c);
        assert_non_null(v);
        assert_non_null(u);
        assert_non_null(ref);
        assert_non_null(rv);
        assert_non_null(ra);
        assert_int_equal(c->type, V_STRING);
        assert_int_equal(u->type, V_STRING);
        assert_int_equal(ref->type, V_STRING);
        /* every kb figure ran and is positive */
        if (v->type != V_NUMBER || !(v->num > 0))
            fail_msg("%s: value is not a positive number", c->str);
        if (rv->type == V_NUMBER) {
            assert_true(rv->num > 0);
            assert_int_equal(ra->type, V_NUMBER);
            double want = v->num / rv->num;
            if (fabs(ra->num - want) > 1e-3 * want + 1e-6)
                fail_msg("%s: ratio %g, value / reference_value %g", c->str, ra->num, want);
        } else {
            /* only Redis may be missing (redis-server not installed), and then it says so */
            assert_int_equal(rv->type, V_NULL);
            assert_non_null(strstr(ref->str, "redis"));
            assert_non_null(s_get(o, "note"));
        }
        double p50 = s_num(o, "p50_us"), p99 = s_num(o, "p99_us");
        if (isfinite(p50) || isfinite(p99))
            assert_true(p50 > 0 && p99 >= p50);
        const field_t *tm = s_get(o, "target_met");
        if (tm)
            assert_true(tm->type == V_BOOL || tm->type == V_NULL);
        /* CPU steal since the case began: a percentage, or null (no /proc/stat, or no clock tick passed) */
        const field_t *steal = s_get(o, "steal_pct");
        assert_non_null(steal);
        assert_true(steal->type == V_NUMBER || steal->type == V_NULL);
        if (steal->type == V_NUMBER) {
            assert_true(steal->num >= 0.0 && steal->num <= 100.0);
            steal_numbers++;
        }
    }
    if (access("/proc/stat", R_OK) == 0)
        assert_true(steal_numbers > 0);

    static const char *const expected[] = {
        "lookup.p50", "lookup.p99", "lookup.throughput", "lookup.throughput.vs_zmq", "lookup.no_create",
        "lookup.throughput.interval", "push.accepted", "push.applied", "push.accepted.sync", "put.sync",
        "put.sync.vs_redis", "put.sync.16w", "put.interval", "mixed.lookup", "mixed.push", "mixed.put",
        "mixed.lookup.pipelined", "knn.flat.2k", "knn.ivf.2k",
        "knn.hnsw.2k", "knn.flat.2k.load", "shards.1.lookup", "shards.2.lookup", "shards.2.put.sync",
        "rows.1000.lookup", "rows.3000.lookup", "rows.3000.memory",
    };
    for (size_t i = 0; i < sizeof expected / sizeof *expected; i++)
        if (!s_case(&run, expected[i]))
            fail_msg("case %s missing", expected[i]);
    /* references that are always there: the ZeroMQ echo and in-process FAISS */
    assert_true(s_num(s_case(&run, "lookup.p50"), "reference_value") > 0);
    assert_true(s_num(s_case(&run, "push.accepted"), "reference_value") > 0);
    assert_true(s_num(s_case(&run, "knn.hnsw.2k"), "reference_value") > 0);
    assert_true(s_num(s_case(&run, "put.sync"), "reference_value") > 0);
    /* the pipelined trainers' figure is a diagnostic: measured against lookups alone, with no target */
    assert_true(s_num(s_case(&run, "mixed.lookup.pipelined"), "value") > 0);
    assert_null(s_get(s_case(&run, "mixed.lookup.pipelined"), "target_met"));
    assert_non_null(s_get(s_case(&run, "lookup.p50"), "target_met"));
    assert_true(strcmp(s_get(s_case(&run, "lookup.throughput"), "unit")->str, "emb/s") == 0);
    s_check_issue_targets(&run);
    s_check_put_sync_vs_redis(s_case(&run, "put.sync.vs_redis"), s_case(&run, "put.sync"));
}

static void test_table_for_people(void **state)
{
    (void)state;
    static run_t run;
    static char text[1 << 16];
    s_run("--smoke --cases lookup,put --redis-server none 2>/dev/null", false, &run, text, sizeof text);
    assert_int_equal(run.status, 0);
    assert_non_null(strstr(text, "case"));
    assert_non_null(strstr(text, "lookup.throughput"));
    assert_non_null(strstr(text, "zmq.echo"));
    assert_non_null(strstr(text, "redis-server unavailable")); /* Redis off: reported, not a failure */
    assert_non_null(strstr(text, "targets:"));
    assert_null(strstr(text, "knn.")); /* --cases lookup,put */
    /* the Redis reference of sync puts is there, unavailable: its target is n/a */
    const char *row = strstr(text, "\nput.sync.vs_redis ");
    assert_non_null(row);
    const char *eol = strchr(row + 1, '\n');
    assert_non_null(eol);
    char line[512];
    snprintf(line, sizeof line, "%.*s", (int)(eol - row - 1), row + 1);
    assert_non_null(strstr(line, "redis.set.appendfsync_always"));
    assert_non_null(strstr(line, ">= 1.0 n/a"));
    assert_non_null(strstr(line, "redis-server unavailable"));
    /* the summary of targets lists every target of the selected cases */
    const char *summary = strstr(text, "\ntarget ");
    assert_non_null(summary);
    static const char *const summarized[] = {"lookup.p50 ", "lookup.throughput ", "put.sync ", "put.sync.vs_redis "};
    for (size_t i = 0; i < sizeof summarized / sizeof *summarized; i++)
        if (!strstr(summary, summarized[i]))
            fail_msg("target summary lacks %s", summarized[i]);
}

/* --repeat 3: every figure once, as one of its rounds: the ratio printed lies within the spread over the
 * rounds, and the spread says how many rounds had the figure. */
static void test_repeat_reports_median_rounds(void **state)
{
    (void)state;
    static run_t run;
    static char out[1 << 16];
    s_run("--smoke --cases put --redis-server none --repeat 3 --json", true, &run, out, sizeof out);
    if (run.status != 0)
        fprintf(stderr, "kb-bench --repeat 3 exited %d; its output:\n%s", run.status, out);
    assert_int_equal(run.status, 0);
    static const char *const expected[] = {"put.interval", "put.sync", "put.sync.vs_redis", "put.sync.16w"};
    assert_int_equal(run.n, sizeof expected / sizeof *expected); /* each figure once, not once per round */
    for (size_t i = 0; i < sizeof expected / sizeof *expected; i++) {
        const object_t *o = s_case(&run, expected[i]);
        if (!o)
            fail_msg("case %s missing", expected[i]);
        assert_int_equal((int)s_num(o, "of_rounds"), 3);
        assert_int_equal((int)s_num(o, "rounds"), 3);
        double ratio = s_num(o, "ratio");
        if (isfinite(ratio)) {
            double lo = s_num(o, "ratio_min"), hi = s_num(o, "ratio_max");
            if (!(lo <= ratio + 1e-9 && ratio <= hi + 1e-9))
                fail_msg("%s: ratio %g outside its rounds' %g-%g", expected[i], ratio, lo, hi);
        } else { /* no Redis here: the spread is of the value */
            double v = s_num(o, "value"), lo = s_num(o, "value_min"), hi = s_num(o, "value_max");
            if (!(lo <= v && v <= hi))
                fail_msg("%s: value %g outside its rounds' %g-%g", expected[i], v, lo, hi);
        }
    }
}

static void test_usage(void **state)
{
    (void)state;
    static run_t run;
    s_run("--help >/dev/null", false, &run, NULL, 0);
    assert_int_equal(run.status, 0);
    s_run("--no-such-option 2>/dev/null", false, &run, NULL, 0);
    assert_int_equal(run.status, 2);
    s_run("--batch 0 2>/dev/null", false, &run, NULL, 0);
    assert_int_equal(run.status, 2);
    /* A --cases name that is no case is refused, by name, rather than running nothing. */
    char text[1024] = "";
    s_run("--cases lookup,wl.word2vec.pus 2>&1", false, &run, text, sizeof text);
    assert_int_equal(run.status, 2);
    assert_non_null(strstr(text, "--cases: 'wl.word2vec.pus' is none of"));
}

/* A workload case named alone runs alone. */
static void test_one_workload_case(void **state)
{
    (void)state;
    static run_t run;
    static char out[16384];
    s_run("--smoke --cases wl.word2vec.push --redis-server none --json", true, &run, out, sizeof out);
    if (run.status != 0)
        fprintf(stderr, "kb-bench --cases wl.word2vec.push exited %d; its output:\n%s", run.status, out);
    assert_int_equal(run.status, 0);
    assert_int_equal(run.n, 1);
    assert_non_null(s_case(&run, "wl.word2vec.push"));
}

CARLS_TEST_MAIN(
    cmocka_unit_test(test_usage),
    cmocka_unit_test(test_table_for_people),
    cmocka_unit_test(test_smoke_json),
    cmocka_unit_test(test_repeat_reports_median_rounds),
    cmocka_unit_test(test_one_workload_case))
