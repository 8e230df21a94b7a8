/* kbctl's verbs for rows: put, push-grad, get, put-feature, get-feature, knn, sample, and whole tables to and
 * from files, export and import (kbctl_verb.h). Rows are text in and out (kb_rows_text.h). */
#include "kbctl_verb.h"

#include "kb_cluster.h"
#include "kb_export.h"
#include "kb_rows_text.h"
#include "npy.h"
#include "progress.h"
#include "protocol.h"
#include "util.h"

#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define S_DEFAULT_BATCH 1000
#define S_MAX_REPORTED_LINES 20 /* invalid input lines reported before "... and K more" */
#define S_PROGRESS_MIN_ROWS 10000 /* put/push-grad print a final progress line from this many rows on */
#define S_DEFAULT_SCAN_PAGE 1000

static const kbctl_enum_t *const s_strategies = &carls__sample_strategy__descriptor;

/* --batch and --page: rows per request, at most what one request may carry. */
static int s_opt_batch(const kbctl_call_t *call, int i, uint64_t *out)
{
    return kbctl_opt_count(call, i, 1, CARLS_DEFAULT_MAX_KEYS_PER_REQUEST, out);
}

/* ---- tables, keys and batches ------------------------------------------------------------------------ */

/* Looks table `name` up (kind, dim, index) into *info. Exit status (a missing table is a server error). */
static int s_table_info(const kbctl_call_t *call, const char *name, kb_cluster_table_t *info)
{
    int rc = kb_cluster_table(call->c, name, info);
    if (rc == 0)
        return KBCTL_EXIT_OK;
    if (rc == KB_CLIENT_ESTATUS && kb_cluster_last_status(call->c) == CARLS__STATUS_CODE__STATUS_NOT_FOUND) {
        fprintf(stderr, "kbctl %s: no table named \"%s\" on the server\n", call->name, name);
        return KBCTL_EXIT_SERVER;
    }
    return kbctl_fail(call, rc);
}

/* Finds table `name` and returns its dimension in *dim; a feature table is a usage error. Exit status. */
static int s_table_dim(const kbctl_call_t *call, const char *name, uint32_t *dim)
{
    kb_cluster_table_t info;
    int st = s_table_info(call, name, &info);
    if (st != KBCTL_EXIT_OK)
        return st;
    *dim = info.dim;
    if (info.kind != CARLS__TABLE_KIND__TABLE_EMBEDDING || info.dim == 0) {
        fprintf(stderr, "kbctl %s: table \"%s\" has no dimension (not an embedding table)\n", call->name, name);
        return KBCTL_EXIT_USAGE;
    }
    return KBCTL_EXIT_OK;
}

/* Checks that table is a feature table. Exit status. */
static int s_need_feature_table(const kbctl_call_t *call, const char *table)
{
    kb_cluster_table_t info;
    int st = s_table_info(call, table, &info);
    if (st == KBCTL_EXIT_OK && info.kind != CARLS__TABLE_KIND__TABLE_FEATURE) {
        fprintf(stderr, "kbctl %s: table \"%s\" is not a feature table (use get/put for embeddings)\n", call->name,
                table);
        st = KBCTL_EXIT_USAGE;
    }
    return st;
}

/* Opens the connection and finds embedding table `table`'s dimension. Exit status. */
static int s_open_embedding_table(kbctl_call_t *call, const char *table, uint32_t *dim)
{
    int st = kbctl_open(call);
    return st != KBCTL_EXIT_OK ? st : s_table_dim(call, table, dim);
}

/* Opens the connection and checks that `table` is a feature table. Exit status. */
static int s_open_feature_table(kbctl_call_t *call, const char *table)
{
    int st = kbctl_open(call);
    return st != KBCTL_EXIT_OK ? st : s_need_feature_table(call, table);
}

/* ---- keys and rows in, results out ------------------------------------------------------------------- */

/* Adds the key in `text` to keyset; on a bad key prints "WHAT NUMBER: why" (just "WHAT: why" for number 0)
 * and returns -1. */
static int s_add_key_arg(const kbctl_call_t *call, kb_rows_t *keyset, const char *text, const char *what, int number)
{
    char err[256];
    if (kb_rows_parse_key_line(keyset, text, strlen(text), err, sizeof err) == 0)
        return 0;
    if (number > 0)
        fprintf(stderr, "kbctl %s: %s %d: %s\n", call->name, what, number, err);
    else
        fprintf(stderr, "kbctl %s: %s: %s\n", call->name, what, err);
    return -1;
}

/* The keys in texts[0..n) as a new key set; NULL after printing why (keys are numbered from 1 as `what`). */
static kb_rows_t *s_key_args(const kbctl_call_t *call, char **texts, int n, const char *what)
{
    kb_rows_t *keyset = kb_rows_new(0);
    for (int i = 0; i < n; i++) {
        if (s_add_key_arg(call, keyset, texts[i], what, i + 1) != 0) {
            kb_rows_destroy(&keyset);
            return NULL;
        }
    }
    return keyset;
}

/* Reads the keys to act on: the positional arguments from index `first` on, else one per line from stdin.
 * Every key is checked before anything is sent. Returns the set, or NULL after printing why. */
static kb_rows_t *s_read_keys(const kbctl_call_t *call, int first)
{
    if (call->n_pos > first)
        return s_key_args(call, call->pos + first, call->n_pos - first, "key argument");
    kb_rows_t *keyset = kb_rows_new(0);
    if (kb_rows_read(keyset, stdin, stderr, S_MAX_REPORTED_LINES, NULL) != 0) {
        fprintf(stderr, "kbctl %s: invalid keys on stdin; nothing was sent\n", call->name);
        kb_rows_destroy(&keyset);
        return NULL;
    }
    return keyset;
}

