/* `trainer graphreg --resume` continues a run exactly (docs/STATE.md, "Resuming a run"), against a real
 * kb-server whose graph and neighbour embeddings do not change (no makers), so the run is deterministic:
 *   - run A trains 60 steps (checkpoints every 20, neighbours from the bank, augmentation on, dropout 0.2),
 *     snapshotting the bank at each checkpoint (--bank-snapshot res): each checkpoint names its snapshot
 *     (res-step<N>), which is on the server (with --keep 5 none is deleted yet; the launcher test keeps 2);
 *   - run B is A stopped at its step-20 checkpoint (the checkpoints after it removed, latest pointing at it,
 *     as a run killed between steps 20 and 40 leaves its directory) and resumed with --resume: its step-60
 *     checkpoint must equal A's byte for byte (model, optimiser moments, data orders, RNG states), it must say
 *     "resumed_from_step=20", and its metrics.csv must hold each evaluation once, with A's accuracies;
 *   - resumed once more at its last step, B only evaluates again: the same accuracy, one metrics row;
 *   - the test can fail: resuming from a copy of the step-20 checkpoint whose batch-draw RNG state was changed
 *     must end with other weights (so the state is really read, not recomputed from the seed as a restart
 *     from step 0 would), and a checkpoint without the trainer's state, a missing directory and other
 *     settings are refused with messages that name the file.
 * And `trainer supervised --resume` (s_supervised), which has no bank. Exits 77 (skipped) without
 * dataset-fashion-mnist. */
#include "maker_testlib.h"
#include "resume_testlib.h"
#include "server_harness.h"

#include "prefetch_bank.h"

#include "checkpoint.h"

#include <math.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#define S_N 2000 /* items: the first 2,000 training images */
#define S_K 5
#define S_E 32 /* the embedding: the last hidden width */

static uint32_t s_neighbor(uint32_t item, uint32_t j)
{
    return (item * 7u + j * 13u + 1u) % S_N;
}

static float s_weight(uint32_t item, uint32_t j)
{
    (void)item;
    return 1.0f / (1.0f + (float)j);
}

static float s_value(uint32_t item, uint32_t c)
{
    return 0.5f + 0.5f * sinf(0.1f * (float)item + (float)c); /* >= 0, as ReLU embeddings are */
}

/* Runs trainer graphreg with the common arguments plus extra (NULL-terminated) into log; returns its status. */
static int s_trainer(const char *endpoint, const char *ckpt_dir, const char *const *extra, const char *log)
{
    const char *args[64] = {"trainer", "graphreg", "--data", "fashion-mnist", "--train-items", "2000",
                            "--steps", "60", "--ckpt-every", "20", "--eval-every", "20", "--hidden", "64,32",
                            "--batch-unlabelled", "32", "--alpha", "0.1", "--neighbors", "5", "--tables", "t",
                            "--kb", endpoint, "--augment-shift", "1", "--augment-flip", "0.5", "--device", "cpu",
                            "--threads", "1", "--keep", "5", "--bank-snapshot", "res", "--ckpt-dir", ckpt_dir, "--log-level", "info"};
    return rt_trainer(args, extra, log);
}

/* Column col (0-based) of the metrics row of step, or NAN; *rows counts the rows of that step. */
static double s_metric(const char *csv, int step, int col, int *rows)
{
    FILE *f = fopen(csv, "r");
    double v = NAN;
    *rows = 0;
    char line[4096];
    while (f && fgets(line, sizeof line, f)) {
        if (atoi(line) != step || line[0] < '0' || line[0] > '9') {
            continue;
        }
        (*rows)++;
        char *p = line;
        for (int c = 0; c < col && p; c++) {
            p = strchr(p, ',');
            p = p ? p + 1 : NULL;
        }
        v = p ? atof(p) : NAN;
    }
    if (f) {
        fclose(f);
    }
    return v;
}

