/* Unit tests for the journal in front of SQLite (kb_journal) and the batch records it holds (kb_batch):
 * encode/decode round trip of every kind of row, decoding of every truncated prefix and of lying counts,
 * append and replay (only epochs after the compacted one), a torn last record dropped, damage followed by
 * acknowledged records refused with the file and offset, a bank that opens over a journal left by a
 * crash replays it into SQLite and removes it, and a sync commit the disk refuses is never acknowledged. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>
#include "test_main.h"

#include <dirent.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include "bank_testlib.h"
#include "kb_bank.h"
#include "kb_batch.h"
#include "kb_journal.h"
#include "kb_table_config.h"
#include "test_util.h"
#include "util.h"

static char s_dir[256];

static int s_setup(void **state)
{
    (void)state;
    return test_tmpdir(s_dir, sizeof s_dir, "kb-journal");
}

static int s_teardown(void **state)
{
    (void)state;
    return test_rmrf(s_dir);
}

static void *s_dup(const void *p, size_t n)
{
    void *q = malloc(n);
    memcpy(q, p, n);
    return q;
}

/* A batch with one of everything: a create and a drop, a row with value, optimizer state, pending
 * gradients; a feature row; an evicted row; a frequency-only update; two clients. */
static void s_sample_batch(kb_batch_t *b, uint64_t epoch)
{
    memset(b, 0, sizeof *b);
    b->epoch = epoch;
    b->op_count = 2;
    b->ops = calloc(2, sizeof *b->ops);
    b->ops[0] = (kb_table_op_t){.drop = false, .id = 7, .name = strdup("emb"), .config = s_dup("\x08\x02", 2),
                                .config_len = 2};
    b->ops[1] = (kb_table_op_t){.drop = true, .id = 3};
    float value[2] = {1.5f, -2.25f}, opt[2] = {0.125f, 4.0f}, pending[4] = {1, 2, 3, 4};
    b->row_count = b->row_capacity = 4;
    b->rows = calloc(4, sizeof *b->rows);
    b->rows[0] = (kb_store_row_t){.table_id = 7, .key = s_dup("alpha", 5), .key_len = 5, .row_id = 11,
                                  .value = s_dup(value, sizeof value), .dim = 2, .opt_state = s_dup(opt, sizeof opt),
                                  .opt_floats = 2, .opt_steps = 9, .pending = s_dup(pending, sizeof pending),
                                  .pending_count = 2, .version = 42, .updated_at_ms = 1234567, .frequency = 5};
    b->rows[1] = (kb_store_row_t){.table_id = 8, .key = s_dup("doc", 3), .key_len = 3, .row_id = 1,
                                  .record = s_dup("\x0a\x01x", 3), .record_len = 3, .version = 1};
    b->rows[2] = (kb_store_row_t){.table_id = 7, .key = s_dup("gone", 4), .key_len = 4, .row_id = 12, .dim = 2,
                                  .deleted = true};
    b->rows[3] = (kb_store_row_t){.table_id = 7, .key = s_dup("beta", 4), .key_len = 4, .row_id = 13, .dim = 2,
                                  .frequency = 77, .frequency_only = true};
    b->client_count = b->client_capacity = 2;
    b->clients = calloc(2, sizeof *b->clients);
    b->clients[0].client_id = 0xabcdef;
    b->clients[0].max_seq = 99;
    b->clients[0].window[0] = 0x5a;
    b->clients[1].client_id = 1;
    b->clients[1].max_seq = 1;
}

static void s_assert_rows_equal(const kb_store_row_t *a, const kb_store_row_t *b)
{
    assert_int_equal(a->table_id, b->table_id);
    assert_int_equal(a->key_len, b->key_len);
    assert_memory_equal(a->key, b->key, a->key_len);
    assert_int_equal(a->row_id, b->row_id);
    assert_int_equal(a->dim, b->dim);
    assert_int_equal(!!a->value, !!b->value);
    if (a->value)
        assert_memory_equal(a->value, b->value, a->dim * sizeof(float));
    assert_int_equal(a->opt_floats, b->opt_floats);
    assert_int_equal(!!a->opt_state, !!b->opt_state);
    if (a->opt_state)
        assert_memory_equal(a->opt_state, b->opt_state, a->opt_floats * sizeof(float));
    assert_int_equal(a->opt_steps, b->opt_steps);
    assert_int_equal(a->pending_count, b->pending_count);
    assert_int_equal(!!a->pending, !!b->pending);
    if (a->pending)
        assert_memory_equal(a->pending, b->pending, a->pending_count * a->dim * sizeof(float));
    assert_int_equal(a->version, b->version);
    assert_int_equal(a->updated_at_ms, b->updated_at_ms);
    assert_int_equal(a->frequency, b->frequency);
    assert_int_equal(a->record_len, b->record_len);
    if (a->record)
        assert_memory_equal(a->record, b->record, a->record_len);
    assert_int_equal(a->deleted, b->deleted);
    assert_int_equal(a->frequency_only, b->frequency_only);
}

