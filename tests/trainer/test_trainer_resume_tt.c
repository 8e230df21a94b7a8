/* `trainer twotower --resume` continues a run exactly (docs/STATE.md, "Resuming a run"), against a real
 * kb-server. The word and trigram rows the trainer trains live in the bank, so a resumed run needs the bank
 * as it was at its checkpoint: each resume here restarts the server with `--restore` of the snapshot the
 * checkpoint names (as `carls run --resume` does). No makers: the bank negatives' pooled inputs (rt.vecx) are
 * written once by the test and read by key (--negatives-sampling pairs, 8 every 4 steps, held in between),
 * so the run is deterministic. The data: 40 made-up documents with 4 queries each (pairs:PAIRS.tsv), 10 held
 * out, 150 training pairs in batches of 16 (9 steps an epoch), 7 epochs (63 steps), token dropout and
 * --word-defs on (both draw from the RNG), a checkpoint every 6 steps with a bank snapshot (--bank-snapshot
 * tt):
 *   - run A is uninterrupted;
 *   - run B is A's directory cut back to its step-24 checkpoint (mid-epoch) and resumed on the bank restored
 *     from tt-step24: its step-63 checkpoint must equal A's byte for byte (heads, Adam moments, pairs' order,
 *     RNG state), its ranking on the hold-out must be A's, its metrics row of step 50 A's (the loss window
 *     is in the checkpoint), and it must say resumed_from_step=24;
 *   - run D does the same from step 18, an epoch's first batch (the shuffle of the new epoch happens after
 *     resuming, from the saved order) and between two fetches of bank negatives (those held come from the
 *     checkpoint);
 *   - the test can fail: resumed from A's step-24 checkpoint with another RNG state (data.rng), the run must
 *     end with other weights; other settings (--seed) are refused naming the checkpoint. */
#include "maker_testlib.h"
#include "resume_testlib.h"
#include "server_harness.h"
#include "test_proto.h"

#include "checkpoint.h"
#include "kb_cluster.h"
#include "util.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define S_DOCS 40

static void s_word(char *out, uint64_t *rng, int len)
{
    for (int i = 0; i < len; i++) {
        out[i] = (char)('a' + carls_splitmix64(rng) % 26);
    }
    out[len] = '\0';
}

/* The documents' names: a made-up word and the document's number. */
static void s_doc_name(char *doc, uint64_t *rng, int d)
{
    char w[8];
    s_word(w, rng, 6);
    w[0] = (char)('a' + d % 26);
    snprintf(doc, 16, "%s%d", w, d);
}

/* dir/pairs.tsv: 4 queries per document, each of filler words and one or two of the document's topic words. */
static void s_write_pairs(const char *path)
{
    FILE *f = fopen(path, "w");
    MT_CHECK(f != NULL, "cannot write %s", path);
    if (!f) {
        return;
    }
    uint64_t rng = 777;
    char fill[20][8];
    for (int i = 0; i < 20; i++) {
        s_word(fill[i], &rng, 4);
    }
    for (int d = 0; d < S_DOCS; d++) {
        char doc[16], t0[8], t1[8];
        s_doc_name(doc, &rng, d);
        s_word(t0, &rng, 7);
        s_word(t1, &rng, 7);
        for (int q = 0; q < 4; q++) {
            const int which = (int)(carls_splitmix64(&rng) % 3);
            fprintf(f, "%s %s %s%s%s%s %s\t%s\n", fill[carls_splitmix64(&rng) % 20],
                    fill[carls_splitmix64(&rng) % 20], which != 1 ? t0 : "", which != 1 ? " " : "",
                    which != 0 ? t1 : "", which != 0 ? " " : "", fill[carls_splitmix64(&rng) % 20], doc);
        }
    }
    fclose(f);
}

/* Creates rt.vecx as the trainer does and writes every document's pooled input there (version 1), as
 * makers would: the bank negatives, read by key (--negatives-sampling pairs), so the run stays deterministic. */