/* Reports input on stdin that was refused before anything was sent: `bad` invalid lines (detail, "" or
 * " (...)", says more), or a read error when bad is 0. Returns KBCTL_EXIT_USAGE. */
static int s_refuse_stdin(const kbctl_call_t *call, size_t bad, const char *detail)
{
    if (bad > 0)
        fprintf(stderr, "kbctl %s: %zu invalid line%s on stdin%s; nothing was sent\n", call->name, bad,
                bad == 1 ? "" : "s", detail);
    else
        fprintf(stderr, "kbctl %s: cannot read stdin; nothing was sent\n", call->name);
    return KBCTL_EXIT_USAGE;
}

/* Walks a key set in requests of at most `size` keys: after each s_batch_next, keys[0..n) are the set's keys
 * first..first+n-1. */
typedef struct {
    const kb_rows_t *set;
    size_t size;    /* keys per request */
    kb_key_t *keys; /* room for size keys */
    size_t first, n;
} s_batch_t;

static s_batch_t s_batch_start(const kb_rows_t *set, uint64_t size)
{
    return (s_batch_t){.set = set, .size = (size_t)size, .keys = carls_xmalloc((size_t)size * sizeof(kb_key_t))};
}

/* Moves on to the next batch; false when the set is done. */
static bool s_batch_next(s_batch_t *b)
{
    b->first += b->n;
    size_t left = b->set->n - b->first;
    b->n = left < b->size ? left : b->size;
    for (size_t i = 0; i < b->n; i++)
        b->keys[i] = kb_rows_key(b->set, b->first + i);
    return b->n > 0;
}

static void s_batch_end(s_batch_t *b)
{
    free(b->keys);
    b->keys = NULL;
}

/* Reports that writing batch b of `what` ("rows", "records") failed after the batches before it went
 * through. Exit status. */
static int s_batch_failed(const kbctl_call_t *call, int rc, const s_batch_t *b, const char *what)
{
    fprintf(stderr, "kbctl %s: %s %zu..%zu: %s (%zu of %zu %s were sent before)\n", call->name, what, b->first + 1,
            b->first + b->n, kb_cluster_last_error(call->c), b->first, b->set->n, what);
    return rc == KB_CLIENT_EINVAL ? KBCTL_EXIT_USAGE : KBCTL_EXIT_SERVER;
}

/* Prints KEY<TAB>NUMBER, the number formatted as get formats values; the caller ends the line. */
static void s_print_key_number(const kb_key_t *key, float value)
{
    char num[KB_ROWS_FLOAT_CHARS];
    fwrite(key->data, 1, key->len, stdout);
    kb_rows_format_float(value, num, sizeof num);
    printf("\t%s", num);
}

/* ---- rows: put, push-grad, get ----------------------------------------------------------------------- */

static const char s_put_usage[] =
    "usage: kbctl put TABLE [--version N] [--batch N] < rows\n"
    "       kbctl put TABLE --npy VALUES.npy --keys KEYS.txt [--version N] [--batch N]\n"
    "Writes rows read from stdin, one per line: KEY, a TAB, then dim numbers separated by spaces or TABs.\n"
    "Every line is checked first (dim numbers, all finite, non-empty key); with any invalid line nothing\n"
    "is sent and the exit status is 1. Rows go in batches of --batch (default 1000) rows per request,\n"
    "tagged with --version (default 0). Prints \"put N rows into TABLE\" to stderr.\n"
    "With --npy, the values are a NumPy array of shape (N, dim) (float32, float64 or integers) and the keys\n"
    "the N lines of KEYS.txt (one key a line, the whole line, as `get` reads keys); both files are read and\n"
    "checked whole first (shape, NaN and infinities, key count), errors name the file and the row or line.\n";

static const char s_push_grad_usage[] =
    "usage: kbctl push-grad TABLE [--batch N] [--npy GRADS.npy --keys KEYS.txt] < gradients\n"
    "Pushes gradient rows read from stdin (same format and checks as put, --npy too); each row is one\n"
    "gradient.\n";

enum { W_BATCH, W_NPY, W_KEYS, W_VERSION, W_N };
static const kbctl_opt_t s_put_opts[W_N] = {[W_BATCH] = {"batch", true},
                                        [W_NPY] = {"npy", true},
                                        [W_KEYS] = {"keys", true},
                                        [W_VERSION] = {"version", true}};
static const kbctl_opt_t s_push_grad_opts[W_N - 1] = {
    [W_BATCH] = {"batch", true}, [W_NPY] = {"npy", true}, [W_KEYS] = {"keys", true}}; /* a gradient has no version */

/* Rows from a NumPy file of values and a text file of keys (one a line), both read and checked whole:
 * the array must be (N, dim) (dim 0: any width, which *dim_out receives) without NaN or infinities, the keys
 * file N valid key lines. NULL after printing why, naming the file and the row or line. */
