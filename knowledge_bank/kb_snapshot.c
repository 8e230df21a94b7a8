/* Bank snapshots (contract and file layout in kb_snapshot.h). */
#include "kb_snapshot.h"

#include "files.h"
#include "kb_batch.h"
#include "kb_journal.h"
#include "log.h"
#include "protocol.h"
#include "util.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <inttypes.h>
#include <pthread.h>
#include <sqlite3.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define S_MANIFEST "MANIFEST"
#define S_MAGIC_LINE "carls-snapshot 1"
#define S_MAX_MANIFEST_BYTES (4u << 20)
#define S_MAX_FILES 64
#define S_PATH 4096

/* One file of a snapshot, as its manifest lists it. */
typedef struct {
    char path[64]; /* relative to the snapshot's directory: bank.sqlite or journal/<20 digits>.kbj */
    uint64_t size;
    uint32_t crc;
} s_file_t;

struct kb_snapshots {
    kb_bank_t *bank;
    uint32_t shard_index, shard_count;
    pthread_mutex_t mutex;
    pthread_cond_t done_cond; /* a create finished */
    char **taking;            /* names being taken now */
    size_t n_taking, cap_taking;
    struct {                  /* the last creates that finished (a ring): their resends are known */
        uint64_t client_id, sequence;
        char name[KB_SNAPSHOT_MAX_NAME + 1];
    } recent[KB_SNAPSHOT_RECENT];
    size_t n_recent;          /* creates remembered so far (the ring's next slot: n_recent % KB_SNAPSHOT_RECENT) */
};

/* ---- small helpers ---- */

static int s_pathf(char *out, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int s_pathf(char *out, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(out, S_PATH, fmt, ap);
    va_end(ap);
    if (n < 0 || n >= S_PATH)
        CARLS_FATAL("path too long: %s...", out);
    return 0;
}

bool kb_snapshot_name_valid(const char *name)
{
    size_t n = name ? strlen(name) : 0;
    if (n == 0 || n > KB_SNAPSHOT_MAX_NAME || name[0] == '.')
        return false;
    for (size_t i = 0; i < n; i++) {
        char c = name[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-' ||
              c == '.'))
            return false;
    }
    return true;
}

void kb_snapshot_info_free(kb_snapshot_info_t *info)
{
    if (!info)
        return;
    for (size_t i = 0; i < info->n_tables; i++)
        free(info->tables[i]);
    free(info->tables);
    info->tables = NULL;
    info->n_tables = 0;
}

static void s_add_table(kb_snapshot_info_t *info, const char *name)
{
    info->tables = carls_xrealloc(info->tables, (info->n_tables + 1) * sizeof *info->tables);
    info->tables[info->n_tables] = strdup(name);
    if (!info->tables[info->n_tables])
        CARLS_FATAL("out of memory");
    info->n_tables++;
}

static int s_compare_strings(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* Size and CRC-32 of a whole file. 0, or -1 with err. */
static int s_file_crc(const char *path, uint64_t *size, uint32_t *crc, char *err, size_t errlen)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return carls_errorf(err, errlen, -1, "cannot open %s: %s", path, strerror(errno));
    uint8_t *buf = carls_xmalloc(1 << 20);
    uint32_t c = 0;
    uint64_t n = 0;
    size_t got;
    while ((got = fread(buf, 1, 1 << 20, f)) > 0) {
        c = carls_crc32(c, buf, got);
        n += got;
    }
    int rc = ferror(f) ? carls_errorf(err, errlen, -1, "reading %s failed: %s", path, strerror(errno)) : 0;
    fclose(f);
    free(buf);
    *size = n;
    *crc = c;
    return rc;
}

/* Copies src to a new file dst (fsynced), checking that src is `size` bytes with CRC-32 `crc` as it goes.
 * 0, or -1 with err naming the file. */
static int s_copy_checked(const char *src, const char *dst, uint64_t size, uint32_t crc, char *err, size_t errlen)
{
    FILE *in = fopen(src, "rb");
    if (!in)
        return carls_errorf(err, errlen, -1, "cannot open %s: %s", src, strerror(errno));
    FILE *out = fopen(dst, "wbx");
    if (!out) {
        fclose(in);
        return carls_errorf(err, errlen, -1, "cannot create %s: %s", dst, strerror(errno));
    }
    uint8_t *buf = carls_xmalloc(1 << 20);
    uint32_t c = 0;
    uint64_t n = 0;
    size_t got;
    int rc = 0;
    while (rc == 0 && (got = fread(buf, 1, 1 << 20, in)) > 0) {
        c = carls_crc32(c, buf, got);
        n += got;
        if (fwrite(buf, 1, got, out) != got)
            rc = carls_errorf(err, errlen, -1, "writing %s failed: %s", dst, strerror(errno));
    }
    if (rc == 0 && ferror(in))
        rc = carls_errorf(err, errlen, -1, "reading %s failed: %s", src, strerror(errno));
    if (rc == 0 && (n != size || c != crc))
        rc = carls_errorf(err, errlen, -1, "%s changed while it was restored (%" PRIu64 " bytes, CRC-32 %08x; the "
                          "manifest says %" PRIu64 " bytes, %08x)", src, n, c, size, crc);
    if (rc == 0 && (fflush(out) != 0 || fsync(fileno(out)) != 0))
        rc = carls_errorf(err, errlen, -1, "writing %s failed: %s", dst, strerror(errno));
    if (fclose(out) != 0 && rc == 0)
        rc = carls_errorf(err, errlen, -1, "writing %s failed: %s", dst, strerror(errno));
    fclose(in);
    free(buf);
    return rc;
}

