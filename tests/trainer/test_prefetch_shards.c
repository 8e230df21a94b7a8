/* The graph trainer's prefetcher and the makers' bank calls (km_bank) against a bank of two shards
 * (kb-server --shard 0/2 and 1/2, endpoints in shard order): the same graph, embeddings and pseudo-labels
 * written through km_bank to the sharded bank and to one unsharded server are fetched identically (neighbour
 * lists, weights, rows, versions, labels), both shards hold some of every table's rows, and km_bank reads
 * back from the sharded bank what it wrote (neighbour lists, labels, knn over both shards). */
#include "maker_testlib.h"
#include "server_harness.h"

#include "kb_cluster.h"
#include "prefetch_bank.h"
#include "trainer_prefetch.h"

#include <math.h>
#include <string.h>

#define S_N 80
#define S_K 5
#define S_E 6
#define S_B 16

static uint32_t s_neighbor(uint32_t item, uint32_t j)
{
    return (item * 11 + j * 7 + 3) % S_N;
}

static float s_weight(uint32_t item, uint32_t j)
{
    return 0.25f + 0.1f * (float)((item + j) % 5);
}

static float s_value(uint32_t item, uint32_t c)
{
    return sinf(0.29f * (float)item + 0.7f * (float)c);
}

/* Writes pseudo-labels of every item (label item % 10, confidence by item) through bank. */
static void s_put_labels(km_bank_t *bank)
{
    uint32_t items[S_N];
    int32_t label[S_N];
    float conf[S_N];
    for (uint32_t i = 0; i < S_N; i++) {
        items[i] = i;
        label[i] = (int32_t)(i % 10);
        conf[i] = 0.5f + (float)i / (2.0f * S_N);
    }
    MT_CHECK(km_bank_create_feature(bank, "t.labels") == 0 &&
                 km_bank_put_labels(bank, "t.labels", items, S_N, label, conf, 4) == 0,
             "labels: %s", km_bank_error(bank));
}

/* Rows table of one shard, from its own list_tables. */
static uint64_t s_rows(const char *endpoint, const char *table)
{
    kb_client_options_t o = {.timeout_ms = 5000};
    kb_cluster_t *c = kb_cluster_new(endpoint, &o);
    Carls__Response *resp = NULL;
    uint64_t rows = 0;
    if (c && kb_cluster_list_tables(c, &resp) == 0)
        for (size_t i = 0; i < resp->table_list->n_tables; i++)
            if (strcmp(resp->table_list->tables[i]->name, table) == 0)
                rows = resp->table_list->tables[i]->rows;
    if (resp)
        carls__response__free_unpacked(resp, NULL);
    kb_cluster_destroy(&c);
    return rows;
}

/* Counts the differences between two fetches of the same batch. */
static int s_diff(const trainer_fetch_t *a, const trainer_fetch_t *b)
{
    int bad = a->B != b->B || a->distinct != b->distinct;
    for (int s = 0; s < S_B * S_K; s++) {
        bad += a->nbr[s] != b->nbr[s] || a->w[s] != b->w[s] || a->nbr_have[s] != b->nbr_have[s] ||
               a->nbr_ver[s] != b->nbr_ver[s];
        for (int e = 0; e < S_E; e++)
            bad += a->nbr_emb[s * S_E + e] != b->nbr_emb[s * S_E + e];
    }
    for (int i = 0; i < S_B; i++)
        bad += a->plabel[i] != b->plabel[i] || a->pconf[i] != b->pconf[i] || a->pver[i] != b->pver[i];
    return bad;
}

