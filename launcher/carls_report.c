/* Plots and report.md (see carls_report.h). */
#include "carls_report.h"

#include "carls_knowledge.h"
#include "carls_stages.h"
#include "log.h"

#include <inttypes.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>

/* Records key = value (a key seen again keeps its last value). */
static void s_result_put(carls_result_t *r, const char *key, size_t len, double v)
{
    int i = 0;
    while (i < r->n && (strlen(r->key[i]) != len || strncmp(r->key[i], key, len) != 0)) {
        i++;
    }
    if (i == r->n) {
        if (r->n >= CARLS_RESULT_MAX || len >= sizeof r->key[0]) {
            return;
        }
        /* The length is checked above; memcpy keeps gcc's truncation warning (-O0) quiet. */
        memcpy(r->key[r->n], key, len);
        r->key[r->n++][len] = '\0';
    }
    r->value[i] = v;
}

int carls_result_read(carls_result_t *r, const char *path)
{
    memset(r, 0, sizeof *r);
    FILE *f = fopen(path, "r");
    if (!f) {
        return -1;
    }
    char line[4096];
    while (fgets(line, sizeof line, f)) {
        /* Every blank-separated word of the form key=number counts; other words are ignored. */
        char *save = NULL;
        for (char *w = strtok_r(line, " \t\r\n", &save); w; w = strtok_r(NULL, " \t\r\n", &save)) {
            char *eq = strchr(w, '=');
            if (!eq || eq == w) {
                continue;
            }
            char *end = NULL;
            double v = strtod(eq + 1, &end);
            if (end == eq + 1 || *end != '\0') {
                continue;
            }
            s_result_put(r, w, (size_t)(eq - w), v);
        }
    }
    fclose(f);
    return r->n;
}

const double *carls_result_get(const carls_result_t *r, const char *key)
{
    for (int i = 0; i < r->n; i++) {
        if (strcmp(r->key[i], key) == 0) {
            return &r->value[i];
        }
    }
    return NULL;
}

/* Whether column col (1-based) of a metrics CSV holds a finite number on some data row. gnuplot refuses a
 * plot whose points are all undefined (a twotower run without bank negatives writes "nan" staleness). */
static bool s_column_has_number(const char *csv, int col)
{
    FILE *f = fopen(csv, "r");
    if (!f) {
        return false;
    }
    char line[4096];
    bool header = true, found = false;
    while (!found && fgets(line, sizeof line, f)) {
        if (header) {
            header = false;
            continue;
        }
        const char *field = line;
        for (int c = 1; c < col && field; c++) {
            field = strchr(field, ',');
            field = field ? field + 1 : NULL;
        }
        if (field) {
            char *end = NULL;
            double v = strtod(field, &end);
            found = end != field && isfinite(v);
        }
    }
    fclose(f);
    return found;
}

/* The knowledge per refresh (dir/knowledge.csv, carls_knowledge.h) into path (len bytes), and which of its
 * columns gnuplot can draw: *purity (2, graph purity), *accuracy (3, pseudo-label accuracy). true when one can. */
static bool s_knowledge_plottable(const char *dir, char *path, size_t len, bool *purity, bool *accuracy)
{
    snprintf(path, len, "%s/" CARLS_KNOWLEDGE_CSV, dir);
    *purity = s_column_has_number(path, 2);
    *accuracy = s_column_has_number(path, 3);
    return *purity || *accuracy;
}

/* Appends knowledge.png (graph purity and pseudo-label accuracy per refresh) to the gnuplot script f when the
 * run wrote knowledge.csv; only columns with a number are drawn (gnuplot refuses a plot of undefined points). */
static void s_knowledge_plot(FILE *f, const char *dir)
{
    char csv[4200];
    bool purity, accuracy;
    if (!s_knowledge_plottable(dir, csv, sizeof csv, &purity, &accuracy)) {
        return;
    }
    fprintf(f,
            "unset y2tics\n"
            "unset y2label\n"
            "set key bottom right\n"
            "set xlabel 'trainer step (graph version, label step)'\n"
            "set ylabel 'share'\n"
            "set output '%s/knowledge.png'\n"
            "set title 'Knowledge per refresh (diagnostics from the true labels)'\n"
            "plot ",
            dir);
    if (purity) {
        fprintf(f, "'%s' using 1:2 with linespoints lw 2 title 'graph purity'%s", csv, accuracy ? ", " : "\n");
    }
    if (accuracy) {
        fprintf(f, "'%s' using 1:3 with linespoints lw 2 title 'pseudo-label accuracy'\n", csv);
    }
}

