/* Fuzz target "service": the server's request handling, kb_service_handle (decode, validation, dispatch and
 * every operation) over a real bank.
 *
 * Set-up (once, and again every S_RESET_EVERY inputs to bound what accumulates): a kb_bank in a fresh
 * temporary directory (under /dev/shm when it exists, so commits cost no disk flushes) with interval
 * durability (1000 ms, so no input waits for a commit), a service with the small FUZZ_* limits, and the base
 * tables of fuzz_common.h created by sending valid packed create_table requests through kb_service_handle.
 *
 * Each input is one frame, handed to kb_service_handle. Invariants checked on every reply:
 *  - it decodes as a carls.Response with protocol_version 1;
 *  - it echoes the request id when the frame decoded as a Request, and is MALFORMED or TOO_LARGE with id 0
 *    when it did not;
 *  - an error carries a message and no result; a success carries the result its operation promises, with
 *    array lengths that agree (values = keys x dim, one version/frequency per key, nq x k neighbours, ...);
 *  - after a successful feature_put, a feature_get of its keys finds the records that were put.
 * After each input the base tables are restored (tables the input created are dropped, a base table it
 * dropped or replaced is created again), so every input starts from nearly the same bank.
 *
 * With CARLS_FUZZ_VERBOSE set in the environment, each reply's status and error are printed.
 *
 * At exit (atexit) the service and bank are closed and the directory is removed, so LeakSanitizer sees a
 * clean process. */
#include "fuzz_common.h"

#include "kb_bank.h"
#include "kb_service.h"
#include "kb_table.h"
#include "kb_table_config.h"
#include "log.h"
#include "protocol.h"
#include "test_proto.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define S_RESET_EVERY 20000u            /* inputs between fresh banks */
#define S_CLIENT_ID 0x66757a7a68617233ull /* the harness's own writes */

static struct {
    bool ready;
    char dir[256];
    kb_bank_t *bank;
    kb_service_t *service;
    kb_table_config_t base[FUZZ_BASE_TABLES]; /* the base tables' configs, defaults filled in */
    uint64_t sequence;                        /* of the harness's own writes */
    uint64_t inputs;                          /* since the last reset */
    bool verbose;                             /* CARLS_FUZZ_VERBOSE set: print each reply's status */
} s;

/* Removes the bank's directory (flat: the SQLite files). */
/* Sends one frame the harness built and checks it succeeded. */
static void s_handle_ok(const uint8_t *frame, size_t len)
{
    uint8_t *reply = NULL;
    size_t reply_len = 0;
    kb_service_handle(s.service, frame, len, &reply, &reply_len);
    Carls__Response *resp = carls__response__unpack(NULL, reply_len, reply);
    FUZZ_CHECK(resp != NULL);
    if (resp->status != CARLS__STATUS_CODE__STATUS_OK)
        fprintf(stderr, "fuzz_service: set-up request failed: %s\n", resp->error);
    FUZZ_CHECK(resp->status == CARLS__STATUS_CODE__STATUS_OK);
    carls__response__free_unpacked(resp, NULL);
    free(reply);
}

static void s_create_base(int i)
{
    uint8_t *frame;
    size_t len;
    fuzz_pack_create_base(i, S_CLIENT_ID, ++s.sequence, &frame, &len);
    s_handle_ok(frame, len);
    free(frame);
}

static void s_close(void)
{
    if (!s.ready)
        return;
    kb_service_destroy(&s.service);
    kb_bank_close(&s.bank);
    fuzz_remove_dir(s.dir);
    s.ready = false;
}

static void s_open(void)
{
    fuzz_scratch_dir("service", s.dir, sizeof s.dir);
    kb_bank_options_t opts = {.data_dir = s.dir, .sync = false, .interval_ms = 1000};
    char err[512];
    if (kb_bank_open(&opts, &s.bank, err, sizeof err) != 0) {
        fprintf(stderr, "fuzz_service: cannot open a bank in %s: %s\n", s.dir, err);
        abort();
    }
    kb_limits_t limits;
    kb_limits_defaults(&limits);
    limits.max_message_bytes = FUZZ_MAX_MESSAGE_BYTES;
    limits.max_key_bytes = FUZZ_MAX_KEY_BYTES;
    limits.max_dim = FUZZ_MAX_DIM;
    limits.max_keys_per_request = FUZZ_MAX_KEYS_PER_REQUEST;
    limits.commit_timeout_ms = 10000;
    s.service = kb_service_new(s.bank, &limits, 1, "interval:1000");
    s.sequence = 0;
    s.inputs = 0;
    s.ready = true;
    for (int i = 0; i < FUZZ_BASE_TABLES; i++)
        s_create_base(i);
}

