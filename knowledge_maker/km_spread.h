/* Label spreading over a k-nearest-neighbour graph (Zhou et al., "Learning with local and global
 * consistency", 2004), the knowledge a label maker writes into the bank.
 *
 * The graph is the bank's neighbour lists: item i lists up to k items with similarity weights. It is made
 * symmetric (W = A + A^T), normalised S = D^-1/2 W D^-1/2, and the class scores iterate
 *   F <- alpha * S F + (1 - alpha) * Y
 * from F = Y, where Y (n, C) is the prior: one-hot rows for labelled items, optionally the model's
 * predicted distribution (scaled) for the others, zero rows otherwise. Then, optionally, class-mass
 * normalisation: each column of F is divided by its total, so that no class takes over the unlabelled items
 * by sheer mass. Everything is CPU work on compressed sparse rows: O(iters * n * k * C). */
#ifndef KM_SPREAD_H
#define KM_SPREAD_H

#include <stddef.h>
#include <stdint.h>

/* nbr (n, k): item indices in [0, n) or UINT32_MAX (empty), weight (n, k) (negative weights count as 0);
 * prior (n, C); F (n, C) output. 0 < alpha < 1, iters >= 1. balance: class-mass normalisation. Returns 0,
 * or -1 when an index is out of range. */
int km_spread(const uint32_t *nbr, const float *weight, size_t n, uint32_t k, const float *prior, int C,
              float alpha, int iters, int balance, float *F);

/* Pseudo-label and confidence of each row of F (n, C): argmax, and the max divided by the row's sum (0 for a
 * row that is all zero: label -1). */
void km_spread_labels(const float *F, size_t n, int C, int32_t *label, float *confidence);

#endif