int main(void)
{
    const pt_bank_spec_t spec = {.n = S_N, .k = S_K, .e = S_E, .n_emb = S_N - 10,
                                 .neighbor = s_neighbor, .weight = s_weight, .value = s_value};
    test_server_t one, sh[2];
    test_server_init(&one);
    test_server_init(&sh[0]);
    test_server_init(&sh[1]);
    const char *a0[] = {"--shard", "0/2", NULL}, *a1[] = {"--shard", "1/2", NULL};
    if (test_server_start(&one, NULL) != 0 || test_server_start(&sh[0], a0) != 0 ||
        test_server_start(&sh[1], a1) != 0)
        return 1;
    char both[600];
    snprintf(both, sizeof both, "%s,%s", sh[0].endpoint, sh[1].endpoint);
    km_bank_t *b1 = pt_fill_bank(one.endpoint, &spec), *b2 = pt_fill_bank(both, &spec);
    s_put_labels(b1);
    s_put_labels(b2);

    /* Every table is split over both shards, and the shards together hold every row. */
    const char *tables[] = {"t.graph", "t.emb", "t.labels"};
    const uint64_t want[] = {S_N, S_N - 10, S_N};
    for (int t = 0; t < 3; t++) {
        uint64_t r0 = s_rows(sh[0].endpoint, tables[t]), r1 = s_rows(sh[1].endpoint, tables[t]);
        MT_CHECK(r0 > 0 && r1 > 0 && r0 + r1 == want[t], "%s: shard 0 holds %llu rows, shard 1 %llu, want %llu in all",
                 tables[t], (unsigned long long)r0, (unsigned long long)r1, (unsigned long long)want[t]);
    }

    /* km_bank reads back from the shards what the single server gives. */
    uint32_t items[S_B], n1[S_B * S_K], n2[S_B * S_K];
    float w1[S_B * S_K], w2[S_B * S_K], c1[S_B], c2[S_B];
    int32_t l1[S_B], l2[S_B];
    for (int i = 0; i < S_B; i++)
        items[i] = (uint32_t)(i * 4); /* all with a row: knn by key of a missing row has no order */
    MT_CHECK(km_bank_get_neighbors(b1, "t.graph", items, S_B, S_K, n1, w1, NULL) == 0 &&
                 km_bank_get_neighbors(b2, "t.graph", items, S_B, S_K, n2, w2, NULL) == 0 &&
                 memcmp(n1, n2, sizeof n1) == 0 && memcmp(w1, w2, sizeof w1) == 0,
             "neighbour lists differ between the single server and the shards");
    MT_CHECK(km_bank_get_labels(b1, "t.labels", items, S_B, l1, c1, NULL) == 0 &&
                 km_bank_get_labels(b2, "t.labels", items, S_B, l2, c2, NULL) == 0 &&
                 memcmp(l1, l2, sizeof l1) == 0 && memcmp(c1, c2, sizeof c1) == 0,
             "labels differ between the single server and the shards");
    float s1[S_B * S_K], s2[S_B * S_K];
    MT_CHECK(km_bank_knn(b1, "t.emb", items, S_B, S_K, n1, s1) == 0 &&
                 km_bank_knn(b2, "t.emb", items, S_B, S_K, n2, s2) == 0 && memcmp(n1, n2, sizeof n1) == 0,
             "knn over the shards differs from the single server's (Flat index: it must not)");

    /* The prefetcher: a batch from each bank, identical. */
    trainer_prefetch_config_t cfg = {
        .endpoints = one.endpoint, .graph_table = "t.graph", .labels_table = "t.labels", .emb_table = "t.emb",
        .K = S_K, .E = S_E, .max_batch = S_B, .n_items = S_N, .timeout_ms = 5000,
    };
    trainer_prefetch_t *p1 = trainer_prefetch_new(&cfg);
    cfg.endpoints = both;
    trainer_prefetch_t *p2 = trainer_prefetch_new(&cfg);
    MT_CHECK(p1 && p2, "trainer_prefetch_new");
    if (p1 && p2) {
        MT_CHECK(trainer_prefetch_submit(p1, items, S_B, 9) == 0 && trainer_prefetch_submit(p2, items, S_B, 9) == 0,
                 "submit");
        const trainer_fetch_t *f1 = trainer_prefetch_wait(p1, NULL), *f2 = trainer_prefetch_wait(p2, NULL);
        MT_CHECK(f1->rc == 0 && f2->rc == 0, "fetch: '%s' / '%s'", f1->err, f2->err);
        MT_CHECK(f2->distinct > S_B && f2->fetched == f2->distinct, "the batch reaches %d neighbours, %d read",
                 f2->distinct, f2->fetched);
        int have = 0, labelled = 0;
        for (int s = 0; s < S_B * S_K; s++)
            have += f2->nbr_have[s];
        for (int i = 0; i < S_B; i++)
            labelled += f2->plabel[i] >= 0;
        MT_CHECK(have > 0 && labelled == S_B, "rows found %d, pseudo-labels %d of %d", have, labelled, S_B);
        MT_CHECK(s_diff(f1, f2) == 0, "%d values differ between the single server's batch and the shards'",
                 s_diff(f1, f2));
    }
    trainer_prefetch_destroy(&p1);
    trainer_prefetch_destroy(&p2);
    km_bank_destroy(&b1);
    km_bank_destroy(&b2);
    MT_CHECK(test_server_cleanup(&one) == 0 && test_server_cleanup(&sh[0]) == 0 && test_server_cleanup(&sh[1]) == 0,
             "a server did not stop cleanly");
    return mt_finish("test_prefetch_shards", NULL);
}
