/* Atomic file writes and mkdir -p (see files.h). */
#include "files.h"

#include "util.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

struct carls_atomic_file {
    FILE *f;        /* the temporary file, open for writing */
    char *path;     /* the target */
    char *tmp;      /* the temporary file's name, beside the target */
    int flags;      /* CARLS_FILE_* flags */
};

/* Tells temporary files of one process apart (two threads may write the same target). */
static atomic_uint s_tmp_seq;

int carls_fsync_dir(const char *dir)
{
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    int rc = fd >= 0 && fsync(fd) == 0 ? 0 : -1;
    int e = errno;
    if (fd >= 0) {
        close(fd);
    }
    errno = e;
    return rc;
}

int carls_fsync_dir_of(const char *path)
{
    char *dir = strdup(path);
    if (!dir) {
        errno = ENOMEM;
        return -1;
    }
    char *slash = strrchr(dir, '/');
    if (!slash) {
        strcpy(dir, ".");
    } else if (slash == dir) {
        dir[1] = '\0';
    } else {
        *slash = '\0';
    }
    int rc = carls_fsync_dir(dir);
    int e = errno;
    free(dir);
    errno = e;
    return rc;
}

static void s_free(carls_atomic_file_t *self)
{
    free(self->path);
    free(self->tmp);
    free(self);
}

int carls_atomic_open(const char *path, mode_t mode, int flags, carls_atomic_file_t **out, char *err,
                      size_t errlen)
{
    if (!out) {
        errno = EINVAL;
        return carls_errorf(err, errlen, CARLS_FILE_EINVAL, "carls_atomic_open: no output pointer");
    }
    *out = NULL;
    if (!path || !*path) {
        errno = EINVAL;
        return carls_errorf(err, errlen, CARLS_FILE_EINVAL, "carls_atomic_open: no path");
    }
    carls_atomic_file_t *self = carls_xcalloc(1, sizeof *self);
    self->flags = flags;
    self->path = carls_xmalloc(strlen(path) + 1);
    strcpy(self->path, path);
    size_t tmp_len = strlen(path) + 48;
    self->tmp = carls_xmalloc(tmp_len);
    int fd = -1;
    /* O_EXCL: never reuse (and so never truncate) a file that is there already, such as one left behind by a
     * crashed process that had the same pid. */
    for (int attempt = 0; attempt < 100 && fd < 0; attempt++) {
        snprintf(self->tmp, tmp_len, "%s.tmp.%ld.%u", path, (long)getpid(), atomic_fetch_add(&s_tmp_seq, 1));
        fd = open(self->tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, mode & 07777);
        if (fd < 0 && errno != EEXIST) {
            break;
        }
    }
    if (fd < 0) {
        int e = errno;
        s_free(self);
        int rc = carls_errorf(err, errlen, CARLS_FILE_EIO, "cannot create a temporary file beside %s: %s", path,
                              strerror(e));
        errno = e;
        return rc;
    }
    const char *failed = NULL;
    if ((flags & CARLS_FILE_EXACT_MODE) && fchmod(fd, mode & 07777) != 0) {
        failed = "set the mode of";
    } else if ((self->f = fdopen(fd, "wb")) == NULL) {
        failed = "open";
    }
    if (failed) {
        int e = errno;
        close(fd);
        unlink(self->tmp);
        int rc = carls_errorf(err, errlen, CARLS_FILE_EIO, "cannot %s %s: %s", failed, self->tmp, strerror(e));
        s_free(self);
        errno = e;
        return rc;
    }
    *out = self;
    return 0;
}

FILE *carls_atomic_stream(carls_atomic_file_t *self)
{
    return self ? self->f : NULL;
}

const char *carls_atomic_tmp_path(const carls_atomic_file_t *self)
{
    return self ? self->tmp : NULL;
}

int carls_atomic_commit(carls_atomic_file_t **self_p, char *err, size_t errlen)
{
    if (!self_p || !*self_p) {
        errno = EINVAL;
        return carls_errorf(err, errlen, CARLS_FILE_EINVAL, "carls_atomic_commit: no file");
    }
    carls_atomic_file_t *self = *self_p;
    *self_p = NULL;
    int rc = 0, e = 0;
    const char *step = NULL;
    errno = 0;
    if (ferror(self->f)) {
        step = "write"; /* the stream recorded a failed write earlier */
    } else if (fflush(self->f) != 0) {
        step = "write";
    } else if (fsync(fileno(self->f)) != 0) {
        step = "fsync";
    }
    e = errno;
    if (fclose(self->f) != 0 && !step) {
        step = "close";
        e = errno;
    }
    self->f = NULL;
    if (step) {
        e = e ? e : EIO;
        rc = carls_errorf(err, errlen, CARLS_FILE_EIO, "%s %s: %s", step, self->tmp, strerror(e));
        unlink(self->tmp);
        goto done;
    }
    if (self->flags & CARLS_FILE_NO_OVERWRITE) {
        /* link, unlike rename, fails when the target exists: no race between a check and the write. */
        int linked = link(self->tmp, self->path);
        e = errno;
        unlink(self->tmp);
        if (linked != 0) {
            if (e == EEXIST) {
                rc = carls_errorf(err, errlen, CARLS_FILE_EEXIST, "cannot create %s: it already exists", self->path);
            } else {
                rc = carls_errorf(err, errlen, CARLS_FILE_EIO, "cannot create %s: %s", self->path, strerror(e));
            }
            goto done;
        }
    } else if (rename(self->tmp, self->path) != 0) {
        e = errno;
        unlink(self->tmp);
        rc = carls_errorf(err, errlen, CARLS_FILE_EIO, "rename %s -> %s: %s", self->tmp, self->path, strerror(e));
        goto done;
    }
    if (carls_fsync_dir_of(self->path) != 0) {
        e = errno;
        rc = carls_errorf(err, errlen, CARLS_FILE_EIO, "fsync the directory of %s: %s", self->path, strerror(e));
    }
done:
    s_free(self);
    errno = e;
    return rc;
}

