/* The walls between folders: every source's #include lines against the layering table of docs/DESIGN.md,
 * and the checker itself against a small tree with one violation of each kind. */
#include "layering.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include "test_main.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static void test_tree_follows_table(void **state)
{
    (void)state;
    layer_table_t table;
    char err[512] = "";
    int rc = layer_table_read(CARLS_SOURCE_DIR "/docs/DESIGN.md", &table, err, sizeof err);
    if (rc != 0)
        fprintf(stderr, "%s\n", err);
    assert_int_equal(rc, 0);
    /* The rooms the design names must all be in the table. */
    const char *rooms[] = {"base", "proto", "client", "knn", "knowledge_bank", "cuda", "nn", "data", "trainer",
                           "knowledge_maker", "launcher", "bench"};
    for (size_t i = 0; i < sizeof rooms / sizeof rooms[0]; i++) {
        if (!layer_table_find(&table, rooms[i]))
            fprintf(stderr, "no row for %s/\n", rooms[i]);
        assert_non_null(layer_table_find(&table, rooms[i]));
    }
    /* The commit pipeline is a room of its own: it may not include the bank (kb_bank.h) that owns it. */
    const char *files[] = {"knowledge_bank/kb_commit.c", "knowledge_bank/kb_commit.h"};
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
        const layer_rule_t *rule = layer_table_find(&table, files[i]);
        if (!rule)
            fprintf(stderr, "no row for %s\n", files[i]);
        assert_non_null(rule);
        assert_true(rule->file);
        for (int j = 0; j < rule->n_allowed; j++)
            assert_null(strstr(rule->allowed[j], "kb_bank"));
    }
    assert_int_equal(layer_check_tree(CARLS_SOURCE_DIR, &table), 0);
}

static void s_write(const char *root, const char *rel, const char *text)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", root, rel);
    char dir[4096];
    snprintf(dir, sizeof dir, "%s", path);
    *strrchr(dir, '/') = '\0';
    mkdir(dir, 0755);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
}

static void test_checker_finds_each_kind_of_violation(void **state)
{
    (void)state;
    char root[] = "/tmp/carls-layering-XXXXXX";
    assert_non_null(mkdtemp(root));
    s_write(root, "docs/DESIGN.md",
            "# x\n## Layering\n| folder | job | may include | may not include |\n|---|---|---|---|\n"
            "| `base/` | floor | — | `zmq.h` |\n| `client/` | client | `base/` | — |\n"
            "| `client/kb_client.c` | a room in a folder | `kb_client.h` | `czmq.h` |\n## Next\n"
            "| `rogue/` | outside the section: not a row | — | — |\n");
    s_write(root, "base/util.h", "#include <stdio.h>\n");
    s_write(root, "base/util.c", "#include \"util.h\"\n#include <string.h>\n");
    s_write(root, "client/kb_client.h", "#include \"util.h\"\n");
    s_write(root, "client/kb_client.c", "#include \"kb_client.h\"\n#include <zmq.h>\n");

    layer_table_t table;
    char err[512] = "";
    char design[4096];
    snprintf(design, sizeof design, "%s/docs/DESIGN.md", root);
    assert_int_equal(layer_table_read(design, &table, err, sizeof err), 0);
    assert_int_equal(table.n, 3);
    assert_null(layer_table_find(&table, "rogue"));
    assert_int_equal(table.rules[1].n_allowed, 1);
    assert_string_equal(table.rules[1].allowed[0], "base");
    assert_false(table.rules[1].file);
    assert_true(table.rules[2].file);
    assert_string_equal(table.rules[2].folder, "client/kb_client.c");
    assert_int_equal(layer_check_tree(root, &table), 0); /* a clean tree */

    /* A file row: a header its folder may include but its row does not list, a library its row forbids;
     * and a row whose file is gone. */
    s_write(root, "client/kb_client.c", "#include \"kb_client.h\"\n#include \"util.h\"\n#include <czmq.h>\n");
    assert_int_equal(layer_check_tree(root, &table), 2);
    char moved[4096];
    snprintf(moved, sizeof moved, "%s/client/kb_client.c", root);
    assert_int_equal(unlink(moved), 0);
    assert_int_equal(layer_check_tree(root, &table), 1);
    s_write(root, "client/kb_client.c", "#include \"kb_client.h\"\n#include <zmq.h>\n");

    /* 1: an upward include; 2: a forbidden library; 3: an include nobody holds; 4: a folder with no row. */
    s_write(root, "base/log.c", "#include \"kb_client.h\"\n#include  <zmq.h>\n  #  include \"nowhere.h\"\n");
    s_write(root, "rogue/x.c", "#include \"util.h\"\n");
    assert_int_equal(layer_check_tree(root, &table), 4);

    char cmd[4200];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", root);
    assert_int_equal(system(cmd), 0);
}

static void test_table_errors_name_the_file(void **state)
{
    (void)state;
    layer_table_t table;
    char err[512] = "";
    assert_int_equal(layer_table_read("/nonexistent/DESIGN.md", &table, err, sizeof err), -1);
    assert_non_null(strstr(err, "/nonexistent/DESIGN.md"));
}

CARLS_TEST_MAIN(
    cmocka_unit_test(test_tree_follows_table),
    cmocka_unit_test(test_checker_finds_each_kind_of_violation),
    cmocka_unit_test(test_table_errors_name_the_file))
