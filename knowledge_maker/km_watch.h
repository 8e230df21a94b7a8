/* Watches a trainer's checkpoint directory for a new `latest` (base/checkpoint.h) and hands the maker the
 * newest checkpoint that verifies.
 *
 * Change detection: inotify on the directory (the trainer renames `latest` into place, which is an
 * IN_MOVED_TO event), with polling every poll_ms as the fallback when inotify is unavailable or misses
 * something (a directory that did not exist yet, a network file system). A change is a different text in
 * `latest` than the last one seen, so an event that does not change the pointer wakes the maker for nothing
 * and costs one small read.
 *
 * Verification: km_watch_next reads and verifies the checkpoint `latest` names (magic, version, sizes,
 * CRC-32: carls_ckpt_read). A checkpoint that does not verify is refused with a warning naming the reason,
 * remembered (it is not read again until `latest` changes), and the maker keeps the last good one. */
#ifndef KM_WATCH_H
#define KM_WATCH_H

#include "checkpoint.h"

#include <signal.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct km_watch km_watch_t;

/* Watches dir (created if missing). poll_ms (>= 10) bounds how long a change can go unnoticed without
 * inotify. Caller owns the result; NULL if dir cannot be created. */
km_watch_t *km_watch_new(const char *dir, int poll_ms);
void km_watch_destroy(km_watch_t **self_p);

/* True when inotify is in use (false: polling only). */
bool km_watch_uses_inotify(const km_watch_t *self);

/* Waits until `latest` names a checkpoint not seen before that verifies, or until timeout_ms passed
 * (negative: no limit), or *stop became nonzero. Returns 1 with *ckpt_out (caller owns) and its path in path
 * (len bytes), 0 on timeout or stop. Corrupt checkpoints are refused and counted (km_watch_refused), and
 * waiting goes on. */
int km_watch_next(km_watch_t *self, int timeout_ms, volatile sig_atomic_t *stop, carls_ckpt_t **ckpt_out,
                  char *path, size_t len);

/* Checkpoints refused so far. */
uint64_t km_watch_refused(const km_watch_t *self);

/* Step of the newest checkpoint `latest` names right now, read from the file's header without verifying it
 * (for "how far behind" logs); 0 when there is none or it cannot be read. */
uint64_t km_watch_latest_step(const km_watch_t *self);

#endif
