#include "nn_testlib.h"

#include "util.h"

#include <math.h>
#include <stdio.h>

static float s_uniform01(uint64_t *state)
{
    return (float)(carls_splitmix64(state) >> 40) * (1.0f / 16777216.0f);
}

void t_fill_uniform(float *x, int n, float lo, float hi, uint64_t *state)
{
    for (int i = 0; i < n; i++) {
        x[i] = lo + (hi - lo) * s_uniform01(state);
    }
}

void t_fill_away_from_zero(float *x, int n, float lo, float hi, float gap, uint64_t *state)
{
    for (int i = 0; i < n; i++) {
        float v;
        do {
            v = lo + (hi - lo) * s_uniform01(state);
        } while (fabsf(v) < gap);
        x[i] = v;
    }
}

double t_dot(const float *w, const float *y, int n)
{
    double s = 0.0;
    for (int i = 0; i < n; i++) {
        s += (double)w[i] * y[i];
    }
    return s;
}

int t_gradcheck(const char *what, float *x, int n, const float *analytic, t_loss_fn f, void *ctx, float eps,
                double atol, double rtol)
{
    int bad = 0;
    double worst = 0.0;
    int worst_i = -1;
    double worst_a = 0.0, worst_n = 0.0;
    for (int i = 0; i < n; i++) {
        float saved = x[i];
        float xp = saved + eps;
        float xm = saved - eps;
        x[i] = xp;
        double fp = f(ctx);
        x[i] = xm;
        double fm = f(ctx);
        x[i] = saved;
        double num = (fp - fm) / ((double)xp - (double)xm);
        double a = analytic[i];
        double scale = fabs(a) > fabs(num) ? fabs(a) : fabs(num);
        double err = fabs(a - num) / (atol + rtol * scale);
        if (err > worst) {
            worst = err;
            worst_i = i;
            worst_a = a;
            worst_n = num;
        }
        if (err > 1.0) {
            bad++;
        }
    }
    printf("gradcheck %-28s n=%-5d worst scaled err %.3f (i=%d analytic %.6g numeric %.6g)%s\n", what, n, worst,
           worst_i, worst_a, worst_n, bad ? "  FAIL" : "");
    return bad;
}

double t_max_scaled_err(const float *a, const float *b, int n, double atol, double rtol)
{
    double worst = 0.0;
    for (int i = 0; i < n; i++) {
        double err = fabs((double)a[i] - b[i]) / (atol + rtol * fabs((double)b[i]));
        if (!(err <= worst)) { /* also catches NaN */
            worst = isnan(err) ? INFINITY : err;
        }
    }
    return worst;
}
