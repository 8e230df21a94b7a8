/* Replays fuzz inputs through a harness without libFuzzer, so the same harness sources build with any
 * compiler (CTest runs this over tests/fuzz/corpus/<target>/ under ASan/UBSan in build-asan).
 *
 * Usage: replay_<target> PATH...   Each PATH is a file (one input) or a directory (every regular file in it,
 * in name order, not recursing). Prints one summary line; exits 0 when every input ran, 1 when a path could
 * not be read or nothing was run. A crash or a broken invariant aborts, as it does under libFuzzer. */
#include "fuzz_common.h"

#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* Optional libFuzzer hook; a harness that needs set-up defines it. */
int LLVMFuzzerInitialize(int *argc, char ***argv) __attribute__((weak));

/* Reads path into a new buffer (*out, *len). 0, or -1 with a message printed. */
static int s_read_file(const char *path, uint8_t **out, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "replay: cannot open %s: %s\n", path, strerror(errno));
        return -1;
    }
    size_t cap = 4096, n = 0;
    uint8_t *buf = malloc(cap);
    if (!buf)
        abort();
    for (;;) {
        if (n == cap) {
            cap *= 2;
            uint8_t *bigger = realloc(buf, cap);
            if (!bigger)
                abort();
            buf = bigger;
        }
        size_t got = fread(buf + n, 1, cap - n, f);
        n += got;
        if (got == 0)
            break;
    }
    int bad = ferror(f);
    fclose(f);
    if (bad) {
        fprintf(stderr, "replay: cannot read %s\n", path);
        free(buf);
        return -1;
    }
    *out = buf;
    *len = n;
    return 0;
}

static int s_run_file(const char *path, size_t *count)
{
    uint8_t *data;
    size_t len;
    if (s_read_file(path, &data, &len) != 0)
        return -1;
    /* An exact-size copy, so ASan catches a harness or reader that reads past the input. */
    uint8_t *exact = malloc(len ? len : 1);
    if (!exact)
        abort();
    memcpy(exact, data, len);
    free(data);
    LLVMFuzzerTestOneInput(exact, len);
    free(exact);
    (*count)++;
    return 0;
}

static int s_cmp_names(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

static int s_run_dir(const char *dir, size_t *count)
{
    DIR *d = opendir(dir);
    if (!d) {
        fprintf(stderr, "replay: cannot open directory %s: %s\n", dir, strerror(errno));
        return -1;
    }
    char **names = NULL;
    size_t n = 0, cap = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (e->d_name[0] == '.')
            continue;
        if (n == cap) {
            cap = cap ? 2 * cap : 64;
            char **bigger = realloc(names, cap * sizeof *names);
            if (!bigger)
                abort();
            names = bigger;
        }
        names[n] = strdup(e->d_name);
        if (!names[n])
            abort();
        n++;
    }
    closedir(d);
    qsort(names, n, sizeof *names, s_cmp_names);
    int rc = 0;
    for (size_t i = 0; i < n; i++) {
        char path[4096];
        struct stat st;
        snprintf(path, sizeof path, "%s/%s", dir, names[i]);
        if (stat(path, &st) == 0 && S_ISREG(st.st_mode) && s_run_file(path, count) != 0)
            rc = -1;
        free(names[i]);
    }
    free(names);
    return rc;
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: %s FILE_OR_DIR...\n", argv[0]);
        return 1;
    }
    if (LLVMFuzzerInitialize)
        LLVMFuzzerInitialize(&argc, &argv);
    size_t count = 0;
    int rc = 0;
    for (int i = 1; i < argc; i++) {
        struct stat st;
        if (stat(argv[i], &st) != 0) {
            fprintf(stderr, "replay: %s: %s\n", argv[i], strerror(errno));
            rc = 1;
        } else if (S_ISDIR(st.st_mode) ? s_run_dir(argv[i], &count) != 0 : s_run_file(argv[i], &count) != 0) {
            rc = 1;
        }
    }
    printf("replay: %zu inputs ran without a crash\n", count);
    if (count == 0) {
        fprintf(stderr, "replay: no inputs found\n");
        rc = 1;
    }
    return rc;
}
