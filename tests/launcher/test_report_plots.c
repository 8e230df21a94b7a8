/* The launcher's plots (carls_report.h): gnuplot draws every PNG for a graphreg metrics CSV, a twotower one
 * with bank negatives, and a twotower one without (its staleness column is all "nan": gnuplot refuses a plot
 * whose points are all undefined, which once cost such runs all their plots). Skips (77) without gnuplot. */
#include "maker_testlib.h"

#include "carls_report.h"
#include "test_util.h"

#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>

static long s_size(const char *dir, const char *name)
{
    char path[600];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    struct stat st;
    return stat(path, &st) == 0 ? (long)st.st_size : -1;
}

/* Writes dir/metrics.csv: header, then rows made by row(i, buf). */
static void s_write_csv(const char *dir, const char *header, const char *const *rows, int n)
{
    char path[600];
    snprintf(path, sizeof path, "%s/metrics.csv", dir);
    FILE *f = fopen(path, "w");
    MT_CHECK(f != NULL, "cannot write %s", path);
    if (!f) {
        return;
    }
    fprintf(f, "%s\n", header);
    for (int i = 0; i < n; i++) {
        fprintf(f, "%s\n", rows[i]);
    }
    fclose(f);
}

static void s_case(const char *tag, const char *experiment, const char *header, const char *const *rows, int n,
                   const char *first_png)
{
    char dir[512], csv[600];
    mt_tempdir(dir, tag);
    s_write_csv(dir, header, rows, n);
    snprintf(csv, sizeof csv, "%s/metrics.csv", dir);
    int rc = carls_report_plots(dir, csv, experiment);
    MT_CHECK(rc == 0, "%s: carls_report_plots failed (see %s/plots.log)", tag, dir);
    MT_CHECK(s_size(dir, first_png) > 0 && s_size(dir, "staleness.png") > 0, "%s: %s %ld bytes, staleness.png %ld",
             tag, first_png, s_size(dir, first_png), s_size(dir, "staleness.png"));
    if (rc == 0) {
        test_rmrf(dir);
    }
}

int main(void)
{
    if (system("gnuplot --version > /dev/null 2>&1") != 0) {
        printf("test_report_plots: SKIPPED (no gnuplot)\n");
        return 77;
    }
    static const char *const graphreg[] = {
        "250,1,1,0,0.1,0.9,0.70,0.5,2280,0,10,120.5,1.2,2.0,90,30,0",
        "500,0.8,0.8,0,0.1,0.8,0.74,0.5,2280,0,0,130.5,1.1,2.1,91,60,0",
    };
    s_case("plots-graphreg", "graphreg",
           "step,loss,ce_loss,pl_loss,graph_loss,test_loss,test_accuracy,pl_coverage,nbr_used,nbr_stale,nbr_missing,"
           "mean_staleness,wait_ms,fetch_ms,steps_per_s,elapsed_s,bank_skipped",
           graphreg, 2, "accuracy.png");
    static const char *const with_negatives[] = {"50,0.1,6.1,16.3,0,nan", "100,0.3,5.6,15.1,1000,112",
                                                 "150,0.5,5.2,15.0,1000,118"};
    s_case("plots-tt-neg", "twotower", "step,epoch,loss,steps_per_s,negatives,neg_staleness_steps", with_negatives, 3,
           "loss.png");
    static const char *const without[] = {"50,0.1,6.1,16.3,0,nan", "100,0.3,5.6,15.1,0,nan"};
    s_case("plots-tt-none", "twotower", "step,epoch,loss,steps_per_s,negatives,neg_staleness_steps", without, 2,
           "loss.png");
    return mt_finish("test_report_plots", NULL);
}