static kb_rows_t *s_npy_rows(const kbctl_call_t *call, const char *npy_path, const char *keys_path, uint32_t dim,
                             uint32_t *dim_out)
{
    FILE *kf = fopen(keys_path, "r");
    if (!kf) {
        fprintf(stderr, "kbctl %s: cannot open %s: %s; nothing was sent\n", call->name, keys_path, strerror(errno));
        return NULL;
    }
    /* One key a line, blank lines included (they would shift every key after them): each line must be a key. */
    kb_rows_t *keys = kb_rows_new(0), *rows = NULL;
    size_t bad = 0, lineno = 0, cap = 0;
    char *line = NULL, why[256];
    ssize_t len;
    while ((len = getline(&line, &cap, kf)) != -1) {
        lineno++;
        if (len > 0 && line[len - 1] == '\n')
            len--;
        if (kb_rows_parse_key_line(keys, line, (size_t)len, why, sizeof why) != 0 && ++bad <= S_MAX_REPORTED_LINES)
            fprintf(stderr, "%s: line %zu: %s\n", keys_path, lineno, why);
    }
    int rc = bad || ferror(kf) ? -1 : 0;
    free(line);
    fclose(kf);
    carls_npy_t a;
    float *x = NULL;
    char err[768];
    if (rc != 0) {
        fprintf(stderr, "kbctl %s: %s: %zu invalid key line%s (above); nothing was sent\n", call->name, keys_path,
                bad, bad == 1 ? "" : "s");
    } else if (carls_npy_read(npy_path, &a, err, sizeof err) != 0) {
        fprintf(stderr, "kbctl %s: %s; nothing was sent\n", call->name, err);
        rc = -1;
    } else {
        if (a.ndim != 2 || a.cols == 0 || a.cols > UINT32_MAX)
            snprintf(err, sizeof err, "%s: values must have shape (N, dim); this is %s(%llu%s)", npy_path,
                     a.ndim == 2 ? "" : "1-d ", (unsigned long long)a.rows, a.ndim == 2 ? ", 0" : ",");
        else if (dim && a.cols != dim)
            snprintf(err, sizeof err, "%s has %llu values a row; the table has dim %u", npy_path,
                     (unsigned long long)a.cols, dim);
        else if (a.rows != keys->n)
            snprintf(err, sizeof err, "%s has %llu rows but %s has %zu keys", npy_path, (unsigned long long)a.rows,
                     keys_path, keys->n);
        else if (carls_npy_to_f32(&a, npy_path, &x, err, sizeof err) == 0)
            err[0] = '\0';
        if (err[0]) {
            fprintf(stderr, "kbctl %s: %s; nothing was sent\n", call->name, err);
            rc = -1;
        } else {
            *dim_out = (uint32_t)a.cols;
            rows = kb_rows_new((uint32_t)a.cols);
            for (size_t i = 0; i < keys->n; i++) {
                kb_key_t k = kb_rows_key(keys, i);
                kb_rows_append(rows, k.data, k.len, x + i * a.cols);
            }
        }
        carls_npy_free(&a);
    }
    free(x);
    kb_rows_destroy(&keys);
    return rows;
}

/* Sends rows to table in batches of `batch` (put with version, or push-grad), showing progress. Exit status. */
static int s_send_rows(kbctl_call_t *call, const char *table, const kb_rows_t *rows, uint64_t batch, bool gradients,
                       uint64_t version)
{
    const uint32_t dim = rows->dim;
    carls_progress_t progress;
    carls_progress_start_units(&progress, gradients ? "push-grad" : "put", (int64_t)rows->n, "rows");
    int st = KBCTL_EXIT_OK;
    s_batch_t b = s_batch_start(rows, batch);
    while (st == KBCTL_EXIT_OK && s_batch_next(&b)) {
        const float *values = rows->values + b.first * dim;
        int rc = gradients ? kb_cluster_push_gradients(call->c, table, b.keys, b.n, dim, values)
                           : kb_cluster_put(call->c, table, b.keys, b.n, dim, values, version);
        if (rc != 0) {
            carls_progress_clear(&progress);
            st = s_batch_failed(call, rc, &b, "rows");
        } else {
            carls_progress_add(&progress, (int64_t)b.n);
        }
    }
    if (st == KBCTL_EXIT_OK && rows->n >= S_PROGRESS_MIN_ROWS)
        carls_progress_finish(&progress, NULL);
    else
        carls_progress_clear(&progress);
    s_batch_end(&b);
    return st;
}

/* put and push-grad: read and check every row (stdin, or --npy and --keys), then send them in batches. */
static int s_write_rows(kbctl_call_t *call, bool gradients)
{
    const char *table = call->pos[0];
    uint64_t batch = S_DEFAULT_BATCH, version = 0;
    if (s_opt_batch(call, W_BATCH, &batch) != 0 ||
        (!gradients && kbctl_opt_count(call, W_VERSION, 0, UINT64_MAX, &version) != 0))
        return KBCTL_EXIT_USAGE;
    const char *npy = call->opt[W_NPY], *keys = call->opt[W_KEYS];
    if ((npy == NULL) != (keys == NULL)) {
        fprintf(stderr, "kbctl %s: --npy VALUES.npy and --keys KEYS.txt go together\n", call->name);
        return KBCTL_EXIT_USAGE;
    }
    uint32_t dim = 0;
    int st = s_open_embedding_table(call, table, &dim);
    if (st != KBCTL_EXIT_OK)
        return st;
    kb_rows_t *rows = NULL;
    if (npy) {
        rows = s_npy_rows(call, npy, keys, dim, &dim);
        if (!rows)
            return KBCTL_EXIT_USAGE;
    } else {
        rows = kb_rows_new(dim);
        size_t bad = 0;
        if (kb_rows_read(rows, stdin, stderr, S_MAX_REPORTED_LINES, &bad) != 0) {
            char detail[CARLS_MAX_TABLE_NAME_BYTES + 48];
            snprintf(detail, sizeof detail, " (table %s has dim %u)", table, dim);
            kb_rows_destroy(&rows);
            return s_refuse_stdin(call, bad, detail);
        }
    }
    st = s_send_rows(call, table, rows, batch, gradients, version);
    size_t n = rows->n;
    if (st == KBCTL_EXIT_OK && gradients)
        fprintf(stderr, "pushed %zu gradient row%s to %s\n", n, n == 1 ? "" : "s", table);
    else if (st == KBCTL_EXIT_OK)
        fprintf(stderr, "put %zu row%s into %s\n", n, n == 1 ? "" : "s", table);
    kb_rows_destroy(&rows);
    return st;
}