static void test_batch_round_trip(void **state)
{
    (void)state;
    kb_batch_t b, back;
    s_sample_batch(&b, 17);
    size_t len;
    uint8_t *bytes = kb_batch_encode(&b, &len);
    char err[256];
    assert_int_equal(kb_batch_decode(bytes, len, &back, err, sizeof err), 0);
    assert_int_equal(back.epoch, 17);
    assert_int_equal(back.op_count, 2);
    assert_string_equal(back.ops[0].name, "emb");
    assert_int_equal(back.ops[0].id, 7);
    assert_int_equal(back.ops[0].config_len, 2);
    assert_memory_equal(back.ops[0].config, "\x08\x02", 2);
    assert_true(back.ops[1].drop);
    assert_int_equal(back.ops[1].id, 3);
    assert_int_equal(back.row_count, b.row_count);
    for (size_t i = 0; i < b.row_count; i++)
        s_assert_rows_equal(&b.rows[i], &back.rows[i]);
    assert_int_equal(back.client_count, 2);
    assert_memory_equal(&back.clients[0], &b.clients[0], sizeof b.clients[0]);
    assert_memory_equal(&back.clients[1], &b.clients[1], sizeof b.clients[1]);
    free(bytes);
    kb_batch_free(&b);
    kb_batch_free(&back);
}

/* Every prefix of a record, and the record with one byte more, are refused with an offset (ASan checks
 * nothing is read out of bounds and nothing leaks). */
static void test_batch_decode_refuses_truncation(void **state)
{
    (void)state;
    kb_batch_t b, back;
    s_sample_batch(&b, 3);
    size_t len;
    uint8_t *bytes = kb_batch_encode(&b, &len);
    char err[256];
    for (size_t n = 0; n < len; n++) {
        err[0] = '\0';
        assert_int_equal(kb_batch_decode(bytes, n, &back, err, sizeof err), -1);
        assert_non_null(strstr(err, "malformed at byte"));
        assert_int_equal(back.row_count, 0);
    }
    uint8_t *longer = malloc(len + 1);
    memcpy(longer, bytes, len);
    longer[len] = 0;
    assert_int_equal(kb_batch_decode(longer, len + 1, &back, err, sizeof err), -1);
    /* A row count that claims far more rows than the bytes could hold is refused before any allocation. */
    size_t rows_at = 8 + 4 + (1 + 8 + 4 + 3 + 4 + 2) + (1 + 8 + 4 + 4);
    memcpy(longer, bytes, len);
    longer[rows_at + 3] = 0x7f;
    assert_int_equal(kb_batch_decode(longer, len, &back, err, sizeof err), -1);
    free(longer);
    free(bytes);
    kb_batch_free(&b);
}

static void test_superseded_rows_marked(void **state)
{
    (void)state;
    kb_batch_t b[2];
    s_sample_batch(&b[0], 1);
    s_sample_batch(&b[1], 2);
    /* Both batches write alpha, doc and gone whole; beta's frequency-only updates are always kept. */
    assert_int_equal(kb_batch_mark_superseded(b, 2), 3);
    assert_true(b[0].rows[0].superseded && b[0].rows[1].superseded && b[0].rows[2].superseded);
    assert_false(b[0].rows[3].superseded);
    for (int i = 0; i < 4; i++)
        assert_false(b[1].rows[i].superseded);
    kb_batch_free(&b[0]);
    kb_batch_free(&b[1]);
}

typedef struct {
    uint64_t epochs[16];
    size_t n;
} s_seen_t;

