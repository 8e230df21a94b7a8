/* The graph-regularised trainer's link to the knowledge bank: a thread that fetches what the NEXT batch
 * needs while the trainer computes the current one (CARLS §3.3: the trainer's communication module), so the
 * trainer does not wait on the network.
 *
 * For a batch of items it fetches, with its own connection to the bank (kb_cluster: one endpoint, or a sharded
 * bank's endpoints in shard order; every read is split by key over the shards, sent to all of them at once and
 * merged back into the batch's order):
 *   - the items' neighbour lists from the graph feature table (the first K entries of each);
 *   - the pseudo-labels and confidences of the items from the labels feature table (when asked);
 *   - in bank mode, the neighbours' embeddings from the embedding table, with the version (checkpoint step)
 *     and write time of each: a no_create lookup of the distinct neighbours of the batch, so rows that no
 *     maker wrote yet are reported as missing instead of being created.
 *
 * Neighbour rows are cached per item: a row (or the fact that no maker wrote it yet) looked up for one batch
 * is reused by the next batches and looked up again only once refresh_batches batches have passed since. The
 * bank's rows change only when makers write a new checkpoint's embeddings, so re-reading every neighbour for
 * every batch moves the same bytes again and again: at K = 50 neighbours a batch of 228 items needs ~7,000
 * distinct rows, while with refresh_batches = 20 a bank of 10,000 items costs ~500 row reads per batch
 * whatever K is. The price is that a row can be up to refresh_batches batches older than the bank's copy;
 * staleness is still measured from each row's version, so --max-staleness and the reported ages include it.
 * refresh_batches <= 1 looks every neighbour up for every batch.
 *
 * With aggregate set the thread also does the neighbour side of the graph term, so the trainer's cost does
 * not grow with K: for item i, over its neighbours j that have an embedding no older than max_staleness
 * steps at the step the batch is used (the step given to submit), with w~_ij = w_ij / sum of the positive
 * w_ij of those neighbours,
 *   agg_mean_i = sum_j w~_ij h_j     agg_sq_i = sum_j w~_ij ||h_j||^2     agg_wsum_i = sum of the positive w_ij
 * and then sum_j w~_ij ||h_i - h_j||^2 = ||h_i||^2 - 2 h_i . agg_mean_i + agg_sq_i, with the gradient
 * 2 (h_i - agg_mean_i). The neighbours used, skipped as stale or missing, and their ages are counted here.
 * Without aggregate the rows themselves are copied to nbr_emb (B, K, E).
 *
 * Up to TRAINER_PREFETCH_DEPTH - 1 batches are in flight beyond the one the caller uses: submit(t+1) and
 * submit(t+2) may be called while the caller still uses the result of t, which submit(t+3) overwrites.
 * Results come back in submission order. Two batches ahead rather than one absorb the fetches that take
 * longer than a training step (their time varies with the other processes on the cores) as long as the
 * fetches are faster than the steps on average.
 *
 * When the bank is unreachable (a request to any shard timed out after timeout_ms, a connection failed, or a
 * server answered UNAVAILABLE while shutting down), the batch comes back with rc = TRAINER_FETCH_SKIPPED and no
 * knowledge (no neighbours, no pseudo-labels), and the prefetcher is "away": it drops its connection and
 * skips every batch without sending anything, except that every probe_ms it asks a fresh connection for the
 * table list of every shard (waiting at most probe_timeout_ms). When a probe is answered it reconnects and fetches again.
 * So a trainer keeps training while the bank restarts: the batch whose request went unanswered waits
 * timeout_ms, later ones at most one probe (probe_timeout_ms), and the batches it trained without the bank
 * are counted. Going away and coming back are logged.
 * Items and neighbour keys are decimal training-image indices (as knowledge_maker/km_bank.h writes them). */
#ifndef TRAINER_PREFETCH_H
#define TRAINER_PREFETCH_H

#include "kb_client.h"
#include "util.h"

#include <stdbool.h>
#include <stdint.h>

#define TRAINER_NO_ITEM CARLS_NO_ITEM /* no item: what carls_key_item answers for an empty slot */
#define TRAINER_PREFETCH_DEPTH 3 /* result slots: the one in use + the batches fetched ahead */