static int s_put(kbctl_call_t *call) { return s_write_rows(call, false); }

static int s_push_grad(kbctl_call_t *call) { return s_write_rows(call, true); }

static const char s_get_usage[] =
    "usage: kbctl get TABLE [--meta] [--no-create] [--batch N] [KEY...]\n"
    "Looks up the keys given (or one key per line on stdin when none are given) and prints one line per\n"
    "key: KEY, a TAB, the values separated by single spaces, each as \"%g\" when that reads back to the\n"
    "same float and as \"%.9g\" otherwise, so the printed values read back exactly.\n"
    "  --meta       adds TAB-separated columns: version, updated_at_ms, frequency\n"
    "  --no-create  do not insert unseen keys (they still show their initial value)\n";

/* get's options; get-feature takes the first two (a feature lookup creates nothing). */
enum { GET_META, GET_BATCH, GET_NO_CREATE, GET_N };
static const kbctl_opt_t s_get_opts[GET_N] = {
    [GET_META] = {"meta", false},
    [GET_BATCH] = {"batch", true},
    [GET_NO_CREATE] = {"no-create", false},
};

/* get's lookups: the keys in batches of `batch`, one output line per key. Exit status. */
static int s_get_rows(kbctl_call_t *call, const kb_rows_t *keyset, uint64_t batch, uint32_t dim)
{
    bool meta = call->opt[GET_META] != NULL, no_create = call->opt[GET_NO_CREATE] != NULL;
    float *values = carls_xmalloc((size_t)batch * dim * sizeof *values);
    kb_row_meta_t *metas = meta ? carls_xmalloc((size_t)batch * sizeof *metas) : NULL;
    s_batch_t b = s_batch_start(keyset, batch);
    int st = KBCTL_EXIT_OK;
    while (st == KBCTL_EXIT_OK && s_batch_next(&b)) {
        int rc = kb_cluster_lookup_ex(call->c, call->pos[0], b.keys, b.n, dim, no_create, values, metas);
        if (rc != 0) {
            st = kbctl_fail(call, rc);
            break;
        }
        for (size_t i = 0; i < b.n; i++) {
            kb_rows_write_row(stdout, b.keys[i].data, b.keys[i].len, values + i * dim, dim);
            if (meta)
                printf("\t%llu\t%lld\t%llu", (unsigned long long)metas[i].version,
                       (long long)metas[i].updated_at_ms, (unsigned long long)metas[i].frequency);
            putchar('\n');
        }
    }
    s_batch_end(&b);
    free(values);
    free(metas);
    return st;
}

/* ---- feature records: put-feature, get-feature (and the lookup it shares with get) --------------------- */

static const char s_put_feature_usage[] =
    "usage: kbctl put-feature TABLE [--batch N] < lines\n"
    "Replaces feature records read from stdin, one per line:\n"
    "  KEY<TAB>label=3 confidence=0.9 version=2 neighbors=a:0.5,b:0.25 data=00ff\n"
    "Fields (any order, each optional): label=INT or flabel=FLOAT, confidence=X, version=N,\n"
    "neighbors=KEY:WEIGHT,... and data=HEX. Keys (the line's and the neighbours') are percent-encoded:\n"
    "bytes outside ! .. ~ and each of % , : = are written %XX. updated_at_ms= is accepted and ignored;\n"
    "found=false lines (from get-feature) are skipped. Every line is checked first; with any invalid line\n"
    "nothing is sent. So `kbctl get-feature T ... | kbctl put-feature T2` copies records.\n";

enum { PF_BATCH, PF_N };
static const kbctl_opt_t s_put_feature_opts[PF_N] = {[PF_BATCH] = {"batch", true}};

static int s_put_feature(kbctl_call_t *call)
{
    const char *table = call->pos[0];
    uint64_t batch = S_DEFAULT_BATCH;
    if (s_opt_batch(call, PF_BATCH, &batch) != 0)
        return KBCTL_EXIT_USAGE;
    int st = s_open_feature_table(call, table);
    if (st != KBCTL_EXIT_OK)
        return st;
    kb_feature_rows_t *rows = kb_feature_rows_new();
    size_t bad = 0;
    if (kb_feature_rows_read(rows, stdin, stderr, S_MAX_REPORTED_LINES, &bad) != 0) {
        kb_feature_rows_destroy(&rows);
        return s_refuse_stdin(call, bad, "");
    }
    s_batch_t b = s_batch_start(rows->keys, batch);
    while (st == KBCTL_EXIT_OK && s_batch_next(&b)) {
        int rc = kb_cluster_feature_put(call->c, table, b.keys, b.n,
                                        (const Carls__FeatureRecord *const *)rows->records + b.first);
        if (rc != 0)
            st = s_batch_failed(call, rc, &b, "records");
    }
    if (st == KBCTL_EXIT_OK) {
        size_t n = rows->keys->n;
        fprintf(stderr, "put %zu record%s into %s", n, n == 1 ? "" : "s", table);
        if (rows->skipped)
            fprintf(stderr, " (skipped %zu found=false line%s)", rows->skipped, rows->skipped == 1 ? "" : "s");
        fputc('\n', stderr);
    }
    s_batch_end(&b);
    kb_feature_rows_destroy(&rows);
    return st;
}