static int s_remove_one(const char *path, const struct stat *st, int type, struct FTW *ftw)
{
    (void)st;
    (void)ftw;
    int rc = type == FTW_DP ? rmdir(path) : unlink(path);
    if (rc != 0)
        LOG_WARN("snapshot: cannot remove %s: %s", path, strerror(errno));
    return 0;
}

/* rm -r path (best effort; a missing path is fine). */
static void s_remove_tree(const char *path)
{
    struct stat st;
    if (lstat(path, &st) != 0)
        return;
    nftw(path, s_remove_one, 16, FTW_DEPTH | FTW_PHYS);
}

/* Appends printf output to a growing buffer. */
typedef struct {
    char *text;
    size_t len, cap;
} s_buf_t;

static void s_appendf(s_buf_t *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void s_appendf(s_buf_t *b, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    b->text = carls_grow(b->text, &b->cap, b->len + (size_t)n + 1, 1);
    va_start(ap, fmt);
    vsnprintf(b->text + b->len, (size_t)n + 1, fmt, ap);
    va_end(ap);
    b->len += (size_t)n;
}

/* Sets info->problem (why the snapshot is not valid). */
static void s_problem(kb_snapshot_info_t *info, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void s_problem(kb_snapshot_info_t *info, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(info->problem, sizeof info->problem, fmt, ap);
    va_end(ap);
}

/* ---- manifest ---- */

static void s_manifest_text(const kb_snapshot_info_t *info, const s_file_t *files, size_t n_files, s_buf_t *b)
{
    s_appendf(b, "%s\nname %s\ncreated_ms %" PRId64 "\nshard %u %u\ncut_epoch %" PRIu64 "\ncompacted_epoch %" PRIu64
              "\n", S_MAGIC_LINE, info->name, info->created_ms, info->shard_index, info->shard_count,
              info->cut_epoch, info->compacted_epoch);
    for (size_t i = 0; i < info->n_tables; i++)
        s_appendf(b, "table %s\n", info->tables[i]);
    for (size_t i = 0; i < n_files; i++)
        s_appendf(b, "file %s %" PRIu64 " %08x\n", files[i].path, files[i].size, files[i].crc);
    s_appendf(b, "manifest_crc %08x\n", carls_crc32(0, b->text, b->len));
}

/* A file path a manifest may name: bank.sqlite or journal/<20 digits>.kbj (nothing that leaves the dir). */
static bool s_file_path_ok(const char *p)
{
    if (strcmp(p, "bank.sqlite") == 0)
        return true;
    return strlen(p) == 8 + 20 + 4 && strncmp(p, "journal/", 8) == 0 && strspn(p + 8, "0123456789") == 20 &&
           strcmp(p + 28, ".kbj") == 0;
}

static bool s_u64(const char *text, uint64_t *out)
{
    if (!text || !*text || strspn(text, "0123456789") != strlen(text) || strlen(text) > 19)
        return false;
    *out = strtoull(text, NULL, 10);
    return true;
}

static bool s_hex32(const char *text, uint32_t *out)
{
    if (!text || strlen(text) != 8 || strspn(text, "0123456789abcdef") != 8)
        return false;
    *out = (uint32_t)strtoul(text, NULL, 16);
    return true;
}

/* Parses manifest text (len bytes, untrusted) into info and files. 0, or -1 with the problem in
 * info->problem (naming path and line). */
static int s_parse_manifest(const char *path, char *text, size_t len, kb_snapshot_info_t *info, s_file_t *files,
                            size_t *n_files)
{
    *n_files = 0;
    /* The last line checks everything before it. */
    const char *tail = len >= 22 ? text + len - 22 : NULL;
    uint32_t want = 0;
    char crc_text[9] = "";
    if (!tail || strncmp(tail, "manifest_crc ", 13) != 0 || tail[21] != '\n' || (tail != text && tail[-1] != '\n')) {
        s_problem(info, "%s does not end with its manifest_crc line (cut short?)", path);
        return -1;
    }
    memcpy(crc_text, tail + 13, 8);
    if (!s_hex32(crc_text, &want) || carls_crc32(0, text, (size_t)(tail - text)) != want) {
        s_problem(info, "%s is damaged: its manifest_crc does not match", path);
        return -1;
    }
    char name[KB_SNAPSHOT_MAX_NAME + 1] = "";
    bool seen[6] = {false};
    int line_no = 0;
    char *save = NULL;
    text[tail - text] = '\0';
    for (char *line = strtok_r(text, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
        line_no++;
        char *words[5] = {NULL};
        int nw = 0;
        char *wsave = NULL;
        for (char *w = strtok_r(line, " ", &wsave); w; w = strtok_r(NULL, " ", &wsave)) {
            if (nw < 5)
                words[nw] = w;
            nw++;
        }
        bool ok = nw > 0;
        uint64_t a = 0, b = 0;
        if (!ok) {
        } else if (line_no == 1) {
            ok = nw == 2 && strcmp(words[0], "carls-snapshot") == 0 && strcmp(words[1], "1") == 0;
            seen[0] = ok;
        } else if (strcmp(words[0], "name") == 0 && nw == 2) {
            ok = kb_snapshot_name_valid(words[1]);
            if (ok)
                snprintf(name, sizeof name, "%s", words[1]);
            seen[1] = ok;
        } else if (strcmp(words[0], "created_ms") == 0 && nw == 2) {
            ok = s_u64(words[1], &a) && a <= INT64_MAX;
            info->created_ms = (int64_t)a;
            seen[2] = ok;
        } else if (strcmp(words[0], "shard") == 0 && nw == 3) {
            ok = s_u64(words[1], &a) && s_u64(words[2], &b) && b <= 65536 && (b == 0 ? a == 0 : a < b);
            info->shard_index = (uint32_t)a;
            info->shard_count = (uint32_t)b;
            seen[3] = ok;
        } else if (strcmp(words[0], "cut_epoch") == 0 && nw == 2) {
            ok = s_u64(words[1], &info->cut_epoch);
            seen[4] = ok;
        } else if (strcmp(words[0], "compacted_epoch") == 0 && nw == 2) {
            ok = s_u64(words[1], &info->compacted_epoch);
            seen[5] = ok;
        } else if (strcmp(words[0], "table") == 0 && nw == 2) {
            ok = carls_table_name_valid(words[1]);
            if (ok)
                s_add_table(info, words[1]);
        } else if (strcmp(words[0], "file") == 0 && nw == 4) {
            ok = *n_files < S_MAX_FILES && s_file_path_ok(words[1]) && s_u64(words[2], &a);
            uint32_t crc = 0;
            ok = ok && s_hex32(words[3], &crc);
            if (ok) {
                s_file_t *f = &files[(*n_files)++];
                snprintf(f->path, sizeof f->path, "%s", words[1]);
                f->size = a;
                f->crc = crc;
            }
        } else {
            ok = false;
        }
        if (!ok) {
            s_problem(info, "%s line %d is not understood", path, line_no);
            return -1;
        }
    }
    for (size_t i = 0; i < sizeof seen / sizeof *seen; i++) {
        if (!seen[i]) {
            s_problem(info, "%s lacks one of its lines (name, created_ms, shard, "
                     "cut_epoch, compacted_epoch)", path);
            return -1;
        }
    }
    bool has_store = false;
    for (size_t i = 0; i < *n_files; i++)
        has_store |= strcmp(files[i].path, "bank.sqlite") == 0;
    if (!has_store || info->compacted_epoch > info->cut_epoch) {
        s_problem(info, "%s %s", path,
                 has_store ? "has its compacted epoch past its cut" : "lists no bank.sqlite");
        return -1;
    }
    if (strcmp(name, info->name) != 0) {
        s_problem(info, "%s names snapshot '%s', not '%s'", path, name, info->name);
        return -1;
    }
    return 0;
}

/* Reads and checks snapshot dir's manifest and files into info, files (S_MAX_FILES). */
static void s_check_dir(const char *dir, bool verify, kb_snapshot_info_t *info, s_file_t *files, size_t *n_files)
{
    *n_files = 0;
    char path[S_PATH];
    s_pathf(path, "%s/%s", dir, S_MANIFEST);
    FILE *f = fopen(path, "rb");
    if (!f) {
        s_problem(info, "%s: %s: the snapshot is incomplete (it was being taken "
                 "when the server stopped, or taking it failed)", path, strerror(errno));
        return;
    }
    char *text = carls_xmalloc(S_MAX_MANIFEST_BYTES + 1);
    size_t len = fread(text, 1, S_MAX_MANIFEST_BYTES + 1, f);
    bool bad_read = ferror(f) != 0;
    fclose(f);
    if (bad_read || len > S_MAX_MANIFEST_BYTES) {
        s_problem(info, "%s: %s", path, bad_read ? "cannot be read" : "is too large");
        free(text);
        return;
    }
    text[len] = '\0';
    if (memchr(text, '\0', len)) {
        s_problem(info, "%s is damaged: it holds a NUL byte", path);
        free(text);
        return;
    }
    int rc = s_parse_manifest(path, text, len, info, files, n_files);
    free(text);
    if (rc != 0)
        return;
    qsort(info->tables, info->n_tables, sizeof *info->tables, s_compare_strings);
    info->bytes = 0;
    for (size_t i = 0; i < *n_files; i++) {
        s_pathf(path, "%s/%s", dir, files[i].path);
        struct stat st;
        if (stat(path, &st) != 0) {
            s_problem(info, "%s is missing: %s", path, strerror(errno));
            return;
        }
        if ((uint64_t)st.st_size != files[i].size) {
            s_problem(info, "%s is %lld bytes; the manifest says %" PRIu64 " (damaged)",
                     path, (long long)st.st_size, files[i].size);
            return;
        }
        info->bytes += files[i].size;
        if (!verify)
            continue;
        uint64_t size = 0;
        uint32_t crc = 0;
        char why[512];
        if (s_file_crc(path, &size, &crc, why, sizeof why) != 0) {
            s_problem(info, "%s", why);
            return;
        }
        if (size != files[i].size || crc != files[i].crc) {
            s_problem(info, "%s is damaged: its CRC-32 is %08x, the manifest says %08x",
                     path, crc, files[i].crc);
            return;
        }
    }
    info->valid = true;
}

static int s_check(const char *data_dir, const char *name, bool verify, kb_snapshot_info_t *out, s_file_t *files,
                   size_t *n_files)
{
    memset(out, 0, sizeof *out);
    *n_files = 0;
    if (!kb_snapshot_name_valid(name)) {
        s_problem(out, "'%s' is not a snapshot name (1..%d characters of "
                 "[A-Za-z0-9_.-], not beginning with '.')", name ? name : "", KB_SNAPSHOT_MAX_NAME);
        return KB_SNAPSHOT_EINVAL;
    }
    snprintf(out->name, sizeof out->name, "%s", name);
    char dir[S_PATH];
    s_pathf(dir, "%s/snapshots/%s", data_dir, name);
    struct stat st;
    if (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode)) {
        s_problem(out, "no snapshot '%s' (%s does not exist)", name, dir);
        return KB_SNAPSHOT_ENOTFOUND;
    }
    s_check_dir(dir, verify, out, files, n_files);
    return KB_SNAPSHOT_OK;
}

int kb_snapshot_check(const char *data_dir, const char *name, bool verify, kb_snapshot_info_t *out)
{
    s_file_t files[S_MAX_FILES];
    size_t n;
    return s_check(data_dir, name, verify, out, files, &n);
}

/* ---- taking one ---- */

/* A snapshot being taken. */
typedef struct {
    sqlite3 *src;       /* read connection on the bank's store; its read transaction is the cut */
    char why[512];      /* what failed in the cut callback */
} s_take_t;

/* kb_commit_snapshot_cut's callback: begins the read transaction while no compaction runs, and checks that
 * the store holds exactly epoch `compacted`. */
static int s_begin_read(void *ctx, uint64_t compacted)
{
    s_take_t *t = ctx;
    sqlite3_stmt *st = NULL;
    int rc = sqlite3_exec(t->src, "BEGIN", NULL, NULL, NULL);
    if (rc == SQLITE_OK)
        rc = sqlite3_prepare_v2(t->src, "SELECT v FROM meta WHERE k = 'journal_epoch'", -1, &st, NULL);
    uint64_t epoch = 0;
    if (rc == SQLITE_OK) {
        rc = sqlite3_step(st);
        if (rc == SQLITE_ROW)
            epoch = (uint64_t)sqlite3_column_int64(st, 0);
        rc = rc == SQLITE_ROW || rc == SQLITE_DONE ? SQLITE_OK : rc;
    }
    sqlite3_finalize(st);
    if (rc != SQLITE_OK) {
        snprintf(t->why, sizeof t->why, "reading the store: %s", sqlite3_errmsg(t->src));
        return -1;
    }
    if (epoch != compacted) {
        snprintf(t->why, sizeof t->why, "the store holds epoch %" PRIu64 ", the compactor says %" PRIu64, epoch,
                 compacted);
        return -1;
    }
    return 0;
}

/* The tables in the read transaction's store, as (id, name), into ids/info. */
static int s_store_tables(sqlite3 *src, int64_t **ids, kb_snapshot_info_t *info, char *err, size_t errlen)
{
    sqlite3_stmt *st = NULL;
    int rc = sqlite3_prepare_v2(src, "SELECT id, name FROM tables", -1, &st, NULL);
    while (rc == SQLITE_OK && (rc = sqlite3_step(st)) == SQLITE_ROW) {
        const char *name = (const char *)sqlite3_column_text(st, 1);
        *ids = carls_xrealloc(*ids, (info->n_tables + 1) * sizeof **ids);
        (*ids)[info->n_tables] = sqlite3_column_int64(st, 0);
        s_add_table(info, name ? name : "");
        rc = SQLITE_OK;
    }
    sqlite3_finalize(st);
    if (rc != SQLITE_DONE)
        return carls_errorf(err, errlen, -1, "reading the store's tables: %s", sqlite3_errmsg(src));
    return 0;
}

/* Follows the table creates and drops of the copied journal records. */
typedef struct {
    int64_t *ids;
    kb_snapshot_info_t *info;
} s_tables_t;

static int s_follow_ops(void *ctx, uint64_t epoch, const uint8_t *payload, size_t len)
{
    (void)epoch;
    s_tables_t *t = ctx;
    kb_batch_t b;
    char why[256];
    if (kb_batch_decode(payload, len, &b, why, sizeof why) != 0) {
        LOG_ERROR("snapshot: a copied journal record does not decode: %s", why);
        return -1;
    }
    for (size_t i = 0; i < b.op_count; i++) {
        const kb_table_op_t *op = &b.ops[i];
        for (size_t j = 0; j < t->info->n_tables; j++) {
            if (t->ids[j] == op->id) { /* a drop, or a create reusing an id: the old entry goes */
                free(t->info->tables[j]);
                t->ids[j] = t->ids[t->info->n_tables - 1];
                t->info->tables[j] = t->info->tables[--t->info->n_tables];
                break;
            }
        }
        if (!op->drop) {
            t->ids = carls_xrealloc(t->ids, (t->info->n_tables + 1) * sizeof *t->ids);
            t->ids[t->info->n_tables] = op->id;
            s_add_table(t->info, op->name ? op->name : "");
        }
    }
    kb_batch_free(&b);
    return 0;
}

/* Fault injection for the tests: CARLS_KB_TEST_SNAPSHOT_DELAY_MS pauses before the cut and after it, so
 * that writes run while a snapshot is being taken. */
static void s_test_delay(void)
{
    const char *text = getenv("CARLS_KB_TEST_SNAPSHOT_DELAY_MS");
    int ms = text ? atoi(text) : 0;
    if (ms > 0) {
        struct timespec pause = {ms / 1000, (long)(ms % 1000) * 1000000L};
        nanosleep(&pause, NULL);
    }
}

/* Copies the read transaction's database into path. */
static int s_backup(sqlite3 *src, const char *path, char *err, size_t errlen)
{
    sqlite3 *dst = NULL;
    int rc = sqlite3_open_v2(path, &dst, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_NOMUTEX, NULL);
    if (rc != SQLITE_OK) {
        carls_errorf(err, errlen, -1, "cannot create %s: %s", path, dst ? sqlite3_errmsg(dst) : "out of memory");
        sqlite3_close(dst);
        return -1;
    }
    sqlite3_backup *b = sqlite3_backup_init(dst, "main", src, "main");
    if (!b) {
        carls_errorf(err, errlen, -1, "copying the store into %s: %s", path, sqlite3_errmsg(dst));
        sqlite3_close(dst);
        return -1;
    }
    do {
        rc = sqlite3_backup_step(b, 1024);
        if (rc == SQLITE_BUSY || rc == SQLITE_LOCKED)
            sqlite3_sleep(5);
    } while (rc == SQLITE_OK || rc == SQLITE_BUSY || rc == SQLITE_LOCKED);
    sqlite3_backup_finish(b);
    int result = 0;
    if (rc != SQLITE_DONE)
        result = carls_errorf(err, errlen, -1, "copying the store into %s: %s", path, sqlite3_errstr(rc));
    if (sqlite3_close(dst) != SQLITE_OK && result == 0)
        result = carls_errorf(err, errlen, -1, "closing %s failed", path);
    return result;
}

/* Takes snapshot name into its new directory dir (see kb_snapshot.h); fills out. */
static int s_take(kb_snapshots_t *self, const char *name, const char *dir, kb_snapshot_info_t *out, char *err,
                  size_t errlen)
{
    const char *data_dir = kb_bank_data_dir(self->bank);
    kb_commit_t *commit = kb_bank_commit(self->bank);
    char path[S_PATH];
    s_take_t take = {0};
    int64_t *ids = NULL;
    s_file_t files[2];
    size_t n_files = 0;
    bool cut = false;
    int rc = -1;
    int64_t t0 = carls_monotonic_ms();
    snprintf(out->name, sizeof out->name, "%s", name);
    out->created_ms = carls_wall_ms();
    out->shard_index = self->shard_index;
    out->shard_count = self->shard_count;

    s_pathf(path, "%s/bank.sqlite", data_dir);
    if (sqlite3_open_v2(path, &take.src, SQLITE_OPEN_READONLY | SQLITE_OPEN_NOMUTEX, NULL) != SQLITE_OK) {
        carls_errorf(err, errlen, -1, "cannot open %s: %s", path, take.src ? sqlite3_errmsg(take.src) : "out of memory");
        goto done;
    }
    sqlite3_busy_timeout(take.src, 10000);
    s_test_delay();
    char why[512];
    if (kb_commit_snapshot_cut(commit, s_begin_read, &take, &out->cut_epoch, &out->compacted_epoch, why,
                               sizeof why) != KB_COMMIT_OK) {
        carls_errorf(err, errlen, -1, "%s%s%s", why, take.why[0] ? ": " : "", take.why);
        goto done;
    }
    cut = true;
    s_test_delay();
    s_pathf(path, "%s/bank.sqlite", dir);
    if (s_backup(take.src, path, err, errlen) != 0 || s_store_tables(take.src, &ids, out, err, errlen) != 0)
        goto done;
    sqlite3_exec(take.src, "COMMIT", NULL, NULL, NULL);
    sqlite3_close(take.src);
    take.src = NULL;
    files[n_files++] = (s_file_t){.path = "bank.sqlite"};
    uint64_t records = 0;
    char journal[64];
    if (kb_commit_snapshot_copy_journal(commit, out->compacted_epoch, out->cut_epoch, dir, journal,
                                        sizeof journal, &records, err, errlen) != 0)
        goto done;
    kb_commit_snapshot_end(commit);
    cut = false;
    if (records) {
        snprintf(files[n_files++].path, sizeof files[0].path, "%s", journal);
        s_tables_t follow = {ids, out};
        uint64_t last = 0;
        int frc = kb_journal_replay(dir, out->compacted_epoch, s_follow_ops, &follow, &last, err, errlen);
        ids = follow.ids;
        if (frc != 0)
            goto done;
    }
    qsort(out->tables, out->n_tables, sizeof *out->tables, s_compare_strings);
    for (size_t i = 0; i < n_files; i++) {
        s_pathf(path, "%s/%s", dir, files[i].path);
        if (s_file_crc(path, &files[i].size, &files[i].crc, err, errlen) != 0)
            goto done;
        out->bytes += files[i].size;
    }
    s_buf_t text = {0};
    s_manifest_text(out, files, n_files, &text);
    s_pathf(path, "%s/%s", dir, S_MANIFEST);
    rc = carls_write_file_atomic(path, text.text, text.len, 0600, CARLS_FILE_NO_OVERWRITE, err, errlen);
    free(text.text);
    if (rc != 0)
        goto done;
    s_pathf(path, "%s/snapshots", data_dir);
    if (carls_fsync_dir(path) != 0)
        LOG_WARN("snapshot: fsync of %s failed: %s", path, strerror(errno));
    out->valid = true;
    rc = 0;
    LOG_INFO("snapshot %s: cut at epoch %" PRIu64 " (store at %" PRIu64 " + %" PRIu64 " journal records), %zu "
             "tables, %" PRIu64 " bytes, in %lld ms", name, out->cut_epoch, out->compacted_epoch, records,
             out->n_tables, out->bytes, (long long)(carls_monotonic_ms() - t0));
done:
    if (take.src)
        sqlite3_close(take.src);
    if (cut)
        kb_commit_snapshot_end(commit);
    free(ids);
    if (rc != 0) {
        LOG_ERROR("snapshot %s failed: %s", name, err);
        s_remove_tree(dir);
        kb_snapshot_info_free(out);
        out->valid = false;
    }
    return rc == 0 ? KB_SNAPSHOT_OK : KB_SNAPSHOT_EIO;
}

/* ---- the registry ---- */

/* Removes what interrupted deletes left in <data>/snapshots (a delete renames first, then removes). Only
 * from the operations that write (a read-only server changes no file). */
static void s_remove_leftovers(const char *data_dir)
{
    char dir[S_PATH];
    s_pathf(dir, "%s/snapshots", data_dir);
    DIR *d = opendir(dir);
    struct dirent *e;
    while (d && (e = readdir(d))) {
        /* ".deleting-NAME-PID-N": this process's own are being removed by their delete now. */
        const char *last = strrchr(e->d_name, '-');
        const char *pid = last && last > e->d_name ? memrchr(e->d_name, '-', (size_t)(last - e->d_name)) : NULL;
        bool ours = pid && strtol(pid + 1, NULL, 10) == (long)getpid();
        if (strncmp(e->d_name, ".deleting-", 10) == 0 && !ours) {
            char path[S_PATH];
            s_pathf(path, "%s/%s", dir, e->d_name);
            s_remove_tree(path);
        }
    }
    if (d)
        closedir(d);
}

kb_snapshots_t *kb_snapshots_new(kb_bank_t *bank, uint32_t shard_index, uint32_t shard_count)
{
    kb_snapshots_t *self = carls_xcalloc(1, sizeof *self);
    self->bank = bank;
    self->shard_index = shard_count > 1 ? shard_index : 0;
    self->shard_count = shard_count > 1 ? shard_count : 0;
    pthread_mutex_init(&self->mutex, NULL);
    pthread_cond_init(&self->done_cond, NULL);
    return self;
}

void kb_snapshots_destroy(kb_snapshots_t **self_p)
{
    if (!self_p || !*self_p)
        return;
    kb_snapshots_t *self = *self_p;
    for (size_t i = 0; i < self->n_taking; i++)
        free(self->taking[i]);
    free(self->taking);
    pthread_mutex_destroy(&self->mutex);
    pthread_cond_destroy(&self->done_cond);
    free(self);
    *self_p = NULL;
}

/* Whether name is being taken. Mutex held. */
static bool s_taking(const kb_snapshots_t *self, const char *name)
{
    for (size_t i = 0; i < self->n_taking; i++)
        if (strcmp(self->taking[i], name) == 0)
            return true;
    return false;
}

/* Waits until name is not being taken; true if it was. Mutex held. */
static bool s_wait_taken(kb_snapshots_t *self, const char *name)
{
    bool was = false;
    while (s_taking(self, name)) {
        was = true;
        pthread_cond_wait(&self->done_cond, &self->mutex);
    }
    return was;
}

/* Whether (client_id, sequence) created name before. Mutex held. */
static bool s_recent(const kb_snapshots_t *self, const char *name, uint64_t client_id, uint64_t sequence)
{
    const size_t n = self->n_recent < KB_SNAPSHOT_RECENT ? self->n_recent : KB_SNAPSHOT_RECENT;
    for (size_t i = 0; client_id && sequence && i < n; i++)
        if (self->recent[i].client_id == client_id && self->recent[i].sequence == sequence &&
            strcmp(self->recent[i].name, name) == 0)
            return true;
    return false;
}

int kb_snapshots_create(kb_snapshots_t *self, const char *name, uint64_t client_id, uint64_t sequence,
                        kb_snapshot_info_t *out, char *err, size_t errlen)
{
    memset(out, 0, sizeof *out);
    if (!kb_snapshot_name_valid(name))
        return carls_errorf(err, errlen, KB_SNAPSHOT_EINVAL, "'%s' is not a snapshot name (1..%d characters of "
                            "[A-Za-z0-9_.-], not beginning with '.')", name ? name : "", KB_SNAPSHOT_MAX_NAME);
    const char *data_dir = kb_bank_data_dir(self->bank);
    pthread_mutex_lock(&self->mutex);
    if (s_wait_taken(self, name) || s_recent(self, name, client_id, sequence)) {
        /* A resend of a create that was in progress, or that has finished: answer as it turned out. */
        pthread_mutex_unlock(&self->mutex);
        int rc = kb_snapshot_check(data_dir, name, false, out);
        if (rc == KB_SNAPSHOT_OK && out->valid)
            return KB_SNAPSHOT_OK;
        kb_snapshot_info_free(out);
        return carls_errorf(err, errlen, KB_SNAPSHOT_EIO, "snapshot %s, being taken when this request came, "
                            "failed (the server's log says why)", name);
    }
    s_remove_leftovers(data_dir);
    char dir[S_PATH];
    s_pathf(dir, "%s/snapshots", data_dir);
    int rc = carls_mkdir_p(dir, 0700, err, errlen) == 0 ? KB_SNAPSHOT_OK : KB_SNAPSHOT_EIO;
    s_pathf(dir, "%s/snapshots/%s", data_dir, name);
    if (rc == KB_SNAPSHOT_OK && mkdir(dir, 0700) != 0)
        rc = errno == EEXIST ? carls_errorf(err, errlen, KB_SNAPSHOT_EEXISTS, "snapshot %s exists (%s): delete it "
                                            "first, or pick another name", name, dir)
                             : carls_errorf(err, errlen, KB_SNAPSHOT_EIO, "cannot create %s: %s", dir, strerror(errno));
    if (rc != KB_SNAPSHOT_OK) {
        pthread_mutex_unlock(&self->mutex);
        return rc;
    }
    self->taking = carls_grow(self->taking, &self->cap_taking, self->n_taking + 1, sizeof *self->taking);
    self->taking[self->n_taking] = strdup(name);
    if (!self->taking[self->n_taking])
        CARLS_FATAL("out of memory");
    self->n_taking++;
    pthread_mutex_unlock(&self->mutex);

    rc = s_take(self, name, dir, out, err, errlen);

    pthread_mutex_lock(&self->mutex);
    if (client_id && sequence) {
        size_t slot = self->n_recent++ % KB_SNAPSHOT_RECENT;
        self->recent[slot].client_id = client_id;
        self->recent[slot].sequence = sequence;
        snprintf(self->recent[slot].name, sizeof self->recent[slot].name, "%s", name);
    }
    for (size_t i = 0; i < self->n_taking; i++) {
        if (strcmp(self->taking[i], name) == 0) {
            free(self->taking[i]);
            self->taking[i] = self->taking[--self->n_taking];
            break;
        }
    }
    pthread_cond_broadcast(&self->done_cond);
    pthread_mutex_unlock(&self->mutex);
    return rc;
}

int kb_snapshots_list(kb_snapshots_t *self, bool verify, kb_snapshot_info_t **out, size_t *n, char *err,
                      size_t errlen)
{
    *out = NULL;
    *n = 0;
    const char *data_dir = kb_bank_data_dir(self->bank);
    char dir[S_PATH];
    s_pathf(dir, "%s/snapshots", data_dir);
    DIR *d = opendir(dir);
    if (!d)
        return errno == ENOENT ? KB_SNAPSHOT_OK
                               : carls_errorf(err, errlen, KB_SNAPSHOT_EIO, "cannot read %s: %s", dir, strerror(errno));
    char **names = NULL;
    size_t count = 0, cap = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (!kb_snapshot_name_valid(e->d_name))
            continue; /* ".", "..", what a delete is removing */
        names = carls_grow(names, &cap, count + 1, sizeof *names);
        names[count] = strdup(e->d_name);
        if (!names[count])
            CARLS_FATAL("out of memory");
        count++;
    }
    closedir(d);
    qsort(names, count, sizeof *names, s_compare_strings);
    *out = carls_xcalloc(count + 1, sizeof **out);
    for (size_t i = 0; i < count; i++) {
        pthread_mutex_lock(&self->mutex);
        bool taking = s_taking(self, names[i]);
        pthread_mutex_unlock(&self->mutex);
        if (taking) /* not listed until it is complete */
            continue;
        if (kb_snapshot_check(data_dir, names[i], verify, &(*out)[*n]) == KB_SNAPSHOT_OK)
            (*n)++;
        else
            kb_snapshot_info_free(&(*out)[*n]);
    }
    for (size_t i = 0; i < count; i++)
        free(names[i]);
    free(names);
    return KB_SNAPSHOT_OK;
}

int kb_snapshots_delete(kb_snapshots_t *self, const char *name, kb_snapshot_info_t *out, char *err, size_t errlen)
{
    const char *data_dir = kb_bank_data_dir(self->bank);
    pthread_mutex_lock(&self->mutex);
    s_wait_taken(self, name);
    int rc = kb_snapshot_check(data_dir, name, false, out);
    if (rc != KB_SNAPSHOT_OK) {
        pthread_mutex_unlock(&self->mutex);
        snprintf(err, errlen, "%s", out->problem);
        return rc;
    }
    /* Renamed first, so a crash halfway leaves no half snapshot under its name. */
    static atomic_uint s_counter;
    char dir[S_PATH], doomed[S_PATH];
    s_pathf(dir, "%s/snapshots/%s", data_dir, name);
    s_pathf(doomed, "%s/snapshots/.deleting-%s-%ld-%u", data_dir, name, (long)getpid(),
            atomic_fetch_add(&s_counter, 1));
    if (rename(dir, doomed) != 0) {
        rc = carls_errorf(err, errlen, KB_SNAPSHOT_EIO, "cannot remove %s: %s", dir, strerror(errno));
        pthread_mutex_unlock(&self->mutex);
        kb_snapshot_info_free(out);
        return rc;
    }
    pthread_mutex_unlock(&self->mutex);
    s_remove_tree(doomed);
    s_pathf(dir, "%s/snapshots", data_dir);
    if (carls_fsync_dir(dir) != 0)
        LOG_WARN("snapshot: fsync of %s failed: %s", dir, strerror(errno));
    LOG_INFO("snapshot %s deleted", name);
    return KB_SNAPSHOT_OK;
}

/* ---- restore ---- */

#define S_MARKER "RESTORING"
#define S_STAGING "restore.tmp"

int kb_snapshot_check_interrupted(const char *data_dir, char *err, size_t errlen)
{
    char path[S_PATH], name[KB_SNAPSHOT_MAX_NAME + 1];
    s_pathf(path, "%s/%s", data_dir, S_MARKER);
    if (access(path, F_OK) != 0)
        return 0;
    if (carls_read_first_line(path, name, sizeof name) != 0)
        snprintf(name, sizeof name, "NAME");
    return carls_errorf(err, errlen, -1, "a restore of snapshot %s into %s was interrupted (%s exists): the store "
                        "may be half replaced, so the server will not start on it; run kb-server --restore %s "
                        "again (the snapshot is kept in %s/snapshots/%s)", name, data_dir, path, name, data_dir, name);
}

/* Removes data_dir's store (with its WAL) and journal segments. */
static int s_remove_store(const char *data_dir, char *err, size_t errlen)
{
    static const char *const names[] = {"bank.sqlite-wal", "bank.sqlite-shm", "bank.sqlite-journal", "bank.sqlite"};
    char path[S_PATH];
    for (size_t i = 0; i < sizeof names / sizeof *names; i++) {
        s_pathf(path, "%s/%s", data_dir, names[i]);
        if (unlink(path) != 0 && errno != ENOENT)
            return carls_errorf(err, errlen, -1, "cannot remove %s: %s", path, strerror(errno));
    }
    return kb_journal_remove_all(data_dir, err, errlen);
}

int kb_snapshot_restore(const char *data_dir, const char *name, uint32_t shard_index, uint32_t shard_count,
                        char *err, size_t errlen)
{
    kb_snapshot_info_t info;
    s_file_t files[S_MAX_FILES];
    size_t n_files = 0;
    int rc = s_check(data_dir, name, true, &info, files, &n_files);
    if (rc == KB_SNAPSHOT_OK && !info.valid)
        rc = KB_SNAPSHOT_EIO;
    if (rc != KB_SNAPSHOT_OK) {
        carls_errorf(err, errlen, rc, "cannot restore snapshot %s: %s", name ? name : "", info.problem);
        kb_snapshot_info_free(&info);
        return rc;
    }
    uint32_t count = shard_count > 1 ? shard_count : 0, index = shard_count > 1 ? shard_index : 0;
    if (info.shard_count != count || info.shard_index != index) {
        rc = carls_errorf(err, errlen, KB_SNAPSHOT_EINVAL, "cannot restore snapshot %s: it was taken by shard %u/%u, "
                          "and this server is shard %u/%u (0/0: unsharded)", name, info.shard_index,
                          info.shard_count, index, count);
        kb_snapshot_info_free(&info);
        return rc;
    }
    char marker[S_PATH], staging[S_PATH], src[S_PATH], dst[S_PATH];
    s_pathf(marker, "%s/%s", data_dir, S_MARKER);
    s_pathf(staging, "%s/%s", data_dir, S_STAGING);
    char line[KB_SNAPSHOT_MAX_NAME + 2];
    snprintf(line, sizeof line, "%s\n", name);
    rc = KB_SNAPSHOT_EIO;
    /* A marker left by an interrupted restore stays until a restore completes. */
    bool had_marker = access(marker, F_OK) == 0;
    bool touched = false; /* the data directory's store was changed: the marker must stay on failure */
    s_remove_tree(staging);
    s_pathf(dst, "%s/journal", staging);
    if (carls_mkdir_p(dst, 0700, err, errlen) != 0)
        goto done;
    /* Copies first, checked again as they are read: the data directory is untouched until they are whole. */
    for (size_t i = 0; i < n_files; i++) {
        s_pathf(src, "%s/snapshots/%s/%s", data_dir, name, files[i].path);
        s_pathf(dst, "%s/%s", staging, files[i].path);
        if (s_copy_checked(src, dst, files[i].size, files[i].crc, err, errlen) != 0)
            goto done;
    }
    s_pathf(dst, "%s/journal", staging);
    if (carls_fsync_dir(dst) != 0 || carls_fsync_dir(staging) != 0) {
        carls_errorf(err, errlen, -1, "fsync of %s failed: %s", staging, strerror(errno));
        goto done;
    }
    if (carls_write_file_atomic(marker, line, strlen(line), 0600, 0, err, errlen) != 0)
        goto done;
    /* The WAL goes before the new store comes: an old WAL beside it would be applied to it. */
    touched = true;
    if (s_remove_store(data_dir, err, errlen) != 0)
        goto done;
    s_pathf(dst, "%s/journal", data_dir);
    if (carls_mkdir_p(dst, 0700, err, errlen) != 0)
        goto done;
    for (size_t i = 0; i < n_files; i++) {
        s_pathf(src, "%s/%s", staging, files[i].path);
        s_pathf(dst, "%s/%s", data_dir, files[i].path);
        if (rename(src, dst) != 0) {
            carls_errorf(err, errlen, -1, "cannot move %s to %s: %s", src, dst, strerror(errno));
            goto done;
        }
    }
    s_pathf(dst, "%s/journal", data_dir);
    if (carls_fsync_dir(dst) != 0 || carls_fsync_dir(data_dir) != 0) {
        carls_errorf(err, errlen, -1, "fsync of %s failed: %s", data_dir, strerror(errno));
        goto done;
    }
    s_remove_tree(staging);
    if (unlink(marker) != 0 || carls_fsync_dir(data_dir) != 0) {
        carls_errorf(err, errlen, -1, "cannot remove %s: %s", marker, strerror(errno));
        goto done;
    }
    LOG_INFO("restored snapshot %s (cut epoch %" PRIu64 ", %zu tables, %" PRIu64 " bytes) into %s", name,
             info.cut_epoch, info.n_tables, info.bytes, data_dir);
    rc = KB_SNAPSHOT_OK;
done:
    if (rc != KB_SNAPSHOT_OK && !touched) { /* the old state is whole: no restore to finish */
        s_remove_tree(staging);
        if (!had_marker)
            unlink(marker);
    }
    kb_snapshot_info_free(&info);
    return rc;
}
