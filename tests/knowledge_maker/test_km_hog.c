/* Unit test of the HOG features (km_hog): the feature length; step edges vote into the one bin their gradient
 * points to, in the cells that hold them, and nowhere else; a 45-degree ramp splits its votes between two bins;
 * on noise, each cell's squared features sum to the gradient magnitudes it holds (votes are neither lost nor
 * made up). */
#include "maker_testlib.h"

#include "km_hog.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

enum { R = 28, W = 28, CELLS = 8, D = KM_HOG_BINS * CELLS * CELLS };

static float s_at(const float *h, int bin, int cy, int cx)
{
    return h[(bin * CELLS + cy) * CELLS + cx];
}

/* Whether cell (cy, cx) covers column (or row) x. */
static int s_covers(int c, int x)
{
    return x >= c * KM_HOG_STRIDE && x < c * KM_HOG_STRIDE + KM_HOG_CELL;
}

/* A step edge between columns 13 and 14 (dark left when bright_right): every vote goes to `bin`, in cells that
 * hold column 13 or 14, 6 rows x 2 columns of magnitude 1 each. transpose: the same edge between rows. */
static void s_check_edge(int bright_right, int transpose, int bin)
{
    uint8_t px[R * W];
    float grad[2 * R * W], h[D];
    for (int y = 0; y < R; y++) {
        for (int x = 0; x < W; x++) {
            int t = transpose ? y : x;
            px[y * W + x] = (uint8_t)(((t >= 14) == (bright_right != 0)) ? 255 : 0);
        }
    }
    km_hog(px, R, W, grad, h);
    int wrong = 0;
    for (int b = 0; b < KM_HOG_BINS; b++) {
        for (int cy = 0; cy < CELLS; cy++) {
            for (int cx = 0; cx < CELLS; cx++) {
                int c = transpose ? cy : cx;
                int cols = s_covers(c, 13) + s_covers(c, 14);
                float want = b == bin ? sqrtf((float)(6 * cols)) : 0.0f;
                wrong += fabsf(s_at(h, b, cy, cx) - want) > 1e-5f;
            }
        }
    }
    MT_CHECK(wrong == 0, "edge (bright %s, %s): %d features differ from bin %d's", bright_right ? "after" : "before",
             transpose ? "rows" : "columns", wrong, bin);
}

int main(void)
{
    MT_CHECK(km_hog_dim(R, W) == D && D == 768, "28x28: dim %d", km_hog_dim(R, W));
    MT_CHECK(km_hog_dim(6, 6) == KM_HOG_BINS, "6x6: dim %d", km_hog_dim(6, 6));
    MT_CHECK(km_hog_dim(1, 784) == 0 && km_hog_dim(5, 28) == 0, "rows too small for a cell were accepted");
    MT_CHECK(km_hog_dim(1 << 20, 1 << 20) == 0, "an image too large for int was accepted");

    s_check_edge(1, 0, 0);                    /* gradient along +x: angle 0 */
    s_check_edge(0, 0, KM_HOG_BINS / 2);      /* along -x: pi */
    s_check_edge(1, 1, KM_HOG_BINS / 4);      /* along +y: pi / 2 */
    s_check_edge(0, 1, 3 * KM_HOG_BINS / 4);  /* along -y: 3 pi / 2 */

    /* A ramp 4 (x + y): inside, gx = gy = 8 / 255, angle pi / 4 = 1.5 bins: half to bin 1, half to bin 2. */
    uint8_t px[R * W];
    float grad[2 * R * W], h[D];
    for (int y = 0; y < R; y++) {
        for (int x = 0; x < W; x++) {
            px[y * W + x] = (uint8_t)(4 * (x + y));
        }
    }
    km_hog(px, R, W, grad, h);
    const float mag = sqrtf(2.0f) * 8.0f / 255.0f, half = sqrtf(36.0f * mag / 2.0f);
    for (int b = 0; b < KM_HOG_BINS; b++) {
        float want = b == 1 || b == 2 ? half : 0.0f;
        MT_CHECK(fabsf(s_at(h, b, 3, 4) - want) < 1e-5f, "ramp: bin %d of an inner cell is %g, not %g", b,
                 (double)s_at(h, b, 3, 4), (double)want);
    }

    /* Noise: sum over bins of a cell's squared features = the magnitudes in the cell, from km_hog's scratch. */
    srand(7);
    for (int i = 0; i < R * W; i++) {
        px[i] = (uint8_t)(rand() % 256);
    }
    km_hog(px, R, W, grad, h);
    int bad = 0;
    for (int cy = 0; cy < CELLS; cy++) {
        for (int cx = 0; cx < CELLS; cx++) {
            double votes = 0.0, mags = 0.0;
            for (int b = 0; b < KM_HOG_BINS; b++) {
                votes += (double)s_at(h, b, cy, cx) * s_at(h, b, cy, cx);
            }
            for (int y = cy * KM_HOG_STRIDE; y < cy * KM_HOG_STRIDE + KM_HOG_CELL; y++) {
                for (int x = cx * KM_HOG_STRIDE; x < cx * KM_HOG_STRIDE + KM_HOG_CELL; x++) {
                    mags += grad[y * W + x];
                }
            }
            bad += fabs(votes - mags) > 1e-4 * mags;
        }
    }
    MT_CHECK(bad == 0, "noise: %d cells' votes differ from their magnitudes", bad);
    return mt_finish("test_km_hog", NULL);
}
