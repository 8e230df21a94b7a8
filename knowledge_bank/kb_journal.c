#include "kb_journal.h"

#include "bytes.h"
#include "files.h"
#include "log.h"
#include "util.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#define MAGIC 0x314a424bu /* "KBJ1" read as little-endian bytes */
#define HEADER_BYTES 20
#define SUFFIX ".kbj"
#define RECYCLED_SUFFIX ".kbr" /* a segment written over a spare: stale records of its earlier life follow the log */
#define SPARE_PREFIX "spare-"
#define SPARE_SUFFIX ".kbs"
#define MAX_SPARES 2

typedef struct {
    char *path;
    uint64_t last_epoch;
    uint64_t bytes;      /* of records */
    uint64_t file_bytes; /* the file's size when it was a spare (0 for a new file): bytes to truncate at close */
} s_segment_t;

struct kb_journal {
    char *dir; /* <data dir>/journal */
    bool sync;
    uint64_t segment_bytes; /* a segment is closed once it holds this many bytes */
    pthread_mutex_t mutex;
    int fd;                /* the open segment, or -1 before the first append after a rotation */
    s_segment_t current;   /* the open segment (path NULL when none) */
    s_segment_t *closed;   /* closed segments, oldest first */
    size_t closed_count, closed_cap;
    uint64_t bytes;        /* in every segment not removed */
    char broken[512];      /* set after a failed append: every later append fails with it */
    int holds;             /* kb_journal_hold: while > 0, kb_journal_release removes nothing */
    char *spares[MAX_SPARES]; /* sync only: released segments kept for reuse (paths) */
    size_t spare_count;
};

/* A record's checksum: CRC-32 of its epoch (the header's bytes 8..16) and its payload. */
static uint32_t s_record_crc(const uint8_t *header, const void *payload, size_t len)
{
    return carls_crc32(carls_crc32(0, header + 8, 8), payload, len);
}

static char *s_join(const char *dir, const char *name)
{
    size_t n = strlen(dir) + strlen(name) + 2;
    char *path = carls_xmalloc(n);
    snprintf(path, n, "%s/%s", dir, name);
    return path;
}

static char *s_journal_dir(const char *data_dir) { return s_join(data_dir, "journal"); }



static bool s_is_segment(const char *name)
{
    size_t n = strlen(name);
    return n == 20 + strlen(SUFFIX) && (strcmp(name + 20, SUFFIX) == 0 || strcmp(name + 20, RECYCLED_SUFFIX) == 0) &&
           strspn(name, "0123456789") == 20;
}

static bool s_is_spare(const char *name)
{
    size_t n = strlen(name), p = strlen(SPARE_PREFIX), x = strlen(SPARE_SUFFIX);
    return n > p + x && strncmp(name, SPARE_PREFIX, p) == 0 && strcmp(name + n - x, SPARE_SUFFIX) == 0;
}

static int s_compare_names(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* The names in dir that `want` accepts, sorted (segments: oldest first); *out malloc'd, each name too. -1 if
 * dir cannot be read (a missing directory is no journal: 0 names). */
static int s_list(const char *dir, bool (*want)(const char *name), char ***out, size_t *count, char *err,
                  size_t errlen)
{
    *out = NULL;
    *count = 0;
    DIR *d = opendir(dir);
    if (!d) {
        if (errno == ENOENT)
            return 0;
        return carls_errorf(err, errlen, -1, "journal: cannot read %s: %s", dir, strerror(errno));
    }
    size_t cap = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (!want(e->d_name))
            continue;
        *out = carls_grow(*out, &cap, *count + 1, sizeof **out);
        (*out)[(*count)++] = strdup(e->d_name);
        if (!(*out)[*count - 1])
            CARLS_FATAL("out of memory");
    }
    closedir(d);
    if (*count > 1)
        qsort(*out, *count, sizeof **out, s_compare_names);
    return 0;
}

static void s_free_names(char **names, size_t n)
{
    for (size_t i = 0; i < n; i++)
        free(names[i]);
    free(names);
}

/* Removes the files of dir that `want` accepts (the directory is not fsynced). Returns how many there were,
 * or -1 with err. */
static int s_remove_listed(const char *dir, bool (*want)(const char *name), char *err, size_t errlen)
{
    char **names;
    size_t n;
    int rc = s_list(dir, want, &names, &n, err, errlen);
    for (size_t i = 0; rc == 0 && i < n; i++) {
        char *path = s_join(dir, names[i]);
        if (unlink(path) != 0)
            rc = carls_errorf(err, errlen, -1, "journal: cannot remove %s: %s", path, strerror(errno));
        free(path);
    }
    s_free_names(names, n);
    return rc == 0 ? (int)n : -1;
}

