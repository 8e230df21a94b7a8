/* base/files: atomic writes (content after commit, the temporary file gone, the target untouched on abort and
 * on every kind of failure, the mode honoured, refusal to overwrite) and mkdir -p (nested, existing, a file
 * in the way), and reading the first line of a small file. */
#include "files.h"
#include "test_util.h"

#include <dirent.h>
#include <errno.h>
#include <signal.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>
#include "test_main.h"

static char s_dir[256];

static int s_setup(void **state)
{
    (void)state;
    umask(022); /* the mode tests count on it */
    return test_tmpdir(s_dir, sizeof s_dir, "files-test");
}

static int s_teardown(void **state)
{
    (void)state;
    return test_rmrf(s_dir);
}

/* A fresh directory s_dir/name for one test (into dir, 512 bytes) and the path of `file` in it (into path,
 * 600 bytes). */
static void s_fresh(const char *name, const char *file, char *dir, char *path)
{
    snprintf(dir, 512, "%s/%s", s_dir, name);
    assert_int_equal(mkdir(dir, 0755), 0);
    snprintf(path, 600, "%s/%s", dir, file);
}

/* The whole file as a NUL-terminated string (NULL when it cannot be opened). Caller frees. */
static char *s_slurp(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    char *buf = calloc(1, 4096);
    assert_non_null(buf);
    size_t n = fread(buf, 1, 4095, f);
    buf[n] = '\0';
    fclose(f);
    return buf;
}

static void s_spit(const char *path, const char *text)
{
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    fputs(text, f);
    assert_int_equal(fclose(f), 0);
}

static void s_assert_content(const char *path, const char *want)
{
    char *got = s_slurp(path);
    assert_non_null(got);
    assert_string_equal(got, want);
    free(got);
}

/* Entries of dir other than . and .. */
static int s_entries(const char *dir)
{
    DIR *d = opendir(dir);
    assert_non_null(d);
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL)
        if (strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0)
            n++;
    closedir(d);
    return n;
}

static mode_t s_mode(const char *path)
{
    struct stat st;
    assert_int_equal(stat(path, &st), 0);
    return st.st_mode & 07777;
}

/* A fresh directory `name` (into dir, 512 bytes) holding the file "target" (its path into path, 600 bytes)
 * with old_text, and an atomic file open over it. */
static carls_atomic_file_t *s_open_over(const char *name, const char *old_text, char *dir, char *path)
{
    char err[512];
    s_fresh(name, "target", dir, path);
    s_spit(path, old_text);
    carls_atomic_file_t *file = NULL;
    assert_int_equal(carls_atomic_open(path, 0644, 0, &file, err, sizeof err), 0);
    assert_non_null(file);
    return file;
}

static void test_write_creates_and_replaces(void **state)
{
    (void)state;
    char dir[512], path[600], err[512];
    s_fresh("whole", "f.txt", dir, path);
    assert_int_equal(carls_write_file_atomic(path, "first\n", 6, 0666, 0, err, sizeof err), 0);
    s_assert_content(path, "first\n");
    assert_int_equal(s_mode(path), 0644); /* 0666 & ~umask 022 */
    assert_int_equal(carls_write_file_atomic(path, "second, longer\n", 15, 0666, 0, err, sizeof err), 0);
    s_assert_content(path, "second, longer\n");
    assert_int_equal(carls_write_file_atomic(path, "", 0, 0666, 0, err, sizeof err), 0);
    s_assert_content(path, "");
    assert_int_equal(s_entries(dir), 1); /* no temporary file left behind */
}

static void test_exact_mode(void **state)
{
    (void)state;
    char dir[512], path[600], err[512];
    s_fresh("mode", "secret", dir, path);
    mode_t old = umask(0);
    assert_int_equal(carls_write_file_atomic(path, "s", 1, 0600, CARLS_FILE_EXACT_MODE, err, sizeof err), 0);
    assert_int_equal(s_mode(path), 0600);
    umask(077);
    snprintf(path, sizeof path, "%s/public", dir);
    assert_int_equal(carls_write_file_atomic(path, "p", 1, 0644, CARLS_FILE_EXACT_MODE, err, sizeof err), 0);
    assert_int_equal(s_mode(path), 0644); /* exactly, although the umask would have removed the 044 */
    snprintf(path, sizeof path, "%s/umasked", dir);
    assert_int_equal(carls_write_file_atomic(path, "u", 1, 0644, 0, err, sizeof err), 0);
    assert_int_equal(s_mode(path), 0600); /* without the flag the umask applies */
    umask(old);
}

