/* Candidate sampling over a snapshot of one table's rows (DESIGN.md "Candidate sampling", DynamicEmbedding
 * §3.2.4): draws negatives for sampled softmax and reports the probability each was drawn with, so the
 * trainer can subtract log(n * p) from its logits.
 *
 * A sampler is built from an array of (row id, frequency) entries, the table's rows at one moment; it is
 * immutable afterwards, so many threads may draw from one sampler at once, each with its own RNG state.
 * Rows created later are not drawn until the caller builds a new sampler. Results name entries by their
 * index in the caller's array (and by row id).
 *
 * Strategies (N = number of entries, f = frequency):
 *   uniform      P(i) = 1 / N.
 *   log-uniform  Zipfian over frequency rank, as TensorFlow's LogUniformCandidateSampler: entries are ranked
 *                by frequency, most frequent first (rank 0; equal frequencies keep the array's order), and
 *                P(rank r) = (log(r + 2) - log(r + 1)) / log(N + 1). Drawn by inverting the CDF
 *                log(r + 2) / log(N + 1): r = floor(exp(u * log(N + 1)) - 1), u uniform in [0, 1).
 *   unigram      P(i) = f_i^0.75 / sum_j f_j^0.75 (word2vec's smoothed unigram). Drawn in O(1) with Vose's
 *                alias method. An entry with frequency 0 is never drawn.
 *
 * Sampling is WITH replacement: the n draws are independent, so an entry can come back several times, and
 * a positive can be drawn as a negative (an "accidental hit"; the caller may mask it). Each draw reports
 * P(i), the probability that ONE draw picks entry i. The expected number of times i appears among n
 * draws is n * P(i), the quantity TensorFlow's samplers call the expected count (for its unique=False
 * mode); use kb_sampler_prob_of() to get the same number for the positives.
 *
 * Errors: 0 or a negative errno: -EINVAL bad argument, -ENOENT row id not in the snapshot, -ENODATA
 * nothing can be drawn (no entries, or unigram with every frequency 0). Out of memory aborts. */
#ifndef KB_SAMPLER_H
#define KB_SAMPLER_H

#include <stddef.h>
#include <stdint.h>

typedef enum {
    KB_SAMPLER_UNIFORM = 0,
    KB_SAMPLER_LOG_UNIFORM = 1,
    KB_SAMPLER_UNIGRAM = 2,
} kb_sampler_strategy_t;

/* One row of the snapshot. */
typedef struct {
    int64_t row_id;     /* the table's row id; unique within the snapshot */
    uint64_t frequency; /* how often the row was seen (lookups, pushes...); ranks log-uniform, weighs unigram */
} kb_sampler_entry_t;

typedef struct kb_sampler kb_sampler_t;

/* Parses "uniform", "log_uniform" (or "log-uniform") and "unigram". Returns 0 and sets *out, or -EINVAL. */
int kb_sampler_strategy_parse(const char *name, kb_sampler_strategy_t *out);
/* "uniform", "log_uniform", "unigram" (or "?"). */
const char *kb_sampler_strategy_name(kb_sampler_strategy_t strategy);

/* Builds a sampler over a copy of entries[0..n) (the caller keeps its array). n may be 0 (nothing can then
 * be drawn). -EINVAL for an unknown strategy or a row id that appears twice. Caller owns *out. */
int kb_sampler_new(kb_sampler_strategy_t strategy, const kb_sampler_entry_t *entries, size_t n, kb_sampler_t **out);

/* Frees the sampler and sets *self_p to NULL; accepts NULL and *self_p == NULL. */
void kb_sampler_destroy(kb_sampler_t **self_p);

/* Draws n entries with replacement. rng: the caller's splitmix64 state (carls_splitmix64), advanced here;
 * the same state and snapshot give the same draws. For draw j: out_index[j] is the entry's index in the
 * snapshot array, out_row_id[j] (may be NULL) its row id, out_prob[j] (may be NULL) its probability P.
 * -ENODATA when n > 0 and nothing can be drawn (the outputs are untouched). */
int kb_sampler_draw(const kb_sampler_t *self, uint64_t *rng, size_t n, size_t *out_index, int64_t *out_row_id,
                    double *out_prob);

/* P(entry index) for one draw; 0 for an index out of range or an entry that cannot be drawn. */
double kb_sampler_prob_at(const kb_sampler_t *self, size_t index);

/* P for row_id (e.g. a positive, for its sampled-softmax correction) and, in *index (may be NULL), its
 * snapshot index. -ENOENT (with *prob = 0) when the row is not in the snapshot. */
int kb_sampler_prob_of(const kb_sampler_t *self, int64_t row_id, double *prob, size_t *index);

/* Number of entries. */
size_t kb_sampler_size(const kb_sampler_t *self);

/* Heap bytes the sampler holds (its arrays as malloc sizes them; kb_memory.h). */
size_t kb_sampler_memory(const kb_sampler_t *self);

/* This snapshot's weight for merging shards (docs/PROTOCOL.md "Candidate sampling"): the number of entries
 * for uniform and log-uniform, sum of f^0.75 for unigram. A client splits n over shards in proportion to
 * their masses and scales each shard's probabilities by mass / total mass. 0 when nothing can be drawn. */
double kb_sampler_mass(const kb_sampler_t *self);

kb_sampler_strategy_t kb_sampler_strategy(const kb_sampler_t *self);

#endif
