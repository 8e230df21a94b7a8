/* Unit tests for bank snapshots (kb_snapshot): names; the snapshot op is routed to a worker; a snapshot of a
 * real bank (kb_bank) with a table created in the journal only; what an interrupted delete left is not listed
 * and is removed by the next create; hostile manifests (a path leaving the directory, lines missing or with
 * extra words, a wrong name or version, a size that does not match, a NUL byte, no checksum line, a bad
 * checksum) each refused with the file named; a restore into the bank's data directory that the bank then
 * opens; and the marker of an interrupted restore. The end-to-end promises are in
 * tests/integration/test_snapshot.c. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>
#include "test_main.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "bank_testlib.h"
#include "kb_bank.h"
#include "kb_service.h"
#include "kb_snapshot.h"
#include "protocol.h"
#include "test_util.h"
#include "util.h"

static void test_names(void **state)
{
    (void)state;
    assert_true(kb_snapshot_name_valid("step-000100"));
    assert_true(kb_snapshot_name_valid("a.b_c"));
    const char *bad[] = {"", ".", "..", ".hidden", "a/b", "../x", "x y", "é"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++)
        assert_false(kb_snapshot_name_valid(bad[i]));
    char name[80];
    memset(name, 'a', sizeof name);
    name[KB_SNAPSHOT_MAX_NAME] = '\0';
    assert_true(kb_snapshot_name_valid(name));
    name[KB_SNAPSHOT_MAX_NAME] = 'a';
    name[KB_SNAPSHOT_MAX_NAME + 1] = '\0';
    assert_false(kb_snapshot_name_valid(name));
    assert_false(kb_snapshot_name_valid(NULL));
}

/* A snapshot request is routed to a worker thread (it takes as long as copying the bank). */
static void test_snapshot_goes_to_a_worker(void **state)
{
    (void)state;
    Carls__Request req = CARLS__REQUEST__INIT;
    Carls__Snapshot op = CARLS__SNAPSHOT__INIT;
    req.protocol_version = CARLS_PROTOCOL_VERSION;
    req.request_id = 7;
    op.name = "x";
    req.op_case = CARLS__REQUEST__OP_SNAPSHOT;
    req.snapshot = &op;
    uint8_t frame[256];
    size_t len = carls__request__pack(&req, frame);
    assert_int_equal(carls_request_peek_op(frame, len), CARLS__REQUEST__OP_SNAPSHOT);
    assert_true(kb_service_request_may_block(frame, len));
    assert_string_equal(carls_op_name(CARLS__REQUEST__OP_SNAPSHOT), "snapshot");
}

/* Opens a bank on data (sync durability, compaction held off: the table stays in the journal). */
static kb_bank_t *s_open(const char *data)
{
    kb_bank_options_t opts = {.data_dir = data, .sync = true, .compact_delay_ms = 3600000};
    return bt_open_bank(&opts);
}

/* Writes body plus its manifest_crc line as snapshot name's MANIFEST (making the directory). */
static void s_write_manifest(const char *data, const char *name, const char *body, size_t len)
{
    char path[600];
    snprintf(path, sizeof path, "%s/snapshots/%s", data, name);
    mkdir(path, 0700);
    snprintf(path, sizeof path, "%s/snapshots/%s/MANIFEST", data, name);
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    fwrite(body, 1, len, f);
    fprintf(f, "manifest_crc %08x\n", carls_crc32(0, body, len));
    fclose(f);
}

/* Checks snapshot name and expects it not valid, with problem containing text. */
static void s_expect_problem(const char *data, const char *name, const char *text)
{
    kb_snapshot_info_t info;
    assert_int_equal(kb_snapshot_check(data, name, true, &info), KB_SNAPSHOT_OK);
    if (info.valid || !strstr(info.problem, text))
        fail_msg("snapshot %s: valid %d, problem '%s'; expected a problem with '%s'", name, info.valid, info.problem,
                 text);
    char where[300];
    snprintf(where, sizeof where, "snapshots/%s/", name);
    assert_non_null(strstr(info.problem, where)); /* the file is named */
    kb_snapshot_info_free(&info);
}

