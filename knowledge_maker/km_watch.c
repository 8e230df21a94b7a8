/* Checkpoint-directory watcher (see km_watch.h). */
#include "km_watch.h"

#include "files.h"
#include "log.h"
#include "util.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/inotify.h>
#include <sys/stat.h>
#include <unistd.h>

struct km_watch {
    char dir[4096];      /* the checkpoint directory */
    int poll_ms;         /* fallback polling period */
    int ifd;             /* inotify descriptor, -1 without */
    int wd;              /* watch on dir, -1 while not watching */
    char seen[4096];     /* the `latest` text last acted on ("" before the first) */
    uint64_t refused;    /* checkpoints that did not verify */
};

static void s_add_watch(km_watch_t *w)
{
    if (w->ifd < 0 || w->wd >= 0) {
        return;
    }
    w->wd = inotify_add_watch(w->ifd, w->dir, IN_MOVED_TO | IN_CLOSE_WRITE | IN_CREATE);
    if (w->wd < 0) {
        LOG_DEBUG("inotify_add_watch %s: %s (polling)", w->dir, strerror(errno));
    }
}

km_watch_t *km_watch_new(const char *dir, int poll_ms)
{
    char err[512];
    if (carls_mkdir_p(dir, 0755, err, sizeof err) != 0) {
        LOG_ERROR("checkpoint directory: %s", err);
        return NULL;
    }
    km_watch_t *w = carls_xcalloc(1, sizeof *w);
    snprintf(w->dir, sizeof w->dir, "%s", dir);
    w->poll_ms = poll_ms < 10 ? 10 : poll_ms;
    w->wd = -1;
    w->ifd = inotify_init1(IN_NONBLOCK | IN_CLOEXEC);
    if (w->ifd < 0) {
        LOG_WARN("inotify unavailable (%s): polling %s every %d ms", strerror(errno), dir, w->poll_ms);
    }
    s_add_watch(w);
    return w;
}

void km_watch_destroy(km_watch_t **self_p)
{
    if (!self_p || !*self_p) {
        return;
    }
    if ((*self_p)->ifd >= 0) {
        close((*self_p)->ifd);
    }
    free(*self_p);
    *self_p = NULL;
}

bool km_watch_uses_inotify(const km_watch_t *self)
{
    return self->ifd >= 0 && self->wd >= 0;
}

uint64_t km_watch_refused(const km_watch_t *self)
{
    return self->refused;
}

/* Reads DIR/latest into text; 0, or -1 when it is missing or unreadable. */
static int s_read_latest(const km_watch_t *w, char *text, size_t len)
{
    char path[4200];
    snprintf(path, sizeof path, "%s/%s", w->dir, CARLS_CKPT_LATEST);
    FILE *f = fopen(path, "rb");
    if (!f) {
        return -1;
    }
    size_t n = fread(text, 1, len - 1, f);
    fclose(f);
    text[n] = '\0';
    return n ? 0 : -1;
}

uint64_t km_watch_latest_step(const km_watch_t *self)
{
    char path[4200], err[256];
    uint64_t step = 0;
    if (carls_ckpt_latest_path(self->dir, path, sizeof path, err, sizeof err) != 0 ||
        carls_ckpt_peek_step(path, &step, err, sizeof err) != 0) {
        return 0;
    }
    return step;
}

/* Drains pending inotify events (their content does not matter: `latest` is re-read). */
static void s_drain(km_watch_t *w)
{
    char buf[4096] __attribute__((aligned(__alignof__(struct inotify_event))));
    while (read(w->ifd, buf, sizeof buf) > 0) {
    }
}

int km_watch_next(km_watch_t *self, int timeout_ms, volatile sig_atomic_t *stop, carls_ckpt_t **ckpt_out,
                  char *path, size_t len)
{
    *ckpt_out = NULL;
    const int64_t deadline = timeout_ms < 0 ? -1 : carls_monotonic_ms() + timeout_ms;
    for (;;) {
        if (stop && *stop) {
            return 0;
        }
        s_add_watch(self); /* the directory may have been re-created */
        char text[4096];
        if (s_read_latest(self, text, sizeof text) == 0 && strcmp(text, self->seen) != 0) {
            snprintf(self->seen, sizeof self->seen, "%s", text);
            char err[1024];
            carls_ckpt_t *ck = NULL;
            int rc = carls_ckpt_latest_path(self->dir, path, len, err, sizeof err);
            if (rc == 0) {
                rc = carls_ckpt_read(path, &ck, err, sizeof err);
            }
            if (rc == 0) {
                *ckpt_out = ck;
                return 1;
            }
            self->refused++;
            LOG_WARN("refusing checkpoint %s: %s (%s); keeping the last good one", path, err,
                     carls_ckpt_strerror(rc));
        }
        int wait = self->poll_ms;
        if (deadline >= 0) {
            int64_t left = deadline - carls_monotonic_ms();
            if (left <= 0) {
                return 0;
            }
            wait = left < wait ? (int)left : wait;
        }
        if (self->ifd >= 0 && self->wd >= 0) {
            struct pollfd p = {.fd = self->ifd, .events = POLLIN};
            int r = poll(&p, 1, wait);
            if (r > 0) {
                s_drain(self);
            }
        } else {
            usleep((useconds_t)wait * 1000u);
        }
    }
}