/* fsyncs the journal directory, after files were removed from it. */
static void s_fsync_dir(const char *dir)
{
    if (carls_fsync_dir(dir) != 0)
        LOG_WARN("journal: fsync of %s failed: %s", dir, strerror(errno));
}

int kb_journal_open(const char *data_dir, bool sync, uint64_t segment_bytes, kb_journal_t **out, char *err,
                    size_t errlen)
{
    *out = NULL;
    char *dir = s_journal_dir(data_dir);
    /* Spares belong to the run that made them: records of a spare from an earlier run could carry epochs this
     * run reaches again. */
    if (carls_mkdir_p(dir, 0700, err, errlen) != 0 || s_remove_listed(dir, s_is_spare, err, errlen) < 0) {
        free(dir);
        return -1;
    }
    kb_journal_t *self = carls_xcalloc(1, sizeof *self);
    self->dir = dir;
    self->sync = sync;
    self->segment_bytes = segment_bytes ? segment_bytes : KB_JOURNAL_SEGMENT_BYTES;
    self->fd = -1;
    pthread_mutex_init(&self->mutex, NULL);
    *out = self;
    return 0;
}

void kb_journal_close(kb_journal_t **self_p)
{
    if (!self_p || !*self_p)
        return;
    kb_journal_t *self = *self_p;
    if (self->fd >= 0)
        close(self->fd);
    free(self->current.path);
    for (size_t i = 0; i < self->closed_count; i++)
        free(self->closed[i].path);
    free(self->closed);
    for (size_t i = 0; i < self->spare_count; i++)
        free(self->spares[i]);
    free(self->dir);
    pthread_mutex_destroy(&self->mutex);
    free(self);
    *self_p = NULL;
}

/* Makes a spare the segment `path` (a rename: its blocks are reused, so appends overwrite in place and an
 * fdatasync need not update the file's size and block map, which costs about as much as the data on ext4).
 * Returns the open descriptor with *file_bytes its size, or -1 (no spare, or it could not be used). */
static int s_take_spare(kb_journal_t *self, const char *path, uint64_t *file_bytes)
{
    while (self->spare_count > 0) {
        char *spare = self->spares[--self->spare_count];
        int fd = rename(spare, path) == 0 ? open(path, O_WRONLY | O_CLOEXEC) : -1;
        struct stat st;
        if (fd >= 0 && fstat(fd, &st) == 0) {
            free(spare);
            *file_bytes = (uint64_t)st.st_size;
            return fd;
        }
        LOG_WARN("journal: cannot reuse %s: %s", spare, strerror(errno));
        if (fd >= 0)
            close(fd);
        unlink(spare);
        unlink(path);
        free(spare);
    }
    return -1;
}

/* Starts a new segment named by its first epoch, over a spare when there is one (sync mode); the directory
 * is fsynced so the file itself survives. */
static int s_begin_segment(kb_journal_t *self, uint64_t epoch, char *err, size_t errlen)
{
    char name[64];
    snprintf(name, sizeof name, "%020" PRIu64 RECYCLED_SUFFIX, epoch);
    char *path = s_join(self->dir, name);
    uint64_t file_bytes = 0;
    int fd = s_take_spare(self, path, &file_bytes);
    if (fd < 0) {
        snprintf(name, sizeof name, "%020" PRIu64 SUFFIX, epoch);
        free(path);
        path = s_join(self->dir, name);
        fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    }
    if (fd < 0 || carls_fsync_dir_of(path) != 0) {
        int e = errno;
        snprintf(err, errlen, "journal: cannot create %s: %s", path, strerror(e));
        if (fd >= 0)
            close(fd);
        free(path);
        return -1;
    }
    self->fd = fd;
    self->current = (s_segment_t){.path = path, .last_epoch = 0, .bytes = 0, .file_bytes = file_bytes};
    return 0;
}

/* Marks the journal broken after a failed write or sync: nothing more is acknowledged. */
static void s_break(kb_journal_t *self, const char *path, int e)
{
    snprintf(self->broken, sizeof self->broken, "journal: writing %s failed: %s (no write is acknowledged "
             "from now on; restart the server once the disk is fixed)", path, strerror(e));
    LOG_ERROR("%s", self->broken);
}

