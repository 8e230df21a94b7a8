/* The knowledge's quality per refresh (issue 22), read back from the makers' logs of a run into
 * runs/<name>/knowledge.csv, which report.md and knowledge.png show.
 *
 * Two kinds of kb-maker log lines carry it (knowledge_maker/km_maker.c):
 *   graph makers (s_graph_build), one line per maker and graph version, for the maker's share of the items:
 *     "graph from T[ + U] (version V): M items, <neighbours> in S s (R items/s); purity P (share ..."
 *   label makers (s_label_step), one line per label step:
 *     "label step S (<how>): M unlabelled items in T s (R items/s); pseudo-label accuracy A, B on the P% with
 *      confidence >= 0.5 (...)"
 * The rows join them by step (the graph version, the label step: both the trainer checkpoint step they were
 * made from). A step's graph purity is the items-weighted mean over the lines of that version (each graph
 * maker covers a share of the items); the label columns likewise over the label lines of that step (the
 * confident accuracy weighted by the confident items; empty where no item was confident). Where one maker's
 * log holds the same step twice (a restarted maker), its last line counts. Where two fleets (the logs that
 * differ only in the worker number: graph-I, maker-graph-I; labels0-0, maker-label-0) wrote the same step,
 * as the resident makers do for step 0 after the initial ones, the fleet whose last line of it is the latest
 * (by the lines' time stamps) counts: the bank holds what it wrote. Any other line, and any line that does
 * not parse whole, is skipped.
 *
 * knowledge.csv: the header "step,graph_purity,pseudo_label_accuracy,confident_accuracy,confident_share", then
 * one row per step in increasing order; a column without a value at that step is empty. confident_share is a
 * fraction (0..1) of the step's unlabelled items. */
#ifndef CARLS_KNOWLEDGE_H
#define CARLS_KNOWLEDGE_H

#include <stddef.h>
#include <stdint.h>

/* The file's name in the run's directory. */
#define CARLS_KNOWLEDGE_CSV "knowledge.csv"

/* One refresh. A value that does not exist at this step (no graph version or no label step) is NAN. */
typedef struct {
    uint64_t step;                /* graph version / label step */
    double graph_purity;          /* share of edges joining items of one class, over the whole graph */
    double pseudo_label_accuracy; /* over the step's unlabelled items whose class is known */
    double confident_accuracy;    /* over those with confidence >= 0.5 */
    double confident_share;       /* share (0..1) of the unlabelled items with confidence >= 0.5 */
} carls_knowledge_row_t;

/* Reads every "*.log" file of logs_dir and returns the rows in increasing step order: *rows (caller frees;
 * NULL when *n is 0) and *n. Returns 0, or -1 when logs_dir cannot be read (*rows NULL, *n 0). A log that
 * cannot be opened is skipped. */
int carls_knowledge_collect(const char *logs_dir, carls_knowledge_row_t **rows, size_t *n);

/* Writes the rows as knowledge.csv at path (atomically). 0, or -1 (logged). */
int carls_knowledge_write_csv(const char *path, const carls_knowledge_row_t *rows, size_t n);

/* Reads a file written by carls_knowledge_write_csv: *rows (caller frees; NULL when *n is 0) and *n. Rows that
 * do not parse whole are skipped. 0, or -1 when path cannot be read or its header is not knowledge.csv's. */
int carls_knowledge_read_csv(const char *path, carls_knowledge_row_t **rows, size_t *n);

/* The launcher's step: collects logs_dir's rows and, when there is at least one, writes them to csv_path.
 * Returns the number of rows (0: nothing written), or -1 when the logs cannot be read or the file not
 * written. */
int carls_knowledge_write(const char *logs_dir, const char *csv_path);

#endif