typedef struct {
    const char *endpoints;    /* the bank: one endpoint, or the shards' endpoints in shard order (kb_cluster.h) */
    const kb_client_curve_t *curve; /* CURVE keys (copied), or NULL for plain TCP */
    const char *graph_table;  /* neighbour lists; NULL: none fetched */
    const char *labels_table; /* pseudo-labels; NULL: none fetched */
    const char *emb_table;    /* neighbour embeddings; NULL: none fetched (in-trainer mode) */
    int K;                    /* neighbours used per item */
    int E;                    /* embedding dimension (emb_table) */
    int max_batch;            /* most items per batch */
    int n_items;              /* item indices are below this */
    int timeout_ms;           /* per request (one attempt); 0: 5000 */
    int probe_ms;             /* while the bank is away: how often to probe it; 0: 250 */
    int probe_timeout_ms;     /* how long a probe waits for the answer; 0: 200 */
    int refresh_batches;      /* look a cached neighbour row up again after this many batches; <= 1: always */
    bool aggregate;           /* fill agg_* (and the counters) instead of nbr_emb */
    int max_staleness;        /* aggregate: skip rows more than this many steps old at use; 0: no limit */
} trainer_prefetch_config_t;

#define TRAINER_FETCH_SKIPPED 1 /* trainer_fetch_t.rc: the bank was unreachable; the batch has no knowledge */

/* One batch's knowledge. Arrays are sized for max_batch; the first B rows are valid. */
typedef struct {
    int B;              /* items */
    uint32_t *items;    /* (B) */
    uint32_t *nbr;      /* (B, K) neighbour items, TRAINER_NO_ITEM past the list */
    float *w;           /* (B, K) edge weights (0 past the list) */
    uint64_t step;      /* the trainer step that uses the batch (given to submit) */
    float *nbr_emb;     /* (B, K, E) neighbour embeddings (bank mode without aggregate) */
    uint64_t *nbr_ver;  /* (B, K) their versions (checkpoint step) */
    uint8_t *nbr_have;  /* (B, K) 1 when a maker wrote the embedding */
    int32_t *plabel;    /* (B) pseudo-label, -1 where none */
    float *pconf;       /* (B) its confidence */
    uint64_t *pver;     /* (B) its version */
    int rc;             /* 0; TRAINER_FETCH_SKIPPED (bank unreachable, err says why); or a negative
                         * KB_CLIENT_E* failure the trainer cannot go on from (err says which) */
    char err[512];
    double fetch_ms;    /* time the thread spent fetching this batch */
    int distinct;       /* distinct neighbours of the batch */
    int fetched;        /* of those, rows read from the bank for this batch (the others came from the cache) */
    /* aggregate only: */
    float *agg_mean;    /* (B, E) sum_j w~_ij h_j */
    float *agg_sq;      /* (B) sum_j w~_ij ||h_j||^2 */
    float *agg_wsum;    /* (B) sum of the positive weights of the neighbours used; 0: no graph term for i */
    int64_t nbr_used, nbr_stale, nbr_missing; /* neighbours used / too old / without an embedding */
    double staleness_sum; /* sum over used neighbours of (step - version) */
} trainer_fetch_t;

typedef struct trainer_prefetch trainer_prefetch_t;

/* Starts the thread. NULL on failure (logged). */
trainer_prefetch_t *trainer_prefetch_new(const trainer_prefetch_config_t *cfg);
/* Stops the thread and frees everything; accepts NULL; nulls *self_p. */
void trainer_prefetch_destroy(trainer_prefetch_t **self_p);

/* Queues a batch (items (B), 1 <= B <= max_batch) that the trainer will use at `step` (staleness is measured
 * against it). Returns 0, or -1 when TRAINER_PREFETCH_DEPTH batches are already queued or held (a caller bug,
 * asserted in debug builds). */
int trainer_prefetch_submit(trainer_prefetch_t *self, const uint32_t *items, int B, uint64_t step);
/* Waits for the oldest submitted batch and returns its result (owned by the prefetcher, valid until the
 * submit after next). *wait_ms receives how long the caller waited. */
const trainer_fetch_t *trainer_prefetch_wait(trainer_prefetch_t *self, double *wait_ms);

/* The graph term of an aggregated batch (cfg.aggregate): for the batch's embeddings h (B, E), adds
 * coef * 2 (h_i - agg_mean_i) to dh (B, E) and returns sum_i coef * sum_j w~_ij ||h_i - h_j||^2, computed as
 * coef * (||h_i||^2 - 2 h_i . agg_mean_i + agg_sq_i). Items without a usable neighbour add nothing. */
double trainer_fetch_graph_term(const trainer_fetch_t *f, const float *h, int E, float coef, float *dh);

#endif