/* trainer supervised --resume: 200 labelled images in batches of 32 (7 steps an epoch), 4 epochs, a checkpoint
 * after each; A uninterrupted, B A's directory cut back to its epoch-2 checkpoint (step 14) and resumed: the
 * step-28 checkpoints are byte-identical, metrics.csv holds each epoch once with A's accuracy; resumed from a
 * copy with another shuffle RNG state (data.rng), the weights differ. */
static void s_supervised(const char *dir)
{
    char a[512], b[512], c[512], log[600], a28[600], b28[600], c28[600], a14[600], c14[600];
    const char *common[] = {"trainer", "supervised", "--data", "fashion-mnist", "--labels-per-class", "20",
                            "--epochs", "4", "--batch", "32", "--hidden", "32", "--device", "cpu", "--threads", "1",
                            "--keep", "10", "--log-level", "info", "--ckpt-dir", NULL};
    snprintf(a, sizeof a, "%s/SA", dir);
    snprintf(b, sizeof b, "%s/SB", dir);
    snprintf(c, sizeof c, "%s/SC", dir);
    const char *runs[3][3] = {{a, NULL, NULL}, {b, "--resume", NULL}, {c, "--resume", NULL}};
    for (int k = 0; k < 3; k++) {
        if (k == 1) {
            rt_sh("cp -r '%s' '%s'", a, b);
            rt_sh("cd '%s' && rm ckpt-000000000021.ckpt ckpt-000000000028.ckpt && test -n '%s'", b, "x");
            rt_point_latest(b, 14);
        } else if (k == 2) {
            rt_sh("mkdir -p '%s' && test -n '%s'", c, "x");
            snprintf(a14, sizeof a14, "%s/ckpt-000000000014.ckpt", a);
            snprintf(c14, sizeof c14, "%s/ckpt-000000000014.ckpt", c);
            rt_rewrite(a14, c14, "data.rng", 12345, 0);
            rt_point_latest(c, 14);
        }
        snprintf(log, sizeof log, "%s.log", runs[k][0]);
        MT_CHECK(rt_trainer(common, runs[k], log) == 0, "supervised run failed (%s)", log);
    }
    snprintf(log, sizeof log, "%s.log", b);
    MT_CHECK(mt_file_contains(log, "resumed_from_step=14\n"), "supervised B does not say resumed_from_step=14");
    snprintf(a28, sizeof a28, "%s/ckpt-000000000028.ckpt", a);
    snprintf(b28, sizeof b28, "%s/ckpt-000000000028.ckpt", b);
    snprintf(c28, sizeof c28, "%s/ckpt-000000000028.ckpt", c);
    MT_CHECK(rt_same_file(a28, b28), "supervised: B's step-28 checkpoint differs from A's (%s, %s)", a28, b28);
    char acsv[600], bcsv[600];
    snprintf(acsv, sizeof acsv, "%s/metrics.csv", a);
    snprintf(bcsv, sizeof bcsv, "%s/metrics.csv", b);
    for (int epoch = 1; epoch <= 4; epoch++) {
        int rows = 0, arows = 0;
        const double acc = s_metric(bcsv, epoch, 5, &rows), aacc = s_metric(acsv, epoch, 5, &arows);
        MT_CHECK(rows == 1 && arows == 1 && acc == aacc && acc > 0.3, "supervised epoch %d: %d rows, accuracy %g "
                 "resumed, %g not", epoch, rows, acc, aacc);
    }
    MT_CHECK(!rt_same_file(a28, c28), "supervised: another shuffle RNG state changed nothing (%s)", c28);
    /* B resumed once more, after its last epoch: only the evaluation, A's accuracy, no new metrics row. */
    size_t len = 0;
    snprintf(log, sizeof log, "%s.log", a);
    char *alog = rt_slurp(log, &len), acc[64] = "";
    const char *at = alog ? strstr(alog, "test_accuracy=") : NULL;
    snprintf(acc, sizeof acc, "%.20s", at ? at : "none");
    free(alog);
    snprintf(log, sizeof log, "%s-again.log", b);
    MT_CHECK(rt_trainer(common, runs[1], log) == 0, "supervised again failed (%s)", log);
    int rows = 0;
    s_metric(bcsv, 4, 5, &rows);
    MT_CHECK(mt_file_contains(log, "resumed_from_step=28\n") && mt_file_contains(log, acc) && rows == 1,
             "supervised again: not resumed at 28 with A's %s, or %d rows of epoch 4 (see %s)", acc, rows, log);
}