static int s_collect(void *ctx, uint64_t epoch, const uint8_t *payload, size_t len)
{
    s_seen_t *seen = ctx;
    char text[32];
    snprintf(text, sizeof text, "payload %llu", (unsigned long long)epoch);
    assert_int_equal(len, strlen(text));
    assert_memory_equal(payload, text, len);
    seen->epochs[seen->n++] = epoch;
    return 0;
}

static void s_append_five(void)
{
    kb_journal_t *j = NULL;
    char err[512];
    assert_int_equal(kb_journal_open(s_dir, true, 0, &j, err, sizeof err), 0);
    for (uint64_t e = 1; e <= 5; e++) {
        char text[32];
        snprintf(text, sizeof text, "payload %llu", (unsigned long long)e);
        assert_int_equal(kb_journal_append(j, e, text, strlen(text), err, sizeof err), 0);
    }
    assert_int_equal(kb_journal_bytes(j), 5 * 20 + 5 * strlen("payload 1"));
    kb_journal_close(&j);
}

/* How many files of the journal directory have suffix in their name; out (when not NULL): the last one's
 * path. */
static int s_find_files(const char *suffix, char *out, size_t outlen)
{
    char dir[300];
    snprintf(dir, sizeof dir, "%s/journal", s_dir);
    DIR *d = opendir(dir);
    assert_non_null(d);
    struct dirent *e;
    int found = 0;
    while ((e = readdir(d))) {
        if (!strstr(e->d_name, suffix))
            continue;
        if (out)
            snprintf(out, outlen, "%s/%s", dir, e->d_name);
        found++;
    }
    closedir(d);
    return found;
}

/* The one segment of the journal (the tests write few records). */
static void s_segment_path(char *out, size_t outlen)
{
    assert_int_equal(s_find_files(".kbj", out, outlen), 1);
}

static void test_append_and_replay(void **state)
{
    (void)state;
    s_append_five();
    s_seen_t seen = {0};
    uint64_t last = 0;
    char err[512];
    assert_int_equal(kb_journal_replay(s_dir, 2, s_collect, &seen, &last, err, sizeof err), 0);
    assert_int_equal(seen.n, 3);
    assert_int_equal(seen.epochs[0], 3);
    assert_int_equal(seen.epochs[2], 5);
    assert_int_equal(last, 5);
    assert_int_equal(kb_journal_remove_all(s_dir, err, sizeof err), 0);
    seen.n = 0;
    assert_int_equal(kb_journal_replay(s_dir, 0, s_collect, &seen, &last, err, sizeof err), 0);
    assert_int_equal(seen.n, 0);
    assert_int_equal(last, 0);
}

/* A record appended with a checksum computed beforehand (kb_journal_crc, as the bank's persister does) replays
 * like one appended plainly; a wrong checksum makes that last record torn, so replay stops before it. */
static void test_append_with_precomputed_crc(void **state)
{
    (void)state;
    kb_journal_t *j = NULL;
    char err[512];
    assert_int_equal(kb_journal_open(s_dir, true, 0, &j, err, sizeof err), 0);
    for (uint64_t e = 1; e <= 3; e++) {
        char text[32];
        snprintf(text, sizeof text, "payload %llu", (unsigned long long)e);
        uint32_t crc = kb_journal_crc(e, text, strlen(text)) ^ (e == 3 ? 1u : 0u);
        assert_int_equal(kb_journal_append_crc(j, e, text, strlen(text), crc, err, sizeof err), 0);
    }
    kb_journal_close(&j);
    s_seen_t seen = {0};
    uint64_t last = 0;
    assert_int_equal(kb_journal_replay(s_dir, 0, s_collect, &seen, &last, err, sizeof err), 0);
    assert_int_equal(seen.n, 2);
    assert_int_equal(seen.epochs[1], 2);
    assert_int_equal(last, 2);
}

static void test_torn_last_record_is_dropped(void **state)
{
    (void)state;
    s_append_five();
    char path[600];
    s_segment_path(path, sizeof path);
    struct stat st;
    assert_int_equal(stat(path, &st), 0);
    assert_int_equal(truncate(path, st.st_size - 3), 0); /* the crash tore the last append */
    s_seen_t seen = {0};
    uint64_t last = 0;
    char err[512];
    assert_int_equal(kb_journal_replay(s_dir, 0, s_collect, &seen, &last, err, sizeof err), 0);
    assert_int_equal(seen.n, 4);
    assert_int_equal(last, 4);
    assert_int_equal(kb_journal_remove_all(s_dir, err, sizeof err), 0);
}

