/* Seed generator for the fuzz corpora: writes valid inputs for every target into OUTDIR/<target>/.
 *
 * Usage: fuzz_seeds OUTDIR
 *   OUTDIR/request/ and OUTDIR/service/  packed carls.Request frames, at least one per operation, naming the
 *                                        service harness's base tables (fuzz_common.h), plus a few invalid
 *                                        ones (bad version, no op, write without client id);
 *   OUTDIR/checkpoint/                   checkpoints written with carls_ckpt_write (one and several tensors,
 *                                        1..4 dimensions, the longest kind);
 *   OUTDIR/export/                       exports written with kb_export_writer (embedding and feature
 *                                        tables, empty and with rows).
 * The directories must exist. The seeds are a starting point for a fuzzing run; the corpus that is kept in
 * tests/fuzz/corpus/ is what libFuzzer minimized from them and from what it found (see README.md). */
#include "fuzz_common.h"

#include "checkpoint.h"
#include "kb_export.h"
#include "protocol.h"
#include "test_proto.h"

#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const char *s_out;

static void s_write_file(const char *target, const char *name, const uint8_t *data, size_t len)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/%s/%s", s_out, target, name);
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(data, 1, len, f) != len || fclose(f) != 0) {
        fprintf(stderr, "fuzz_seeds: cannot write %s\n", path);
        exit(1);
    }
}