static void s_put_inputs(const char *endpoint, const char *pairs)
{
    kb_client_options_t opts = {.timeout_ms = 10000};
    kb_cluster_t *kb = kb_cluster_new(endpoint, &opts);
    MT_CHECK(kb != NULL, "cannot connect to %s", endpoint);
    if (!kb) {
        return;
    }
    test_table_config_t tc;
    test_embedding_table_config(&tc, 16, CARLS__INIT_KIND__INIT_ZEROS, 0, CARLS__OPTIMIZER_KIND__OPT_SGD, 0.0f,
                                CARLS__UPDATE_POLICY__UPDATE_IMMEDIATE);
    MT_CHECK(kb_cluster_create_table(kb, "rt.vecx", &tc.cfg, true) == 0, "create rt.vecx: %s",
             kb_cluster_last_error(kb));
    char names[S_DOCS][16], line[256];
    kb_key_t keys[S_DOCS];
    float rows[S_DOCS * 16];
    int d = 0;
    FILE *f = fopen(pairs, "r");
    for (int i = 0; f && fgets(line, sizeof line, f) && d < S_DOCS; i++) {
        if (i % 4 == 0) { /* each document's first query */
            const char *tab = strchr(line, '\t');
            snprintf(names[d], sizeof names[d], "%.*s", tab ? (int)strcspn(tab + 1, "\n") : 0, tab ? tab + 1 : "");
            keys[d] = (kb_key_t){names[d], strlen(names[d])};
            for (int e = 0; e < 16; e++) {
                rows[d * 16 + e] = 0.1f * (float)((d * 7 + e * 3) % 11) - 0.5f;
            }
            d++;
        }
    }
    if (f) {
        fclose(f);
    }
    MT_CHECK(d == S_DOCS && kb_cluster_put(kb, "rt.vecx", keys, S_DOCS, 16, rows, 1) == 0, "put %d rows: %s", d,
             kb_cluster_last_error(kb));
    kb_cluster_destroy(&kb);
}

/* Runs trainer twotower with the common arguments plus extra (NULL-terminated) into log; returns its status. */
static int s_trainer(const char *endpoint, const char *data, const char *ckpt_dir, const char *const *extra,
                     const char *log)
{
    char metrics[600];
    snprintf(metrics, sizeof metrics, "%s/metrics.csv", ckpt_dir);
    const char *args[64] = {"trainer", "twotower", "--kb", endpoint, "--data", data, "--holdout-count", "10",
                            "--dim", "16", "--out-dim", "16", "--hidden", "8", "--batch", "16", "--epochs", "7",
                            "--word-defs", "2", "--token-dropout", "0.3", "--seed", "3", "--knn-check", "0",
                            "--table", "rt", "--ckpt-dir", ckpt_dir, "--ckpt-every", "6", "--keep", "20",
                            "--bank-snapshot", "tt", "--metrics", metrics, "--kb-retries", "2", "--kb-negatives", "8",
                            "--negatives-every", "4", "--negatives-sampling", "pairs"};
    return rt_trainer(args, extra, log);
}

/* The text of log's line holding key, from key (less a leading newline) to the line's end (out, len bytes); "" when none. */
static void s_line_from(const char *log, const char *key, char *out, size_t len)
{
    size_t n = 0;
    char *text = rt_slurp(log, &n);
    const char *p = text ? strstr(text, key) : NULL;
    p = p && *p == '\n' ? p + 1 : p;
    size_t k = 0;
    for (; p && p[k] && p[k] != '\n' && k + 1 < len; k++) {
        out[k] = p[k];
    }
    out[k] = '\0';
    free(text);
}

/* Restarts the server on its data directory with the bank restored from snapshot tt-step<step>. */
static int s_restore(test_server_t *srv, int step)
{
    char name[64];
    snprintf(name, sizeof name, "tt-step%d", step);
    int st = test_server_stop(srv, SIGTERM);
    MT_CHECK(st == 0, "kb-server stopped with status %d", st);
    int rc = test_server_start(srv, (const char *const[]){"--restore", name, NULL});
    MT_CHECK(rc == 0, "kb-server --restore %s did not start (see %s)", name, srv->log_file);
    return rc;
}

