/* The maker loop against a real kb-server: a new checkpoint becomes new embeddings in the bank tagged with
 * its step (values equal to a local forward pass); a corrupt checkpoint (one flipped byte) and a truncated
 * one (half a file) are refused with a log line naming the file and the last good one kept; a checkpoint
 * that arrives while the bank is dead (SIGKILL) is retried and written once the bank is back on the same
 * endpoint; SIGTERM ends the maker with status 0. Uses 600 real Fashion-MNIST images; exits 77 (skipped)
 * without dataset-fashion-mnist. */
#include "maker_testlib.h"
#include "server_harness.h"

#include "km_bank.h"

#include "data_fmnist.h"
#include "nn_mlp.h"
#include "nn_mlp_encode_u8.h"

#include "checkpoint.h"
#include "util.h"

#include <math.h>
#include <signal.h>
#include <string.h>
#include <unistd.h>

#define N_ITEMS 600
#define HIDDEN 16

/* A fresh model (seed) saved as step into dir; returns it (caller destroys). */
static nn_mlp_t *s_model_ckpt(const char *dir, uint64_t seed, uint64_t step)
{
    nn_mlp_config_t cfg = {.in_dim = 784, .n_hidden = 1, .hidden = {HIDDEN}, .num_classes = 10};
    nn_mlp_t *m = NULL;
    carls_ckpt_t *c = NULL;
    char err[512];
    if (nn_mlp_new(&cfg, NN_DEVICE_CPU, 64, seed, &m, err, sizeof err) != 0 || nn_mlp_to_ckpt(m, step, &c, err, sizeof err) != 0 ||
        (dir && carls_ckpt_save_to_dir(c, dir, NULL, 0, err, sizeof err) != 0)) {
        fprintf(stderr, "model: %s\n", err);
        abort();
    }
    carls_ckpt_destroy(&c);
    return m;
}

/* Waits until every item's embedding has version `step`; returns 1 when it happened within timeout_ms. */
static int s_wait_version(km_bank_t *bank, const uint32_t *items, uint64_t step, int timeout_ms)
{
    uint64_t ver[N_ITEMS];
    int64_t upd[N_ITEMS];
    int64_t deadline = carls_monotonic_ms() + timeout_ms;
    while (carls_monotonic_ms() < deadline) {
        if (km_bank_lookup(bank, "fmnist.emb", items, N_ITEMS, HIDDEN, NULL, ver, upd) == 0) {
            int all = 1;
            for (int i = 0; i < N_ITEMS; i++) {
                all = all && upd[i] != 0 && ver[i] == step;
            }
            if (all) {
                return 1;
            }
        }
        usleep(50 * 1000);
    }
    return 0;
}

/* The bank's embeddings equal the model's forward pass (up to float rounding). */
static void s_check_values(km_bank_t *bank, const uint32_t *items, nn_mlp_t *m, const carls_fmnist_t *ds)
{
    static float got[N_ITEMS * HIDDEN], want[N_ITEMS * HIDDEN];
    MT_CHECK(km_bank_lookup(bank, "fmnist.emb", items, N_ITEMS, HIDDEN, got, NULL, NULL) == 0, "%s",
             km_bank_error(bank));
    nn_mlp_encode_u8(m, ds->train.pixels, N_ITEMS, want, NULL, 128);
    double worst = 0;
    for (int i = 0; i < N_ITEMS * HIDDEN; i++) {
        double d = fabs((double)got[i] - want[i]) / (1.0 + fabs(want[i]));
        worst = d > worst ? d : worst;
    }
    MT_CHECK(worst < 1e-5, "embeddings differ from a local forward pass by %g", worst);
}