void carls_atomic_abort(carls_atomic_file_t **self_p)
{
    if (!self_p || !*self_p) {
        return;
    }
    carls_atomic_file_t *self = *self_p;
    int e = errno; /* the caller is usually about to report why it aborts */
    if (self->f) {
        fclose(self->f);
    }
    unlink(self->tmp);
    s_free(self);
    errno = e;
    *self_p = NULL;
}

int carls_write_file_atomic(const char *path, const void *data, size_t len, mode_t mode, int flags, char *err,
                            size_t errlen)
{
    carls_atomic_file_t *file = NULL;
    int rc = carls_atomic_open(path, mode, flags, &file, err, errlen);
    if (rc != 0) {
        return rc;
    }
    /* Straight to the descriptor (the stream holds nothing yet): no copy of the data, which may be a secret
     * key, is left behind in a stdio buffer. */
    const char *p = data;
    for (size_t done = 0; done < len;) {
        ssize_t n = write(fileno(file->f), p + done, len - done);
        if (n < 0 && errno == EINTR) {
            continue;
        }
        if (n <= 0) {
            int e = n < 0 ? errno : EIO;
            rc = carls_errorf(err, errlen, CARLS_FILE_EIO, "write %s: %s", file->tmp, strerror(e));
            carls_atomic_abort(&file);
            errno = e;
            return rc;
        }
        done += (size_t)n;
    }
    return carls_atomic_commit(&file, err, errlen);
}

int carls_read_first_line(const char *path, char *out, size_t outlen)
{
    out[0] = '\0';
    FILE *f = fopen(path, "r");
    if (!f) {
        return -1;
    }
    bool got = fgets(out, (int)(outlen > INT_MAX ? INT_MAX : outlen), f) != NULL;
    fclose(f);
    if (!got) {
        out[0] = '\0';
        return -1;
    }
    out[strcspn(out, "\r\n")] = '\0';
    return 0;
}

int carls_wait_first_line(const char *path, pid_t child, int timeout_ms, char *out, size_t outlen, int *status)
{
    const struct timespec tick = {0, 10 * 1000 * 1000};
    for (int waited = 0; waited < timeout_ms; waited += 10) {
        if (carls_read_first_line(path, out, outlen) == 0) {
            return 0;
        }
        if (waitpid(child, status, WNOHANG) == child) {
            return -1;
        }
        nanosleep(&tick, NULL);
    }
    return -2;
}

/* mkdir of one component (dir, a prefix of whole); an existing directory counts as success. */
static int s_mkdir_one(const char *dir, mode_t mode, const char *whole, char *err, size_t errlen)
{
    if (mkdir(dir, mode) == 0) {
        return 0;
    }
    int e = errno, rc;
    struct stat st;
    if (e == EEXIST && stat(dir, &st) == 0) {
        if (S_ISDIR(st.st_mode)) {
            return 0;
        }
        e = ENOTDIR;
        rc = carls_errorf(err, errlen, CARLS_FILE_EIO, "cannot create directory %s: %s exists and is not a directory",
                          whole, dir);
    } else if (strcmp(dir, whole) == 0) {
        rc = carls_errorf(err, errlen, CARLS_FILE_EIO, "cannot create directory %s: %s", whole, strerror(e));
    } else {
        rc = carls_errorf(err, errlen, CARLS_FILE_EIO, "cannot create directory %s: %s: %s", whole, dir, strerror(e));
    }
    errno = e;
    return rc;
}

int carls_mkdir_p(const char *path, mode_t mode, char *err, size_t errlen)
{
    if (!path || !*path) {
        int rc = carls_errorf(err, errlen, CARLS_FILE_EINVAL, "carls_mkdir_p: no path");
        errno = EINVAL;
        return rc;
    }
    char *dir = carls_xmalloc(strlen(path) + 1);
    strcpy(dir, path);
    int rc = 0;
    /* Each parent in turn: cut the string at every '/' that follows a name (not the leading one, not a
     * repeated one). */
    for (char *p = dir + 1; *p && rc == 0; p++) {
        if (*p == '/' && p[-1] != '/') {
            *p = '\0';
            rc = s_mkdir_one(dir, mode, path, err, errlen);
            *p = '/';
        }
    }
    if (rc == 0) {
        rc = s_mkdir_one(dir, mode, path, err, errlen);
    }
    int e = errno;
    free(dir);
    errno = e;
    return rc;
}