/* Makes dir a copy of A's directory as a run killed after its checkpoint of step leaves it: the later
 * checkpoints gone, latest naming that one. */
static void s_cut_copy(const char *a, const char *dir, int step)
{
    rt_sh("rm -rf '%s' && test -n '%s'", dir, a);
    rt_sh("cp -r '%s' '%s'", a, dir);
    for (int s = step + 1; s <= 63; s++) {
        char path[700];
        snprintf(path, sizeof path, "%s/ckpt-%012d.ckpt", dir, s);
        unlink(path);
    }
    rt_point_latest(dir, step);
}

int main(void)
{
    char dir[256], pairs[512], data[600], a[512], b[512], c[512], dd[512], log[600];
    mt_tempdir(dir, "trainer_resume_tt");
    snprintf(pairs, sizeof pairs, "%s/pairs.tsv", dir);
    snprintf(data, sizeof data, "pairs:%s", pairs);
    snprintf(a, sizeof a, "%s/A", dir);
    snprintf(b, sizeof b, "%s/B", dir);
    snprintf(c, sizeof c, "%s/C", dir);
    snprintf(dd, sizeof dd, "%s/D", dir);
    s_write_pairs(pairs);
    test_server_t srv;
    test_server_init(&srv);
    MT_CHECK(test_server_start(&srv, NULL) == 0, "kb-server did not start");

    s_put_inputs(srv.endpoint, pairs);

    /* A: uninterrupted. */
    char alog[600], a63[600], aline[512], aloss[512];
    snprintf(alog, sizeof alog, "%s/A.log", dir);
    MT_CHECK(s_trainer(srv.endpoint, data, a, NULL, alog) == 0, "run A failed (see %s)", alog);
    snprintf(a63, sizeof a63, "%s/ckpt-000000000063.ckpt", a);
    s_line_from(alog, " r1=", aline, sizeof aline);
    MT_CHECK(*aline && strstr(aline, "mrr="), "run A printed no ranking (see %s)", alog);
    char acsv[600], line[600];
    snprintf(acsv, sizeof acsv, "%s/metrics.csv", a);
    s_line_from(acsv, "\n50,", aloss, sizeof aloss);
    MT_CHECK(*aloss, "A's metrics have no row of step 50 (%s)", acsv);
    double cols[6] = {0};
    MT_CHECK(sscanf(aloss, "%lf,%lf,%lf,%lf,%lf", &cols[0], &cols[1], &cols[2], &cols[3], &cols[4]) == 5 &&
                 cols[4] == 8.0,
             "A held no bank negatives at step 50: '%s'", aloss);
    carls_ckpt_t *ck = NULL;
    char err[512], path[700];
    snprintf(path, sizeof path, "%s/ckpt-000000000024.ckpt", a);
    MT_CHECK(carls_ckpt_read(path, &ck, err, sizeof err) == 0, "%s", err);
    const char *snap = ck ? carls_ckpt_text(ck, "bank.snapshot") : NULL;
    MT_CHECK(snap && strcmp(snap, "tt-step24") == 0, "A's step-24 checkpoint names snapshot %s", snap ? snap : "none");
    MT_CHECK(ck && carls_ckpt_find(ck, "opt.m") && carls_ckpt_blob(ck, "data.order", NULL),
             "A's step-24 checkpoint lacks the optimiser or the pairs' order");
    carls_ckpt_destroy(&ck);

    /* B: resumed mid-epoch (24 = 2 epochs of 9 steps + 6). D: at an epoch's first batch (18). */
    const struct {
        const char *dir;
        int step;
    } resumes[] = {{b, 24}, {dd, 18}};
    for (int i = 0; i < 2; i++) {
        const char *rdir = resumes[i].dir;
        char rlog[700], r63[700], rline[512], rloss[512], want[64], rcsv[700];
        snprintf(rlog, sizeof rlog, "%s.log", rdir);
        s_cut_copy(a, rdir, resumes[i].step);
        MT_CHECK(s_restore(&srv, resumes[i].step) == 0, "restore");
        MT_CHECK(s_trainer(srv.endpoint, data, rdir, (const char *const[]){"--resume", NULL}, rlog) == 0,
                 "resumed run failed (see %s)", rlog);
        snprintf(want, sizeof want, "resumed_from_step=%d ", resumes[i].step);
        MT_CHECK(mt_file_contains(rlog, want), "%s does not say %s", rlog, want);
        snprintf(want, sizeof want, "resumed from step %d (checkpoint", resumes[i].step);
        MT_CHECK(mt_file_contains(rlog, want), "%s does not say where it resumed", rlog);
        snprintf(r63, sizeof r63, "%s/ckpt-000000000063.ckpt", rdir);
        MT_CHECK(rt_same_file(a63, r63), "the step-63 checkpoint resumed from step %d differs from A's (%s, %s)",
                 resumes[i].step, a63, r63);
        s_line_from(rlog, " r1=", rline, sizeof rline);
        MT_CHECK(strcmp(rline, aline) == 0, "resumed from %d, the ranking is '%s', A's '%s'", resumes[i].step, rline,
                 aline);
        snprintf(rcsv, sizeof rcsv, "%s/metrics.csv", rdir);
        s_line_from(rcsv, "\n50,", rloss, sizeof rloss);
        /* step, epoch, loss: the same (steps/s differs) */
        char *cut_a = strchr(aloss + 4, ','), *cut_r = strchr(rloss + 4, ',');
        cut_a = cut_a ? strchr(cut_a + 1, ',') : NULL;
        cut_r = cut_r ? strchr(cut_r + 1, ',') : NULL;
        MT_CHECK(cut_a && cut_r && cut_a - aloss == cut_r - rloss && memcmp(aloss, rloss, (size_t)(cut_a - aloss)) == 0,
                 "metrics row of step 50: '%s' resumed, '%s' in A", rloss, aloss);
        size_t n = 0;
        char *csv = rt_slurp(rcsv, &n);
        const char *first = csv ? strstr(csv, "\n50,") : NULL;
        MT_CHECK(first && !strstr(first + 1, "\n50,"), "%s does not hold step 50 once", rcsv);
        free(csv);
    }

    /* C: A's step-24 checkpoint with another RNG state: other draws, other weights. */
    char c24[700], c63[700];
    snprintf(c24, sizeof c24, "%s/ckpt-000000000024.ckpt", a);
    snprintf(log, sizeof log, "%s/C.log", dir);
    s_cut_copy(a, c, 24);
    snprintf(path, sizeof path, "%s/ckpt-000000000024.ckpt", c);
    rt_rewrite(c24, path, "data.rng", 12345, 0);
    MT_CHECK(s_restore(&srv, 24) == 0, "restore");
    MT_CHECK(s_trainer(srv.endpoint, data, c, (const char *const[]){"--resume", NULL}, log) == 0, "run C failed (%s)",
             log);
    snprintf(c63, sizeof c63, "%s/ckpt-000000000063.ckpt", c);
    MT_CHECK(rt_tensor_differs(a63, c63, "query.weight"),
             "another RNG state in the checkpoint changed nothing: the state is not what resume uses");

    /* Refused: other settings. */
    snprintf(log, sizeof log, "%s/refuse-settings.log", dir);
    MT_CHECK(s_trainer(srv.endpoint, data, b, (const char *const[]){"--resume", "--seed", "4", NULL}, log) == 1,
             "other settings: not refused");
    MT_CHECK(mt_file_contains(log, "was written by a run with other settings"), "other settings: unclear (%s)", log);
    snprintf(line, sizeof line, "%s/ckpt-000000000063.ckpt", b);
    MT_CHECK(mt_file_contains(log, line), "the refusal does not name the checkpoint (%s)", log);

    MT_CHECK(test_server_cleanup(&srv) == 0, "kb-server did not shut down cleanly");
    return mt_finish("test_trainer_resume_tt", dir);
}
