/* The shared library's client API in plain C types (kb_ffi.h), over kb_cluster. */
#include "kb_ffi.h"

#include "kb_cluster.h"
#include "kb_json.h"
#include "log.h"
#include "protocol.h"
#include "util.h"

#include <assert.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

_Static_assert((int)KB_FFI_ETIMEOUT == (int)KB_CLIENT_ETIMEOUT && (int)KB_FFI_ESTATUS == (int)KB_CLIENT_ESTATUS &&
                   (int)KB_FFI_EINVAL == (int)KB_CLIENT_EINVAL && (int)KB_FFI_EIO == (int)KB_CLIENT_EIO &&
                   (int)KB_FFI_EMALFORMED == (int)KB_CLIENT_EMALFORMED,
               "kb_ffi.h's codes are kb_client.h's");

struct kb_ffi {
    kb_cluster_t *cluster;
    char error[512];        /* this layer's own error (bad arguments, a collected push's), when own_error */
    bool own_error;
    int own_status;         /* the status that goes with it (0 for bad arguments) */
    kb_cluster_pending_t **pushes; /* pushes in flight, oldest first */
    size_t n_pushes, pushes_cap;
    kb_key_t *keys;         /* the call's keys, pointing into the caller's data */
    size_t keys_cap;
    kb_json_t json;         /* the last *_json answer */
    char *result_keys;      /* the last knn/sample keys, joined by NULs */
    size_t result_len, result_cap;
    uint64_t *result_ends;  /* (result_n) */
    size_t result_n, result_ends_cap;
    bool result_has_nul;
};

/* ---- errors ---------------------------------------------------------------------------------------------- */

