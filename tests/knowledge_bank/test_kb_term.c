/* kb_term: a shard member's replication term in DATA/REPLICATION. The file round-trips, the history's rules
 * hold (terms and first epochs grow), divergence follows the log-matching rule, and every damaged or
 * hostile file is refused with a message naming the file and, where there is one, the line. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>
#include "test_main.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kb_term.h"
#include "util.h"

static char s_dir[] = "/tmp/test_kb_term_XXXXXX";

static int s_setup(void **state)
{
    (void)state;
    return mkdtemp(s_dir) ? 0 : -1;
}

static int s_teardown(void **state)
{
    (void)state;
    char path[512];
    snprintf(path, sizeof path, "%s/" KB_TERM_FILE, s_dir);
    unlink(path);
    return rmdir(s_dir);
}

/* Writes text as the state file (no checksum added). */
static void s_write_raw(const char *text, size_t len)
{
    char path[512];
    snprintf(path, sizeof path, "%s/" KB_TERM_FILE, s_dir);
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(text, 1, len, f), len);
    assert_int_equal(fclose(f), 0);
}

/* Writes body followed by its correct crc line: the parser's checks behind the checksum. */
static void s_write_signed(const char *body)
{
    char text[2048];
    size_t n = (size_t)snprintf(text, sizeof text, "%s", body);
    n += (size_t)snprintf(text + n, sizeof text - n, "crc %08x\n", (unsigned)carls_crc32(0, body, strlen(body)));
    s_write_raw(text, n);
}

/* Loading must fail with rc and a message holding want. */
static void s_expect_refused(int rc, const char *want)
{
    kb_term_state_t *st = calloc(1, sizeof *st);
    char err[512] = "";
    assert_int_equal(kb_term_load(s_dir, st, err, sizeof err), rc);
    if (!strstr(err, want))
        fail_msg("expected '%s' in: %s", want, err);
    assert_non_null(strstr(err, KB_TERM_FILE));
    free(st);
}

static void test_round_trip(void **state)
{
    (void)state;
    kb_term_state_t *st = calloc(1, sizeof *st), *back = calloc(1, sizeof *back);
    char err[512] = "";
    assert_int_equal(kb_term_load(s_dir, back, err, sizeof err), -ENOENT);
    kb_term_init(st, "tcp://node1:7070", 1);
    assert_int_equal(st->term, 1);
    assert_int_equal(st->role, KB_TERM_PRIMARY);
    assert_true(st->lineage != 0);
    kb_term_state_t *other = calloc(1, sizeof *other);
    kb_term_init(other, "tcp://node1:7070", 1); /* another member starting a shard: another history */
    assert_true(other->lineage != 0 && other->lineage != st->lineage);
    free(other);
    assert_int_equal(kb_term_begin(st, 3, 4821), 0);
    assert_int_equal(kb_term_begin(st, 4, 9000), 0);
    st->role = KB_TERM_FOLLOWER;
    assert_int_equal(kb_term_save(s_dir, st, err, sizeof err), 0);
    assert_int_equal(kb_term_load(s_dir, back, err, sizeof err), 0);
    assert_int_equal(back->term, 4);
    assert_int_equal(back->role, KB_TERM_FOLLOWER);
    assert_string_equal(back->member, "tcp://node1:7070");
    assert_int_equal(back->n_history, 3);
    assert_int_equal(back->history[1].term, 3);
    assert_int_equal(back->history[1].first_epoch, 4821);
    assert_int_equal(back->history[2].first_epoch, 9000);
    assert_string_equal(kb_term_role_name(back->role), "follower");
    assert_true(back->lineage == st->lineage);
    /* A file written before lineages (no such line) reads as lineage 0, unknown. */
    s_write_signed("carls-replication 1\nterm 2\nrole follower\nmember m\nhistory 1 1\nhistory 2 5\n");
    assert_int_equal(kb_term_load(s_dir, back, err, sizeof err), 0);
    assert_true(back->lineage == 0);
    assert_int_equal(back->term, 2);
    free(st);
    free(back);
}

static void test_begin_rules(void **state)
{
    (void)state;
    kb_term_state_t *st = calloc(1, sizeof *st);
    kb_term_init(st, "m", 10);
    assert_int_equal(kb_term_begin(st, 1, 20), -EINVAL); /* the term must grow */
    assert_int_equal(kb_term_begin(st, 2, 5), -EINVAL);  /* epochs cannot go back */
    assert_int_equal(kb_term_begin(st, 2, 10), 0);       /* term 1 wrote nothing: its span is replaced */
    assert_int_equal(st->n_history, 1);
    assert_int_equal(st->history[0].term, 2);
    assert_int_equal(kb_term_begin(st, 5, 30), 0);
    assert_int_equal(st->n_history, 2);
    assert_int_equal(st->term, 5);
    /* A state that breaks the rules is not written. */
    char err[512] = "";
    st->history[1].first_epoch = 3;
    assert_int_equal(kb_term_save(s_dir, st, err, sizeof err), -EINVAL);
    assert_non_null(strstr(err, "both must grow"));
    st->history[1].first_epoch = 30;
    st->term = 0;
    assert_int_equal(kb_term_save(s_dir, st, err, sizeof err), -EINVAL);
    assert_non_null(strstr(err, "term 0"));
    free(st);
}

/* Terms by epoch and the log-matching rule: the old primary of term 1 wrote epochs 1..120, but the member
 * promoted in term 2 had only 1..100, so term 2 starts at 101. */