static void test_damage_before_acknowledged_records_is_refused(void **state)
{
    (void)state;
    s_append_five();
    char path[600];
    s_segment_path(path, sizeof path);
    int fd = open(path, O_RDWR);
    assert_true(fd >= 0);
    size_t record = 20 + strlen("payload 1");
    uint8_t byte = 'X';
    assert_int_equal(pwrite(fd, &byte, 1, (off_t)(record + 20 + 2)), 1); /* inside record 2's payload */
    close(fd);
    s_seen_t seen = {0};
    uint64_t last = 0;
    char err[512];
    assert_int_equal(kb_journal_replay(s_dir, 0, s_collect, &seen, &last, err, sizeof err), -1);
    assert_non_null(strstr(err, path));
    char where[64];
    snprintf(where, sizeof where, "corrupt at byte %zu", record);
    assert_non_null(strstr(err, where));
    assert_non_null(strstr(err, "checksum"));
    assert_int_equal(kb_journal_remove_all(s_dir, err, sizeof err), 0);
}

/* ---- spares: released segments reused in sync mode ---- */

static int s_collect_any(void *ctx, uint64_t epoch, const uint8_t *payload, size_t len)
{
    (void)payload;
    (void)len;
    s_seen_t *seen = ctx;
    assert_true(seen->n < 16);
    seen->epochs[seen->n++] = epoch;
    return 0;
}

/* Appends epoch e with a payload of `len` bytes ('payload <e>' padded with dots). */
static void s_append_sized(kb_journal_t *j, uint64_t e, size_t len)
{
    char text[128];
    memset(text, '.', sizeof text);
    int n = snprintf(text, sizeof text, "payload %llu", (unsigned long long)e);
    text[n] = '.';
    char err[512];
    assert_int_equal(kb_journal_append(j, e, text, len, err, sizeof err), 0);
}

static int s_count_files(const char *suffix) { return s_find_files(suffix, NULL, 0); }

static void s_journal_file(char *out, size_t outlen, uint64_t first, const char *suffix)
{
    snprintf(out, outlen, "%s/journal/%020llu%s", s_dir, (unsigned long long)first, suffix);
}

/* Writes segments 1..4, 5..8 (released: spares), 9..12, then 13 and 14 over a spare. */
static void s_write_over_a_spare(void)
{
    kb_journal_t *j = NULL;
    char err[512];
    assert_int_equal(kb_journal_open(s_dir, true, 100, &j, err, sizeof err), 0);
    for (uint64_t e = 1; e <= 9; e++)
        s_append_sized(j, e, 9); /* 29 bytes a record: a segment closes after 4 */
    assert_int_equal(s_count_files(".kbj"), 3);
    kb_journal_release(j, 8);
    assert_int_equal(s_count_files(".kbs"), 2);
    assert_int_equal(s_count_files(".kbj"), 1);
    assert_int_equal(kb_journal_bytes(j), 29);
    for (uint64_t e = 10; e <= 14; e++)
        s_append_sized(j, e, 10);
    assert_int_equal(s_count_files(".kbr"), 1); /* 13 began a segment over a spare */
    assert_int_equal(s_count_files(".kbs"), 1);
    kb_journal_close(&j);
}

/* Replay reads a segment written over a spare up to its own records: the stale records of the file's earlier
 * life after them (older epochs, checksums right) are not replayed, and a torn record there ends the log. */