int main(void)
{
    if (!mt_have_fmnist()) {
        printf("SKIPPED: dataset-fashion-mnist is not installed\n");
        return 77;
    }
    char dir[256], a[512], b[512], c[512], log[600], a60[600], b60[600], c60[600], csv[600];
    mt_tempdir(dir, "trainer_resume");
    snprintf(a, sizeof a, "%s/A", dir);
    snprintf(b, sizeof b, "%s/B", dir);
    snprintf(c, sizeof c, "%s/C", dir);
    const pt_bank_spec_t spec = {.n = S_N, .k = S_K, .e = S_E, .n_emb = S_N - 200, .neighbor = s_neighbor,
                                 .weight = s_weight, .value = s_value};
    test_server_t srv;
    km_bank_t *bank = pt_start_bank(&srv, &spec);
    MT_CHECK(bank != NULL, "the bank did not start");
    if (!bank) {
        return mt_finish("test_trainer_resume", dir);
    }
    km_bank_destroy(&bank);
    s_supervised(dir);

    /* A: uninterrupted. */
    snprintf(log, sizeof log, "%s/A.log", dir);
    MT_CHECK(s_trainer(srv.endpoint, a, NULL, log) == 0, "run A failed (see %s)", log);
    snprintf(a60, sizeof a60, "%s/ckpt-000000000060.ckpt", a);
    MT_CHECK(mt_file_contains(log, "neighbors_used=") && !mt_file_contains(log, "neighbors_used=0\n"),
             "run A used no neighbours from the bank (see %s)", log);

    char a20[600], c20[600], manifest[700];
    snprintf(a20, sizeof a20, "%s/ckpt-000000000020.ckpt", a);
    carls_ckpt_t *ck = NULL;
    char err[512];
    MT_CHECK(carls_ckpt_read(a20, &ck, err, sizeof err) == 0, "%s", err);
    const char *snap = ck ? carls_ckpt_text(ck, "bank.snapshot") : NULL;
    MT_CHECK(snap && strcmp(snap, "res-step20") == 0, "A's step-20 checkpoint names snapshot %s", snap ? snap : "none");
    carls_ckpt_destroy(&ck);
    for (int step = 0; step <= 60; step += 20) {
        snprintf(manifest, sizeof manifest, "%s/db/snapshots/res-step%d/MANIFEST", srv.data_dir, step);
        MT_CHECK(access(manifest, R_OK) == 0, "no snapshot %s", manifest);
    }

    /* B: A's directory as a kill between steps 20 and 40 leaves it (its step-40 metrics row already written),
     * resumed. */
    rt_sh("cp -r '%s' '%s'", a, b);
    rt_sh("rm '%s/ckpt-000000000040.ckpt' '%s/ckpt-000000000060.ckpt'", b, b);
    rt_point_latest(b, 20);
    snprintf(log, sizeof log, "%s/B.log", dir);
    MT_CHECK(s_trainer(srv.endpoint, b, (const char *const[]){"--resume", NULL}, log) == 0,
             "resumed run B failed (see %s)", log);
    MT_CHECK(mt_file_contains(log, "resumed_from_step=20\n"), "B does not say it resumed from step 20 (%s)", log);
    MT_CHECK(mt_file_contains(log, "resumed from step 20 (checkpoint"), "B's log does not say where it resumed");
    snprintf(b60, sizeof b60, "%s/ckpt-000000000060.ckpt", b);
    MT_CHECK(rt_same_file(a60, b60), "B's step-60 checkpoint differs from A's (%s, %s)", a60, b60);
    snprintf(csv, sizeof csv, "%s/metrics.csv", b);
    char acsv[600];
    snprintf(acsv, sizeof acsv, "%s/metrics.csv", a);
    for (int step = 20; step <= 60; step += 20) {
        int rows = 0, arows = 0;
        const double acc = s_metric(csv, step, 6, &rows), aacc = s_metric(acsv, step, 6, &arows);
        MT_CHECK(rows == 1 && arows == 1, "step %d: %d rows in %s (1 expected)", step, rows, csv);
        MT_CHECK(acc == aacc && acc > 0.1, "step %d: test accuracy %g after resuming, %g without", step, acc, aacc);
    }

    /* B resumed once more, at its last step: only the evaluation is left, with the same accuracy and no second
     * metrics row for it. */
    snprintf(log, sizeof log, "%s/B-again.log", dir);
    MT_CHECK(s_trainer(srv.endpoint, b, (const char *const[]){"--resume", NULL}, log) == 0, "B again failed (%s)", log);
    MT_CHECK(mt_file_contains(log, "resumed_from_step=60\n"), "B again did not resume at step 60 (see %s)", log);
    int rows = 0, arows = 0;
    MT_CHECK(s_metric(csv, 60, 6, &rows) == s_metric(acsv, 60, 6, &arows) && rows == 1,
             "B again: %d rows of step 60 in %s, or another accuracy", rows, csv);

    /* C: the step-20 checkpoint with another batch-draw RNG state: other batches, other weights. */
    rt_sh("mkdir -p '%s' && test -d '%s'", c, c);
    snprintf(c20, sizeof c20, "%s/ckpt-000000000020.ckpt", c);
    rt_rewrite(a20, c20, "data.rng", 12345, 0);
    rt_point_latest(c, 20);
    snprintf(log, sizeof log, "%s/C.log", dir);
    MT_CHECK(s_trainer(srv.endpoint, c, (const char *const[]){"--resume", NULL}, log) == 0, "run C failed (%s)", log);
    snprintf(c60, sizeof c60, "%s/ckpt-000000000060.ckpt", c);
    MT_CHECK(rt_tensor_differs(a60, c60, "enc.0.weight"),
             "another RNG state in the checkpoint changed nothing: the state is not what resume uses");

    /* Refusals: a checkpoint without the trainer's state (as older builds wrote), no directory, other settings. */
    rt_rewrite(a20, c20, "", 0, 1);
    rt_point_latest(c, 20);
    snprintf(log, sizeof log, "%s/refuse-nostate.log", dir);
    MT_CHECK(s_trainer(srv.endpoint, c, (const char *const[]){"--resume", NULL}, log) == 1, "no state: not refused");
    MT_CHECK(mt_file_contains(log, "ckpt-000000000020.ckpt is a mlp_classifier checkpoint without a trainer state"),
             "no state: the message does not name the file (see %s)", log);
    snprintf(log, sizeof log, "%s/refuse-nodir.log", dir);
    char none[600];
    snprintf(none, sizeof none, "%s/none", dir);
    MT_CHECK(s_trainer(srv.endpoint, none, (const char *const[]){"--resume", NULL}, log) == 1, "no dir: not refused");
    MT_CHECK(mt_file_contains(log, "no checkpoint to resume from in"), "no dir: unclear message (see %s)", log);
    snprintf(log, sizeof log, "%s/refuse-settings.log", dir);
    MT_CHECK(s_trainer(srv.endpoint, b, (const char *const[]){"--resume", "--seed", "2", NULL}, log) == 1,
             "other settings: not refused");
    MT_CHECK(mt_file_contains(log, "was written by a run with other settings"), "other settings: unclear (%s)", log);

    MT_CHECK(test_server_cleanup(&srv) == 0, "kb-server did not shut down cleanly");
    return mt_finish("test_trainer_resume", dir);
}