/* Closes the open segment and keeps it on the list for kb_journal_release. A segment written over a spare is
 * cut to its records first, and the cut made durable before the next segment exists: only the last segment
 * may hold stale bytes after its records. */
static void s_close_segment(kb_journal_t *self)
{
    if (self->current.file_bytes > self->current.bytes &&
        (ftruncate(self->fd, (off_t)self->current.bytes) != 0 || fsync(self->fd) != 0))
        s_break(self, self->current.path, errno);
    close(self->fd);
    self->fd = -1;
    self->closed = carls_grow(self->closed, &self->closed_cap, self->closed_count + 1, sizeof *self->closed);
    self->closed[self->closed_count++] = self->current;
    self->current = (s_segment_t){0};
}

static int s_write_all(int fd, struct iovec *iov, int n, uint64_t at)
{
    while (n > 0) {
        ssize_t w = pwritev(fd, iov, n, (off_t)at);
        if (w < 0) {
            if (errno == EINTR)
                continue;
            return -1;
        }
        at += (uint64_t)w;
        while (n > 0 && (size_t)w >= iov->iov_len) {
            w -= (ssize_t)iov->iov_len;
            iov++;
            n--;
        }
        if (n > 0) {
            iov->iov_base = (char *)iov->iov_base + w;
            iov->iov_len -= (size_t)w;
        }
    }
    return 0;
}

bool kb_journal_is_broken(kb_journal_t *self)
{
    pthread_mutex_lock(&self->mutex);
    bool broken = self->broken[0] != '\0';
    pthread_mutex_unlock(&self->mutex);
    return broken;
}

uint32_t kb_journal_crc(uint64_t epoch, const void *payload, size_t len)
{
    uint8_t header[HEADER_BYTES] = {0};
    carls_put_le64(header + 8, epoch);
    return s_record_crc(header, payload, len);
}

int kb_journal_append(kb_journal_t *self, uint64_t epoch, const void *payload, size_t len, char *err,
                      size_t errlen)
{
    return kb_journal_append_crc(self, epoch, payload, len, kb_journal_crc(epoch, payload, len), err, errlen);
}

int kb_journal_append_crc(kb_journal_t *self, uint64_t epoch, const void *payload, size_t len, uint32_t crc,
                          char *err, size_t errlen)
{
    if (len > UINT32_MAX)
        return carls_errorf(err, errlen, -1, "journal: an epoch of %zu bytes is larger than a record can be", len);
    pthread_mutex_lock(&self->mutex);
    int rc = -1;
    if (self->broken[0]) {
        snprintf(err, errlen, "%s", self->broken);
        goto done;
    }
    if (self->fd < 0 && s_begin_segment(self, epoch, err, errlen) != 0)
        goto done;
    uint8_t header[HEADER_BYTES];
    carls_put_le32(header, MAGIC);
    carls_put_le32(header + 4, (uint32_t)len);
    carls_put_le64(header + 8, epoch);
    carls_put_le32(header + 16, crc);
    struct iovec iov[2] = {{header, HEADER_BYTES}, {(void *)payload, len}};
    if (s_write_all(self->fd, iov, len ? 2 : 1, self->current.bytes) != 0 ||
        (self->sync && fdatasync(self->fd) != 0)) {
        /* After a failed write or fdatasync the file's state is unknown (Linux may drop the dirty pages of
         * a failed fsync): nothing more is acknowledged. The torn record, if any, is at the end of the last
         * segment, where replay stops. */
        s_break(self, self->current.path, errno);
        snprintf(err, errlen, "%s", self->broken);
        goto done;
    }
    self->current.last_epoch = epoch;
    self->current.bytes += HEADER_BYTES + len;
    self->bytes += HEADER_BYTES + len;
    if (self->current.bytes >= self->segment_bytes)
        s_close_segment(self); /* the record is durable: a failed cut only breaks later appends */
    rc = 0;
done:
    pthread_mutex_unlock(&self->mutex);
    return rc;
}

/* Sync mode: keeps a compacted segment as a spare for a later one (s_take_spare) instead of removing it, while
 * there are fewer than MAX_SPARES. Whether it did. */
static bool s_keep_spare(kb_journal_t *self, const s_segment_t *seg)
{
    if (!self->sync || self->spare_count >= MAX_SPARES)
        return false;
    char name[64];
    snprintf(name, sizeof name, SPARE_PREFIX "%020" PRIu64 SPARE_SUFFIX, seg->last_epoch);
    char *spare = s_join(self->dir, name);
    if (rename(seg->path, spare) != 0) {
        free(spare);
        return false;
    }
    self->spares[self->spare_count++] = spare;
    return true;
}