static void test_spare_reused_and_replayed_to_its_end(void **state)
{
    (void)state;
    s_write_over_a_spare();
    s_seen_t seen = {0};
    uint64_t last = 0;
    char err[512];
    assert_int_equal(kb_journal_replay(s_dir, 0, s_collect_any, &seen, &last, err, sizeof err), 0);
    assert_int_equal(seen.n, 6);
    for (size_t i = 0; i < 6; i++)
        assert_int_equal(seen.epochs[i], 9 + i);
    assert_int_equal(last, 14);

    /* Tear record 14 (the last append): the log ends at 13, with stale records still after it. */
    char path[600];
    s_journal_file(path, sizeof path, 13, ".kbr");
    int fd = open(path, O_RDWR);
    assert_true(fd >= 0);
    uint8_t byte = 'X';
    assert_int_equal(pwrite(fd, &byte, 1, 30 + 20 + 3), 1);
    close(fd);
    seen.n = 0;
    assert_int_equal(kb_journal_replay(s_dir, 0, s_collect_any, &seen, &last, err, sizeof err), 0);
    assert_int_equal(seen.n, 5);
    assert_int_equal(last, 13);

    /* Damage record 13 instead, with 14 intact after it: acknowledged data is lost, so replay refuses. */
    byte = 'Y';
    fd = open(path, O_RDWR);
    assert_true(fd >= 0);
    assert_int_equal(pwrite(fd, "payload 14", 10, 30 + 20), 10); /* 14 whole again */
    assert_int_equal(pwrite(fd, &byte, 1, 20 + 3), 1);
    close(fd);
    seen.n = 0;
    assert_int_equal(kb_journal_replay(s_dir, 0, s_collect_any, &seen, &last, err, sizeof err), -1);
    assert_non_null(strstr(err, path));
    assert_non_null(strstr(err, "corrupt at byte 0"));
    assert_int_equal(kb_journal_remove_all(s_dir, err, sizeof err), 0);
    assert_int_equal(s_count_files(".kb"), 0); /* spares included */
}

/* A segment written over a larger spare is cut to its records when it closes, so a later segment follows it
 * cleanly; spares left by an earlier run are removed when a journal opens. */
static void test_spare_segment_cut_at_close(void **state)
{
    (void)state;
    kb_journal_t *j = NULL;
    char err[512];
    assert_int_equal(kb_journal_open(s_dir, true, 100, &j, err, sizeof err), 0);
    s_append_sized(j, 1, 60);
    s_append_sized(j, 2, 60); /* 160 bytes: closed */
    s_append_sized(j, 3, 9);
    kb_journal_release(j, 2);
    assert_int_equal(s_count_files(".kbs"), 1);
    for (uint64_t e = 4; e <= 7; e++)
        s_append_sized(j, e, 9); /* 3..6 close their segment (116 bytes); 7 begins one over the spare */
    for (uint64_t e = 8; e <= 10; e++)
        s_append_sized(j, e, 10);
    /* 7..10: 29 + 3 * 30 = 119 bytes: closed and cut from the spare's 160 */
    char path[600];
    s_journal_file(path, sizeof path, 7, ".kbr");
    struct stat st;
    assert_int_equal(stat(path, &st), 0);
    assert_int_equal(st.st_size, 119);
    s_append_sized(j, 11, 10); /* a new file: no spare left */
    assert_int_equal(s_count_files(".kbs"), 0);
    kb_journal_release(j, 6); /* 3..6 becomes a spare ... */
    assert_int_equal(s_count_files(".kbs"), 1);
    kb_journal_close(&j);

    s_seen_t seen = {0};
    uint64_t last = 0;
    assert_int_equal(kb_journal_replay(s_dir, 6, s_collect_any, &seen, &last, err, sizeof err), 0);
    assert_int_equal(seen.n, 5);
    assert_int_equal(seen.epochs[0], 7);
    assert_int_equal(last, 11);
    /* ... and the next run's journal removes it. */
    assert_int_equal(kb_journal_open(s_dir, true, 100, &j, err, sizeof err), 0);
    assert_int_equal(s_count_files(".kbs"), 0);
    kb_journal_close(&j);
    assert_int_equal(kb_journal_remove_all(s_dir, err, sizeof err), 0);
}

/* A crash right after a spare became a segment, before its first record was written: the segment holds only
 * the earlier life's records (whole, checksums right, epochs older than its name), and none is replayed. */
