/* carls_knowledge.h: the knowledge per refresh read back from fake maker logs, in both forms of the graph line
 * (the pixel graph's "k=10", the refreshed graph's "20 neighbours each") from two graph makers and the label
 * maker's lines, among garbage, truncated and out-of-range lines. knowledge.csv must hold exactly the
 * items-weighted purity per graph version joined with the label steps, with empty cells where a step has only
 * one of them and, where two fleets wrote one step, the later fleet's values; it reads back whole; a run without such lines writes nothing. report.md shows the rows (4 digits)
 * and, with gnuplot, knowledge.png is drawn and referenced. */
#include "carls_knowledge.h"
#include "carls_report.h"
#include "test_util.h"

#include <math.h>
#include <setjmp.h>
#include <stdbool.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <cmocka.h>
#include "test_main.h"

#define S_AT(sec) "2026-11-27T08:21:" sec "Z INFO  km_maker.c:356 "
#define S_PFX S_AT("28.357")
#define S_TAIL_G " (share of edges joining items of one class, among items whose class is known: a diagnostic, never written)\n"
#define S_TAIL_L " with confidence >= 0.5 (diagnostics from the true labels, which are never written); trainer's newest checkpoint 250, 0 steps ahead\n"

/* The expected knowledge.csv of s_write_logs's logs. */
static const char s_expected_csv[] = "step,graph_purity,pseudo_label_accuracy,confident_accuracy,confident_share\n"
                                     "0,0.7,0.66,,0\n"
                                     "125,,0.75,0.8,0.25\n"
                                     "250,0.8,0.8,0.9,0.5\n"
                                     "500,0.95,,,\n";

/* Writes text as dir/name. */
static void s_put(const char *dir, const char *name, const char *text)
{
    char path[512];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    assert_int_equal(fputs(text, f) >= 0, 1);
    assert_int_equal(fclose(f), 0);
}

/* scratch/<sub>, made fresh; its path into dir (len bytes). */
static void s_subdir(char *dir, size_t len, const char *sub)
{
    snprintf(dir, len, "%s/%s", test_scratch_dir, sub);
    test_rmrf(dir);
    assert_int_equal(mkdir(dir, 0755), 0);
}

/* A run's logs: initial pixel graph (old form) from two makers, refreshed graphs (new form) from two resident
 * makers, one of them restarted, the first label spreading and the resident label maker; plus noise. */