/* trainer twotower's metrics: 1 step, 3 loss, 4 steps/s, 5 bank negatives, 6 their staleness (steps). */
static void s_twotower_plots(FILE *f, const char *dir, const char *metrics_csv)
{
    fprintf(f,
            "set datafile separator ','\n"
            "set terminal pngcairo size 900,540 noenhanced\n"
            "set key autotitle columnhead top right\n"
            "set grid\n"
            "set xlabel 'trainer step'\n"
            "set output '%s/loss.png'\n"
            "set ylabel 'InfoNCE loss (mean over 50 steps)'\n"
            "set y2label 'steps/s'\n"
            "set y2tics\n"
            "set title 'Training loss and speed'\n"
            "plot '%s' using 1:3 with lines lw 2, '' using 1:4 axes x1y2 with lines title 'steps/s'\n"
            "set output '%s/staleness.png'\n"
            "set ylabel 'steps'\n"
            "set y2label 'bank negatives per step'\n",
            dir, metrics_csv, dir);
    if (s_column_has_number(metrics_csv, 6)) {
        fprintf(f,
                "set title 'Staleness of the bank negatives (trainer step - checkpoint step of their vectors)'\n"
                "plot '%s' using 1:6 with linespoints lw 2 title 'mean staleness', "
                "'' using 1:5 axes x1y2 with lines title 'bank negatives'\n",
                metrics_csv);
    } else {
        fprintf(f,
                "set title 'No bank negatives were used in this run (no staleness to show)'\n"
                "plot '%s' using 1:5 axes x1y2 with lines title 'bank negatives'\n",
                metrics_csv);
    }
}

int carls_report_plots(const char *dir, const char *metrics_csv, const char *experiment)
{
    char script[4200];
    snprintf(script, sizeof script, "%s/plots.gp", dir);
    FILE *f = fopen(script, "w");
    if (!f) {
        return -1;
    }
    if (strcmp(experiment, "twotower") == 0) {
        s_twotower_plots(f, dir, metrics_csv);
    } else {
    /* Columns of trainer graphreg's metrics: 1 step, 7 accuracy, 9 neighbours/step, 10 stale, 11 missing,
     * 12 mean staleness (steps). */
    fprintf(f,
            "set datafile separator ','\n"
            "set terminal pngcairo size 900,540 noenhanced\n"
            "set key autotitle columnhead bottom right\n"
            "set grid\n"
            "set xlabel 'trainer step'\n"
            "set output '%s/accuracy.png'\n"
            "set ylabel 'accuracy'\n"
            "set title 'Evaluation accuracy over training'\n"
            "plot '%s' using 1:7 with linespoints lw 2\n"
            "set output '%s/staleness.png'\n"
            "set ylabel 'steps'\n"
            "set y2label 'neighbour embeddings per eval window'\n"
            "set y2tics\n"
            "set key top left\n"
            "set title 'Staleness of the neighbour embeddings read from the bank'\n"
            "plot '%s' using 1:12 with linespoints lw 2 title 'mean age (trainer step - embedding version)', "
            "'' using 1:10 axes x1y2 with linespoints title 'skipped as too stale', "
            "'' using 1:11 axes x1y2 with linespoints title 'missing (not yet embedded)'\n",
            dir, metrics_csv, dir, metrics_csv);
    }
    s_knowledge_plot(f, dir);
    fclose(f);
    char cmd[9000];
    snprintf(cmd, sizeof cmd, "gnuplot '%s' 2>'%s/plots.log'", script, dir);
    int st = system(cmd);
    if (st != 0) {
        LOG_WARN("gnuplot failed or is missing (exit %d): no plots (install gnuplot-nox; see %s/plots.log)",
                 WIFEXITED(st) ? WEXITSTATUS(st) : -1, dir);
        return -1;
    }
    return 0;
}

/* " value |" rounded to 4 digits, or " |" for a value the step does not have. */
static void s_knowledge_cell(FILE *f, double v)
{
    if (isnan(v)) {
        fprintf(f, " |");
    } else {
        fprintf(f, " %.4f |", v);
    }
}