static const char s_get_feature_usage[] =
    "usage: kbctl get-feature TABLE [--meta] [--batch N] [KEY...]\n"
    "Prints the records of the keys given (as they are, not encoded), or of one key per line on stdin, in the\n"
    "put-feature line format; a key without a record prints KEY<TAB>found=false. --meta adds\n"
    "updated_at_ms=N (the server's time of the last put).\n";

static const kbctl_opt_t s_get_feature_opts[GET_NO_CREATE] = {[GET_META] = {"meta", false}, [GET_BATCH] = {"batch", true}};

/* get-feature's requests: the keys in batches of `batch`, one output line per key. Exit status. */
static int s_get_records(kbctl_call_t *call, const kb_rows_t *keyset, uint64_t batch)
{
    s_batch_t b = s_batch_start(keyset, batch);
    int st = KBCTL_EXIT_OK;
    while (st == KBCTL_EXIT_OK && s_batch_next(&b)) {
        kb_feature_result_t *res = NULL;
        int rc = kb_cluster_feature_get(call->c, call->pos[0], b.keys, b.n, &res);
        if (rc != 0) {
            st = kbctl_fail(call, rc);
            break;
        }
        for (size_t i = 0; i < b.n; i++) {
            kb_feature_write_line(stdout, b.keys[i].data, b.keys[i].len, res->records[i], call->opt[GET_META] != NULL);
            putchar('\n');
        }
        kb_feature_result_destroy(&res);
    }
    s_batch_end(&b);
    return st;
}

/* get and get-feature: checks every key (the arguments, else stdin) before it looks them up in batches of
 * --batch and prints one line per key. */
static int s_look_up(kbctl_call_t *call, bool feature)
{
    uint64_t batch = S_DEFAULT_BATCH;
    if (s_opt_batch(call, GET_BATCH, &batch) != 0)
        return KBCTL_EXIT_USAGE;
    kb_rows_t *keyset = s_read_keys(call, 1);
    if (!keyset)
        return KBCTL_EXIT_USAGE;
    const char *table = call->pos[0];
    uint32_t dim = 0;
    int st = feature ? s_open_feature_table(call, table) : s_open_embedding_table(call, table, &dim);
    if (st == KBCTL_EXIT_OK)
        st = feature ? s_get_records(call, keyset, batch) : s_get_rows(call, keyset, batch, dim);
    kb_rows_destroy(&keyset);
    return st;
}

static int s_get(kbctl_call_t *call) { return s_look_up(call, false); }

static int s_get_feature(kbctl_call_t *call) { return s_look_up(call, true); }

/* ---- knn, sample ------------------------------------------------------------------------------------- */

/* Parses "v1 v2 ..." (blank-separated finite floats) into a new array of exactly dim values. NULL after
 * printing why. */
static float *s_parse_vector(const char *verb, const char *text, uint32_t dim)
{
    kb_rows_t *row = kb_rows_new(dim);
    /* The row parser reads "KEY<TAB>numbers": give it a dummy key so the same checks apply. */
    size_t len = strlen(text);
    char *line = carls_xmalloc(len + 3);
    line[0] = 'q';
    line[1] = '\t';
    memcpy(line + 2, text, len + 1);
    char err[256];
    float *out = NULL;
    if (kb_rows_parse_line(row, line, len + 2, err, sizeof err) != 0) {
        fprintf(stderr, "kbctl %s: --vector: %s\n", verb, err);
    } else {
        out = carls_xmalloc(dim * sizeof *out);
        memcpy(out, row->values, dim * sizeof *out);
    }
    free(line);
    kb_rows_destroy(&row);
    return out;
}

static const char s_knn_usage[] =
    "usage: kbctl knn TABLE --k K (--key KEY [--exclude-self] | --vector \"v1 v2 ...\")\n"
    "Nearest neighbours (K, default 10, at most 4096) of a key's current value or of a vector of the table's\n"
    "dim, through the table's index: one line per row found, best first, KEY<TAB>SCORE (score formatted as\n"
    "get formats numbers; L2 scores are squared distances, lower is nearer; ip and cosine, higher is nearer).\n"
    "--exclude-self leaves the query key out. With several shards every shard is asked and the answers merged.\n";

enum { KNN_K, KNN_KEY, KNN_EXCLUDE_SELF, KNN_VECTOR, KNN_N };
static const kbctl_opt_t s_knn_opts[KNN_N] = {
    [KNN_K] = {"k", true},
    [KNN_KEY] = {"key", true},
    [KNN_EXCLUDE_SELF] = {"exclude-self", false},
    [KNN_VECTOR] = {"vector", true},
};

/* Asks for the k nearest rows of table to the query: the key in keyset, or the vector in --vector. Exit
 * status. */
