/* Helpers shared by the nn tests: seeded random fill and finite-difference gradient checks. */
#ifndef NN_TESTLIB_H
#define NN_TESTLIB_H

#include <stdint.h>

/* Fills x (n) with uniform values in [lo, hi) from *state (a splitmix64 state). */
void t_fill_uniform(float *x, int n, float lo, float hi, uint64_t *state);
/* Like t_fill_uniform but keeps every value at least `gap` away from 0 (for kinks such as ReLU's). */
void t_fill_away_from_zero(float *x, int n, float lo, float hi, float gap, uint64_t *state);

/* Scalar function of the current contents of the tensors under test (the forward pass, projected). */
typedef double (*t_loss_fn)(void *ctx);

/* Central finite differences over every element of x (n): numeric_i = (f(x+h e_i) - f(x-h e_i)) / (x_i+h -
 * (x_i-h)) with h = eps. Compares with analytic (n): |a - n| <= atol + rtol * max(|a|, |n|). Prints the
 * worst element under `what` and returns the number of elements outside the tolerance. */
int t_gradcheck(const char *what, float *x, int n, const float *analytic, t_loss_fn f, void *ctx, float eps,
                double atol, double rtol);

/* Sum over i of w[i] * y[i], in double. */
double t_dot(const float *w, const float *y, int n);

/* Largest |a - b| / (atol + rtol * |b|) over n elements: <= 1 means within tolerance. */
double t_max_scaled_err(const float *a, const float *b, int n, double atol, double rtol);

#endif