int main(void)
{
    if (!mt_have_fmnist()) {
        printf("SKIPPED: dataset-fashion-mnist is not installed\n");
        return 77;
    }
    carls_fmnist_t ds;
    char err[512];
    if (carls_fmnist_load(NULL, &ds, err, sizeof err) != 0) {
        fprintf(stderr, "%s\n", err);
        return 1;
    }
    test_server_t srv;
    test_server_init(&srv);
    if (test_server_start(&srv, NULL) != 0) {
        return 1;
    }
    char dir[64], log[128];
    mt_tempdir(dir, "mkloop");
    snprintf(log, sizeof log, "%s/maker.log", dir);
    char ckpt[128];
    snprintf(ckpt, sizeof ckpt, "%s/ckpt", dir);
    uint32_t items[N_ITEMS];
    for (int i = 0; i < N_ITEMS; i++) {
        items[i] = (uint32_t)i;
    }

    /* Step 5 exists before the maker starts; it picks it up at once. */
    nn_mlp_t *a = s_model_ckpt(ckpt, 11, 5);
    char *argv[] = {"kb-maker", "--kb", srv.endpoint, "--task", "embed", "--ckpt-dir", ckpt, "--items", "600",
                    "--worker", "0/1", "--device", "cpu", "--poll-ms", "50", "--batch", "256", "--bank-timeout-ms", "1000",
                    NULL};
    pid_t maker = mt_spawn("kb-maker", argv, log);
    km_bank_t *bank = km_bank_new(srv.endpoint, 5000, NULL);
    MT_CHECK(bank != NULL, "bank client");
    MT_CHECK(s_wait_version(bank, items, 5, 60000), "embeddings of step 5 did not appear");
    s_check_values(bank, items, a, &ds);

    /* A corrupt checkpoint (one flipped byte) named by latest: refused, step 5 stays. */
    {
        nn_mlp_t *b = s_model_ckpt(NULL, 12, 9);
        carls_ckpt_t *c = NULL;
        MT_CHECK(nn_mlp_to_ckpt(b, 9, &c, err, sizeof err) == 0, "%s", err);
        char tmp[160], bad[160], latest[160], latest_tmp[170];
        snprintf(tmp, sizeof tmp, "%s/good9.ckpt", dir);
        snprintf(bad, sizeof bad, "%s/ckpt-000000000009.ckpt", ckpt);
        MT_CHECK(carls_ckpt_write(c, tmp, err, sizeof err) == 0, "%s", err);
        carls_ckpt_destroy(&c);
        nn_mlp_destroy(&b);
        FILE *f = fopen(tmp, "rb");
        static unsigned char bytes[1 << 20];
        size_t n = fread(bytes, 1, sizeof bytes, f);
        fclose(f);
        bytes[n / 2] ^= 0x40;
        f = fopen(bad, "wb");
        fwrite(bytes, 1, n, f);
        fclose(f);
        snprintf(latest, sizeof latest, "%s/latest", ckpt);
        snprintf(latest_tmp, sizeof latest_tmp, "%s/latest.tmp", ckpt);
        f = fopen(latest_tmp, "w");
        fprintf(f, "ckpt-000000000009.ckpt\n");
        fclose(f);
        MT_CHECK(rename(latest_tmp, latest) == 0, "rename latest");
        int64_t deadline = carls_monotonic_ms() + 20000;
        while (!mt_file_contains(log, "refusing checkpoint") && carls_monotonic_ms() < deadline) {
            usleep(50 * 1000);
        }
        MT_CHECK(mt_file_contains(log, "refusing checkpoint"), "the corrupt checkpoint was not refused (see %s)", log);
        MT_CHECK(s_wait_version(bank, items, 5, 1000), "the bank lost step 5 after a corrupt checkpoint");
        s_check_values(bank, items, a, &ds);

        /* A truncated one (the first half of a good file): refused as well, step 5 still stays. */
        char cut[160];
        snprintf(cut, sizeof cut, "%s/ckpt-000000000010.ckpt", ckpt);
        f = fopen(tmp, "rb");
        n = fread(bytes, 1, sizeof bytes, f);
        fclose(f);
        f = fopen(cut, "wb");
        fwrite(bytes, 1, n / 2, f);
        fclose(f);
        f = fopen(latest_tmp, "w");
        fprintf(f, "ckpt-000000000010.ckpt\n");
        fclose(f);
        MT_CHECK(rename(latest_tmp, latest) == 0, "rename latest");
        deadline = carls_monotonic_ms() + 20000;
        while (!mt_file_contains(log, "ckpt-000000000010.ckpt") && carls_monotonic_ms() < deadline) {
            usleep(50 * 1000);
        }
        MT_CHECK(mt_file_contains(log, "refusing checkpoint") && mt_file_contains(log, "ckpt-000000000010.ckpt"),
                 "the truncated checkpoint was not refused (see %s)", log);
        MT_CHECK(s_wait_version(bank, items, 5, 1000), "the bank lost step 5 after a truncated checkpoint");
        s_check_values(bank, items, a, &ds);
    }

    /* A good step 12: new embeddings with the new step. */
    nn_mlp_t *c12 = s_model_ckpt(ckpt, 13, 12);
    MT_CHECK(s_wait_version(bank, items, 12, 60000), "embeddings of step 12 did not appear");
    s_check_values(bank, items, c12, &ds);

    /* The bank dies (SIGKILL) and a checkpoint arrives while it is away: the maker's requests go unanswered,
     * it logs and retries the step, and writes it once the bank is back on the same endpoint and data. */
    MT_CHECK(test_server_stop(&srv, SIGKILL) == 128 + SIGKILL, "kill the bank");
    nn_mlp_t *c15 = s_model_ckpt(ckpt, 14, 15);
    {
        int64_t deadline = carls_monotonic_ms() + 60000;
        while (!mt_file_contains(log, "retrying step 15") && carls_monotonic_ms() < deadline) {
            usleep(50 * 1000);
        }
        MT_CHECK(mt_file_contains(log, "retrying step 15"), "the maker did not retry step 15 (see %s)", log);
        char endpoint[256];
        snprintf(endpoint, sizeof endpoint, "%s", srv.endpoint);
        const char *same[] = {"--listen", endpoint, NULL};
        MT_CHECK(test_server_start(&srv, same) == 0 && strcmp(srv.endpoint, endpoint) == 0,
                 "restart the bank on %s", endpoint);
        MT_CHECK(s_wait_version(bank, items, 15, 60000), "embeddings of step 15 did not appear after the restart");
        s_check_values(bank, items, c15, &ds);
        /* The maker logs the recovery after its write returns, which can be just after the test sees the rows. */
        deadline = carls_monotonic_ms() + 20000;
        while (!mt_file_contains(log, "bank reachable again: step 15 done") && carls_monotonic_ms() < deadline) {
            usleep(50 * 1000);
        }
        MT_CHECK(mt_file_contains(log, "bank reachable again: step 15 done"), "no recovery line (see %s)", log);
    }

    kill(maker, SIGTERM);
    int st = mt_wait(maker, 30000);
    MT_CHECK(st == 0, "kb-maker exited with %d after SIGTERM (see %s)", st, log);
    MT_CHECK(mt_file_contains(log, "2 refused"), "the maker's summary does not count the two refusals");

    km_bank_destroy(&bank);
    nn_mlp_destroy(&a);
    nn_mlp_destroy(&c12);
    nn_mlp_destroy(&c15);
    carls_fmnist_free(&ds);
    MT_CHECK(test_server_cleanup(&srv) == 0, "kb-server did not shut down cleanly");
    return mt_finish("test_maker_loop", dir);
}