static void test_no_overwrite(void **state)
{
    (void)state;
    char dir[512], path[600], err[512];
    s_fresh("keep", "key", dir, path);
    assert_int_equal(carls_write_file_atomic(path, "one", 3, 0600, CARLS_FILE_NO_OVERWRITE, err, sizeof err), 0);
    s_assert_content(path, "one");
    err[0] = '\0';
    assert_int_equal(carls_write_file_atomic(path, "two", 3, 0600, CARLS_FILE_NO_OVERWRITE, err, sizeof err),
                     CARLS_FILE_EEXIST);
    printf("  refused: %s\n", err);
    assert_non_null(strstr(err, path));
    assert_non_null(strstr(err, "already exists"));
    s_assert_content(path, "one");
    assert_int_equal(s_entries(dir), 1);
}

static void test_stream_commit(void **state)
{
    (void)state;
    char dir[512], path[600], err[512];
    carls_atomic_file_t *file = s_open_over("stream", "old\n", dir, path);
    const char *tmp = carls_atomic_tmp_path(file);
    assert_non_null(tmp);
    assert_memory_equal(tmp, path, strlen(path)); /* beside the target: same directory, same file system */
    assert_int_equal(access(tmp, F_OK), 0);
    char tmp_copy[700];
    snprintf(tmp_copy, sizeof tmp_copy, "%s", tmp);
    FILE *f = carls_atomic_stream(file);
    for (int i = 0; i < 1000; i++)
        fprintf(f, "row %d\n", i);
    s_assert_content(path, "old\n"); /* readers see the old file until the commit */
    assert_int_equal(carls_atomic_commit(&file, err, sizeof err), 0);
    assert_null(file);
    char *got = s_slurp(path);
    assert_non_null(got);
    assert_int_equal(strncmp(got, "row 0\nrow 1\n", 12), 0);
    free(got);
    assert_int_equal(access(tmp_copy, F_OK), -1);
    assert_int_equal(s_entries(dir), 1);
}

static void test_stream_abort(void **state)
{
    (void)state;
    char dir[512], path[600];
    carls_atomic_file_t *file = s_open_over("abort", "kept\n", dir, path);
    fputs("half of a new file", carls_atomic_stream(file));
    carls_atomic_abort(&file);
    assert_null(file);
    carls_atomic_abort(&file); /* accepts NULL */
    s_assert_content(path, "kept\n");
    assert_int_equal(s_entries(dir), 1);
}

static void test_failures_leave_target(void **state)
{
    (void)state;
    char dir[512], path[600], err[512];
    s_fresh("fail", "missing/x", dir, path);

    /* No such directory: nothing can be created. */
    err[0] = '\0';
    assert_int_equal(carls_write_file_atomic(path, "x", 1, 0644, 0, err, sizeof err), CARLS_FILE_EIO);
    printf("  missing directory: %s\n", err);
    assert_non_null(strstr(err, path));

    /* The rename fails (the target is a directory): the temporary file goes, the directory stays. */
    snprintf(path, sizeof path, "%s/adir", dir);
    assert_int_equal(mkdir(path, 0755), 0);
    err[0] = '\0';
    assert_int_equal(carls_write_file_atomic(path, "x", 1, 0644, 0, err, sizeof err), CARLS_FILE_EIO);
    printf("  rename over a directory: %s\n", err);
    assert_non_null(strstr(err, path));
    struct stat st;
    assert_int_equal(stat(path, &st), 0);
    assert_true(S_ISDIR(st.st_mode));
    assert_int_equal(s_entries(dir), 1);

    /* A write that fails on the way (the descriptor is gone): the commit fails, the target is untouched. */
    snprintf(path, sizeof path, "%s/y", dir);
    s_spit(path, "before\n");
    carls_atomic_file_t *file = NULL;
    assert_int_equal(carls_atomic_open(path, 0644, 0, &file, err, sizeof err), 0);
    FILE *f = carls_atomic_stream(file);
    close(fileno(f));
    fputs("lost", f);
    err[0] = '\0';
    assert_int_equal(carls_atomic_commit(&file, err, sizeof err), CARLS_FILE_EIO);
    printf("  failed write: %s\n", err);
    assert_non_null(strstr(err, path)); /* the temporary file's name starts with the target's */
    assert_null(file);
    s_assert_content(path, "before\n");
    assert_int_equal(s_entries(dir), 2); /* adir and y */

    assert_int_equal(carls_atomic_open("", 0644, 0, &file, err, sizeof err), CARLS_FILE_EINVAL);
    assert_null(file);
}

static void test_read_first_line(void **state)
{
    (void)state;
    char dir[512], path[600], line[16];
    s_fresh("lines", "endpoint", dir, path);
    assert_int_equal(carls_read_first_line(path, line, sizeof line), -1); /* missing */
    assert_string_equal(line, "");
    s_spit(path, "");
    assert_int_equal(carls_read_first_line(path, line, sizeof line), -1); /* empty */
    assert_string_equal(line, "");
    s_spit(path, "tcp://h:1\r\nsecond\n");
    assert_int_equal(carls_read_first_line(path, line, sizeof line), 0);
    assert_string_equal(line, "tcp://h:1");
    s_spit(path, "no line end");
    assert_int_equal(carls_read_first_line(path, line, sizeof line), 0);
    assert_string_equal(line, "no line end");
    s_spit(path, "a line longer than the buffer\n");
    assert_int_equal(carls_read_first_line(path, line, sizeof line), 0);
    assert_string_equal(line, "a line longer t"); /* cut to 15 bytes */
}