static void s_write_logs(const char *dir)
{
    /* Version 0: 20,000 items at 0.8 and 10,000 at 0.5 -> 0.7 (the plain mean would be 0.65). */
    s_put(dir, "graph-0.log",
          S_PFX "graph maker 0/2: 20000 items\n" S_PFX
                "graph from fmnist.pixels (version 0): 20000 items, k=10 in 41.82 s (478 items/s); purity 0.8000" S_TAIL_G
                "graph from\n" S_PFX "graph from fmnist.pixels (version -1): 5 items, k=10 in 1 s (5 items/s); purity 0.1000" S_TAIL_G
                S_PFX "graph from fmnist.pixels (version 18446744073709551616): 5 items, k=10 in 1 s; purity 0.1000" S_TAIL_G
                S_PFX "graph from fmnist.pixels (version 7): 5 items, k=10 in 1 s (5 items/s); purity 1.5000" S_TAIL_G
                S_PFX "graph from fmnist.pixels (version 8): 5 items, k=10 in 1 s (5 items/s); purity nan" S_TAIL_G
                S_PFX "graph from fmnist.pixels (version 9): 5x items, k=10 in 1 s (5 items/s); purity 0.1" S_TAIL_G
                "\n\x01\x02\xff garbage \xfe\n"
                /* cut while the number was written: must not count as purity 0.9 */
                S_PFX "graph from fmnist.pixels (version 0): 90000 items, k=10 in 1.00 s (1 items/s); purity 0.9");
    s_put(dir, "graph-1.log",
          S_PFX "graph from fmnist.pixels (version 0): 10000 items, k=10 in 41.59 s (240 items/s); purity 0.5000" S_TAIL_G);
    /* The resident graph makers (another fleet): version 0 before the initial graph's lines (which stay), 250 from
     * both (maker 0 restarted: its last line counts) -> 20,000 at 0.9 and 10,000 at 0.6 = 0.8; 500 from one. */
    s_put(dir, "maker-graph-0.log",
          S_AT("20.000") "graph from fmnist.emb (version 0): 15000 items, 10 neighbours each in 0.05 s (10450 items/s); "
                         "purity 0.1000" S_TAIL_G
          S_PFX "graph from fmnist.emb + fmnist.pixels (version 250): 15000 items, 20 neighbours each in 3.10 s "
                "(4838 items/s); purity 0.1000" S_TAIL_G
          S_PFX "graph from fmnist.emb + fmnist.pixels (version 250): 20000 items, 20 neighbours each in 3.10 s "
                "(6451 items/s); purity 0.9000" S_TAIL_G
          S_PFX "graph from fmnist.emb + fmnist.pixels (version 500): 30000 items, 20 neighbours each in 3.00 s "
                "(10000 items/s); purity 0.9500" S_TAIL_G);
    s_put(dir, "maker-graph-1.log",
          S_AT("21.000") "graph from fmnist.emb (version 0): 15000 items, 10 neighbours each in 0.05 s (10450 items/s); "
                         "purity 0.1000" S_TAIL_G
          S_PFX "graph from fmnist.emb + fmnist.pixels (version 250): 10000 items, 20 neighbours each in 3.20 s "
                "(3125 items/s); purity 0.6000" S_TAIL_G
          S_PFX "graph from fmnist.emb + fmnist.pixels (version 500): 15000 items, 20 neigh");
    s_put(dir, "labels0-0.log",
          S_PFX "label step 0 (graph only): 59900 unlabelled items in 0.89 s (67588 items/s); pseudo-label accuracy "
                "0.7604, 0.8537 on the 78.6%" S_TAIL_L
          S_PFX "label step 0 (graph only): waiting for the graph\n");
    /* The resident label maker's step 0 comes after the first spreading's: it counts (no confident item: no
     * confident accuracy). */
    s_put(dir, "maker-label-0.log",
          S_AT("40.000") "label step 0 (graph + model): 900 unlabelled items in 0.09 s (10320 items/s); "
                         "pseudo-label accuracy 0.6600, 0.0000 on the 0.0%" S_TAIL_L
          S_PFX "label step 125 (graph + model): 59900 unlabelled items in 0.90 s (66555 items/s); pseudo-label "
                "accuracy 0.7500, 0.8000 on the 25.0%" S_TAIL_L
          S_PFX "label step 250 (graph + model): 59900 unlabelled items in 0.90 s (66555 items/s); pseudo-label "
                "accuracy 0.8000, 0.9000 on the 50.0%" S_TAIL_L
          S_PFX "label step 300 (graph only): 59900 unlabelled items in 0.90 s (66555 items/s); pseudo-label "
                "accuracy 0.7a00, 0.9000 on the 50.0%" S_TAIL_L
          S_PFX "label step 400 (graph only): 59900 unlabelled items in 0.90 s (66555 items/s); pseudo-label "
                "accuracy 0.8000, 0.9000 on the 150.0%" S_TAIL_L
          S_PFX "label step 375 (graph only): 59900 unlabelled items in 0.90 s (66555 items/s); pseudo-label "
                "accuracy 0.8000, 0.9");
    s_put(dir, "trainer.log", S_PFX "step 250: the graph from the bank; label step 250 seen\n");
    /* Not a log: never read. */
    s_put(dir, "notes.txt",
          S_PFX "graph from fmnist.pixels (version 999): 10 items, k=10 in 1 s (10 items/s); purity 0.5000" S_TAIL_G);
}

/* The whole of path as a string (caller frees). */
static char *s_slurp(const char *path)
{
    size_t len = 0;
    char *text = (char *)test_read_file(path, 1, &len);
    assert_non_null(text);
    text[len] = '\0';
    return text;
}