static void test_take_check_hostile_restore(void **state)
{
    (void)state;
    char data[300], err[1024], path[1024];
    snprintf(data, sizeof data, "%s/data", test_scratch_dir);
    kb_bank_t *bank = s_open(data);
    bt_create_table(bank, "t", 4);
    kb_snapshots_t *snaps = kb_snapshots_new(bank, 0, 0);
    kb_snapshot_info_t info;
    if (kb_snapshots_create(snaps, "one", 0, 0, &info, err, sizeof err) != KB_SNAPSHOT_OK)
        fail_msg("create: %s", err);
    assert_true(info.valid);
    assert_int_equal(info.n_tables, 1); /* found in the copied journal: nothing was compacted */
    assert_string_equal(info.tables[0], "t");
    assert_int_equal(info.compacted_epoch, 0);
    assert_true(info.cut_epoch > 0);
    kb_snapshot_info_free(&info);
    assert_int_equal(kb_snapshots_create(snaps, "one", 0, 0, &info, err, sizeof err), KB_SNAPSHOT_EEXISTS);
    /* What a delete interrupted by a crash left (another process's) is not listed, and the next create
     * removes it. */
    snprintf(path, sizeof path, "%s/snapshots/.deleting-old-1-0", data);
    assert_int_equal(mkdir(path, 0700), 0);
    kb_snapshot_info_t *list = NULL;
    size_t n = 0;
    assert_int_equal(kb_snapshots_list(snaps, true, &list, &n, err, sizeof err), KB_SNAPSHOT_OK);
    assert_int_equal(n, 1);
    assert_string_equal(list[0].name, "one");
    kb_snapshot_info_free(&list[0]);
    free(list);
    assert_int_equal(kb_snapshots_create(snaps, "two", 0, 0, &info, err, sizeof err), KB_SNAPSHOT_OK);
    kb_snapshot_info_free(&info);
    struct stat gone;
    assert_int_not_equal(stat(path, &gone), 0);
    assert_int_equal(kb_snapshots_delete(snaps, "two", &info, err, sizeof err), KB_SNAPSHOT_OK);
    kb_snapshot_info_free(&info);
    assert_int_equal(kb_snapshots_create(snaps, "../one", 0, 0, &info, err, sizeof err), KB_SNAPSHOT_EINVAL);
    /* A client's resend of a create that has finished (the same client_id and sequence) is answered as the
     * snapshot turned out; another request for the name, or a resend naming another snapshot, is refused. */
    if (kb_snapshots_create(snaps, "three", 7, 9, &info, err, sizeof err) != KB_SNAPSHOT_OK)
        fail_msg("create three: %s", err);
    kb_snapshot_info_free(&info);
    if (kb_snapshots_create(snaps, "three", 7, 9, &info, err, sizeof err) != KB_SNAPSHOT_OK)
        fail_msg("the resend of create three: %s", err);
    assert_true(info.valid);
    assert_string_equal(info.name, "three");
    kb_snapshot_info_free(&info);
    assert_int_equal(kb_snapshots_create(snaps, "three", 7, 10, &info, err, sizeof err), KB_SNAPSHOT_EEXISTS);
    assert_int_equal(kb_snapshots_create(snaps, "three", 0, 0, &info, err, sizeof err), KB_SNAPSHOT_EEXISTS);
    assert_int_equal(kb_snapshots_create(snaps, "one", 7, 9, &info, err, sizeof err), KB_SNAPSHOT_EEXISTS);
    assert_int_equal(kb_snapshots_delete(snaps, "three", &info, err, sizeof err), KB_SNAPSHOT_OK);
    kb_snapshot_info_free(&info);

    /* The real manifest, read back. */
    snprintf(path, sizeof path, "%s/snapshots/one/MANIFEST", data);
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    char text[4096];
    size_t len = fread(text, 1, sizeof text - 1, f);
    fclose(f);
    text[len] = '\0';
    char *crc_line = strstr(text, "manifest_crc ");
    assert_non_null(crc_line);
    size_t body_len = (size_t)(crc_line - text);
    char *file_line = strstr(text, "file bank.sqlite ");
    assert_non_null(file_line);

    /* Hostile variants of it, each in a snapshot directory of its own (with the real files beside it). */
    struct {
        const char *name, *find, *replace, *problem;
    } cases[] = {
        {"escape", "file bank.sqlite", "file ../../../etc/passwd", "not understood"},
        {"absolute", "file bank.sqlite", "file /etc/passwd", "not understood"},
        {"extra", "cut_epoch ", "cut_epoch 1 2 ", "not understood"},
        {"noshard", "shard 0 0\n", "", "lacks one of its lines"},
        {"badshard", "shard 0 0", "shard 3 2", "not understood"},
        {"wrongname", "", "", "names snapshot 'two'"},
        {"nostore", "file bank.sqlite", "table x\nfile journal/00000000000000000001.kbj", "lists no bank.sqlite"},
        {"backwards", "compacted_epoch 0", "compacted_epoch 999999", "compacted epoch past its cut"},
        {"badtable", "table t", "table t/x", "not understood"},
        {"badversion", "carls-snapshot 1", "carls-snapshot 2", "not understood"},
        {"size", "file bank.sqlite ", "file bank.sqlite 1", "the manifest says 1"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        /* The manifest with its name line naming the case's directory (or "two" for the wrong name) ... */
        char named[4096], body[4096];
        const char *n = strstr(text, "name one\n");
        assert_non_null(n);
        snprintf(named, sizeof named, "%.*sname %s\n%.*s", (int)(n - text), text,
                 strcmp(cases[i].name, "wrongname") == 0 ? "two" : cases[i].name, (int)(body_len - (size_t)(n - text) - 9),
                 n + 9);
        /* ... and the case's change. */
        char *at = strstr(named, cases[i].find);
        if (strcmp(cases[i].name, "wrongname") == 0)
            snprintf(body, sizeof body, "%s", named);
        else {
            assert_non_null(at);
            snprintf(body, sizeof body, "%.*s%s%s", (int)(at - named), named, cases[i].replace,
                     at + strlen(cases[i].find));
        }
        s_write_manifest(data, cases[i].name, body, strlen(body));
        snprintf(path, sizeof path, "cp %s/snapshots/one/bank.sqlite %s/snapshots/%s/", data, data, cases[i].name);
        assert_int_equal(system(path), 0);
        s_expect_problem(data, cases[i].name, cases[i].problem);
    }
    /* No checksum line, a bad checksum, a NUL byte, a size that does not match. */
    s_write_manifest(data, "nocrc", text, body_len);
    snprintf(path, sizeof path, "%s/snapshots/nocrc/MANIFEST", data);
    assert_int_equal(truncate(path, (off_t)body_len), 0);
    s_expect_problem(data, "nocrc", "does not end with its manifest_crc line");
    snprintf(path, sizeof path, "%s/snapshots/badcrc/MANIFEST", data);
    s_write_manifest(data, "badcrc", text, body_len);
    f = fopen(path, "r+b");
    fseek(f, 10, SEEK_SET);
    fputc('X', f);
    fclose(f);
    s_expect_problem(data, "badcrc", "manifest_crc does not match");
    char with_nul[4096];
    memcpy(with_nul, text, body_len);
    with_nul[3] = '\0';
    s_write_manifest(data, "nul", with_nul, body_len);
    s_expect_problem(data, "nul", "NUL byte");
    kb_snapshots_destroy(&snaps);
    kb_bank_close(&bank);

    /* Restore into the bank's own directory after it was closed: the bank opens with the table. */
    assert_int_equal(kb_snapshot_restore(data, "escape", 0, 0, err, sizeof err), KB_SNAPSHOT_EIO);
    assert_non_null(strstr(err, "snapshots/escape/MANIFEST"));
    assert_int_equal(kb_snapshot_restore(data, "one", 1, 2, err, sizeof err), KB_SNAPSHOT_EINVAL);
    assert_int_equal(kb_snapshot_check_interrupted(data, err, sizeof err), 0); /* refusals leave no marker */
    if (kb_snapshot_restore(data, "one", 0, 0, err, sizeof err) != KB_SNAPSHOT_OK)
        fail_msg("restore: %s", err);
    assert_int_equal(kb_snapshot_check_interrupted(data, err, sizeof err), 0);
    snprintf(path, sizeof path, "%s/restore.tmp", data);
    struct stat st;
    assert_int_not_equal(stat(path, &st), 0); /* the staging directory is gone */
    bank = s_open(data);
    kb_table_t *t = kb_bank_acquire(bank, "t");
    assert_non_null(t);
    kb_bank_release(bank, t);
    kb_bank_close(&bank);

    /* A marker left by a crash stops the start and names the snapshot. */
    snprintf(path, sizeof path, "%s/RESTORING", data);
    f = fopen(path, "w");
    fputs("one\n", f);
    fclose(f);
    assert_int_equal(kb_snapshot_check_interrupted(data, err, sizeof err), -1);
    assert_non_null(strstr(err, "--restore one"));
    /* A refused restore leaves that marker; a completed one removes it. */
    assert_int_equal(kb_snapshot_restore(data, "escape", 0, 0, err, sizeof err), KB_SNAPSHOT_EIO);
    assert_int_equal(kb_snapshot_check_interrupted(data, err, sizeof err), -1);
    assert_int_equal(kb_snapshot_restore(data, "one", 0, 0, err, sizeof err), KB_SNAPSHOT_OK);
    assert_int_equal(kb_snapshot_check_interrupted(data, err, sizeof err), 0);
}

CARLS_TEST_MAIN_GROUP(test_scratch_setup, test_scratch_teardown,
    cmocka_unit_test(test_names),
    cmocka_unit_test(test_snapshot_goes_to_a_worker),
    cmocka_unit_test(test_take_check_hostile_restore))