static int s_knn_query(kbctl_call_t *call, const kb_rows_t *keyset, uint32_t k, kb_knn_result_t **res)
{
    const char *table = call->pos[0], *vector_text = call->opt[KNN_VECTOR];
    int rc;
    if (vector_text) {
        uint32_t dim;
        int st = s_table_dim(call, table, &dim);
        if (st != KBCTL_EXIT_OK)
            return st;
        float *query = s_parse_vector(call->name, vector_text, dim);
        if (!query)
            return KBCTL_EXIT_USAGE;
        rc = kb_cluster_knn(call->c, table, query, 1, dim, k, res);
        free(query);
    } else {
        kb_key_t key = kb_rows_key(keyset, 0);
        rc = kb_cluster_knn_by_key(call->c, table, &key, 1, k, call->opt[KNN_EXCLUDE_SELF] != NULL, res);
    }
    return rc == 0 ? KBCTL_EXIT_OK : kbctl_fail(call, rc);
}

static int s_knn(kbctl_call_t *call)
{
    const char *key_text = call->opt[KNN_KEY];
    uint64_t k = 10;
    if (kbctl_opt_count(call, KNN_K, 1, CARLS_MAX_KNN_K, &k) != 0)
        return KBCTL_EXIT_USAGE;
    if (!key_text == !call->opt[KNN_VECTOR]) {
        fprintf(stderr, "kbctl %s: give exactly one of --key KEY and --vector \"v1 v2 ...\"\n", call->name);
        return KBCTL_EXIT_USAGE;
    }
    if (call->opt[KNN_EXCLUDE_SELF] && !key_text) {
        fprintf(stderr, "kbctl %s: --exclude-self goes with --key\n", call->name);
        return KBCTL_EXIT_USAGE;
    }
    kb_rows_t *keyset = kb_rows_new(0);
    kb_knn_result_t *res = NULL;
    int st = KBCTL_EXIT_USAGE;
    if (!key_text || s_add_key_arg(call, keyset, key_text, "--key", 0) == 0)
        st = kbctl_open(call);
    if (st == KBCTL_EXIT_OK)
        st = s_knn_query(call, keyset, (uint32_t)k, &res);
    /* Slots past the last row found (fewer rows than k) have empty keys. */
    for (uint32_t r = 0; st == KBCTL_EXIT_OK && r < res->k && res->keys[r].len > 0; r++) {
        s_print_key_number(&res->keys[r], res->scores[r]);
        putchar('\n');
    }
    kb_knn_result_destroy(&res);
    kb_rows_destroy(&keyset);
    return st;
}

static const char s_sample_usage[] =
    "usage: kbctl sample TABLE --n N [--strategy uniform|log-uniform|unigram] [--seed S] [POSITIVE...]\n"
    "Draws N candidates (with replacement; default strategy uniform) and prints the positives first, then the\n"
    "candidates: KEY<TAB>PROBABILITY<TAB>positive|sampled, where PROBABILITY is the chance that one draw picks\n"
    "the key. A seed (not 0) makes the draw repeatable. With several shards the draws are split over the\n"
    "shards by their mass: exact for uniform and unigram, an approximation for log-uniform (ranks are\n"
    "per shard).\n";

enum { SAMPLE_N, SAMPLE_STRATEGY, SAMPLE_SEED, SAMPLE_N_OPTS };
static const kbctl_opt_t s_sample_opts[SAMPLE_N_OPTS] = {
    [SAMPLE_N] = {"n", true},
    [SAMPLE_STRATEGY] = {"strategy", true},
    [SAMPLE_SEED] = {"seed", true},
};

static int s_sample(kbctl_call_t *call)
{
    const char *table = call->pos[0];
    uint64_t n = 0, seed = 0;
    int strategy = CARLS__SAMPLE_STRATEGY__SAMPLE_UNIFORM;
    if (!call->opt[SAMPLE_N]) {
        fprintf(stderr, "kbctl %s: --n is required (candidates to draw; 0 for the positives' probabilities only)\n",
                call->name);
        return KBCTL_EXIT_USAGE;
    }
    if (kbctl_opt_count(call, SAMPLE_N, 0, CARLS_DEFAULT_MAX_KEYS_PER_REQUEST, &n) != 0 ||
        kbctl_opt_choice(call, SAMPLE_STRATEGY, s_strategies, &strategy) != 0 ||
        kbctl_opt_count(call, SAMPLE_SEED, 0, UINT64_MAX, &seed) != 0)
        return KBCTL_EXIT_USAGE;
    /* Positives come from the arguments only (stdin is not read: a sample needs no input). */
    kb_rows_t *positives = s_key_args(call, call->pos + 1, call->n_pos - 1, "positive");
    if (!positives)
        return KBCTL_EXIT_USAGE;
    kb_key_t *keys = carls_xcalloc(positives->n ? positives->n : 1, sizeof *keys);
    for (size_t i = 0; i < positives->n; i++)
        keys[i] = kb_rows_key(positives, i);
    kb_sample_result_t *res = NULL;
    int st = kbctl_open(call);
    if (st == KBCTL_EXIT_OK) {
        int rc = kb_cluster_sample(call->c, table, keys, positives->n, (uint32_t)n, (Carls__SampleStrategy)strategy,
                                   seed, &res);
        st = rc == 0 ? KBCTL_EXIT_OK : kbctl_fail(call, rc);
    }
    for (size_t i = 0; st == KBCTL_EXIT_OK && i < res->n; i++) {
        s_print_key_number(&res->keys[i], res->probabilities[i]);
        printf("\t%s\n", res->is_positive[i] ? "positive" : "sampled");
    }
    kb_sample_result_destroy(&res);
    free(keys);
    kb_rows_destroy(&positives);
    return st;
}

/* ---- export, import ---------------------------------------------------------------------------------- */