/* Checks the rows of s_write_logs's logs (n of them; 1e-12: knowledge.csv's 6 digits hold them exactly). */
static void s_check_rows(const carls_knowledge_row_t *rows, size_t n)
{
    static const carls_knowledge_row_t want[] = {
        {0, 0.7, 0.66, NAN, 0.0},
        {125, NAN, 0.75, 0.8, 0.25},
        {250, 0.8, 0.8, 0.9, 0.5},
        {500, 0.95, NAN, NAN, NAN},
    };
    assert_int_equal(n, sizeof want / sizeof want[0]);
    for (size_t i = 0; i < n; i++) {
        const double got[] = {rows[i].graph_purity, rows[i].pseudo_label_accuracy, rows[i].confident_accuracy,
                              rows[i].confident_share};
        const double exp[] = {want[i].graph_purity, want[i].pseudo_label_accuracy, want[i].confident_accuracy,
                              want[i].confident_share};
        assert_int_equal(rows[i].step, want[i].step);
        for (int c = 0; c < 4; c++) {
            if (isnan(exp[c])) {
                assert_true(isnan(got[c]));
            } else {
                assert_float_equal(got[c], exp[c], 1e-12);
            }
        }
    }
}

/* The rows, weighted and joined per step (unknown, truncated and out-of-range lines skipped); knowledge.csv
 * exactly, and read back whole. */
static void test_collect_csv(void **state)
{
    (void)state;
    char dir[400], csv[500];
    s_subdir(dir, sizeof dir, "logs");
    s_write_logs(dir);
    carls_knowledge_row_t *rows = NULL;
    size_t n = 0;
    assert_int_equal(carls_knowledge_collect(dir, &rows, &n), 0);
    s_check_rows(rows, n);
    free(rows);

    snprintf(csv, sizeof csv, "%s/" CARLS_KNOWLEDGE_CSV, dir);
    assert_int_equal(carls_knowledge_write(dir, csv), 4);
    char *text = s_slurp(csv);
    assert_string_equal(text, s_expected_csv);
    free(text);
    assert_int_equal(carls_knowledge_read_csv(csv, &rows, &n), 0);
    s_check_rows(rows, n);
    free(rows);

    /* Rows that do not parse whole are skipped; a file that is not knowledge.csv is refused. */
    s_put(dir, "k2.csv", "step,graph_purity,pseudo_label_accuracy,confident_accuracy,confident_share\n"
                         "1,0.5,,,\n2,0.5x,,,\n3,0.5,,,,\n4,0.5\n-5,0.5,,,\n6,,0.25,0.5,0.75\r\n7,0.1,0.2,0.3,0.");
    snprintf(csv, sizeof csv, "%s/k2.csv", dir);
    assert_int_equal(carls_knowledge_read_csv(csv, &rows, &n), 0);
    assert_int_equal(n, 3);
    assert_int_equal(rows[0].step, 1);
    assert_int_equal(rows[1].step, 6);
    assert_float_equal(rows[1].confident_share, 0.75, 1e-12);
    assert_int_equal(rows[2].step, 7);
    assert_float_equal(rows[2].confident_share, 0.0, 1e-12);
    free(rows);
    s_put(dir, "k3.csv", "step,loss\n1,0.5\n");
    snprintf(csv, sizeof csv, "%s/k3.csv", dir);
    assert_int_equal(carls_knowledge_read_csv(csv, &rows, &n), -1);
    assert_null(rows);
    assert_int_equal(n, 0);
    snprintf(csv, sizeof csv, "%s/none.csv", dir);
    assert_int_equal(carls_knowledge_read_csv(csv, &rows, &n), -1);
}