static void s_setup(void)
{
    carls_log_set_level(CARLS_LOG_OFF);
    s.verbose = getenv("CARLS_FUZZ_VERBOSE") != NULL;
    for (int i = 0; i < FUZZ_BASE_TABLES; i++) {
        kb_table_config_wire_t w;
        fuzz_base_table_config(i, &w);
        char err[256];
        if (kb_table_config_from_proto(&w.config, FUZZ_MAX_DIM, &s.base[i], err, sizeof err) != 0) {
            fprintf(stderr, "fuzz_service: base table %d: %s\n", i, err);
            abort();
        }
    }
    s_open();
    atexit(s_close);
}

static int s_base_index(const char *name)
{
    for (int i = 0; i < FUZZ_BASE_TABLES; i++)
        if (strcmp(name, fuzz_base_table_name(i)) == 0)
            return i;
    return -1;
}

/* Drops every table that is not a base table with its base config; re-creates missing base tables. */
static void s_restore_tables(void)
{
    kb_table_t **tables;
    size_t n = kb_bank_acquire_all(s.bank, &tables);
    bool present[FUZZ_BASE_TABLES] = {false};
    char (*drop)[CARLS_MAX_TABLE_NAME_BYTES + 1] = n ? calloc(n, sizeof *drop) : NULL;
    size_t n_drop = 0;
    for (size_t i = 0; i < n; i++) {
        const char *name = kb_table_name(tables[i]);
        int b = s_base_index(name);
        if (b >= 0 && memcmp(kb_table_config(tables[i]), &s.base[b], sizeof s.base[b]) == 0)
            present[b] = true;
        else
            snprintf(drop[n_drop++], sizeof drop[0], "%s", name);
        kb_bank_release(s.bank, tables[i]);
    }
    free(tables);
    if (n_drop > 0) {
        kb_commit_write_begin(kb_bank_commit(s.bank));
        for (size_t i = 0; i < n_drop; i++)
            kb_bank_drop_table(s.bank, drop[i]);
        kb_commit_write_end(kb_bank_commit(s.bank));
    }
    free(drop);
    for (int i = 0; i < FUZZ_BASE_TABLES; i++)
        if (!present[i])
            s_create_base(i);
}

/* A record's known fields packed as the server stores them (found and updated_at_ms cleared), in a new
 * buffer. */
static uint8_t *s_pack_known(const Carls__FeatureRecord *rec, size_t *len)
{
    Carls__FeatureRecord r = *rec;
    r.found = false;
    r.updated_at_ms = 0;
    r.base.n_unknown_fields = 0;
    r.base.unknown_fields = NULL;
    *len = carls__feature_record__get_packed_size(&r);
    uint8_t *buf = malloc(*len ? *len : 1);
    FUZZ_CHECK(buf != NULL);
    carls__feature_record__pack(&r, buf);
    return buf;
}

/* Read after write: after a successful (not duplicate) feature_put, a feature_get of the same keys must find
 * every key with the record that was put (for a key put twice, the last one). (Records with unknown fields
 * are refused since finding F2, so every acknowledged record must read back.) */
static void s_check_feature_put(const Carls__Request *put)
{
    const Carls__FeaturePut *fp = put->feature_put;
    Carls__FeatureGet fg;
    Carls__Request req = CARLS__REQUEST__INIT;
    req.protocol_version = CARLS_PROTOCOL_VERSION;
    req.request_id = 77;
    req.table = put->table;
    test_feature_get_request(&req, &fg, fp->keys, fp->n_keys);
    uint8_t *frame, *reply = NULL;
    size_t len, reply_len = 0;
    fuzz_pack_request(&req, &frame, &len);
    kb_service_handle(s.service, frame, len, &reply, &reply_len);
    free(frame);
    Carls__Response *resp = carls__response__unpack(NULL, reply_len, reply);
    FUZZ_CHECK(resp != NULL && resp->status == CARLS__STATUS_CODE__STATUS_OK);
    FUZZ_CHECK(resp->result_case == CARLS__RESPONSE__RESULT_FEATURES && resp->features->n_records == fp->n_keys);
    for (size_t i = 0; i < fp->n_keys; i++) {
        size_t last = i;
        for (size_t j = i + 1; j < fp->n_keys; j++)
            if (fp->keys[j].len == fp->keys[i].len && memcmp(fp->keys[j].data, fp->keys[i].data, fp->keys[i].len) == 0)
                last = j;
        const Carls__FeatureRecord *want = fp->records[last];
        FUZZ_CHECK(want->base.n_unknown_fields == 0);
        const Carls__FeatureRecord *got = resp->features->records[i];
        FUZZ_CHECK(got->found);
        size_t a_len, b_len;
        uint8_t *a = s_pack_known(want, &a_len), *b = s_pack_known(got, &b_len);
        FUZZ_CHECK(a_len == b_len && memcmp(a, b, a_len) == 0);
        free(a);
        free(b);
    }
    carls__response__free_unpacked(resp, NULL);
    free(reply);
}