/* A child that sleeps delay_ms, writes text (when not NULL) to path, then exits with code exit_code
 * (or, when exit_code < 0, sleeps until killed). */
static pid_t s_child(const char *path, int delay_ms, const char *text, int exit_code)
{
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        usleep((useconds_t)delay_ms * 1000);
        if (text) {
            s_spit(path, text);
        }
        while (exit_code < 0) {
            pause();
        }
        _exit(exit_code);
    }
    return pid;
}

static void test_wait_first_line(void **state)
{
    (void)state;
    char dir[512], path[600], line[32];
    int status = -7;
    s_fresh("wait", "endpoint", dir, path);

    /* the child writes the file while it lives: its line (the child is not reaped) */
    pid_t pid = s_child(path, 50, "tcp://127.0.0.1:5\n", -1);
    assert_int_equal(carls_wait_first_line(path, pid, 10000, line, sizeof line, &status), 0);
    assert_string_equal(line, "tcp://127.0.0.1:5");
    assert_int_equal(status, -7);
    kill(pid, SIGKILL);
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_int_equal(unlink(path), 0);

    /* the child exits without writing it: -1, reaped, with its status */
    pid = s_child(path, 0, NULL, 3);
    assert_int_equal(carls_wait_first_line(path, pid, 10000, line, sizeof line, &status), -1);
    assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 3);
    assert_int_equal(waitpid(pid, NULL, WNOHANG), -1); /* already reaped */

    /* the child lives but never writes it: -2 once the time is up, the child still running */
    pid = s_child(path, 0, NULL, -1);
    assert_int_equal(carls_wait_first_line(path, pid, 60, line, sizeof line, &status), -2);
    assert_string_equal(line, "");
    assert_int_equal(waitpid(pid, NULL, WNOHANG), 0);
    kill(pid, SIGKILL);
    assert_int_equal(waitpid(pid, &status, 0), pid);
}

static void test_mkdir_p(void **state)
{
    (void)state;
    char path[600], err[512];
    snprintf(path, sizeof path, "%s/m/a/b/c", s_dir);
    assert_int_equal(carls_mkdir_p(path, 0755, err, sizeof err), 0);
    struct stat st;
    assert_int_equal(stat(path, &st), 0);
    assert_true(S_ISDIR(st.st_mode));
    assert_int_equal(carls_mkdir_p(path, 0755, err, sizeof err), 0); /* existing: fine */

    snprintf(path, sizeof path, "%s/m//x///y/", s_dir); /* repeated and trailing slashes */
    assert_int_equal(carls_mkdir_p(path, 0755, err, sizeof err), 0);
    snprintf(path, sizeof path, "%s/m/x/y", s_dir);
    assert_int_equal(stat(path, &st), 0);
    assert_true(S_ISDIR(st.st_mode));

    /* A file in the way, in the middle and at the end. */
    char file[512];
    snprintf(file, sizeof file, "%s/m/a/file", s_dir);
    s_spit(file, "not a directory");
    snprintf(path, sizeof path, "%s/below", file);
    err[0] = '\0';
    errno = 0;
    assert_int_equal(carls_mkdir_p(path, 0755, err, sizeof err), CARLS_FILE_EIO);
    assert_int_equal(errno, ENOTDIR);
    printf("  file in the way: %s\n", err);
    assert_non_null(strstr(err, path));
    assert_non_null(strstr(err, "not a directory"));
    err[0] = '\0';
    assert_int_equal(carls_mkdir_p(file, 0755, err, sizeof err), CARLS_FILE_EIO);
    assert_non_null(strstr(err, file));

    /* Relative paths work from the current directory. */
    char cwd[512];
    assert_non_null(getcwd(cwd, sizeof cwd));
    assert_int_equal(chdir(s_dir), 0);
    assert_int_equal(carls_mkdir_p("rel/one", 0755, err, sizeof err), 0);
    assert_int_equal(chdir(cwd), 0);
    snprintf(path, sizeof path, "%s/rel/one", s_dir);
    assert_int_equal(stat(path, &st), 0);
}

CARLS_TEST_MAIN_GROUP(s_setup, s_teardown,
    cmocka_unit_test(test_write_creates_and_replaces),
    cmocka_unit_test(test_exact_mode),
    cmocka_unit_test(test_no_overwrite),
    cmocka_unit_test(test_stream_commit),
    cmocka_unit_test(test_stream_abort),
    cmocka_unit_test(test_failures_leave_target),
    cmocka_unit_test(test_read_first_line),
    cmocka_unit_test(test_wait_first_line),
    cmocka_unit_test(test_mkdir_p))