/* No such lines (a twotower run, label_maker = 0 without a graph): nothing written; no logs directory: -1. */
static void test_nothing(void **state)
{
    (void)state;
    char dir[400], csv[500];
    s_subdir(dir, sizeof dir, "logs-none");
    s_put(dir, "trainer.log", S_PFX "step 50: loss 6.1\n");
    s_put(dir, "maker-words-0.log", S_PFX "words step 50: 5000 rows in 1.0 s\n");
    snprintf(csv, sizeof csv, "%s/" CARLS_KNOWLEDGE_CSV, dir);
    assert_int_equal(carls_knowledge_write(dir, csv), 0);
    struct stat st;
    assert_int_equal(stat(csv, &st), -1);
    char missing[500];
    snprintf(missing, sizeof missing, "%s/no-such-dir", dir);
    assert_int_equal(carls_knowledge_write(missing, csv), -1);
    assert_int_equal(stat(csv, &st), -1);
}

/* report.md's section (4 digits, empty cells) and knowledge.png, only with knowledge.csv. */
static void test_report(void **state)
{
    (void)state;
    static carls_ini_t ini; /* large: not on the stack */
    memset(&ini, 0, sizeof ini);
    char dir[400], logs[450], csv[500], md[500];
    s_subdir(dir, sizeof dir, "run");
    snprintf(logs, sizeof logs, "%s/logs", dir);
    assert_int_equal(mkdir(logs, 0755), 0);
    s_write_logs(logs);
    snprintf(csv, sizeof csv, "%s/" CARLS_KNOWLEDGE_CSV, dir);
    snprintf(md, sizeof md, "%s/report.md", dir);
    carls_result_t res = {0};

    /* Without knowledge.csv: no section. */
    assert_int_equal(carls_report_write(dir, "x.ini", &ini, &res, NULL, NULL, 1), 0);
    char *text = s_slurp(md);
    assert_null(strstr(text, "Knowledge per refresh"));
    assert_null(strstr(text, "knowledge.png"));
    free(text);

    assert_int_equal(carls_knowledge_write(logs, csv), 4);
    const bool gnuplot = system("gnuplot --version > /dev/null 2>&1") == 0;
    if (gnuplot) {
        char metrics[500], png[500];
        snprintf(metrics, sizeof metrics, "%s/metrics.csv", dir);
        s_put(dir, "metrics.csv",
              "step,loss,ce_loss,pl_loss,graph_loss,test_loss,test_accuracy,pl_coverage,nbr_used,nbr_stale,"
              "nbr_missing,mean_staleness,wait_ms,fetch_ms,steps_per_s,elapsed_s,bank_skipped\n"
              "250,1,1,0,0.1,0.9,0.70,0.5,2280,0,10,120.5,1.2,2.0,90,30,0\n");
        assert_int_equal(carls_report_plots(dir, metrics, "graphreg"), 0);
        snprintf(png, sizeof png, "%s/knowledge.png", dir);
        struct stat st;
        assert_int_equal(stat(png, &st), 0);
        assert_true(st.st_size > 0);
    } else {
        printf("test_report: no gnuplot, knowledge.png not checked\n");
    }
    assert_int_equal(carls_report_write(dir, "x.ini", &ini, &res, NULL, NULL, 1), 0);
    text = s_slurp(md);
    assert_non_null(strstr(text, "\n## Knowledge per refresh\n"));
    assert_non_null(strstr(text, "| step | graph purity | pseudo-label accuracy | confident accuracy | "
                                 "confident share |\n| --- | --- | --- | --- | --- |\n"
                                 "| 0 | 0.7000 | 0.6600 | | 0.0000 |\n"
                                 "| 125 | | 0.7500 | 0.8000 | 0.2500 |\n"
                                 "| 250 | 0.8000 | 0.8000 | 0.9000 | 0.5000 |\n"
                                 "| 500 | 0.9500 | | | |\n"));
    assert_non_null(strstr(text, "![knowledge](knowledge.png)"));
    free(text);
}

CARLS_TEST_MAIN_GROUP(test_scratch_setup, test_scratch_teardown,
    cmocka_unit_test(test_collect_csv),
    cmocka_unit_test(test_nothing),
    cmocka_unit_test(test_report))