void kb_journal_release(kb_journal_t *self, uint64_t upto)
{
    pthread_mutex_lock(&self->mutex);
    if (self->holds > 0) { /* a snapshot copies segments (kb_journal_copy): they stay until it is done */
        pthread_mutex_unlock(&self->mutex);
        return;
    }
    size_t kept = 0;
    bool removed = false;
    for (size_t i = 0; i < self->closed_count; i++) {
        s_segment_t *seg = &self->closed[i];
        if (seg->last_epoch <= upto && (s_keep_spare(self, seg) || unlink(seg->path) == 0)) {
            self->bytes -= seg->bytes;
            removed = true;
            free(seg->path);
        } else {
            self->closed[kept++] = *seg;
        }
    }
    self->closed_count = kept;
    if (removed)
        s_fsync_dir(self->dir);
    pthread_mutex_unlock(&self->mutex);
}

uint64_t kb_journal_bytes(kb_journal_t *self)
{
    pthread_mutex_lock(&self->mutex);
    uint64_t bytes = self->bytes;
    pthread_mutex_unlock(&self->mutex);
    return bytes;
}

/* ---- replay ---- */


/* Whether a whole record of this life (epoch >= first and > seen, checksum right) starts anywhere in
 * buf[from, size): then a bad record before it is damage, not the end of the log. */
static bool s_record_follows(const uint8_t *buf, uint64_t size, uint64_t from, uint64_t first, uint64_t seen)
{
    for (uint64_t at = from; at + HEADER_BYTES <= size; at++) {
        if (carls_get_le32(buf + at) != MAGIC)
            continue;
        uint32_t len = carls_get_le32(buf + at + 4);
        uint64_t epoch = carls_get_le64(buf + at + 8);
        if (epoch < first || epoch <= seen || len > size - at - HEADER_BYTES)
            continue;
        if (s_record_crc(buf + at, buf + at + HEADER_BYTES, len) == carls_get_le32(buf + at + 16))
            return true;
    }
    return false;
}

/* The rest of file f from byte `from` to `size`, read whole (a segment is at most a few tens of MiB). NULL on
 * error. */
static uint8_t *s_read_rest(FILE *f, uint64_t from, uint64_t size)
{
    uint8_t *buf = carls_xmalloc(size - from ? size - from : 1);
    if (fseeko(f, (off_t)from, SEEK_SET) != 0 || fread(buf, 1, size - from, f) != size - from) {
        free(buf);
        return NULL;
    }
    return buf;
}



/* Replays one segment. last: whether it is the newest (a torn record there ends the journal). first: the
 * epoch in its name; recycled: written over a spare, so stale records of the file's earlier life (older
 * epochs) may follow its own. */
