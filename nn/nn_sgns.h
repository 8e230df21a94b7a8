/* Skip-gram with negative sampling (word2vec's SGNS) over one minibatch of rows fetched from the knowledge
 * bank: the forward pass and the gradients of the summed loss for every input and output row, which the
 * trainer then pushes back to the bank (trainer word2vec, DynamicEmbedding §3.1.4).
 *
 * CPU only: the op is a few dot products per pair over rows that travel through the bank, so the bank and
 * not the arithmetic sets the pace; it has no CUDA twin. Hot loops are built for AVX2+FMA with a generic
 * fallback (GCC function multi-versioning), so one binary runs everywhere.
 *
 * For each sentence and each position i holding center word c, a window half-width b = 1 + r % window (r
 * from *rng: word2vec's dynamic window) gives contexts o at positions i-b..i+b (not i, inside the sentence).
 * For each pair (c, o), with h = in[c], the targets are o (label 1) and `negatives` rows drawn uniformly from
 * pool (label 0; a draw equal to o is drawn again, up to 8 times). Loss per target: -log sigmoid(+-u.h).
 * The gradients of the summed loss are accumulated with every pair seeing the same (stale) values:
 *   d_in[c] += (sigmoid(u.h) - label) * u,   d_out[t] += (sigmoid(u.h) - label) * h.
 * Shapes: in (n_in, dim), out (n_out, dim), d_in (n_in, dim), d_out (n_out, dim); tokens index both tables
 * (a token's word u has input row u and output row u, so u < n_in <= n_out); pool entries index out.
 * d_in and d_out are OVERWRITTEN (zeroed first). sigmoid is read from a 2048-entry table over [-8, 8]
 * (clamped outside), as word2vec and fastText do. */
#ifndef NN_SGNS_H
#define NN_SGNS_H

#include <stdint.h>

typedef struct {
    const uint32_t *tokens;    /* (n_tokens) word of each kept token, sentence after sentence */
    const uint32_t *sent_end;  /* (n_sents) end offset of each sentence in tokens, increasing */
    uint32_t n_sents;
    uint32_t n_in;             /* input rows */
    uint32_t n_out;            /* output rows (>= n_in) */
    const uint32_t *pool;      /* (n_pool) negative candidates, output rows; n_pool may be 0 (no negatives) */
    uint32_t n_pool;
    uint32_t dim, window, negatives;
} nn_sgns_batch_t;

/* Runs the batch. loss_out: summed loss; pairs_out: (center, context) pairs. rng advanced. */
void nn_sgns_cpu(const nn_sgns_batch_t *b, const float *in, const float *out, float *d_in, float *d_out,
                 uint64_t *rng, double *loss_out, uint64_t *pairs_out);

#endif