/* A failure of this layer (nothing sent): the message into self->error; returns KB_FFI_EINVAL. */
static int s_fail(kb_ffi_t *self, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int s_fail(kb_ffi_t *self, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(self->error, sizeof self->error, fmt, ap);
    va_end(ap);
    self->own_error = true;
    self->own_status = 0;
    return KB_FFI_EINVAL;
}

/* Starts a call: forgets this layer's last error. */
static void s_begin(kb_ffi_t *self)
{
    self->own_error = false;
    self->error[0] = '\0';
}

const char *kb_ffi_last_error(const kb_ffi_t *self)
{
    assert(self);
    return self->own_error ? self->error : kb_cluster_last_error(self->cluster);
}

int kb_ffi_last_status(const kb_ffi_t *self)
{
    assert(self);
    return self->own_error ? self->own_status : (int)kb_cluster_last_status(self->cluster);
}

const char *kb_ffi_status_name(int status)
{
    if (!protobuf_c_enum_descriptor_get_value(&carls__status_code__descriptor, status))
        return "UNKNOWN";
    return carls_status_name((Carls__StatusCode)status);
}

/* ---- handle ------------------------------------------------------------------------------------------------ */

int kb_ffi_log_level(const char *level)
{
    carls_log_level_t l;
    if (!level || carls_log_parse_level(level, &l) != 0)
        return KB_FFI_EINVAL;
    carls_log_set_level(l);
    return 0;
}

kb_ffi_t *kb_ffi_open(const char *endpoints, int timeout_ms, int retries, const char *key_file,
                      const char *server_key_file, char *err, size_t errlen)
{
    carls_log_init_from_env();
    if (!endpoints || !*endpoints) {
        carls_errorf(err, errlen, KB_FFI_EINVAL, "no endpoint given");
        return NULL;
    }
    bool want_curve = (key_file && *key_file) || (server_key_file && *server_key_file);
    kb_client_curve_t curve;
    if (want_curve) {
        if (!key_file || !*key_file || !server_key_file || !*server_key_file) {
            carls_errorf(err, errlen, KB_FFI_EINVAL,
                         "CURVE needs both a client key file and the server's public key file");
            return NULL;
        }
        if (kb_client_curve_load(key_file, server_key_file, &curve, err, errlen) != 0)
            return NULL;
    }
    kb_client_options_t opts = {.timeout_ms = timeout_ms, .retries = retries, .curve = want_curve ? &curve : NULL};
    kb_cluster_t *cluster = kb_cluster_new(endpoints, &opts);
    if (want_curve)
        explicit_bzero(&curve, sizeof curve);
    if (!cluster) {
        carls_errorf(err, errlen, KB_FFI_EINVAL,
                     "cannot open a client of '%s' (an empty or repeated endpoint, more than %u of them, or one "
                     "ZeroMQ refuses; the reason is logged on stderr)",
                     endpoints, KB_CLUSTER_MAX_SHARDS);
        return NULL;
    }
    kb_ffi_t *self = carls_xcalloc(1, sizeof *self);
    self->cluster = cluster;
    return self;
}

void kb_ffi_close(kb_ffi_t **self_p)
{
    if (!self_p || !*self_p)
        return;
    kb_ffi_t *self = *self_p;
    for (size_t i = 0; i < self->n_pushes; i++)
        kb_cluster_pending_destroy(self->cluster, &self->pushes[i]);
    free(self->pushes);
    kb_cluster_destroy(&self->cluster);
    free(self->keys);
    free(self->json.text);
    free(self->result_keys);
    free(self->result_ends);
    free(self);
    *self_p = NULL;
}

uint32_t kb_ffi_shards(const kb_ffi_t *self)
{
    assert(self);
    return kb_cluster_shards(self->cluster);
}

void kb_ffi_set_read_replicas(kb_ffi_t *self, uint32_t staleness_ms)
{
    assert(self);
    kb_cluster_set_read_replicas(self->cluster, staleness_ms); /* a kb_cluster_new cluster: cannot fail */
}

/* ---- arguments -------------------------------------------------------------------------------------------------- */

/* The n keys of (data, data_len, ends) as kb_key_t (in self->keys, pointing into data). what names the
 * argument in errors. 0, or KB_FFI_EINVAL. */
static int s_keys(kb_ffi_t *self, const char *what, const void *data, size_t data_len, const uint64_t *ends,
                  size_t n)
{
    if (n == 0)
        return data_len == 0 ? 0 : s_fail(self, "%s: no keys but %zu bytes of them", what, data_len);
    if (!data)
        return s_fail(self, "%s: %zu keys but no data", what, n);
    self->keys = carls_grow(self->keys, &self->keys_cap, n, sizeof *self->keys);
    const char *p = data;
    if (ends) {
        uint64_t start = 0;
        for (size_t i = 0; i < n; i++) {
            if (ends[i] < start || ends[i] > data_len)
                return s_fail(self, "%s: key %zu ends at byte %llu, outside %llu..%zu", what, i,
                              (unsigned long long)ends[i], (unsigned long long)start, data_len);
            self->keys[i] = (kb_key_t){p + start, (size_t)(ends[i] - start)};
            start = ends[i];
        }
        if (start != data_len)
            return s_fail(self, "%s: the keys end at byte %llu of %zu", what, (unsigned long long)start, data_len);
        return 0;
    }
    size_t start = 0;
    for (size_t i = 0; i < n; i++) {
        const char *nul = memchr(p + start, '\0', data_len - start);
        size_t end = nul ? (size_t)(nul - p) : data_len;
        if ((i + 1 < n) != (nul != NULL))
            return s_fail(self, "%s: %zu keys expected, the NUL-separated data holds %s", what, n,
                          nul ? "more" : "fewer");
        self->keys[i] = (kb_key_t){p + start, end - start};
        start = end + 1;
    }
    return 0;
}

/* Names the table in this layer's errors; the cluster checks the name itself. */
static int s_table(kb_ffi_t *self, const char *table)
{
    if (!table || !*table)
        return s_fail(self, "no table name given");
    return 0;
}

/* The arguments every keyed operation checks: a table name, the keys, and (for n > 0) the array the operation
 * reads or fills; `missing` says which array in the error ("OP: MISSING"). 0, or KB_FFI_EINVAL (error set). */
static int s_keyed_args(kb_ffi_t *self, const char *op, const char *table, const void *data, size_t data_len,
                        const uint64_t *ends, size_t n, const void *array, const char *missing)
{
    if (s_table(self, table) != 0 || s_keys(self, op, data, data_len, ends, n) != 0)
        return KB_FFI_EINVAL;
    if (n > 0 && !array)
        return s_fail(self, "%s: %s", op, missing);
    return 0;
}

/* ---- tables ----------------------------------------------------------------------------------------------------- */

/* The config being built by kb_ffi_create_table: a message and the ones below it, freed together with
 * protobuf_c_message_free_unpacked. */

/* Sets the scalar field f of msg from text. 0, or KB_FFI_EINVAL naming path. */
static int s_set_scalar(kb_ffi_t *self, ProtobufCMessage *msg, const ProtobufCFieldDescriptor *f, const char *path,
                        const char *text)
{
    char *p = (char *)msg + f->offset;
    uint64_t u = 0;
    switch (f->type) {
    case PROTOBUF_C_TYPE_UINT32:
        if (carls_parse_u64(text, &u) != 0 || u > UINT32_MAX)
            return s_fail(self, "table setting %s: '%s' is not an integer in 0..%u", path, text, UINT32_MAX);
        *(uint32_t *)p = (uint32_t)u;
        return 0;
    case PROTOBUF_C_TYPE_UINT64:
        if (carls_parse_u64(text, &u) != 0)
            return s_fail(self, "table setting %s: '%s' is not an integer in 0..%llu", path, text,
                          (unsigned long long)UINT64_MAX);
        *(uint64_t *)p = u;
        return 0;
    case PROTOBUF_C_TYPE_FLOAT:
        if (carls_parse_float(text, (float *)p) != 0)
            return s_fail(self, "table setting %s: '%s' is not a number", path, text);
        return 0;
    case PROTOBUF_C_TYPE_BOOL:
        if (strcmp(text, "true") != 0 && strcmp(text, "false") != 0)
            return s_fail(self, "table setting %s: '%s' is not true or false", path, text);
        *(protobuf_c_boolean *)p = strcmp(text, "true") == 0;
        return 0;
    case PROTOBUF_C_TYPE_ENUM: {
        const ProtobufCEnumDescriptor *names = f->descriptor;
        if (carls_enum_parse(names, text, (int *)p) == 0)
            return 0;
        char list[256] = "";
        size_t used = 0;
        for (unsigned i = 0; i < names->n_values && used < sizeof list; i++)
            used += (size_t)snprintf(list + used, sizeof list - used, "%s%s", i ? ", " : "",
                                     carls_enum_name(&names->values[i]).text);
        return s_fail(self, "table setting %s: '%s' is none of %s", path, text, list);
    }
    case PROTOBUF_C_TYPE_STRING: {
        char **s = (char **)p;
        size_t len = strlen(text);
        char *copy = carls_xmalloc(len + 1);
        memcpy(copy, text, len + 1);
        if (*s && *s != (char *)f->default_value && *s != protobuf_c_empty_string)
            free(*s);
        *s = copy;
        return 0;
    }
    default:
        return s_fail(self, "table setting %s: a field of a type settings cannot set", path);
    }
}

/* Applies one "PATH=VALUE" line to cfg. 0, or KB_FFI_EINVAL. */
static int s_setting(kb_ffi_t *self, Carls__TableConfig *cfg, char *line)
{
    char *eq = strchr(line, '=');
    if (!eq)
        return s_fail(self, "table setting '%s': not PATH=VALUE", line);
    *eq = '\0';
    const char *path = line, *value = eq + 1;
    ProtobufCMessage *msg = &cfg->base;
    char *part = line;
    for (;;) {
        char *dot = strchr(part, '.');
        int part_len = (int)(dot ? (size_t)(dot - part) : strlen(part));
        if (dot)
            *dot = '\0';
        const ProtobufCFieldDescriptor *f = protobuf_c_message_descriptor_get_field_by_name(msg->descriptor, part);
        if (dot)
            *dot = '.';
        if (!f || f->label == PROTOBUF_C_LABEL_REPEATED || (f->flags & PROTOBUF_C_FIELD_FLAG_ONEOF))
            return s_fail(self, "table setting %s: %s has no field '%.*s'", path, msg->descriptor->name, part_len,
                          part);
        if (f->type != PROTOBUF_C_TYPE_MESSAGE) {
            if (dot)
                return s_fail(self, "table setting %s: '%.*s' is not a message", path, part_len, part);
            return s_set_scalar(self, msg, f, path, value);
        }
        if (!dot)
            return s_fail(self, "table setting %s: a message; set one of its fields (%s.FIELD)", path, path);
        ProtobufCMessage **sub = (ProtobufCMessage **)((char *)msg + f->offset);
        if (!*sub) {
            const ProtobufCMessageDescriptor *d = f->descriptor;
            *sub = carls_xcalloc(1, d->sizeof_message);
            protobuf_c_message_init(d, *sub);
        }
        msg = *sub;
        part = dot + 1;
    }
}

int kb_ffi_create_table(kb_ffi_t *self, const char *table, const char *settings, bool if_not_exists)
{
    assert(self);
    s_begin(self);
    if (s_table(self, table) != 0)
        return KB_FFI_EINVAL;
    Carls__TableConfig *cfg = carls_xcalloc(1, sizeof *cfg);
    carls__table_config__init(cfg);
    size_t len = settings ? strlen(settings) : 0;
    char *text = carls_xmalloc(len + 1);
    memcpy(text, settings ? settings : "", len + 1);
    int rc = 0;
    char *save = NULL;
    for (char *line = strtok_r(text, "\n", &save); line && rc == 0; line = strtok_r(NULL, "\n", &save))
        rc = s_setting(self, cfg, line);
    free(text);
    if (rc == 0)
        rc = kb_cluster_create_table(self->cluster, table, cfg, if_not_exists);
    protobuf_c_message_free_unpacked(&cfg->base, NULL);
    return rc;
}

int kb_ffi_drop_table(kb_ffi_t *self, const char *table, bool if_exists)
{
    assert(self);
    s_begin(self);
    if (s_table(self, table) != 0)
        return KB_FFI_EINVAL;
    int rc = kb_cluster_drop_table(self->cluster, table, if_exists);
    kb_cluster_forget_tables(self->cluster);
    return rc;
}

int kb_ffi_table_info(kb_ffi_t *self, const char *table, uint32_t *dim_out, int *kind_out)
{
    assert(self);
    s_begin(self);
    if (s_table(self, table) != 0)
        return KB_FFI_EINVAL;
    kb_cluster_table_t info;
    int rc = kb_cluster_table(self->cluster, table, &info);
    if (rc != 0)
        return rc;
    if (dim_out)
        *dim_out = info.dim;
    if (kind_out)
        *kind_out = (int)info.kind;
    return 0;
}

void kb_ffi_forget_tables(kb_ffi_t *self)
{
    assert(self);
    kb_cluster_forget_tables(self->cluster);
}

/* Starts a JSON answer. */
static kb_json_t *s_json(kb_ffi_t *self)
{
    self->json.len = 0;
    kb_json_raw(&self->json, "");
    return &self->json;
}

/* After a call that answered resp (rc 0) or failed (rc): the answer's part as JSON in *json_out, or
 * KB_FFI_EMALFORMED with `missing` when the part is absent. Frees resp. */
static int s_answer_json(kb_ffi_t *self, int rc, Carls__Response *resp, const ProtobufCMessage *part,
                         const char *missing, const char **json_out)
{
    if (rc == 0 && !part) {
        rc = KB_FFI_EMALFORMED;
        s_fail(self, "%s", missing);
    } else if (rc == 0) {
        kb_json_message(s_json(self), part);
        *json_out = self->json.text;
    }
    if (resp)
        carls__response__free_unpacked(resp, NULL);
    return rc;
}

int kb_ffi_list_tables_json(kb_ffi_t *self, const char **json_out)
{
    assert(self && json_out);
    s_begin(self);
    Carls__Response *resp = NULL;
    int rc = kb_cluster_list_tables(self->cluster, &resp);
    const ProtobufCMessage *part = rc == 0 && resp->table_list ? &resp->table_list->base : NULL;
    return s_answer_json(self, rc, resp, part, "list_tables: the answer holds no table list", json_out);
}

int kb_ffi_stats_json(kb_ffi_t *self, uint32_t shard, const char *table, const char **json_out)
{
    assert(self && json_out);
    s_begin(self);
    if (shard >= kb_cluster_shards(self->cluster))
        return s_fail(self, "stats: shard %u of a bank of %u", shard, kb_cluster_shards(self->cluster));
    Carls__Response *resp = NULL;
    int rc = kb_cluster_stats(self->cluster, shard, table, &resp);
    const ProtobufCMessage *part = rc == 0 && resp->stats ? &resp->stats->base : NULL;
    return s_answer_json(self, rc, resp, part, "stats: the answer holds no stats", json_out);
}

int kb_ffi_checkpoint_json(kb_ffi_t *self, const char **json_out)
{
    assert(self && json_out);
    s_begin(self);
    uint32_t shards = kb_cluster_shards(self->cluster);
    Carls__CheckpointResult *per = carls_xcalloc(shards, sizeof *per);
    int rc = kb_cluster_checkpoint(self->cluster, per);
    if (rc == 0) {
        kb_json_t *j = s_json(self);
        kb_json_raw(j, "[");
        for (uint32_t s = 0; s < shards; s++) {
            if (s)
                kb_json_raw(j, ",");
            kb_json_message(j, &per[s].base);
        }
        kb_json_raw(j, "]");
        *json_out = j->text;
    }
    free(per);
    return rc;
}

/* ---- rows --------------------------------------------------------------------------------------------------------- */

int kb_ffi_lookup(kb_ffi_t *self, const char *table, const void *data, size_t data_len, const uint64_t *ends,
                  size_t n, uint32_t dim, bool no_create, float *values_out, uint64_t *versions_out,
                  int64_t *updated_at_ms_out, uint64_t *frequencies_out)
{
    assert(self);
    s_begin(self);
    if (s_keyed_args(self, "lookup", table, data, data_len, ends, n, values_out, "no array for the values") != 0)
        return KB_FFI_EINVAL;
    bool want_meta = versions_out || updated_at_ms_out || frequencies_out;
    kb_row_meta_t *meta = want_meta ? carls_xmalloc((n ? n : 1) * sizeof *meta) : NULL;
    int rc = kb_cluster_lookup_ex(self->cluster, table, self->keys, n, dim, no_create, values_out, meta);
    if (rc == 0 && meta) {
        for (size_t i = 0; i < n; i++) {
            if (versions_out)
                versions_out[i] = meta[i].version;
            if (updated_at_ms_out)
                updated_at_ms_out[i] = meta[i].updated_at_ms;
            if (frequencies_out)
                frequencies_out[i] = meta[i].frequency;
        }
    }
    free(meta);
    return rc;
}

int kb_ffi_put(kb_ffi_t *self, const char *table, const void *data, size_t data_len, const uint64_t *ends,
               size_t n, uint32_t dim, const float *values, uint64_t version)
{
    assert(self);
    s_begin(self);
    if (s_keyed_args(self, "put", table, data, data_len, ends, n, values, "no values") != 0)
        return KB_FFI_EINVAL;
    return kb_cluster_put(self->cluster, table, self->keys, n, dim, values, version);
}

/* Starts a gradient push, waited for or only sent, and checks its arguments the same way for both. 0, or
 * KB_FFI_EINVAL (error set). */
static int s_push_args(kb_ffi_t *self, const char *table, const void *data, size_t data_len, const uint64_t *ends,
                       size_t n, const float *gradients)
{
    assert(self);
    s_begin(self);
    return s_keyed_args(self, "push_gradients", table, data, data_len, ends, n, gradients, "no gradients");
}

int kb_ffi_push_gradients(kb_ffi_t *self, const char *table, const void *data, size_t data_len,
                          const uint64_t *ends, size_t n, uint32_t dim, const float *gradients)
{
    if (s_push_args(self, table, data, data_len, ends, n, gradients) != 0)
        return KB_FFI_EINVAL;
    return kb_cluster_push_gradients(self->cluster, table, self->keys, n, dim, gradients);
}

/* Collects the oldest push in flight; its result (the cluster's error describes a failure). */
static int s_collect_oldest(kb_ffi_t *self)
{
    kb_cluster_pending_t *p = self->pushes[0];
    self->n_pushes--;
    memmove(self->pushes, self->pushes + 1, self->n_pushes * sizeof *self->pushes);
    return kb_cluster_push_gradients_wait(self->cluster, &p);
}

int kb_ffi_push_gradients_send(kb_ffi_t *self, const char *table, const void *data, size_t data_len,
                               const uint64_t *ends, size_t n, uint32_t dim, const float *gradients)
{
    if (s_push_args(self, table, data, data_len, ends, n, gradients) != 0)
        return KB_FFI_EINVAL;
    if (self->n_pushes == KB_FFI_MAX_PUSHES) {
        int rc = s_collect_oldest(self);
        if (rc != 0)
            return rc;
    }
    kb_cluster_pending_t *p = NULL;
    int rc = kb_cluster_push_gradients_send(self->cluster, table, self->keys, n, dim, gradients, &p);
    if (rc != 0)
        return rc;
    self->pushes = carls_grow(self->pushes, &self->pushes_cap, self->n_pushes + 1, sizeof *self->pushes);
    self->pushes[self->n_pushes++] = p;
    return 0;
}

int kb_ffi_wait_pushes(kb_ffi_t *self)
{
    assert(self);
    s_begin(self);
    int first = 0;
    while (self->n_pushes > 0) {
        int rc = s_collect_oldest(self);
        if (rc != 0 && first == 0) {
            first = rc;
            snprintf(self->error, sizeof self->error, "%s", kb_cluster_last_error(self->cluster));
            self->own_status = (int)kb_cluster_last_status(self->cluster);
        }
    }
    self->own_error = first != 0;
    return first;
}

size_t kb_ffi_pushes_in_flight(const kb_ffi_t *self)
{
    assert(self);
    return self->n_pushes;
}

/* ---- nearest neighbours, sampling ------------------------------------------------------------------------------- */

/* Keeps n keys as the handle's result keys. */
static void s_result_keys(kb_ffi_t *self, const kb_key_t *keys, size_t n)
{
    size_t total = 0;
    for (size_t i = 0; i < n; i++)
        total += keys[i].len + 1;
    self->result_keys = carls_grow(self->result_keys, &self->result_cap, total + 1, 1);
    self->result_ends = carls_grow(self->result_ends, &self->result_ends_cap, n ? n : 1, sizeof(uint64_t));
    self->result_has_nul = false;
    size_t at = 0;
    for (size_t i = 0; i < n; i++) {
        if (i)
            self->result_keys[at++] = '\0';
        if (keys[i].len) {
            memcpy(self->result_keys + at, keys[i].data, keys[i].len);
            if (memchr(keys[i].data, '\0', keys[i].len))
                self->result_has_nul = true;
        }
        at += keys[i].len;
        self->result_ends[i] = at;
    }
    self->result_keys[at] = '\0';
    self->result_len = at;
    self->result_n = n;
}

void kb_ffi_result_keys(const kb_ffi_t *self, const char **data_out, size_t *len_out, const uint64_t **ends_out,
                        size_t *n_out, bool *has_nul_out)
{
    assert(self);
    *data_out = self->result_keys ? self->result_keys : "";
    *len_out = self->result_len;
    *ends_out = self->result_ends;
    *n_out = self->result_n;
    *has_nul_out = self->result_has_nul;
}

/* Hands a knn answer over: scores into scores_out, keys into the handle; frees it. */
static void s_knn_out(kb_ffi_t *self, kb_knn_result_t **res_p, float *scores_out)
{
    kb_knn_result_t *res = *res_p;
    size_t n = res->nq * res->k;
    if (n)
        memcpy(scores_out, res->scores, n * sizeof *scores_out);
    s_result_keys(self, res->keys, n);
    kb_knn_result_destroy(res_p);
}

int kb_ffi_knn(kb_ffi_t *self, const char *table, const float *queries, size_t nq, uint32_t dim, uint32_t k,
               float *scores_out)
{
    assert(self);
    s_begin(self);
    if (s_table(self, table) != 0)
        return KB_FFI_EINVAL;
    if (nq > 0 && (!queries || !scores_out))
        return s_fail(self, "knn: no queries or no array for the scores");
    kb_knn_result_t *res = NULL;
    int rc = kb_cluster_knn(self->cluster, table, queries, nq, dim, k, &res);
    if (rc == 0)
        s_knn_out(self, &res, scores_out);
    return rc;
}

int kb_ffi_knn_by_key(kb_ffi_t *self, const char *table, const void *data, size_t data_len, const uint64_t *ends,
                      size_t nq, uint32_t k, bool exclude_self, float *scores_out)
{
    assert(self);
    s_begin(self);
    if (s_keyed_args(self, "knn_by_key", table, data, data_len, ends, nq, scores_out, "no array for the scores") != 0)
        return KB_FFI_EINVAL;
    kb_knn_result_t *res = NULL;
    int rc = kb_cluster_knn_by_key(self->cluster, table, self->keys, nq, k, exclude_self, &res);
    if (rc == 0)
        s_knn_out(self, &res, scores_out);
    return rc;
}

int kb_ffi_sample(kb_ffi_t *self, const char *table, const void *data, size_t data_len, const uint64_t *ends,
                  size_t n_pos, uint32_t n, const char *strategy, uint64_t seed, size_t cap, size_t *count_out,
                  float *probabilities_out, uint8_t *is_positive_out, double *mass_out, uint64_t *rows_out)
{
    assert(self && count_out);
    s_begin(self);
    if (s_table(self, table) != 0 || s_keys(self, "sample", data, data_len, ends, n_pos) != 0)
        return KB_FFI_EINVAL;
    if (cap > 0 && (!probabilities_out || !is_positive_out))
        return s_fail(self, "sample: no arrays for the probabilities and positive flags");
    int kind = 0;
    if (strategy && carls_enum_parse(&carls__sample_strategy__descriptor, strategy, &kind) != 0)
        return s_fail(self, "sample: no strategy '%s' (uniform, log-uniform, unigram)", strategy);
    kb_sample_result_t *res = NULL;
    int rc = kb_cluster_sample(self->cluster, table, self->keys, n_pos, n, (Carls__SampleStrategy)kind, seed, &res);
    if (rc != 0)
        return rc;
    if (res->n > cap) {
        rc = s_fail(self, "sample: %zu entries answered, room for %zu", res->n, cap);
    } else {
        for (size_t i = 0; i < res->n; i++) {
            probabilities_out[i] = res->probabilities[i];
            is_positive_out[i] = res->is_positive[i] ? 1 : 0;
        }
        *count_out = res->n;
        if (mass_out)
            *mass_out = res->mass;
        if (rows_out)
            *rows_out = res->rows;
        s_result_keys(self, res->keys, res->n);
    }
    kb_sample_result_destroy(&res);
    return rc;
}

/* ---- feature records --------------------------------------------------------------------------------------------------- */

int kb_ffi_get_features_json(kb_ffi_t *self, const char *table, const void *data, size_t data_len,
                             const uint64_t *ends, size_t n, const char **json_out)
{
    assert(self && json_out);
    s_begin(self);
    if (s_table(self, table) != 0 || s_keys(self, "get_features", data, data_len, ends, n) != 0)
        return KB_FFI_EINVAL;
    kb_feature_result_t *res = NULL;
    int rc = kb_cluster_feature_get(self->cluster, table, self->keys, n, &res);
    if (rc != 0)
        return rc;
    kb_json_t *j = s_json(self);
    kb_json_raw(j, "[");
    for (size_t i = 0; i < res->n; i++) {
        if (i)
            kb_json_raw(j, ",");
        kb_json_message(j, &res->records[i]->base);
    }
    kb_json_raw(j, "]");
    *json_out = j->text;
    kb_feature_result_destroy(&res);
    return 0;
}

int kb_ffi_put_features(kb_ffi_t *self, const char *table, const void *message, size_t message_len)
{
    assert(self);
    s_begin(self);
    if (s_table(self, table) != 0)
        return KB_FFI_EINVAL;
    if (!message && message_len)
        return s_fail(self, "put_features: no message");
    Carls__FeaturePut *put = carls__feature_put__unpack(NULL, message_len, message);
    if (!put)
        return s_fail(self, "put_features: %zu bytes that are no packed carls.FeaturePut", message_len);
    int rc;
    if (put->n_keys != put->n_records) {
        rc = s_fail(self, "put_features: %zu keys but %zu records", put->n_keys, put->n_records);
    } else {
        self->keys = carls_grow(self->keys, &self->keys_cap, put->n_keys ? put->n_keys : 1, sizeof *self->keys);
        for (size_t i = 0; i < put->n_keys; i++)
            self->keys[i] = (kb_key_t){put->keys[i].data, put->keys[i].len};
        rc = kb_cluster_feature_put(self->cluster, table, self->keys, put->n_keys,
                                    (const Carls__FeatureRecord *const *)put->records);
    }
    carls__feature_put__free_unpacked(put, NULL);
    return rc;
}