static void test_spare_renamed_before_its_first_record(void **state)
{
    (void)state;
    kb_journal_t *j = NULL;
    char err[512];
    assert_int_equal(kb_journal_open(s_dir, true, 100, &j, err, sizeof err), 0);
    for (uint64_t e = 1; e <= 5; e++)
        s_append_sized(j, e, 9);
    kb_journal_release(j, 4);
    kb_journal_close(&j);
    char spare[600], segment[600], five[600];
    snprintf(spare, sizeof spare, "%s/journal/spare-%020d.kbs", s_dir, 4);
    s_journal_file(segment, sizeof segment, 6, ".kbr");
    s_journal_file(five, sizeof five, 5, ".kbj");
    assert_int_equal(rename(spare, segment), 0);
    assert_int_equal(unlink(five), 0); /* compacted: the renamed spare is the whole journal */
    s_seen_t seen = {0};
    uint64_t last = 0;
    assert_int_equal(kb_journal_replay(s_dir, 0, s_collect_any, &seen, &last, err, sizeof err), 0);
    assert_int_equal(seen.n, 0);
    assert_int_equal(last, 0);
    assert_int_equal(kb_journal_remove_all(s_dir, err, sizeof err), 0);
}

/* A journal left by a crash (a record of a table and a row that never reached SQLite) is replayed into the
 * store when a bank opens the directory, and removed; the table and row are there, and so after a clean
 * close and a second open. */
static void test_bank_replays_journal_left_by_crash(void **state)
{
    (void)state;
    kb_table_config_t cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.kind = KB_TABLE_EMBEDDING;
    cfg.dim = 2;
    char err[512];
    assert_int_equal(kb_table_config_finish(&cfg, 1024, err, sizeof err), 0);
    kb_batch_t b;
    memset(&b, 0, sizeof b);
    b.epoch = 4;
    b.op_count = 1;
    b.ops = calloc(1, sizeof *b.ops);
    b.ops[0].id = 1;
    b.ops[0].name = strdup("emb");
    b.ops[0].config = kb_table_config_pack(&cfg, &b.ops[0].config_len);
    float v[2] = {3.5f, -1.0f};
    b.row_count = b.row_capacity = 1;
    b.rows = calloc(1, sizeof *b.rows);
    b.rows[0] = (kb_store_row_t){.table_id = 1, .key = s_dup("k", 1), .key_len = 1, .row_id = 1,
                                 .value = s_dup(v, sizeof v), .dim = 2, .version = 7};
    size_t len;
    uint8_t *bytes = kb_batch_encode(&b, &len);
    kb_journal_t *j = NULL;
    assert_int_equal(kb_journal_open(s_dir, true, 0, &j, err, sizeof err), 0);
    assert_int_equal(kb_journal_append(j, 4, bytes, len, err, sizeof err), 0);
    kb_journal_close(&j);
    free(bytes);
    kb_batch_free(&b);

    for (int open_no = 0; open_no < 2; open_no++) {
        kb_bank_options_t opts = {.data_dir = s_dir, .sync = true};
        kb_bank_t *bank = bt_open_bank(&opts);
        kb_table_t *t = kb_bank_acquire(bank, "emb");
        assert_non_null(t);
        ProtobufCBinaryData key = {1, (uint8_t *)"k"};
        float out[2];
        uint64_t version, frequency;
        int64_t updated;
        kb_table_lookup(t, &key, 1, true, out, &version, &updated, &frequency);
        assert_memory_equal(out, v, sizeof v);
        assert_int_equal(version, 7);
        kb_bank_release(bank, t);
        kb_commit_stats_t st;
        kb_commit_get_stats(kb_bank_commit(bank), &st);
        assert_true(st.compacted_epoch >= 4); /* epochs go on after the replayed one */
        kb_bank_close(&bank);
        s_seen_t seen = {0};
        uint64_t last = 0;
        assert_int_equal(kb_journal_replay(s_dir, 0, s_collect, &seen, &last, err, sizeof err), 0);
        assert_int_equal(seen.n, 0); /* replayed, then removed; a clean close leaves none either */
    }
}

/* One put of key k = v in the sync bank, and the wait for its commit: 0 (acknowledged) or KB_COMMIT_ESTORAGE.
 * The wait is far longer than ctest lets the test run: a refused commit must be answered without it. */
static int s_put_and_wait(kb_bank_t *bank, const char *k, const float v[2], char *err, size_t errlen)
{
    kb_commit_t *commit = kb_bank_commit(bank);
    kb_commit_write_begin(commit);
    kb_table_t *t = kb_bank_acquire(bank, "emb");
    assert_non_null(t);
    ProtobufCBinaryData key = {strlen(k), (uint8_t *)k};
    kb_table_put(t, &key, 1, v, 1);
    kb_bank_release(bank, t);
    uint64_t ticket = kb_commit_write_end(commit);
    return kb_commit_wait_durable(commit, ticket, 3600 * 1000, err, errlen);
}