/* Exit status for a kb_export_* / kb_import_table failure: the bank's fault or the file's. */
static int s_export_status(int rc)
{
    return rc == KB_EXPORT_EBANK ? KBCTL_EXIT_SERVER : KBCTL_EXIT_USAGE;
}

static const char s_export_usage[] =
    "usage: kbctl export TABLE FILE [--force] [--page N]\n"
    "       kbctl export TABLE VALUES.npy --keys KEYS.txt [--force] [--page N]\n"
    "Writes the table (config and every row of every shard, read with scan pages of N rows, default 1000)\n"
    "to FILE: a self-checking snapshot (magic, version, CRC-32) written to a temporary name, fsynced and\n"
    "renamed, mode 0600 (format 2). It carries every row's whole state: keys, values or feature records,\n"
    "versions, frequencies, updated_at, optimizer state and steps, pending gradients -- what training needs\n"
    "to continue exactly. An existing FILE is replaced only with --force. Each row is read whole under its\n"
    "lock, but a table that is written meanwhile is exported as the scan finds it (not one point in time:\n"
    "export from a --read-only server for that; docs/STATE.md).\n"
    "With a FILE ending in .npy and --keys, an embedding table is written as NumPy instead: the values as\n"
    "float32 (N, dim) and the keys one a line in KEYS.txt, in the same order (what `kbctl import` and\n"
    "`kbctl put --npy` read back); a key holding a newline is refused.\n"
    "Progress goes to stderr: a line with the count and rate on a terminal, log lines otherwise.\n";

enum { EX_FORCE, EX_PAGE, EX_KEYS, EX_N };
static const kbctl_opt_t s_export_opts[EX_N] = {
    [EX_FORCE] = {"force", false}, [EX_PAGE] = {"page", true}, [EX_KEYS] = {"keys", true}};

/* Whether path names a NumPy file (ends in ".npy"). */
static bool s_is_npy(const char *path)
{
    size_t n = strlen(path);
    return n > 4 && strcmp(path + n - 4, ".npy") == 0;
}

static int s_export(kbctl_call_t *call)
{
    const char *table = call->pos[0], *path = call->pos[1];
    uint64_t page = S_DEFAULT_SCAN_PAGE;
    if (s_opt_batch(call, EX_PAGE, &page) != 0)
        return KBCTL_EXIT_USAGE;
    const char *keys = call->opt[EX_KEYS];
    if (keys && !s_is_npy(path)) {
        fprintf(stderr, "kbctl %s: --keys goes with a FILE ending in .npy\n", call->name);
        return KBCTL_EXIT_USAGE;
    }
    if (s_is_npy(path) && !keys) {
        fprintf(stderr, "kbctl %s: a .npy export needs --keys KEYS.txt for the keys\n", call->name);
        return KBCTL_EXIT_USAGE;
    }
    struct stat sb;
    if (!call->opt[EX_FORCE] && (stat(path, &sb) == 0 || (keys && stat(keys, &sb) == 0))) {
        fprintf(stderr, "kbctl %s: %s exists; --force replaces it\n", call->name,
                stat(path, &sb) == 0 ? path : keys);
        return KBCTL_EXIT_USAGE;
    }
    int st = kbctl_open(call);
    if (st != KBCTL_EXIT_OK)
        return st;
    char err[768];
    uint64_t rows = 0;
    carls_progress_t progress = {0};
    int rc = keys ? kb_export_table_npy(call->c, table, path, keys, (uint32_t)page, &rows, &progress, err, sizeof err)
                  : kb_export_table(call->c, table, path, (uint32_t)page, &rows, &progress, err, sizeof err);
    if (rc != 0) {
        if (progress.tty && progress.done > 0)
            fputc('\n', stderr); /* end the progress line */
        fprintf(stderr, "kbctl %s: %s\n", call->name, err);
        return s_export_status(rc);
    }
    fprintf(stderr, "exported %llu row%s of %s to %s%s%s\n", (unsigned long long)rows, rows == 1 ? "" : "s", table,
            path, keys ? " and its keys to " : "", keys ? keys : "");
    return KBCTL_EXIT_OK;
}

static const char s_import_usage[] =
    "usage: kbctl import TABLE FILE [--batch N]\n"
    "Verifies FILE completely (format, sizes, checksum) and refuses it, importing nothing, when anything is\n"
    "wrong; then creates TABLE with the file's config unless it exists with that config, and writes the rows\n"
    "(values with their versions, or feature records) in batches of N routed by the current shard count, so\n"
    "a file exported from one shard imports into three. A format-2 file's rows are restored with their whole\n"
    "state (import_rows: frequencies, optimizer state, pending gradients included), so the table trains on\n"
    "as the exported one would; a format-1 file's rows are put (no optimizer state, frequencies not\n"
    "restored). Existing rows with other keys stay.\n"
    "       kbctl import TABLE VALUES.npy --keys KEYS.txt [--batch N]\n"
    "imports an embedding table from NumPy: values (N, dim) float32, float64 or integers, and the N keys one\n"
    "a line; both files are checked whole first (shape, NaN, key count: errors name the file and the row or\n"
    "line) and nothing is sent when anything is wrong; TABLE is created (dim from the file, the server's\n"
    "defaults) unless it exists with that dim; rows are written at version 0.\n"
    "Progress goes to stderr: a line with the rate and the time left on a terminal, log lines otherwise.\n";

enum { IM_BATCH, IM_KEYS, IM_N };
static const kbctl_opt_t s_import_opts[IM_N] = {[IM_BATCH] = {"batch", true}, [IM_KEYS] = {"keys", true}};