/* Writes req into request/ and service/ as seed-<name>, the name formatted from fmt like printf. */
static void s_request(Carls__Request *req, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void s_request(Carls__Request *req, const char *fmt, ...)
{
    uint8_t *buf;
    size_t len;
    fuzz_pack_request(req, &buf, &len);
    char name[96], file[128];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(name, sizeof name, fmt, ap);
    va_end(ap);
    snprintf(file, sizeof file, "seed-%s", name);
    s_write_file("request", file, buf, len);
    s_write_file("service", file, buf, len);
    free(buf);
}

/* Addresses req (its operation kept): version 1, a request id, a write identity, the table. */
static void s_address(Carls__Request *req, const char *table, uint64_t sequence)
{
    req->protocol_version = CARLS_PROTOCOL_VERSION;
    req->request_id = 100 + sequence;
    req->client_id = 42;
    req->sequence = sequence;
    req->table = (char *)table;
}

/* A request with no operation yet, addressed as s_address does. */
static Carls__Request s_envelope(const char *table, uint64_t sequence)
{
    Carls__Request req = CARLS__REQUEST__INIT;
    s_address(&req, table, sequence);
    return req;
}

/* The envelope of a request that writes nothing: no client id, no sequence. */
static Carls__Request s_read_envelope(const char *table)
{
    Carls__Request req = s_envelope(table, 0);
    req.client_id = 0;
    return req;
}

static void s_requests(void)
{
    static uint8_t k1[] = "alpha", k2[] = "beta", k3[] = "gamma";
    ProtobufCBinaryData keys[3] = {{5, k1}, {4, k2}, {5, k3}};
    float emb_values[3 * FUZZ_EMB_DIM], lazy_values[3 * FUZZ_LAZY_DIM];
    for (unsigned i = 0; i < 3 * FUZZ_EMB_DIM; i++)
        emb_values[i] = 0.25f * (float)i - 1.0f;
    for (unsigned i = 0; i < 3 * FUZZ_LAZY_DIM; i++)
        lazy_values[i] = 0.5f - 0.125f * (float)i;
    uint64_t seq = 1;

    /* create_table: each base table (also with if_not_exists), and a few other configs. */
    for (int i = 0; i < FUZZ_BASE_TABLES; i++) {
        kb_table_config_wire_t w;
        fuzz_base_table_config(i, &w);
        Carls__CreateTable ct = CARLS__CREATE_TABLE__INIT;
        ct.config = &w.config;
        ct.if_not_exists = i == 0;
        Carls__Request req = s_envelope(fuzz_base_table_name(i), seq++);
        req.op_case = CARLS__REQUEST__OP_CREATE_TABLE;
        req.create_table = &ct;
        s_request(&req, "create-%s", fuzz_base_table_name(i));
    }
    {
        /* Adam, L2 HNSW index, Bloom admission. */
        kb_table_config_wire_t w;
        fuzz_base_table_config(0, &w);
        w.config.dim = 16;
        w.optimizer.kind = CARLS__OPTIMIZER_KIND__OPT_ADAM;
        w.knn.spec = "HNSW8";
        w.knn.metric = CARLS__KNN_METRIC__METRIC_L2;
        w.knn.ef_search = 32;
        w.config.admission = &w.admission;
        w.admission.kind = CARLS__ADMISSION_KIND__ADMIT_BLOOM;
        w.admission.bloom_bits_log2 = 10;
        w.admission.bloom_hashes = 3;
        Carls__CreateTable ct = CARLS__CREATE_TABLE__INIT;
        ct.config = &w.config;
        Carls__Request req = s_envelope("hnsw", seq++);
        req.op_case = CARLS__REQUEST__OP_CREATE_TABLE;
        req.create_table = &ct;
        s_request(&req, "create-hnsw");
        /* Momentum, IVF index with inner product. */
        w.config.dim = 4;
        w.optimizer.kind = CARLS__OPTIMIZER_KIND__OPT_MOMENTUM;
        w.knn.spec = "IVF4,Flat";
        w.knn.metric = CARLS__KNN_METRIC__METRIC_IP;
        w.knn.nprobe = 2;
        w.config.admission = NULL;
        w.lazy.policy = CARLS__UPDATE_POLICY__UPDATE_LAZY;
        w.lazy.outlier_rule = CARLS__OUTLIER_RULE__OUTLIER_NONE;
        s_address(&req, "ivf", seq++);
        s_request(&req, "create-ivf");
    }
    {
        Carls__DropTable dt = CARLS__DROP_TABLE__INIT;
        dt.if_exists = 1;
        Carls__Request req = s_envelope("nosuch", seq++);
        req.op_case = CARLS__REQUEST__OP_DROP_TABLE;
        req.drop_table = &dt;
        s_request(&req, "drop-if-exists");
        dt.if_exists = 0;
        s_address(&req, FUZZ_TABLE_LAZY, seq++);
        s_request(&req, "drop-lazy");
    }
    {
        Carls__ListTables lt = CARLS__LIST_TABLES__INIT;
        Carls__Request req = s_read_envelope("");
        req.op_case = CARLS__REQUEST__OP_LIST_TABLES;
        req.list_tables = &lt;
        s_request(&req, "list-tables");
    }
    for (int t = 0; t < 2; t++) {
        const char *table = t == 0 ? FUZZ_TABLE_EMB : FUZZ_TABLE_LAZY;
        float *values = t == 0 ? emb_values : lazy_values;
        unsigned dim = t == 0 ? FUZZ_EMB_DIM : FUZZ_LAZY_DIM;

        Carls__Lookup lk = CARLS__LOOKUP__INIT;
        lk.n_keys = 3;
        lk.keys = keys;
        Carls__Request req = s_read_envelope(table);
        req.op_case = CARLS__REQUEST__OP_LOOKUP;
        req.lookup = &lk;
        s_request(&req, "lookup-%s", table);
        lk.no_create = 1;
        s_request(&req, "lookup-no-create-%s", table);

        Carls__Put put = CARLS__PUT__INIT;
        put.version = 9;
        req = s_envelope(table, seq++);
        test_put_request(&req, &put, keys, 3, values, 3 * dim);
        s_request(&req, "put-%s", table);

        /* Three gradients for one key (the outlier rule needs three), two others. */
        ProtobufCBinaryData gkeys[3] = {keys[0], keys[0], keys[0]};
        Carls__PushGradients pg = CARLS__PUSH_GRADIENTS__INIT;
        pg.n_keys = 3;
        pg.keys = gkeys;
        pg.n_gradients = 3 * dim;
        pg.gradients = values;
        req = s_envelope(table, seq++);
        req.op_case = CARLS__REQUEST__OP_PUSH_GRADIENTS;
        req.push_gradients = &pg;
        s_request(&req, "push-%s", table);
        pg.keys = keys;
        s_address(&req, table, seq++);
        s_request(&req, "push-3keys-%s", table);

        Carls__Sample sm = CARLS__SAMPLE__INIT;
        sm.n_positives = 1;
        sm.positives = keys;
        sm.n = 5;
        sm.seed = 3;
        for (int st = 0; st < 3; st++) {
            sm.strategy = (Carls__SampleStrategy)st;
            req = s_read_envelope(table);
            req.op_case = CARLS__REQUEST__OP_SAMPLE;
            req.sample = &sm;
            s_request(&req, "sample-%d-%s", st, table);
        }

        Carls__Scan sc = CARLS__SCAN__INIT;
        sc.limit = 2;
        req = s_read_envelope(table);
        req.op_case = CARLS__REQUEST__OP_SCAN;
        req.scan = &sc;
        s_request(&req, "scan-%s", table);

        Carls__Stats stq = CARLS__STATS__INIT;
        req = s_read_envelope(table);
        req.op_case = CARLS__REQUEST__OP_STATS;
        req.stats = &stq;
        s_request(&req, "stats-%s", table);
    }
    {
        Carls__Knn kq = CARLS__KNN__INIT;
        kq.k = 2;
        kq.n_vectors = 2 * FUZZ_EMB_DIM;
        kq.vectors = emb_values;
        Carls__Request req = s_read_envelope(FUZZ_TABLE_EMB);
        req.op_case = CARLS__REQUEST__OP_KNN;
        req.knn = &kq;
        s_request(&req, "knn-vectors");
        kq.n_vectors = 0;
        kq.vectors = NULL;
        kq.n_keys = 2;
        kq.keys = keys;
        kq.exclude_query = 1;
        kq.k = 3;
        s_request(&req, "knn-keys");
    }
    {
        static uint8_t n1[] = "beta", n2[] = "delta", blob[] = {1, 2, 3, 0, 255};
        ProtobufCBinaryData nk[2] = {{4, n1}, {5, n2}};
        float nw[2] = {0.75f, 0.25f};
        Carls__FeatureRecord r1 = CARLS__FEATURE_RECORD__INIT, r2 = CARLS__FEATURE_RECORD__INIT;
        test_record_neighbors(&r1, nk, nw, 2);
        r1.label_case = CARLS__FEATURE_RECORD__LABEL_INT_LABEL;
        r1.int_label = 7;
        r1.label_confidence = 0.9f;
        r1.version = 3;
        r2.label_case = CARLS__FEATURE_RECORD__LABEL_FLOAT_LABEL;
        r2.float_label = 1.5f;
        r2.data.len = sizeof blob;
        r2.data.data = blob;
        Carls__FeatureRecord *recs[2] = {&r1, &r2};
        Carls__FeaturePut fp;
        Carls__Request req = s_envelope(FUZZ_TABLE_FEAT, seq++);
        test_feature_put_request(&req, &fp, keys, recs, 2);
        s_request(&req, "feature-put");

        Carls__FeatureGet fg;
        req = s_read_envelope(FUZZ_TABLE_FEAT);
        test_feature_get_request(&req, &fg, keys, 3);
        s_request(&req, "feature-get");

        Carls__Scan sc = CARLS__SCAN__INIT;
        req = s_read_envelope(FUZZ_TABLE_FEAT);
        req.op_case = CARLS__REQUEST__OP_SCAN;
        req.scan = &sc;
        s_request(&req, "scan-feat");

        Carls__Sample sm = CARLS__SAMPLE__INIT;
        sm.n = 4;
        req = s_read_envelope(FUZZ_TABLE_FEAT);
        req.op_case = CARLS__REQUEST__OP_SAMPLE;
        req.sample = &sm;
        s_request(&req, "sample-feat");
    }
    {
        /* import_rows: AdaGrad rows of the lazy table with their accumulators, one with a pending gradient;
         * then a feature row. */
        uint64_t versions[3] = {4, 5, 6}, freqs[3] = {2, 3, 9}, steps[3] = {1, 0, 7};
        int64_t updated[3] = {1000, 0, 2000};
        uint32_t pending[3] = {1, 0, 0};
        float acc[3 * FUZZ_LAZY_DIM];
        for (unsigned i = 0; i < 3 * FUZZ_LAZY_DIM; i++)
            acc[i] = 0.1f + 0.01f * (float)i;
        Carls__ImportRows im = CARLS__IMPORT_ROWS__INIT;
        im.n_keys = 3;
        im.keys = keys;
        im.n_values = 3 * FUZZ_LAZY_DIM;
        im.values = lazy_values;
        im.opt_floats = FUZZ_LAZY_DIM;
        im.n_opt_state = 3 * FUZZ_LAZY_DIM;
        im.opt_state = acc;
        im.n_opt_steps = im.n_versions = im.n_updated_at_ms = im.n_frequencies = im.n_pending_counts = 3;
        im.opt_steps = steps;
        im.versions = versions;
        im.updated_at_ms = updated;
        im.frequencies = freqs;
        im.pending_counts = pending;
        im.n_pending = FUZZ_LAZY_DIM;
        im.pending = lazy_values;
        Carls__Request req = s_envelope(FUZZ_TABLE_LAZY, seq++);
        req.op_case = CARLS__REQUEST__OP_IMPORT_ROWS;
        req.import_rows = &im;
        s_request(&req, "import-rows-lazy");

        Carls__FeatureRecord rec = CARLS__FEATURE_RECORD__INIT;
        rec.version = 2;
        Carls__FeatureRecord *recs[1] = {&rec};
        uint32_t none = 0;
        uint64_t zero = 0;
        Carls__ImportRows fim = CARLS__IMPORT_ROWS__INIT;
        fim.n_keys = 1;
        fim.keys = keys;
        fim.n_records = 1;
        fim.records = recs;
        fim.n_opt_steps = fim.n_versions = fim.n_updated_at_ms = fim.n_frequencies = fim.n_pending_counts = 1;
        fim.opt_steps = &zero;
        fim.versions = versions;
        fim.updated_at_ms = updated;
        fim.frequencies = freqs;
        fim.pending_counts = &none;
        req = s_envelope(FUZZ_TABLE_FEAT, seq++);
        req.op_case = CARLS__REQUEST__OP_IMPORT_ROWS;
        req.import_rows = &fim;
        s_request(&req, "import-rows-feat");
    }
    {
        Carls__Stats stq = CARLS__STATS__INIT;
        Carls__Request req = s_read_envelope("");
        req.op_case = CARLS__REQUEST__OP_STATS;
        req.stats = &stq;
        s_request(&req, "stats-all");

        Carls__Checkpoint ck = CARLS__CHECKPOINT__INIT;
        req.op_case = CARLS__REQUEST__OP_CHECKPOINT;
        req.checkpoint = &ck;
        s_request(&req, "checkpoint");

        /* Refused: no operation, another protocol version, a write without client id. */
        req = s_envelope(FUZZ_TABLE_EMB, 0);
        s_request(&req, "no-op");
        Carls__ListTables lt = CARLS__LIST_TABLES__INIT;
        req.op_case = CARLS__REQUEST__OP_LIST_TABLES;
        req.list_tables = &lt;
        req.protocol_version = 2;
        s_request(&req, "bad-version");
        Carls__Put put = CARLS__PUT__INIT;
        req = s_read_envelope(FUZZ_TABLE_EMB);
        test_put_request(&req, &put, keys, 1, emb_values, FUZZ_EMB_DIM);
        s_request(&req, "put-no-client");
    }
}

/* Writes a checkpoint built by add() into checkpoint/seed-<name>. */
static void s_checkpoint(const char *name, const char *kind, int tensors, int ndim)
{
    carls_ckpt_t *ck = carls_ckpt_new(kind, 1000 + (uint64_t)tensors);
    if (!ck)
        exit(1);
    for (int t = 0; t < tensors; t++) {
        int64_t dims[4] = {2, 3, 1, 2};
        int64_t numel = 1;
        for (int d = 0; d < ndim; d++)
            numel *= dims[d];
        float data[12];
        for (int64_t i = 0; i < numel; i++)
            data[i] = (float)(t + 1) * 0.5f - (float)i;
        char tname[32];
        snprintf(tname, sizeof tname, "layer%d.weight", t);
        if (carls_ckpt_add(ck, tname, ndim, dims, data) != 0)
            exit(1);
    }
    char path[1024], err[256];
    snprintf(path, sizeof path, "%s/checkpoint/seed-%s", s_out, name);
    if (carls_ckpt_write(ck, path, err, sizeof err) != 0) {
        fprintf(stderr, "fuzz_seeds: %s\n", err);
        exit(1);
    }
    carls_ckpt_destroy(&ck);
}

static void s_checkpoints(void)
{
    s_checkpoint("empty", "mlp_classifier", 0, 1);
    s_checkpoint("one-1d", "mlp_classifier", 1, 1);
    s_checkpoint("three-2d", "mlp_encoder", 3, 2);
    s_checkpoint("two-4d", "0123456789012345678901234567890123456789012345678901234567890123", 2, 4);
    /* Format version 2: a tensor and blobs (a trainer's resume state: a u64, a text, raw bytes). */
    carls_ckpt_t *ck = carls_ckpt_new("mlp_classifier", 250);
    const float w[2] = {0.5f, -1.5f};
    const int64_t dims[1] = {2};
    const unsigned char order[6] = {3, 0, 0, 0, 1, 0};
    char path[1024], err[256];
    snprintf(path, sizeof path, "%s/checkpoint/seed-blobs", s_out);
    if (!ck || carls_ckpt_add(ck, "enc.0.bias", 1, dims, w) != 0 || carls_ckpt_add_u64(ck, "train.step", 250) != 0 ||
        carls_ckpt_add_text(ck, "bank.snapshot", "run-step250") != 0 ||
        carls_ckpt_add_blob(ck, "data.order", order, sizeof order) != 0 ||
        carls_ckpt_write(ck, path, err, sizeof err) != 0) {
        fprintf(stderr, "fuzz_seeds: seed-blobs: %s\n", err);
        exit(1);
    }
    carls_ckpt_destroy(&ck);
}

/* Writes an export of `rows` rows into export/seed-<name>. */
static void s_export(const char *name, bool feature, uint32_t dim, int rows)
{
    Carls__TableConfig cfg = CARLS__TABLE_CONFIG__INIT;
    cfg.kind = feature ? CARLS__TABLE_KIND__TABLE_FEATURE : CARLS__TABLE_KIND__TABLE_EMBEDDING;
    cfg.dim = feature ? 0 : dim;
    cfg.init_scale = 0.05f;
    char path[1024], err[256];
    snprintf(path, sizeof path, "%s/export/seed-%s", s_out, name);
    kb_export_writer_t *w = NULL;
    if (kb_export_writer_open(path, feature ? "features" : "embeddings", &cfg, &w, err, sizeof err) != 0)
        goto fail;
    for (int i = 0; i < rows; i++) {
        char key[32];
        snprintf(key, sizeof key, "key-%d", i);
        float values[8];
        for (uint32_t j = 0; j < dim && j < 8; j++)
            values[j] = (float)i - 0.25f * (float)j;
        static uint8_t nb[] = "key-0";
        ProtobufCBinaryData nk = {5, nb};
        float nw = 0.5f;
        Carls__FeatureRecord rec = CARLS__FEATURE_RECORD__INIT;
        test_record_neighbors(&rec, &nk, &nw, (size_t)(i % 2));
        rec.label_case = CARLS__FEATURE_RECORD__LABEL_INT_LABEL;
        rec.int_label = i;
        rec.version = (uint64_t)i;
        /* Format 2: embedding rows with an optimizer state of dim floats and i % 3 pending gradients. */
        float state[8 + 2 * 8];
        for (unsigned j = 0; j < sizeof state / sizeof *state; j++)
            state[j] = 0.125f * (float)(i + (int)j);
        kb_export_state_t st = {.version = (uint64_t)i + 1, .frequency = (uint64_t)i * 3,
                                .updated_at_ms = 1000 * (int64_t)i, .opt_steps = feature ? 0 : (uint64_t)i,
                                .opt_floats = feature || dim > 8 ? 0 : dim, .opt_state = state,
                                .pending_count = feature || dim > 8 ? 0 : (uint32_t)(i % 3), .pending = state + 8};
        if (kb_export_writer_add_state(w, key, strlen(key), feature ? NULL : values, feature ? &rec : NULL, &st, err,
                                       sizeof err) != 0)
            goto fail;
    }
    if (kb_export_writer_finish(w, err, sizeof err) != 0)
        goto fail;
    kb_export_writer_destroy(&w);
    return;
fail:
    fprintf(stderr, "fuzz_seeds: export %s: %s\n", name, err);
    exit(1);
}

static void s_exports(void)
{
    s_export("embedding-empty", false, 4, 0);
    s_export("embedding-3rows", false, 4, 3);
    s_export("embedding-dim1", false, 1, 2);
    s_export("feature-empty", true, 0, 0);
    s_export("feature-3rows", true, 0, 3);
}

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: %s OUTDIR (with request/ service/ checkpoint/ export/ in it)\n", argv[0]);
        return 1;
    }
    s_out = argv[1];
    s_requests();
    s_checkpoints();
    s_exports();
    return 0;
}