static void s_expect_value(kb_bank_t *bank, const char *k, const float v[2])
{
    kb_table_t *t = kb_bank_acquire(bank, "emb");
    assert_non_null(t);
    ProtobufCBinaryData key = {strlen(k), (uint8_t *)k};
    float out[2];
    uint64_t version, frequency;
    int64_t updated;
    kb_table_lookup(t, &key, 1, true, out, &version, &updated, &frequency);
    kb_bank_release(bank, t);
    assert_memory_equal(out, v, sizeof out);
}

/* A sync commit that the disk refuses (RLIMIT_FSIZE: every write that would grow a file fails with EFBIG,
 * which is what a full disk looks like to the journal) is not acknowledged, nor is any later write; the
 * failure is counted; closing gives up after its retries instead of hanging; and after a restart every
 * acknowledged write is there and new writes commit again. */
static void test_bank_refused_commit_is_not_acknowledged(void **state)
{
    (void)state;
    char err[512];
    kb_bank_options_t opts = {.data_dir = s_dir, .sync = true};
    kb_bank_t *bank = bt_open_bank(&opts);
    bt_create_table(bank, "emb", 2);
    const float a[2] = {1.0f, 2.0f}, b[2] = {3.0f, 4.0f}, c[2] = {5.0f, 6.0f};
    assert_int_equal(s_put_and_wait(bank, "a", a, err, sizeof err), 0);

    struct rlimit saved, tiny;
    assert_int_equal(getrlimit(RLIMIT_FSIZE, &saved), 0);
    tiny = saved;
    tiny.rlim_cur = 1;
    void (*old_handler)(int) = signal(SIGXFSZ, SIG_IGN);
    assert_int_equal(setrlimit(RLIMIT_FSIZE, &tiny), 0);
    int refused = s_put_and_wait(bank, "b", b, err, sizeof err);
    int refused_again = s_put_and_wait(bank, "c", c, err, sizeof err);
    kb_commit_stats_t st;
    kb_commit_get_stats(kb_bank_commit(bank), &st);
    kb_bank_close(&bank); /* the final round fails too: it gives up after three tries */
    assert_int_equal(setrlimit(RLIMIT_FSIZE, &saved), 0);
    signal(SIGXFSZ, old_handler);
    assert_int_equal(refused, KB_COMMIT_ESTORAGE);
    assert_int_equal(refused_again, KB_COMMIT_ESTORAGE);
    assert_non_null(strstr(err, "journal"));
    assert_true(st.commit_failures >= 1);

    bank = bt_open_bank(&opts);
    s_expect_value(bank, "a", a);
    assert_int_equal(s_put_and_wait(bank, "c", c, err, sizeof err), 0);
    kb_bank_close(&bank);
    bank = bt_open_bank(&opts);
    s_expect_value(bank, "a", a);
    s_expect_value(bank, "c", c);
    kb_bank_close(&bank);
}

CARLS_TEST_MAIN(
    cmocka_unit_test(test_batch_round_trip),
    cmocka_unit_test(test_batch_decode_refuses_truncation),
    cmocka_unit_test(test_superseded_rows_marked),
    cmocka_unit_test_setup_teardown(test_append_and_replay, s_setup, s_teardown),
    cmocka_unit_test_setup_teardown(test_append_with_precomputed_crc, s_setup, s_teardown),
    cmocka_unit_test_setup_teardown(test_torn_last_record_is_dropped, s_setup, s_teardown),
    cmocka_unit_test_setup_teardown(test_damage_before_acknowledged_records_is_refused, s_setup, s_teardown),
    cmocka_unit_test_setup_teardown(test_spare_reused_and_replayed_to_its_end, s_setup, s_teardown),
    cmocka_unit_test_setup_teardown(test_spare_segment_cut_at_close, s_setup, s_teardown),
    cmocka_unit_test_setup_teardown(test_spare_renamed_before_its_first_record, s_setup, s_teardown),
    cmocka_unit_test_setup_teardown(test_bank_replays_journal_left_by_crash, s_setup, s_teardown),
    cmocka_unit_test_setup_teardown(test_bank_refused_commit_is_not_acknowledged, s_setup, s_teardown))
