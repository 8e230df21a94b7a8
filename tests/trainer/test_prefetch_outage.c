/* The graph-regularised trainer's prefetcher across a bank outage (trainer_prefetch.h): with a real kb-server
 * holding neighbour lists and embeddings, batches come back with their knowledge; after SIGKILL of the
 * server the next batch comes back TRAINER_FETCH_SKIPPED (empty) within about one request timeout and the
 * following ones without waiting for the bank longer than a probe; once the server is started again on the same endpoint and
 * data, batches come back complete again. */
#include "maker_testlib.h"
#include "server_harness.h"

#include "prefetch_bank.h"
#include "trainer_prefetch.h"

#include "util.h"

#include <signal.h>
#include <string.h>
#include <unistd.h>

#define S_N 100
#define S_K 3
#define S_E 4
#define S_B 10

/* Submits items start..start+S_B-1 and waits for them; *ms receives the wait. */
static const trainer_fetch_t *s_batch(trainer_prefetch_t *pf, uint32_t start, double *ms)
{
    uint32_t items[S_B];
    for (int i = 0; i < S_B; i++) {
        items[i] = (start + (uint32_t)i) % S_N;
    }
    MT_CHECK(trainer_prefetch_submit(pf, items, S_B, 0) == 0, "submit");
    return trainer_prefetch_wait(pf, ms);
}

/* A complete batch: every item's S_K neighbours (item+1..item+S_K) with their embeddings (value = item). */
static int s_complete(const trainer_fetch_t *f)
{
    int ok = f->rc == 0 && f->B == S_B;
    for (int i = 0; ok && i < S_B; i++) {
        for (int j = 0; j < S_K; j++) {
            const uint32_t want = (f->items[i] + 1 + (uint32_t)j) % S_N;
            ok = ok && f->nbr[i * S_K + j] == want && f->nbr_have[i * S_K + j] &&
                 f->nbr_emb[((size_t)i * S_K + (size_t)j) * S_E] == (float)want;
        }
    }
    return ok;
}

/* The bank: item i's neighbours are i+1..i+S_K (mod S_N), weight 1; every item has a row of value i. */
static uint32_t s_neighbor(uint32_t item, uint32_t j)
{
    return (item + 1 + j) % S_N;
}

static float s_weight(uint32_t item, uint32_t j)
{
    (void)item;
    (void)j;
    return 1.0f;
}

static float s_value(uint32_t item, uint32_t c)
{
    (void)c;
    return (float)item;
}

int main(void)
{
    test_server_t srv;
    const pt_bank_spec_t spec = {.n = S_N, .k = S_K, .e = S_E, .n_emb = S_N,
                                 .neighbor = s_neighbor, .weight = s_weight, .value = s_value};
    km_bank_t *bank = pt_start_bank(&srv, &spec);
    if (!bank) {
        return 1;
    }
    km_bank_destroy(&bank);

    trainer_prefetch_config_t cfg = {
        .endpoints = srv.endpoint, .graph_table = "t.graph", .emb_table = "t.emb", .K = S_K, .E = S_E, .max_batch = S_B,
        .n_items = S_N, .timeout_ms = 1000, .probe_ms = 200, .probe_timeout_ms = 300,
    };
    trainer_prefetch_t *pf = trainer_prefetch_new(&cfg);
    MT_CHECK(pf != NULL, "trainer_prefetch_new");
    double ms = 0;
    uint32_t next = 0;
    const trainer_fetch_t *f = s_batch(pf, next, &ms);
    next += S_B;
    MT_CHECK(s_complete(f), "a batch with the bank up is incomplete (rc %d: %s)", f->rc, f->err);

    /* The bank dies: skipped batches, the first after about one request timeout, the rest at once. */
    char endpoint[256];
    snprintf(endpoint, sizeof endpoint, "%s", srv.endpoint);
    MT_CHECK(test_server_stop(&srv, SIGKILL) == 128 + SIGKILL, "kill the bank");
    f = s_batch(pf, next, &ms);
    next += S_B;
    MT_CHECK(f->rc == TRAINER_FETCH_SKIPPED, "rc %d with the bank dead (%s)", f->rc, f->err);
    MT_CHECK(ms < 10000, "the first batch without the bank waited %.0f ms", ms);
    for (int i = 0; i < S_B * S_K; i++) {
        MT_CHECK(f->nbr[i] == TRAINER_NO_ITEM && !f->nbr_have[i], "a skipped batch has neighbours");
    }
    printf("first batch without the bank: skipped after %.0f ms (%s)\n", ms, f->err);
    int skipped = 1;
    double worst = 0;
    for (int i = 0; i < 20; i++) {
        usleep(50 * 1000); /* a training step: probes come due meanwhile and fail */
        f = s_batch(pf, next, &ms);
        next += S_B;
        MT_CHECK(f->rc == TRAINER_FETCH_SKIPPED, "rc %d with the bank dead (%s)", f->rc, f->err);
        skipped++;
        worst = ms > worst ? ms : worst;
    }
    MT_CHECK(worst < 5000, "a batch waited %.0f ms while the bank was away", worst);
    printf("20 more batches skipped, the longest wait %.0f ms (probes)\n", worst);

    /* Back on the same endpoint and data: complete batches again. */
    const char *same[] = {"--listen", endpoint, NULL};
    MT_CHECK(test_server_start(&srv, same) == 0 && strcmp(srv.endpoint, endpoint) == 0, "restart the bank");
    const int64_t t_back = carls_monotonic_ms();
    int complete = 0;
    while (!complete && carls_monotonic_ms() - t_back < 30000) {
        f = s_batch(pf, next, &ms);
        next += S_B;
        MT_CHECK(f->rc == 0 || f->rc == TRAINER_FETCH_SKIPPED, "rc %d after the restart (%s)", f->rc, f->err);
        complete = s_complete(f);
        skipped += f->rc == TRAINER_FETCH_SKIPPED;
    }
    MT_CHECK(complete, "no complete batch within 30 s of the restart");
    printf("complete batches again %.1f s after the restart; %d batches skipped in all\n",
           (double)(carls_monotonic_ms() - t_back) / 1000.0, skipped);
    for (int i = 0; i < 5; i++) {
        f = s_batch(pf, next, &ms);
        next += S_B;
        MT_CHECK(s_complete(f), "batch %d after the recovery is incomplete (rc %d: %s)", i, f->rc, f->err);
    }
    trainer_prefetch_destroy(&pf);
    MT_CHECK(test_server_cleanup(&srv) == 0, "kb-server did not shut down cleanly");
    return mt_finish("test_prefetch_outage", NULL);
}
