/* Helpers shared by the fuzz harnesses and the seed generator (see fuzz_common.h). */
#include "fuzz_common.h"

#include "bytes.h"
#include "protocol.h"
#include "util.h"

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

_Noreturn void fuzz_fail(const char *file, int line, const char *what)
{
    fprintf(stderr, "%s:%d: fuzz invariant failed: %s\n", file, line, what);
    abort();
}

static const char *const s_base_names[FUZZ_BASE_TABLES] = {FUZZ_TABLE_EMB, FUZZ_TABLE_LAZY, FUZZ_TABLE_FEAT};

const char *fuzz_base_table_name(int i)
{
    return i >= 0 && i < FUZZ_BASE_TABLES ? s_base_names[i] : NULL;
}

void fuzz_base_table_config(int i, kb_table_config_wire_t *w)
{
    memset(w, 0, sizeof *w);
    carls__table_config__init(&w->config);
    carls__optimizer_config__init(&w->optimizer);
    carls__lazy_update_config__init(&w->lazy);
    carls__knn_config__init(&w->knn);
    carls__admission_config__init(&w->admission);
    carls__eviction_config__init(&w->eviction);
    Carls__TableConfig *c = &w->config;
    c->eviction = &w->eviction;
    w->eviction.max_rows = FUZZ_BASE_MAX_ROWS;
    switch (i) {
    case 0:
        c->kind = CARLS__TABLE_KIND__TABLE_EMBEDDING;
        c->dim = FUZZ_EMB_DIM;
        c->init = CARLS__INIT_KIND__INIT_UNIFORM;
        c->init_seed = 7;
        c->optimizer = &w->optimizer;
        w->optimizer.kind = CARLS__OPTIMIZER_KIND__OPT_SGD;
        w->optimizer.learning_rate = 0.5f;
        c->lazy = &w->lazy;
        w->lazy.policy = CARLS__UPDATE_POLICY__UPDATE_IMMEDIATE;
        c->knn = &w->knn;
        w->knn.spec = "Flat";
        w->knn.metric = CARLS__KNN_METRIC__METRIC_COSINE;
        w->eviction.kind = CARLS__EVICTION_KIND__EVICT_LRU;
        break;
    case 1:
        c->kind = CARLS__TABLE_KIND__TABLE_EMBEDDING;
        c->dim = FUZZ_LAZY_DIM;
        c->init = CARLS__INIT_KIND__INIT_NORMAL;
        c->optimizer = &w->optimizer;
        w->optimizer.kind = CARLS__OPTIMIZER_KIND__OPT_ADAGRAD;
        c->lazy = &w->lazy;
        w->lazy.policy = CARLS__UPDATE_POLICY__UPDATE_LAZY;
        w->lazy.max_pending = 4;
        c->admission = &w->admission;
        w->admission.kind = CARLS__ADMISSION_KIND__ADMIT_FREQUENCY;
        w->admission.min_frequency = 2;
        w->eviction.kind = CARLS__EVICTION_KIND__EVICT_OLDEST;
        break;
    default:
        /* No eviction, so a record that was put is still there when the harness reads it back. */
        c->kind = CARLS__TABLE_KIND__TABLE_FEATURE;
        c->eviction = NULL;
        break;
    }
}

void fuzz_pack_request(const Carls__Request *req, uint8_t **out, size_t *out_len)
{
    size_t len = carls__request__get_packed_size(req);
    uint8_t *buf = malloc(len ? len : 1);
    if (!buf)
        abort();
    *out_len = carls__request__pack(req, buf);
    *out = buf;
}

void fuzz_pack_create_base(int i, uint64_t client_id, uint64_t sequence, uint8_t **out, size_t *out_len)
{
    kb_table_config_wire_t w;
    fuzz_base_table_config(i, &w);
    Carls__CreateTable ct = CARLS__CREATE_TABLE__INIT;
    ct.config = &w.config;
    Carls__Request req = CARLS__REQUEST__INIT;
    req.protocol_version = CARLS_PROTOCOL_VERSION;
    req.request_id = 1000 + (uint64_t)i;
    req.client_id = client_id;
    req.sequence = sequence;
    req.table = (char *)fuzz_base_table_name(i);
    req.op_case = CARLS__REQUEST__OP_CREATE_TABLE;
    req.create_table = &ct;
    fuzz_pack_request(&req, out, out_len);
}

int fuzz_memfile(const uint8_t *data, size_t size, char *path, size_t path_len)
{
    int fd = memfd_create("carls-fuzz", MFD_CLOEXEC);
    FUZZ_CHECK(fd >= 0);
    size_t done = 0;
    while (done < size) {
        ssize_t n = write(fd, data + done, size - done);
        FUZZ_CHECK(n > 0);
        done += (size_t)n;
    }
    snprintf(path, path_len, "/proc/self/fd/%d", fd);
    return fd;
}

void fuzz_scratch_dir(const char *tag, char *dir, size_t dir_len)
{
    const char *base = access("/dev/shm", W_OK) == 0 ? "/dev/shm" : (getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
    snprintf(dir, dir_len, "%s/carls-fuzz-%s-XXXXXX", base, tag);
    FUZZ_CHECK(mkdtemp(dir) != NULL);
}

void fuzz_remove_dir(const char *dir)
{
    DIR *d = opendir(dir);
    if (d) {
        struct dirent *e;
        while ((e = readdir(d)) != NULL) {
            if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
                continue;
            char path[512];
            snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
            unlink(path);
        }
        closedir(d);
    }
    rmdir(dir);
}

static char s_scratch_dir[256];
static char s_scratch_path[512];

static void s_scratch_remove(void)
{
    fuzz_remove_dir(s_scratch_dir);
}

const char *fuzz_scratch_file(const char *tag, const char *name)
{
    if (!s_scratch_dir[0]) {
        fuzz_scratch_dir(tag, s_scratch_dir, sizeof s_scratch_dir);
        snprintf(s_scratch_path, sizeof s_scratch_path, "%s/%s", s_scratch_dir, name);
        atexit(s_scratch_remove);
    }
    return s_scratch_path;
}

/* read() on the bytes through an in-memory file. */
static void s_read_memfile(const uint8_t *data, size_t size, void (*read)(const char *, const uint8_t *, size_t))
{
    char path[64];
    int fd = fuzz_memfile(data, size, path, sizeof path);
    read(path, data, size);
    close(fd);
}

void fuzz_read_with_crc_fixup(const uint8_t *data, size_t size, size_t min_size, void (*prepare)(uint8_t *, size_t),
                              void (*read)(const char *path, const uint8_t *data, size_t size))
{
    s_read_memfile(data, size, read);
    if (size < min_size || size < 4)
        return;
    uint8_t *fixed = malloc(size);
    FUZZ_CHECK(fixed != NULL);
    memcpy(fixed, data, size);
    if (prepare)
        prepare(fixed, size);
    carls_put_le32(fixed + size - 4, carls_crc32(0, fixed, size - 4));
    if (memcmp(fixed, data, size) != 0)
        s_read_memfile(fixed, size, read);
    free(fixed);
}
