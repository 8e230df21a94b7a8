/* Progress line (see progress.h). */
#include "progress.h"

#include "util.h"

#include <stdio.h>
#include <string.h>
#include <unistd.h>

#define S_BAR_WIDTH 30

static void s_start(carls_progress_t *p, const char *label, int64_t total, const char *unit, bool with_loss)
{
    memset(p, 0, sizeof *p);
    snprintf(p->label, sizeof p->label, "%s", label);
    snprintf(p->unit, sizeof p->unit, "%s", unit);
    p->with_loss = with_loss;
    p->total = total > 0 ? total : 0;
    p->start_us = carls_monotonic_us();
    p->last_draw_us = p->start_us;
    p->tty = isatty(STDERR_FILENO) == 1;
}

void carls_progress_start(carls_progress_t *p, const char *label, int64_t total)
{
    s_start(p, label, total > 0 ? total : 1, "ex", true);
}

void carls_progress_start_units(carls_progress_t *p, const char *label, int64_t total, const char *unit)
{
    s_start(p, label, total, unit, false);
}

static double s_rate(const carls_progress_t *p, int64_t now)
{
    double secs = (double)(now - p->start_us) / 1e6;
    return secs > 0 ? (double)p->done / secs : 0.0;
}

/* Seconds as "1h02m", "3m05s" or "42s". */
static void s_duration(double secs, char *buf, size_t len)
{
    long s = secs < 0 ? 0 : (long)(secs + 0.5);
    if (s >= 3600)
        snprintf(buf, len, "%ldh%02ldm", s / 3600, s / 60 % 60);
    else if (s >= 60)
        snprintf(buf, len, "%ldm%02lds", s / 60, s % 60);
    else
        snprintf(buf, len, "%lds", s);
}

void carls_progress_format(const carls_progress_t *p, int64_t now_us, char *buf, size_t len)
{
    double rate = s_rate(p, now_us);
    int n = snprintf(buf, len, "%-14s", p->label);
    if (p->total > 0 && (size_t)n < len) {
        char bar[S_BAR_WIDTH + 1];
        int filled = (int)((double)p->done / (double)p->total * S_BAR_WIDTH);
        filled = filled > S_BAR_WIDTH ? S_BAR_WIDTH : filled;
        for (int i = 0; i < S_BAR_WIDTH; i++)
            bar[i] = i < filled ? '#' : '.';
        bar[S_BAR_WIDTH] = '\0';
        n += snprintf(buf + n, len - (size_t)n, " [%s] %3d%%", bar, (int)(100.0 * (double)p->done / (double)p->total));
    }
    if (p->with_loss && (size_t)n < len) {
        double loss = p->batches ? p->loss_sum / (double)p->batches : 0.0;
        n += snprintf(buf + n, len - (size_t)n, "  loss %.4f  %8.0f %s/s", loss, rate, p->unit);
    } else if ((size_t)n < len) {
        n += snprintf(buf + n, len - (size_t)n, "  %lld %s  %.0f %s/s", (long long)p->done, p->unit, rate, p->unit);
    }
    if (p->total > 0 && p->done < p->total && rate > 0 && (size_t)n < len) {
        char left[32];
        s_duration((double)(p->total - p->done) / rate, left, sizeof left);
        snprintf(buf + n, len - (size_t)n, "  %s left", left);
    }
}

static void s_draw(const carls_progress_t *p, int64_t now, const char *end)
{
    char line[256];
    carls_progress_format(p, now, line, sizeof line);
    /* on a terminal: back to the line's start and clear it, so a shorter line leaves nothing behind */
    fprintf(stderr, "%s%s%s", p->tty ? "\r\033[K" : "", line, end);
    fflush(stderr);
}

/* Redraws (terminal, 10 times a second) or logs a line (otherwise, every CARLS_PROGRESS_LOG_EVERY_US). */
static void s_tick(carls_progress_t *p)
{
    int64_t now = carls_monotonic_us();
    int64_t every = p->tty ? 100000 : CARLS_PROGRESS_LOG_EVERY_US;
    if (now - p->last_draw_us >= every) {
        p->last_draw_us = now;
        s_draw(p, now, p->tty ? "" : "\n");
    }
}

void carls_progress_update(carls_progress_t *p, int64_t n, double loss)
{
    p->done += n;
    p->loss_sum += loss;
    p->batches++;
    s_tick(p);
}

void carls_progress_add(carls_progress_t *p, int64_t n)
{
    p->done += n;
    s_tick(p);
}

void carls_progress_clear(carls_progress_t *p)
{
    if (p->tty) {
        fputs("\r\033[K", stderr);
        fflush(stderr);
        p->last_draw_us = 0; /* redraw at the next update */
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