static int s_replay_segment(const char *path, bool last, uint64_t first, bool recycled, uint64_t after,
                            kb_journal_record_fn fn, void *ctx, uint64_t *seen, char *err, size_t errlen)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return carls_errorf(err, errlen, -1, "journal: cannot open %s: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fileno(f), &st) != 0) {
        fclose(f);
        return carls_errorf(err, errlen, -1, "journal: cannot stat %s: %s", path, strerror(errno));
    }
    uint64_t size = (uint64_t)st.st_size, at = 0, torn_len = 0;
    uint8_t *payload = NULL;
    int rc = 0;
    const char *problem = NULL;
    while (at < size) {
        uint8_t header[HEADER_BYTES];
        if (size - at < HEADER_BYTES || fread(header, 1, HEADER_BYTES, f) != HEADER_BYTES) {
            problem = "a record header is cut short";
            break;
        }
        uint32_t len = carls_get_le32(header + 4);
        uint64_t epoch = carls_get_le64(header + 8);
        torn_len = len;
        if (carls_get_le32(header) != MAGIC) {
            problem = "a record does not begin with the journal's magic number";
            break;
        }
        if (len > size - at - HEADER_BYTES) {
            problem = "a record is cut short";
            break;
        }
        free(payload);
        payload = carls_xmalloc(len ? len : 1);
        if (fread(payload, 1, len, f) != len) {
            problem = "a record is cut short";
            break;
        }
        if (s_record_crc(header, payload, len) != carls_get_le32(header + 16)) {
            problem = "a record's checksum does not match";
            break;
        }
        if (epoch <= *seen || epoch < first) {
            problem = "epochs go backwards";
            break;
        }
        *seen = epoch;
        if (epoch > after) {
            rc = fn(ctx, epoch, payload, len);
            if (rc != 0) {
                snprintf(err, errlen, "journal: replaying the record of epoch %" PRIu64 " at byte %" PRIu64 " of %s failed",
                         epoch, at, path);
                break;
            }
        }
        at += HEADER_BYTES + len;
    }
    free(payload);
    /* A crash tears at most the record being appended, which is then the last thing in the file (in a
     * recycled segment, the last thing of this life: no record of it follows): a bad record with more of
     * this life after it is damage to acknowledged data, wherever it is. */
    bool at_end = problem && (size - at < HEADER_BYTES || at + HEADER_BYTES + torn_len >= size);
    if (problem && recycled && rc == 0) {
        uint8_t *rest = s_read_rest(f, at, size);
        if (!rest)
            rc = carls_errorf(err, errlen, -1, "journal: cannot read %s: %s", path, strerror(errno));
        at_end = rest && !s_record_follows(rest, size - at, 1, first, *seen); /* after the bad record's start */
        free(rest);
    }
    fclose(f);
    if (rc != 0)
        return -1;
    if (problem && last && at_end && recycled) {
        /* What follows is the file's earlier life, and perhaps an append a crash tore (never acknowledged). */
        LOG_INFO("journal: %s: its records end at byte %" PRIu64 " (the %" PRIu64 " bytes after them are an "
                 "earlier segment's, or an append a crash interrupted)", path, at, size - at);
        return 0;
    }
    if (problem && last && at_end) {
        /* The append that was torn by the crash was never acknowledged: the journal ends before it. */
        LOG_WARN("journal: %s ends with an incomplete record at byte %" PRIu64 " (%" PRIu64
                 " bytes dropped: a write the crash interrupted, never acknowledged)",
                 path, at, size - at);
        return 0;
    }
    if (problem)
        return carls_errorf(err, errlen, -1,
                            "journal: %s is corrupt at byte %" PRIu64 ": %s, and acknowledged records follow "
                            "it: refusing to start (restore the data directory from a backup, or move the journal "
                            "directory away to start from the SQLite store alone, losing what it held)",
                            path, at, problem);
    return 0;
}

int kb_journal_replay(const char *data_dir, uint64_t after, kb_journal_record_fn fn, void *ctx,
                      uint64_t *last_epoch, char *err, size_t errlen)
{
    uint64_t seen = 0;
    char *dir = s_journal_dir(data_dir);
    char **names;
    size_t n;
    int rc = s_list(dir, s_is_segment, &names, &n, err, errlen);
    for (size_t i = 0; rc == 0 && i < n; i++) {
        char *path = s_join(dir, names[i]);
        uint64_t first = strtoull(names[i], NULL, 10);
        bool recycled = strcmp(names[i] + 20, RECYCLED_SUFFIX) == 0;
        rc = s_replay_segment(path, i + 1 == n, first, recycled, after, fn, ctx, &seen, err, errlen);
        free(path);
    }
    *last_epoch = seen > after ? seen : after;
    s_free_names(names, n);
    free(dir);
    return rc;
}

int kb_journal_remove_all(const char *data_dir, char *err, size_t errlen)
{
    char *dir = s_journal_dir(data_dir);
    int segments = s_remove_listed(dir, s_is_segment, err, errlen);
    int rc = segments < 0 ? -1 : s_remove_listed(dir, s_is_spare, err, errlen) < 0 ? -1 : 0;
    if (rc == 0 && segments > 0)
        s_fsync_dir(dir);
    free(dir);
    return rc;
}

/* ---- snapshots: hold and copy (kb_snapshot.h) ---- */

void kb_journal_hold(kb_journal_t *self)
{
    pthread_mutex_lock(&self->mutex);
    self->holds++;
    pthread_mutex_unlock(&self->mutex);
}

void kb_journal_unhold(kb_journal_t *self)
{
    pthread_mutex_lock(&self->mutex);
    if (self->holds > 0)
        self->holds--;
    pthread_mutex_unlock(&self->mutex);
}

/* Copies the records of one segment (its first `bytes` bytes: whole records only) with after < epoch <= upto
 * to *out (opened on the first record copied, at out_path). *stop: a record past upto was met. */
