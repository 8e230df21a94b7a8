/* Histograms of oriented gradients (see km_hog.h). */
#include "km_hog.h"

#include <limits.h>
#include <math.h>
#include <string.h>

static int s_cells(int len)
{
    return len < KM_HOG_CELL ? 0 : (len - KM_HOG_CELL) / KM_HOG_STRIDE + 1;
}

int km_hog_dim(int rows, int cols)
{
    const long long d = (long long)KM_HOG_BINS * s_cells(rows) * s_cells(cols);
    return d > 0 && d <= INT_MAX && (long long)rows * cols <= INT_MAX / 2 ? (int)d : 0;
}

void km_hog(const uint8_t *pixels, int rows, int cols, float *grad, float *out)
{
    const int cy = s_cells(rows), cx = s_cells(cols);
    const size_t npx = (size_t)rows * (size_t)cols;
    float *mag = grad, *pos = grad + npx; /* pos: the orientation in bins, [0, KM_HOG_BINS) */
    const float two_pi = 6.28318530717958647692f;
    for (int y = 0; y < rows; y++) {
        const uint8_t *row = pixels + (size_t)y * (size_t)cols;
        const uint8_t *up = pixels + (size_t)(y > 0 ? y - 1 : y) * (size_t)cols;
        const uint8_t *down = pixels + (size_t)(y + 1 < rows ? y + 1 : y) * (size_t)cols;
        for (int x = 0; x < cols; x++) {
            const float gx = (float)(row[x + 1 < cols ? x + 1 : x] - row[x > 0 ? x - 1 : x]) / 255.0f;
            const float gy = (float)(down[x] - up[x]) / 255.0f;
            float a = atan2f(gy, gx);
            if (a < 0.0f) {
                a += two_pi;
            }
            float b = a / two_pi * (float)KM_HOG_BINS;
            if (!(b < (float)KM_HOG_BINS)) {
                b = 0.0f; /* 2 pi after rounding is 0 */
            }
            mag[(size_t)y * (size_t)cols + (size_t)x] = sqrtf(gx * gx + gy * gy);
            pos[(size_t)y * (size_t)cols + (size_t)x] = b;
        }
    }
    memset(out, 0, sizeof *out * (size_t)KM_HOG_BINS * (size_t)cy * (size_t)cx);
    for (int j = 0; j < cy; j++) {
        for (int i = 0; i < cx; i++) {
            float hist[KM_HOG_BINS] = {0};
            for (int y = j * KM_HOG_STRIDE; y < j * KM_HOG_STRIDE + KM_HOG_CELL; y++) {
                for (int x = i * KM_HOG_STRIDE; x < i * KM_HOG_STRIDE + KM_HOG_CELL; x++) {
                    const size_t p = (size_t)y * (size_t)cols + (size_t)x;
                    const int b0 = (int)pos[p];
                    const float f = pos[p] - (float)b0;
                    hist[b0] += mag[p] * (1.0f - f);
                    hist[(b0 + 1) % KM_HOG_BINS] += mag[p] * f;
                }
            }
            for (int b = 0; b < KM_HOG_BINS; b++) {
                out[((size_t)b * (size_t)cy + (size_t)j) * (size_t)cx + (size_t)i] = sqrtf(hist[b]);
            }
        }
    }
}
