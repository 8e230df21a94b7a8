/* Progress bar (see progress.h). */
#include "progress.h"

#include "util.h"

#include <stdio.h>
#include <string.h>
#include <unistd.h>

#define S_BAR_WIDTH 30

void carls_progress_start(carls_progress_t *p, const char *label, int64_t total)
{
    memset(p, 0, sizeof *p);
    snprintf(p->label, sizeof p->label, "%s", label);
    p->total = total > 0 ? total : 1;
    p->start_us = carls_monotonic_us();
    p->tty = isatty(STDERR_FILENO) == 1;
}

static double s_rate(const carls_progress_t *p, int64_t now)
{
    double secs = (double)(now - p->start_us) / 1e6;
    return secs > 0 ? (double)p->done / secs : 0.0;
}

static void s_draw(const carls_progress_t *p, int64_t now, const char *end)
{
    char bar[S_BAR_WIDTH + 1];
    int filled = (int)((double)p->done / (double)p->total * S_BAR_WIDTH);
    filled = filled > S_BAR_WIDTH ? S_BAR_WIDTH : filled;
    for (int i = 0; i < S_BAR_WIDTH; i++) {
        bar[i] = i < filled ? '#' : '.';
    }
    bar[S_BAR_WIDTH] = '\0';
    double loss = p->batches ? p->loss_sum / (double)p->batches : 0.0;
    fprintf(stderr, "%s%-14s [%s] %3d%%  loss %.4f  %8.0f ex/s%s", p->tty ? "\r" : "", p->label, bar,
            (int)(100.0 * (double)p->done / (double)p->total), loss, s_rate(p, now), end);
    fflush(stderr);
}

void carls_progress_update(carls_progress_t *p, int64_t n, double loss)
{
    p->done += n;
    p->loss_sum += loss;
    p->batches++;
    if (!p->tty) {
        return;
    }
    int64_t now = carls_monotonic_us();
    if (now - p->last_draw_us >= 100000) {
        p->last_draw_us = now;
        s_draw(p, now, "");
    }
}

double carls_progress_finish(carls_progress_t *p, const char *extra)
{
    int64_t now = carls_monotonic_us();
    double rate = s_rate(p, now);
    char end[256];
    snprintf(end, sizeof end, "%s%s\n", extra ? "  " : "", extra ? extra : "");
    s_draw(p, now, end);
    return rate;
}