static int s_copy_segment(const char *path, uint64_t bytes, uint64_t after, uint64_t upto, const char *out_path,
                          FILE **out, uint64_t *copied, bool *stop, char *err, size_t errlen)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return carls_errorf(err, errlen, -1, "journal: cannot open %s: %s", path, strerror(errno));
    uint64_t at = 0;
    uint8_t *payload = NULL;
    int rc = 0;
    while (rc == 0 && at + HEADER_BYTES <= bytes) {
        uint8_t header[HEADER_BYTES];
        if (fread(header, 1, HEADER_BYTES, f) != HEADER_BYTES) {
            rc = carls_errorf(err, errlen, -1, "journal: %s: cannot read the record at byte %" PRIu64, path, at);
            break;
        }
        uint32_t len = carls_get_le32(header + 4);
        uint64_t epoch = carls_get_le64(header + 8);
        if (carls_get_le32(header) != MAGIC || len > bytes - at - HEADER_BYTES) {
            rc = carls_errorf(err, errlen, -1, "journal: %s is corrupt at byte %" PRIu64, path, at);
            break;
        }
        if (epoch > upto) {
            *stop = true;
            break;
        }
        free(payload);
        payload = carls_xmalloc(len ? len : 1);
        if (fread(payload, 1, len, f) != len ||
            s_record_crc(header, payload, len) != carls_get_le32(header + 16)) {
            rc = carls_errorf(err, errlen, -1, "journal: %s: the record at byte %" PRIu64 " is unreadable or its "
                              "checksum does not match", path, at);
            break;
        }
        at += HEADER_BYTES + len;
        if (epoch <= after)
            continue;
        if (!*out && !(*out = fopen(out_path, "wbx")))
            rc = carls_errorf(err, errlen, -1, "journal: cannot create %s: %s", out_path, strerror(errno));
        else if (fwrite(header, 1, HEADER_BYTES, *out) != HEADER_BYTES || fwrite(payload, 1, len, *out) != len)
            rc = carls_errorf(err, errlen, -1, "journal: writing %s failed: %s", out_path, strerror(errno));
        else
            (*copied)++;
    }
    free(payload);
    fclose(f);
    return rc;
}

int kb_journal_copy(kb_journal_t *self, uint64_t after, uint64_t upto, const char *dest_dir, char *path_out,
                    size_t path_len, uint64_t *records, char *err, size_t errlen)
{
    *records = 0;
    if (path_len)
        path_out[0] = '\0';
    /* The segments and their lengths now: every record <= upto is committed, so it lies within them. */
    pthread_mutex_lock(&self->mutex);
    size_t n = self->closed_count + (self->current.path ? 1 : 0);
    s_segment_t *segs = carls_xcalloc(n + 1, sizeof *segs);
    for (size_t i = 0; i < self->closed_count; i++)
        segs[i] = (s_segment_t){.path = strdup(self->closed[i].path), .last_epoch = self->closed[i].last_epoch,
                                .bytes = self->closed[i].bytes};
    if (self->current.path)
        segs[n - 1] = (s_segment_t){.path = strdup(self->current.path), .last_epoch = self->current.last_epoch,
                                    .bytes = self->current.bytes};
    pthread_mutex_unlock(&self->mutex);

    char name[64];
    snprintf(name, sizeof name, "journal/%020" PRIu64 SUFFIX, after + 1);
    char *out_path = s_join(dest_dir, name);
    char *out_dir = s_journal_dir(dest_dir);
    FILE *out = NULL;
    bool stop = false;
    int rc = carls_mkdir_p(out_dir, 0700, err, errlen);
    for (size_t i = 0; rc == 0 && !stop && i < n; i++) {
        if (!segs[i].path)
            CARLS_FATAL("out of memory");
        if (segs[i].last_epoch > after)
            rc = s_copy_segment(segs[i].path, segs[i].bytes, after, upto, out_path, &out, records, &stop, err,
                                errlen);
    }
    if (out) {
        if ((fflush(out) != 0 || fsync(fileno(out)) != 0) && rc == 0)
            rc = carls_errorf(err, errlen, -1, "journal: writing %s failed: %s", out_path, strerror(errno));
        if (fclose(out) != 0 && rc == 0)
            rc = carls_errorf(err, errlen, -1, "journal: writing %s failed: %s", out_path, strerror(errno));
        if (rc == 0 && carls_fsync_dir(out_dir) != 0)
            rc = carls_errorf(err, errlen, -1, "journal: fsync of %s failed: %s", out_dir, strerror(errno));
        if (rc == 0 && path_len)
            snprintf(path_out, path_len, "%s", name);
    }
    for (size_t i = 0; i < n; i++)
        free(segs[i].path);
    free(segs);
    free(out_path);
    free(out_dir);
    return rc;
}
