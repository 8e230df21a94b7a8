/* Maker fleets against a real kb-server, on 900 real Fashion-MNIST images:
 *   - three embed makers (--worker 0/3, 1/3, 2/3, --once) cover every item exactly once: every item has the
 *     checkpoint's step, and the bank counted as many puts as there are items;
 *   - a pixel fleet and a graph fleet build k=5 neighbour lists: every item has 5 neighbours, never itself,
 *     with weights in [0, 1], best first;
 *   - a label maker writes pseudo-labels for the unlabelled items only;
 *   - a convolutional encoder's checkpoint is embedded, and a graph fleet with --source emb+pixels writes rows
 *     of the embeddings' k nearest then the pixels' k nearest; a step-0 checkpoint leaves the graph alone;
 *   - a sqrt-centered pixel fleet (--pixel-features) writes rows whose mean over the items is zero (both makers
 *     subtract the mean image of all items, not of their share).
 * Exits 77 (skipped) without dataset-fashion-mnist. */
#include "maker_testlib.h"
#include "server_harness.h"

#include "km_bank.h"
#include "km_hog.h"
#include "data_fmnist.h"

#include "nn_mlp.h"

#include "checkpoint.h"
#include "kb_cluster.h"

#include <math.h>
#include <string.h>

#define N_ITEMS 900

/* Runs n makers with the given extra arguments (--worker i/n added) and checks they all exit 0. */
static void s_fleet(const char *endpoint, const char *dir, int n, const char *const *extra)
{
    pid_t pids[8];
    char logs[8][160];
    for (int i = 0; i < n; i++) {
        char *argv[40];
        char worker[32];
        int a = 0;
        snprintf(worker, sizeof worker, "%d/%d", i, n);
        argv[a++] = "kb-maker";
        argv[a++] = "--kb";
        argv[a++] = (char *)endpoint;
        argv[a++] = "--worker";
        argv[a++] = worker;
        argv[a++] = "--items";
        argv[a++] = "900";
        argv[a++] = "--device";
        argv[a++] = "cpu";
        argv[a++] = "--once";
        for (int e = 0; extra[e]; e++) {
            argv[a++] = (char *)extra[e];
        }
        argv[a] = NULL;
        snprintf(logs[i], sizeof logs[i], "%s/maker-%s-%d.log", dir, extra[1], i);
        pids[i] = mt_spawn("kb-maker", argv, logs[i]);
    }
    for (int i = 0; i < n; i++) {
        int st = mt_wait(pids[i], 120000);
        MT_CHECK(st == 0, "maker %d/%d (%s) exited with %d, see %s", i, n, extra[1], st, logs[i]);
    }
}

static uint64_t s_stat(kb_cluster_t *c, const char *table, const char *field)
{
    Carls__Response *r = NULL;
    uint64_t v = UINT64_MAX;
    if (kb_cluster_stats(c, 0, table, &r) == 0) {
        for (size_t i = 0; i < r->stats->n_tables; i++) {
            const Carls__TableStats *t = r->stats->tables[i];
            if (strcmp(t->name, table) == 0) {
                v = strcmp(field, "rows") == 0 ? t->rows : t->puts;
            }
        }
    }
    if (r) {
        carls__response__free_unpacked(r, NULL);
    }
    return v;
}