static void test_divergence(void **state)
{
    (void)state;
    kb_term_state_t *old = calloc(1, sizeof *old), *now = calloc(1, sizeof *now);
    kb_term_init(old, "a", 1);
    kb_term_init(now, "b", 1);
    assert_int_equal(kb_term_begin(now, 2, 101), 0);
    assert_int_equal(kb_term_of_epoch(now, 0), 0);
    assert_int_equal(kb_term_of_epoch(now, 100), 1);
    assert_int_equal(kb_term_of_epoch(now, 101), 2);
    assert_int_equal(kb_term_of_epoch(now, 1000000), 2);
    assert_false(kb_term_diverged(old, 0, now));   /* holds nothing */
    assert_false(kb_term_diverged(old, 100, now)); /* a prefix of the new primary's journal */
    assert_true(kb_term_diverged(old, 101, now));  /* epoch 101 of term 1 was never the new primary's */
    assert_true(kb_term_diverged(old, 120, now));
    /* A follower of term 2 that got up to 150 is a prefix too. */
    kb_term_state_t *f = calloc(1, sizeof *f);
    kb_term_init(f, "c", 1);
    assert_int_equal(kb_term_begin(f, 2, 101), 0);
    assert_false(kb_term_diverged(f, 150, now));
    free(old);
    free(now);
    free(f);
}

static void test_damaged_files(void **state)
{
    (void)state;
    kb_term_state_t *st = calloc(1, sizeof *st);
    char err[512] = "";
    kb_term_init(st, "tcp://n:1", 1);
    assert_int_equal(kb_term_save(s_dir, st, err, sizeof err), 0);
    char path[512], text[1024];
    snprintf(path, sizeof path, "%s/" KB_TERM_FILE, s_dir);
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    size_t n = fread(text, 1, sizeof text, f);
    fclose(f);
    /* One byte changed: the term 1 becomes 7. */
    char *term = strstr(text, "term 1");
    assert_non_null(term);
    term[5] = '7';
    s_write_raw(text, n);
    s_expect_refused(-EINVAL, "CRC-32 mismatch");
    /* Truncated. */
    term[5] = '1';
    s_write_raw(text, n - 5);
    s_expect_refused(-EINVAL, "does not end with its 'crc' line");
    s_write_raw("", 0);
    s_expect_refused(-EINVAL, "does not end with its 'crc' line");
    /* A NUL byte, and a file far too large. */
    s_write_raw("term\0 1\n", 8);
    s_expect_refused(-EINVAL, "NUL byte");
    size_t big = KB_TERM_MAX_FILE_BYTES + 10;
    char *huge = malloc(big);
    memset(huge, 'x', big);
    s_write_raw(huge, big);
    free(huge);
    s_expect_refused(-EINVAL, "larger than");
    /* Behind a correct checksum: each rule names its line. */
    static const struct {
        const char *body; /* the file before its crc line */
        const char *problem;
    } rules[] = {
        {"something else 1\nterm 1\nrole primary\nmember m\nhistory 1 1\n", ":1: not a replication state file"},
        {"carls-replication 9\nterm 1\nrole primary\nmember m\nhistory 1 1\n", "format version 9"},
        {"carls-replication 1\nterm 1\nrole boss\nmember m\nhistory 1 1\n", ":3: role 'boss'"},
        {"carls-replication 1\nterm x\nrole primary\nmember m\nhistory 1 1\n", ":2: term 'x' is not a number"},
        {"carls-replication 1\nterm 1\nrole primary\nmember m\nhistory 1\n", ":5: history needs 'TERM FIRST_EPOCH'"},
        {"carls-replication 1\nterm 1\nrole primary\nmember m\nhistory 1 1\nowner me\n", ":6: unknown key 'owner'"},
        {"carls-replication 1\nterm 3\nrole primary\nmember m\nhistory 2 50\nhistory 3 40\n", "both must grow"},
        {"carls-replication 1\nterm 2\nrole primary\nmember m\nhistory 5 1\n", "beyond the current term"},
        {"carls-replication 1\nterm 2\nrole primary\nhistory 1 1\n", "needs term, role, member and a history line"},
        {"carls-replication 1\nterm 1\nrole primary\nmember m\nlineage 12g4\nhistory 1 1\n",
         ":5: lineage '12g4' is not 16 hex digits"},
        {"carls-replication 1\nterm 1\nrole primary\nmember m\nlineage 0000000000000000\nhistory 1 1\n",
         ":5: lineage '0000000000000000' is not 16 hex digits (nonzero)"},
    };
    for (size_t i = 0; i < sizeof rules / sizeof rules[0]; i++) {
        s_write_signed(rules[i].body);
        s_expect_refused(-EINVAL, rules[i].problem);
    }
    /* The last good state is still readable after a save replaced a damaged file. */
    assert_int_equal(kb_term_save(s_dir, st, err, sizeof err), 0);
    assert_int_equal(kb_term_load(s_dir, st, err, sizeof err), 0);
    assert_string_equal(st->member, "tcp://n:1");
    free(st);
}

CARLS_TEST_MAIN_GROUP(s_setup, s_teardown,
    cmocka_unit_test(test_round_trip),
    cmocka_unit_test(test_begin_rules),
    cmocka_unit_test(test_divergence),
    cmocka_unit_test(test_damaged_files))
