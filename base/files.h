/* Files written whole or not at all, and directories made together with their parents.
 *
 * An atomic write goes to a temporary file beside the target ("<path>.tmp.<pid>.<n>", so the same file
 * system and the rename is atomic), which is flushed and fsynced, then renamed over the target (or, with
 * CARLS_FILE_NO_OVERWRITE, hard-linked to it, which fails when the target exists, so there is no window
 * between a check and the write), and finally the directory is fsynced so the new entry is durable too.
 * A crash at any point leaves either the old file (or none) or the whole new one, never half of it; a
 * failure removes the temporary file and leaves the target untouched.
 *
 * Return convention: 0 on success, a negative CARLS_FILE_E* code on failure with a one-line message naming
 * the path in err (errlen bytes; err may be NULL when errlen is 0). errno holds the cause as well. */
#ifndef CARLS_FILES_H
#define CARLS_FILES_H

#include <stdio.h>
#include <sys/types.h>

enum {
    CARLS_FILE_OK = 0,
    CARLS_FILE_EIO = -1,     /* create, write, fsync, rename or link failed */
    CARLS_FILE_EEXIST = -2,  /* CARLS_FILE_NO_OVERWRITE and the target exists (nothing was written to it) */
    CARLS_FILE_EINVAL = -3,  /* bad arguments (no path, a path too long) */
};

/* Flags of carls_atomic_open and carls_write_file_atomic. */
enum {
    CARLS_FILE_NO_OVERWRITE = 1 << 0, /* refuse an existing target (CARLS_FILE_EEXIST) instead of replacing it */
    CARLS_FILE_EXACT_MODE = 1 << 1,   /* the file gets exactly mode; without it mode & ~umask, as open(2) does */
};

/* fsyncs the directory dir itself (carls_fsync_dir) or the one holding path (carls_fsync_dir_of), so that a
 * file created, renamed, linked or removed there survives a crash. 0, or -1 with errno set. */
int carls_fsync_dir(const char *dir);
int carls_fsync_dir_of(const char *path);

/* ---- streaming: open, write through a FILE *, then commit or abort -------------------------------------- */

typedef struct carls_atomic_file carls_atomic_file_t;

/* Creates the temporary file for path with mode (never more permissive than mode at any moment) and opens
 * it for writing. Caller owns *out and must end it with carls_atomic_commit or carls_atomic_abort. */
int carls_atomic_open(const char *path, mode_t mode, int flags, carls_atomic_file_t **out, char *err,
                      size_t errlen);

/* The stream to write the contents to (owned by the atomic file: do not close it). */
FILE *carls_atomic_stream(carls_atomic_file_t *self);

/* The temporary file's name (for messages about write errors the caller sees first). */
const char *carls_atomic_tmp_path(const carls_atomic_file_t *self);

/* Flushes and fsyncs the temporary file, renames (or links) it to the target and fsyncs the directory. A
 * write error the stream recorded fails the commit. On failure the temporary file is removed and the target
 * is as it was. Frees *self_p and nulls it either way; accepts NULL. */
int carls_atomic_commit(carls_atomic_file_t **self_p, char *err, size_t errlen);

/* Closes and removes the temporary file; the target is untouched. Frees *self_p and nulls it; accepts NULL. */
void carls_atomic_abort(carls_atomic_file_t **self_p);

/* ---- whole buffers ---------------------------------------------------------------------------------------- */

/* Writes len bytes of data as path, atomically as above. */
int carls_write_file_atomic(const char *path, const void *data, size_t len, mode_t mode, int flags, char *err,
                            size_t errlen);

/* ---- small text files --------------------------------------------------------------------------------- */

/* Reads the first line of path into out (outlen bytes, at least 1), without its line end: how programs read
 * the one-line files others write atomically (kb-server's endpoint file). 0, or -1 with out "" when the file
 * is missing, unreadable or empty. A longer line is cut to outlen - 1 bytes. */
int carls_read_first_line(const char *path, char *out, size_t outlen);

/* Waits for a child process to write path (kb-server its endpoint file once it listens): polls every 10 ms
 * for up to timeout_ms until carls_read_first_line(path) gives a line, as long as the child lives. Returns 0
 * with the line in out; -1 when the child exited first (reaped, its wait status in *status); -2 when the time
 * ran out (the child left running). */
int carls_wait_first_line(const char *path, pid_t child, int timeout_ms, char *out, size_t outlen, int *status);

/* ---- directories ------------------------------------------------------------------------------------------ */

/* mkdir -p: creates path and its missing parents with mode (& ~umask). An existing directory is fine; an
 * existing component that is not a directory is an error (ENOTDIR) naming that component. */
int carls_mkdir_p(const char *path, mode_t mode, char *err, size_t errlen);

#endif