/* The "Knowledge per refresh" section from dir/knowledge.csv; nothing when the run wrote none. */
static void s_knowledge_section(FILE *f, const char *dir)
{
    char csv[4200];
    snprintf(csv, sizeof csv, "%s/" CARLS_KNOWLEDGE_CSV, dir);
    carls_knowledge_row_t *rows = NULL;
    size_t n = 0;
    if (carls_knowledge_read_csv(csv, &rows, &n) != 0 || n == 0) {
        free(rows);
        return;
    }
    fprintf(f, "\n## Knowledge per refresh\n\n"
               "The graph's purity (share of edges joining items of one class) and the pseudo-labels' accuracy over "
               "the unlabelled items (all of them, and those with confidence >= 0.5, with their share) at each graph "
               "version and label step, from the makers' logs: diagnostics from the true labels, which the makers "
               "never write. Also in `" CARLS_KNOWLEDGE_CSV "`.\n\n"
               "| step | graph purity | pseudo-label accuracy | confident accuracy | confident share |\n"
               "| --- | --- | --- | --- | --- |\n");
    for (size_t i = 0; i < n; i++) {
        fprintf(f, "| %" PRIu64 " |", rows[i].step);
        s_knowledge_cell(f, rows[i].graph_purity);
        s_knowledge_cell(f, rows[i].pseudo_label_accuracy);
        s_knowledge_cell(f, rows[i].confident_accuracy);
        s_knowledge_cell(f, rows[i].confident_share);
        fputc('\n', f);
    }
    free(rows);
}

int carls_report_write(const char *dir, const char *config_path, const carls_ini_t *ini, const carls_result_t *r,
                       const char *phases, const char *faults, int plotted)
{
    char path[4200];
    snprintf(path, sizeof path, "%s/report.md", dir);
    FILE *f = fopen(path, "w");
    if (!f) {
        return -1;
    }
    time_t now = time(NULL);
    char when[64];
    strftime(when, sizeof when, "%Y-%m-%d %H:%M:%S UTC", gmtime(&now));
    double load[3] = {0, 0, 0};
    FILE *la = fopen("/proc/loadavg", "r");
    if (la) {
        if (fscanf(la, "%lf %lf %lf", &load[0], &load[1], &load[2]) != 3) {
            load[0] = load[1] = load[2] = 0;
        }
        fclose(la);
    }
    fprintf(f, "# Run %s\n\n", carls_ini_get(ini, "name", "?"));
    fprintf(f, "Config `%s`, finished %s, load average at the end %.2f %.2f %.2f.\n\n", config_path, when, load[0],
            load[1], load[2]);
    fprintf(f, "## Result\n\n| key | value |\n| --- | --- |\n");
    for (int i = 0; i < r->n; i++) {
        fprintf(f, "| %s | %.6g |\n", r->key[i], r->value[i]);
    }
    if (phases && *phases) {
        fprintf(f, "\n## Stages\n\nThe wall time of each stage, in the order they ran (they do not overlap; also "
                   "in `" CARLS_STAGES_JSON "`).\n\n| stage | seconds |\n| --- | --- |\n%s", phases);
    }
    if (faults && *faults) {
        fprintf(f, "\n## Faults\n\n%s", faults);
    }
    s_knowledge_section(f, dir);
    fprintf(f, "\n## Plots\n\n");
    if (plotted) {
        const bool tt = strcmp(carls_ini_get(ini, "experiment", "graphreg"), "twotower") == 0;
        fprintf(f, "![%s](%s.png)\n\n![staleness](staleness.png)\n", tt ? "loss" : "accuracy", tt ? "loss" : "accuracy");
        char csv[4200];
        bool purity, accuracy;
        if (s_knowledge_plottable(dir, csv, sizeof csv, &purity, &accuracy)) {
            fprintf(f, "\n![knowledge](knowledge.png)\n");
        }
    } else {
        fprintf(f, "No plots: gnuplot is missing or failed (see plots.log).\n");
    }
    fprintf(f, "\n## Configuration\n\n| key | value |\n| --- | --- |\n");
    for (int i = 0; i < ini->n; i++) {
        fprintf(f, "| %s | %s%s |\n", ini->key[i], ini->value[i], ini->overridden[i] ? " (--set)" : "");
    }
    fprintf(f, "\nFiles: `metrics.csv` (one row per evaluation), `logs/` (every process's log), `trainer.out`, "
               "`processes.tsv` (every process: role, pid, start, end, exit).\n");
    fclose(f);
    return 0;
}