/* A successful row write's reply: a write result with every one of its n_keys rows, or a duplicate (a resend
 * of a write already applied). */
static void s_check_rows_written(const Carls__Response *resp, size_t n_keys)
{
    FUZZ_CHECK(resp->result_case == CARLS__RESPONSE__RESULT_WRITE);
    FUZZ_CHECK(resp->write->duplicate || resp->write->rows == n_keys);
}

/* The shape checks of a successful reply to req. */
static void s_check_result(const Carls__Request *req, const Carls__Response *resp)
{
    switch (req->op_case) {
    case CARLS__REQUEST__OP_CREATE_TABLE:
    case CARLS__REQUEST__OP_DROP_TABLE:
        FUZZ_CHECK(resp->result_case == CARLS__RESPONSE__RESULT_WRITE);
        break;
    case CARLS__REQUEST__OP_PUT:
        s_check_rows_written(resp, req->put->n_keys);
        break;
    case CARLS__REQUEST__OP_PUSH_GRADIENTS:
        s_check_rows_written(resp, req->push_gradients->n_keys);
        break;
    case CARLS__REQUEST__OP_FEATURE_PUT:
        s_check_rows_written(resp, req->feature_put->n_keys);
        if (!resp->write->duplicate)
            s_check_feature_put(req);
        break;
    case CARLS__REQUEST__OP_IMPORT_ROWS:
        s_check_rows_written(resp, req->import_rows->n_keys);
        break;
    case CARLS__REQUEST__OP_LIST_TABLES:
        FUZZ_CHECK(resp->result_case == CARLS__RESPONSE__RESULT_TABLE_LIST);
        for (size_t i = 0; i < resp->table_list->n_tables; i++)
            FUZZ_CHECK(carls_table_name_valid(resp->table_list->tables[i]->name));
        break;
    case CARLS__REQUEST__OP_LOOKUP: {
        FUZZ_CHECK(resp->result_case == CARLS__RESPONSE__RESULT_LOOKUP);
        const Carls__LookupResult *r = resp->lookup;
        size_t n = req->lookup->n_keys;
        FUZZ_CHECK(r->dim >= 1 && r->dim <= FUZZ_MAX_DIM);
        FUZZ_CHECK(r->n_values == n * r->dim);
        FUZZ_CHECK(r->n_versions == n && r->n_updated_at_ms == n && r->n_frequencies == n);
        break;
    }
    case CARLS__REQUEST__OP_STATS:
        FUZZ_CHECK(resp->result_case == CARLS__RESPONSE__RESULT_STATS);
        FUZZ_CHECK(!(req->table && req->table[0]) || resp->stats->n_tables == 1);
        break;
    case CARLS__REQUEST__OP_CHECKPOINT:
        FUZZ_CHECK(resp->result_case == CARLS__RESPONSE__RESULT_CHECKPOINT);
        break;
    case CARLS__REQUEST__OP_KNN: {
        FUZZ_CHECK(resp->result_case == CARLS__RESPONSE__RESULT_KNN);
        const Carls__KnnResult *r = resp->knn;
        FUZZ_CHECK(r->k == req->knn->k);
        FUZZ_CHECK(r->n_keys == r->n_scores && r->k > 0 && r->n_keys % r->k == 0);
        if (req->knn->n_keys > 0)
            FUZZ_CHECK(r->n_keys == req->knn->n_keys * r->k);
        break;
    }
    case CARLS__REQUEST__OP_SAMPLE: {
        FUZZ_CHECK(resp->result_case == CARLS__RESPONSE__RESULT_SAMPLE);
        const Carls__SampleResult *r = resp->sample;
        size_t total = req->sample->n_positives + req->sample->n;
        FUZZ_CHECK(r->n_keys == total && r->n_probabilities == total && r->n_is_positive == total);
        for (size_t i = 0; i < total; i++)
            FUZZ_CHECK(r->is_positive[i] == (i < req->sample->n_positives));
        break;
    }
    case CARLS__REQUEST__OP_FEATURE_GET:
        FUZZ_CHECK(resp->result_case == CARLS__RESPONSE__RESULT_FEATURES);
        FUZZ_CHECK(resp->features->n_records == req->feature_get->n_keys);
        for (size_t i = 0; s.verbose && i < resp->features->n_records; i++)
            fprintf(stderr, "fuzz_service:   record %zu: found %d\n", i, (int)resp->features->records[i]->found);
        break;
    case CARLS__REQUEST__OP_SCAN: {
        FUZZ_CHECK(resp->result_case == CARLS__RESPONSE__RESULT_SCAN);
        const Carls__ScanResult *r = resp->scan;
        size_t n = r->n_keys;
        FUZZ_CHECK(n <= FUZZ_MAX_KEYS_PER_REQUEST);
        FUZZ_CHECK(r->n_row_ids == n && r->n_versions == n && r->n_frequencies == n);
        FUZZ_CHECK(r->n_values == n * r->dim);
        FUZZ_CHECK(r->dim == 0 ? r->n_records == n : r->n_records == 0);
        for (size_t i = 1; i < n; i++)
            FUZZ_CHECK(r->row_ids[i] > r->row_ids[i - 1]);
        /* Each row's whole state: one entry per row, opt_floats per row, the pending floats the counts need. */
        FUZZ_CHECK(r->n_opt_steps == n && r->n_updated_at_ms == n && r->n_pending_counts == n);
        FUZZ_CHECK(r->n_opt_state == n * r->opt_floats && r->opt_floats <= 2 * r->dim);
        size_t pending = 0;
        for (size_t i = 0; i < n; i++)
            pending += r->pending_counts[i];
        FUZZ_CHECK(r->n_pending == pending * r->dim);
        if (n > 0)
            FUZZ_CHECK(r->row_ids[0] > req->scan->after_row_id);
        break;
    }
    case CARLS__REQUEST__OP_SNAPSHOT: /* create and delete answer the one snapshot, list any number */
        FUZZ_CHECK(resp->result_case == CARLS__RESPONSE__RESULT_SNAPSHOT);
        FUZZ_CHECK(req->snapshot->action == CARLS__SNAPSHOT_ACTION__SNAPSHOT_LIST || resp->snapshot->n_snapshots == 1);
        for (size_t i = 0; i < resp->snapshot->n_snapshots; i++)
            FUZZ_CHECK(resp->snapshot->snapshots[i] && resp->snapshot->snapshots[i]->name);
        break;
    default:
        fuzz_fail(__FILE__, __LINE__, "a request without a known operation succeeded");
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (!s.ready)
        s_setup();
    else if (s.inputs >= S_RESET_EVERY) {
        s_close();
        s_open();
    }
    s.inputs++;

    uint8_t *reply = NULL;
    size_t reply_len = 0;
    kb_service_handle(s.service, data, size, &reply, &reply_len);
    FUZZ_CHECK(reply != NULL);

    Carls__Response *resp = carls__response__unpack(NULL, reply_len, reply);
    FUZZ_CHECK(resp != NULL);
    FUZZ_CHECK(resp->protocol_version == CARLS_PROTOCOL_VERSION);
    if (s.verbose)
        fprintf(stderr, "fuzz_service: %zu bytes -> %s %s\n", size, carls_status_name(resp->status), resp->error);
    Carls__Request *req = size <= FUZZ_MAX_MESSAGE_BYTES ? carls__request__unpack(NULL, size, data) : NULL;
    if (req) {
        FUZZ_CHECK(resp->request_id == req->request_id);
        FUZZ_CHECK(resp->status != CARLS__STATUS_CODE__STATUS_MALFORMED);
    } else {
        FUZZ_CHECK(resp->request_id == 0);
        FUZZ_CHECK(resp->status == CARLS__STATUS_CODE__STATUS_MALFORMED ||
                   resp->status == CARLS__STATUS_CODE__STATUS_TOO_LARGE);
    }
    if (resp->status != CARLS__STATUS_CODE__STATUS_OK) {
        FUZZ_CHECK(resp->error && resp->error[0] != '\0');
        FUZZ_CHECK(resp->result_case == CARLS__RESPONSE__RESULT__NOT_SET);
    } else {
        FUZZ_CHECK(req != NULL);
        s_check_result(req, resp);
    }
    if (req)
        carls__request__free_unpacked(req, NULL);
    carls__response__free_unpacked(resp, NULL);
    free(reply);

    s_restore_tables();
    return 0;
}