int main(void)
{
    if (!mt_have_fmnist()) {
        printf("SKIPPED: dataset-fashion-mnist is not installed\n");
        return 77;
    }
    test_server_t srv;
    test_server_init(&srv);
    if (test_server_start(&srv, NULL) != 0) {
        return 1;
    }
    char dir[64], ckpt[128], err[512];
    mt_tempdir(dir, "mkfleet");
    snprintf(ckpt, sizeof ckpt, "%s/ckpt", dir);
    nn_mlp_config_t cfg = {.in_dim = 784, .n_hidden = 1, .hidden = {8}, .num_classes = 10};
    nn_mlp_t *m = NULL;
    carls_ckpt_t *c = NULL;
    if (nn_mlp_new(&cfg, NN_DEVICE_CPU, 64, 3, &m, err, sizeof err) != 0 || nn_mlp_to_ckpt(m, 42, &c, err, sizeof err) != 0 ||
        carls_ckpt_save_to_dir(c, ckpt, NULL, 0, err, sizeof err) != 0) {
        fprintf(stderr, "%s\n", err);
        return 1;
    }
    carls_ckpt_destroy(&c);
    nn_mlp_destroy(&m);

    /* Embed fleet of three. */
    const char *embed[] = {"--task", "embed", "--ckpt-dir", ckpt, NULL};
    s_fleet(srv.endpoint, dir, 3, embed);
    km_bank_t *bank = km_bank_new(srv.endpoint, 5000, NULL);
    kb_cluster_t *client = kb_cluster_new(srv.endpoint, NULL);
    static uint32_t items[N_ITEMS];
    static uint64_t ver[N_ITEMS];
    static int64_t upd[N_ITEMS];
    for (int i = 0; i < N_ITEMS; i++) {
        items[i] = (uint32_t)i;
    }
    MT_CHECK(km_bank_lookup(bank, "fmnist.emb", items, N_ITEMS, 8, NULL, ver, upd) == 0, "%s", km_bank_error(bank));
    int ok = 1;
    for (int i = 0; i < N_ITEMS; i++) {
        ok = ok && upd[i] != 0 && ver[i] == 42;
    }
    MT_CHECK(ok, "some item lacks the step-42 embedding");
    MT_CHECK(s_stat(client, "fmnist.emb", "rows") == N_ITEMS, "rows %llu", (unsigned long long)s_stat(client, "fmnist.emb", "rows"));
    MT_CHECK(s_stat(client, "fmnist.emb", "puts") == N_ITEMS, "puts %llu: the fleet did not write each item exactly once",
             (unsigned long long)s_stat(client, "fmnist.emb", "puts"));

    /* Pixel graph, k = 5, built by two makers. */
    const char *pixels[] = {"--task", "embed", "--encoder", "pixels", NULL};
    s_fleet(srv.endpoint, dir, 2, pixels);
    MT_CHECK(s_stat(client, "fmnist.pixels", "puts") == N_ITEMS, "pixel puts");
    const char *graph[] = {"--task", "graph", "--source", "pixels", "--k", "5", NULL};
    s_fleet(srv.endpoint, dir, 2, graph);
    static uint32_t nbr[N_ITEMS * 5];
    static float w[N_ITEMS * 5];
    MT_CHECK(km_bank_get_neighbors(bank, "fmnist.graph", items, N_ITEMS, 5, nbr, w, ver) == 0, "%s", km_bank_error(bank));
    int full = 1, self = 0, range = 1, order = 1;
    for (int i = 0; i < N_ITEMS; i++) {
        for (int j = 0; j < 5; j++) {
            uint32_t t = nbr[i * 5 + j];
            full = full && t != KM_NO_ITEM;
            self += t == (uint32_t)i;
            range = range && (t == KM_NO_ITEM || t < N_ITEMS) && w[i * 5 + j] >= 0.0f && w[i * 5 + j] <= 1.0001f;
            order = order && (j == 0 || w[i * 5 + j] <= w[i * 5 + j - 1] + 1e-6f);
        }
    }
    MT_CHECK(full, "an item has fewer than 5 neighbours");
    MT_CHECK(self == 0, "%d items list themselves", self);
    MT_CHECK(range, "a neighbour or weight out of range");
    MT_CHECK(order, "neighbours are not best first");

    /* Label spreading: labels for the unlabelled items only. */
    const char *label[] = {"--task", "label", "--labels-per-class", "3", "--label-seed", "1", "--k", "5", NULL};
    s_fleet(srv.endpoint, dir, 1, label);
    static int32_t lab[N_ITEMS];
    static float conf[N_ITEMS];
    MT_CHECK(km_bank_get_labels(bank, "fmnist.labels", items, N_ITEMS, lab, conf, NULL) == 0, "%s", km_bank_error(bank));
    int labelled = 0, bad = 0;
    for (int i = 0; i < N_ITEMS; i++) {
        labelled += lab[i] >= 0;
        bad += lab[i] >= 10 || (lab[i] >= 0 && !(conf[i] > 0.0f && conf[i] <= 1.0f));
    }
    MT_CHECK(labelled == N_ITEMS - 30, "%d items got pseudo-labels, expected the %d unlabelled ones", labelled, N_ITEMS - 30);
    MT_CHECK(bad == 0, "%d bad labels or confidences", bad);
    MT_CHECK(s_stat(client, "fmnist.labels", "rows") == N_ITEMS - 30, "label rows");

    /* A convolutional encoder's embeddings (table prefix fmcv), then a graph over them and the pixels together
     * (--source emb+pixels, k = 5): each row is the embeddings' 5 nearest, then the pixels' 5 nearest, and the
     * graph carries the checkpoint's step. A step-0 (untrained) checkpoint leaves that graph alone. */
    char ckpt_conv[160], ckpt_zero[160];
    snprintf(ckpt_conv, sizeof ckpt_conv, "%s/ckpt-conv", dir);
    snprintf(ckpt_zero, sizeof ckpt_zero, "%s/ckpt-zero", dir);
    nn_mlp_config_t ccfg = {.in_dim = 784, .n_hidden = 1, .hidden = {8}, .num_classes = 10, .n_conv = 1,
                            .conv = {{4, 5, 2}}, .image_h = 28, .image_w = 28, .image_c = 1};
    for (int z = 0; z < 2; z++) {
        if (nn_mlp_new(&ccfg, NN_DEVICE_CPU, 64, 5, &m, err, sizeof err) != 0 ||
            nn_mlp_to_ckpt(m, z ? 0 : 7, &c, err, sizeof err) != 0 ||
            carls_ckpt_save_to_dir(c, z ? ckpt_zero : ckpt_conv, NULL, 0, err, sizeof err) != 0) {
            fprintf(stderr, "%s\n", err);
            return 1;
        }
        carls_ckpt_destroy(&c);
        nn_mlp_destroy(&m);
    }
    const char *cv_pixels[] = {"--task", "embed", "--encoder", "pixels", "--tables", "fmcv", NULL};
    s_fleet(srv.endpoint, dir, 2, cv_pixels);
    const char *cv_embed[] = {"--task", "embed", "--ckpt-dir", ckpt_conv, "--tables", "fmcv", NULL};
    s_fleet(srv.endpoint, dir, 2, cv_embed);
    MT_CHECK(km_bank_lookup(bank, "fmcv.emb", items, N_ITEMS, 8, NULL, ver, upd) == 0, "%s", km_bank_error(bank));
    ok = 1;
    for (int i = 0; i < N_ITEMS; i++) {
        ok = ok && upd[i] != 0 && ver[i] == 7;
    }
    MT_CHECK(ok, "some item lacks the conv encoder's step-7 embedding");
    const char *cv_pixel_graph[] = {"--task", "graph", "--source", "pixels", "--k", "5", "--tables", "fmcv", NULL};
    s_fleet(srv.endpoint, dir, 2, cv_pixel_graph);
    const char *cv_graph[] = {"--task", "graph", "--source", "emb+pixels", "--k", "5", "--tables", "fmcv",
                              "--ckpt-dir", ckpt_conv, NULL};
    s_fleet(srv.endpoint, dir, 2, cv_graph);
    /* The pixels' half came from the pixel graph the bank held, not from a second search. */
    for (int i = 0; i < 2; i++) {
        char log[200];
        snprintf(log, sizeof log, "%s/maker-graph-%d.log", dir, i);
        MT_CHECK(mt_file_contains(log, "neighbour lists of 450 items taken from fmcv.graph"),
                 "graph maker %d did not reuse the pixel graph's lists (see %s)", i, log);
    }
    static uint32_t un[N_ITEMS * 10];
    static float uw[N_ITEMS * 10];
    MT_CHECK(km_bank_get_neighbors(bank, "fmcv.graph", items, N_ITEMS, 10, un, uw, ver) == 0, "%s",
             km_bank_error(bank));
    int tail_same = 0, head_differs = 0, versions = 0, complete = 1;
    for (int i = 0; i < N_ITEMS; i++) {
        tail_same += memcmp(un + i * 10 + 5, nbr + i * 5, sizeof(uint32_t) * 5) == 0;
        head_differs += memcmp(un + i * 10, nbr + i * 5, sizeof(uint32_t) * 5) != 0;
        versions += ver[i] == 7;
        for (int j = 0; j < 10; j++) {
            complete = complete && un[i * 10 + j] < N_ITEMS && un[i * 10 + j] != (uint32_t)i;
        }
    }
    MT_CHECK(complete, "a union row is not 10 other items");
    MT_CHECK(versions == N_ITEMS, "%d of %d union rows carry the checkpoint's step 7", versions, N_ITEMS);
    /* The pixels' half equals the pixel graph built above (near-ties may order differently between tables). */
    MT_CHECK(tail_same >= N_ITEMS * 95 / 100, "only %d of %d rows end with the pixel graph's 5", tail_same, N_ITEMS);
    MT_CHECK(head_differs >= N_ITEMS / 2, "only %d of %d rows start with neighbours other than the pixels'",
             head_differs, N_ITEMS);
    const char *zero_graph[] = {"--task", "graph", "--source", "emb+pixels", "--k", "5", "--tables", "fmcv",
                                "--ckpt-dir", ckpt_zero, NULL};
    const uint64_t graph_puts = s_stat(client, "fmcv.graph", "puts");
    s_fleet(srv.endpoint, dir, 1, zero_graph);
    MT_CHECK(s_stat(client, "fmcv.graph", "puts") == graph_puts, "a step-0 checkpoint rewrote %llu graph rows",
             (unsigned long long)(s_stat(client, "fmcv.graph", "puts") - graph_puts));

    /* sqrt-centered pixel features, two makers: every column sums to zero over the items. */
    const char *sqc[] = {"--task", "embed", "--encoder", "pixels", "--pixel-features", "sqrt-centered", "--tables", "fmsc",
                         NULL};
    s_fleet(srv.endpoint, dir, 2, sqc);
    MT_CHECK(s_stat(client, "fmsc.pixels", "puts") == N_ITEMS, "sqrt-centered pixel puts");
    static float px[N_ITEMS * 784];
    MT_CHECK(km_bank_lookup(bank, "fmsc.pixels", items, N_ITEMS, 784, px, NULL, NULL) == 0, "%s", km_bank_error(bank));
    double worst = 0.0, spread = 0.0;
    for (int d = 0; d < 784; d++) {
        double sum = 0.0;
        for (int i = 0; i < N_ITEMS; i++) {
            sum += px[(size_t)i * 784 + d];
            spread += fabs(px[(size_t)i * 784 + d]);
        }
        worst = fabs(sum / N_ITEMS) > worst ? fabs(sum / N_ITEMS) : worst;
    }
    MT_CHECK(worst < 1e-4, "a column of the sqrt-centered rows has mean %g", worst);
    MT_CHECK(spread > 0.01 * N_ITEMS * 784, "the sqrt-centered rows are (nearly) all zero");

    /* HOG features, two makers: rows of km_hog_dim(28, 28), centred over the items, and the difference of two
     * rows is the difference of the two images' km_hog (the mean cancels). */
    const char *hog[] = {"--task", "embed", "--encoder", "pixels", "--pixel-features", "hog", "--tables", "fmhg", NULL};
    s_fleet(srv.endpoint, dir, 2, hog);
    const int hd = km_hog_dim(28, 28);
    MT_CHECK(hd == 768 && s_stat(client, "fmhg.pixels", "puts") == N_ITEMS, "hog: dim %d, puts %llu", hd,
             (unsigned long long)s_stat(client, "fmhg.pixels", "puts"));
    static float hg[N_ITEMS * 768];
    MT_CHECK(km_bank_lookup(bank, "fmhg.pixels", items, N_ITEMS, 768, hg, NULL, NULL) == 0, "%s", km_bank_error(bank));
    carls_fmnist_t ds;
    MT_CHECK(carls_fmnist_load(NULL, &ds, err, sizeof err) == CARLS_FMNIST_OK, "loading Fashion-MNIST: %s", err);
    float grad[2 * 784], h0[768], h1[768];
    double worst_mean = 0.0, worst_diff = 0.0;
    for (int d = 0; d < 768; d++) {
        double sum = 0.0;
        for (int i = 0; i < N_ITEMS; i++) {
            sum += hg[(size_t)i * 768 + d];
        }
        worst_mean = fabs(sum / N_ITEMS) > worst_mean ? fabs(sum / N_ITEMS) : worst_mean;
    }
    for (int i = 1; i < N_ITEMS; i += 149) {
        km_hog(ds.train.pixels, 28, 28, grad, h0);
        km_hog(ds.train.pixels + (size_t)i * 784, 28, 28, grad, h1);
        for (int d = 0; d < 768; d++) {
            double want = (double)h1[d] - h0[d], got = (double)hg[(size_t)i * 768 + d] - hg[d];
            worst_diff = fabs(want - got) > worst_diff ? fabs(want - got) : worst_diff;
        }
    }
    MT_CHECK(worst_mean < 1e-4, "a column of the hog rows has mean %g", worst_mean);
    MT_CHECK(worst_diff < 1e-4, "hog rows differ from km_hog by %g", worst_diff);
    carls_fmnist_free(&ds);

    kb_cluster_destroy(&client);
    km_bank_destroy(&bank);
    MT_CHECK(test_server_cleanup(&srv) == 0, "kb-server did not shut down cleanly");
    return mt_finish("test_maker_fleet", dir);
}