/* import TABLE VALUES.npy --keys KEYS.txt: checked whole, the table created if missing, then put. */
static int s_import_npy(kbctl_call_t *call, const char *table, const char *path, uint64_t batch)
{
    uint32_t dim = 0;
    kb_rows_t *rows = s_npy_rows(call, path, call->opt[IM_KEYS], 0, &dim);
    if (!rows)
        return KBCTL_EXIT_USAGE;
    int st = kbctl_open(call);
    if (st == KBCTL_EXIT_OK) {
        Carls__TableConfig cfg = CARLS__TABLE_CONFIG__INIT;
        cfg.kind = CARLS__TABLE_KIND__TABLE_EMBEDDING;
        cfg.dim = dim;
        int rc = kb_cluster_create_table(call->c, table, &cfg, true);
        if (rc != 0)
            st = kbctl_fail(call, rc);
    }
    uint32_t have = 0;
    if (st == KBCTL_EXIT_OK)
        st = s_table_dim(call, table, &have);
    if (st == KBCTL_EXIT_OK && have != dim) {
        fprintf(stderr, "kbctl %s: table %s has dim %u, %s has %u values a row; nothing was sent\n", call->name,
                table, have, path, dim);
        st = KBCTL_EXIT_USAGE;
    }
    if (st == KBCTL_EXIT_OK)
        st = s_send_rows(call, table, rows, batch, false, 0);
    if (st == KBCTL_EXIT_OK)
        fprintf(stderr, "imported %zu row%s into %s from %s\n", rows->n, rows->n == 1 ? "" : "s", table, path);
    kb_rows_destroy(&rows);
    return st;
}

static int s_import(kbctl_call_t *call)
{
    const char *table = call->pos[0], *path = call->pos[1];
    uint64_t batch = S_DEFAULT_BATCH;
    if (s_opt_batch(call, IM_BATCH, &batch) != 0)
        return KBCTL_EXIT_USAGE;
    if (s_is_npy(path) != (call->opt[IM_KEYS] != NULL)) {
        fprintf(stderr, "kbctl %s: a FILE ending in .npy and --keys KEYS.txt go together\n", call->name);
        return KBCTL_EXIT_USAGE;
    }
    if (s_is_npy(path))
        return s_import_npy(call, table, path, batch);
    char err[768];
    /* Verified here first as well, so a bad file is refused before any connection is opened. */
    kb_export_reader_t *r = NULL;
    int rc = kb_export_reader_open(path, &r, err, sizeof err);
    if (rc != 0) {
        fprintf(stderr, "kbctl %s: refusing %s: %s; nothing was imported\n", call->name, path, err);
        return KBCTL_EXIT_USAGE;
    }
    char from[CARLS_MAX_TABLE_NAME_BYTES + 1];
    snprintf(from, sizeof from, "%s", kb_export_reader_table(r));
    uint64_t in_file = kb_export_reader_rows(r);
    kb_export_reader_destroy(&r);
    int st = kbctl_open(call);
    if (st != KBCTL_EXIT_OK)
        return st;
    uint64_t rows = 0;
    carls_progress_t progress = {0};
    rc = kb_import_table(call->c, table, path, (size_t)batch, &rows, &progress, err, sizeof err);
    if (rc != 0) {
        if (progress.tty && progress.done > 0)
            fputc('\n', stderr); /* end the progress line */
        fprintf(stderr, "kbctl %s: %s (%llu of %llu rows were imported)\n", call->name, err, (unsigned long long)rows,
                (unsigned long long)in_file);
        return s_export_status(rc);
    }
    fprintf(stderr, "imported %llu row%s into %s (exported from table %s)\n", (unsigned long long)rows,
            rows == 1 ? "" : "s", table, from);
    return KBCTL_EXIT_OK;
}

/* ---- the verbs ---- */

const kbctl_verb_t kbctl_verb_put = {"put", s_put_usage, s_put_opts, KBCTL_COUNT(s_put_opts), 1, 1, true, s_put};
const kbctl_verb_t kbctl_verb_push_grad = {"push-grad", s_push_grad_usage, s_push_grad_opts, KBCTL_COUNT(s_push_grad_opts), 1, 1, true, s_push_grad};
const kbctl_verb_t kbctl_verb_get = {"get", s_get_usage, s_get_opts, KBCTL_COUNT(s_get_opts), 1, -1, true, s_get};
const kbctl_verb_t kbctl_verb_knn = {"knn", s_knn_usage, s_knn_opts, KBCTL_COUNT(s_knn_opts), 1, 1, true, s_knn};
const kbctl_verb_t kbctl_verb_sample = {"sample", s_sample_usage, s_sample_opts, KBCTL_COUNT(s_sample_opts), 1, -1, true, s_sample};
const kbctl_verb_t kbctl_verb_put_feature = {"put-feature", s_put_feature_usage, s_put_feature_opts, KBCTL_COUNT(s_put_feature_opts), 1, 1, true, s_put_feature};
const kbctl_verb_t kbctl_verb_get_feature = {"get-feature", s_get_feature_usage, s_get_feature_opts, KBCTL_COUNT(s_get_feature_opts), 1, -1, true, s_get_feature};
const kbctl_verb_t kbctl_verb_export = {"export", s_export_usage, s_export_opts, KBCTL_COUNT(s_export_opts), 2, 2, true, s_export};
const kbctl_verb_t kbctl_verb_import = {"import", s_import_usage, s_import_opts, KBCTL_COUNT(s_import_opts), 2, 2, true, s_import};
