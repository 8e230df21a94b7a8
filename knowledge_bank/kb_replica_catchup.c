/* Snapshot catch-up, a follower's side (docs/REPLICATION.md): receiving the primary's snapshot into
 * DATA/snapshots/NAME (only a snapshot's own files, written as they come), checking it, and once the server has
 * stopped, restoring it and writing the primary's term history. The primary's side is in kb_replica.c. */
#include "kb_replica.h"
#include "kb_replica_internal.h"

#include "files.h"
#include "log.h"
#include "util.h"

#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ---- follower: receiving a snapshot ---- */


static int s_remove_entry(const char *path, const struct stat *sb, int type, struct FTW *ftw)
{
    (void)sb;
    (void)type;
    (void)ftw;
    return remove(path) != 0 && errno != ENOENT ? -1 : 0;
}

static void s_remove_tree(const char *path) { nftw(path, s_remove_entry, 16, FTW_DEPTH | FTW_PHYS); }

/* The only files a snapshot has (kb_snapshot.h): nothing else may be written from the network. */
static bool s_snapshot_path_ok(const char *p)
{
    if (strcmp(p, "bank.sqlite") == 0 || strcmp(p, "MANIFEST") == 0)
        return true;
    if (strncmp(p, "journal/", 8) != 0 || strlen(p) != 8 + 20 + 4 || strcmp(p + 28, ".kbj") != 0)
        return false;
    for (int i = 8; i < 28; i++)
        if (p[i] < '0' || p[i] > '9')
            return false;
    return true;
}

int kb_replica_on_snapshot_begin(kb_replica_t *self, kb_replica_receive_t *rx, const Carls__ReplSnapshotBegin *b)
{
    if (!kb_snapshot_name_valid(b->name) || b->n_history_terms != b->n_history_epochs ||
        b->n_history_terms == 0 || b->n_history_terms > KB_TERM_MAX_HISTORY) {
        LOG_ERROR("replication: a malformed snapshot announcement from the primary dropped");
        return -1;
    }
    memset(rx, 0, sizeof *rx);
    snprintf(rx->name, sizeof rx->name, "%s", b->name);
    snprintf(rx->dir, sizeof rx->dir, "%s/snapshots/%s", self->data_dir, b->name);
    s_remove_tree(rx->dir);
    char jdir[1300], err[512];
    snprintf(jdir, sizeof jdir, "%s/journal", rx->dir);
    if (carls_mkdir_p(jdir, 0700, err, sizeof err) != 0) {
        LOG_ERROR("replication: %s", err);
        return -1;
    }
    kb_term_state_t *st = &rx->pending.state;
    memset(st, 0, sizeof *st);
    st->term = b->term;
    st->lineage = b->lineage;
    st->role = KB_TERM_FOLLOWER;
    snprintf(st->member, sizeof st->member, "%s", self->member);
    st->n_history = b->n_history_terms;
    for (size_t i = 0; i < st->n_history; i++)
        st->history[i] = (kb_term_span_t){b->history_terms[i], b->history_epochs[i]};
    rx->active = true;
    LOG_INFO("replication: receiving snapshot %s (cut epoch %" PRIu64 ", %" PRIu64 " bytes) from the primary",
             b->name, b->cut_epoch, b->bytes);
    return 0;
}

int kb_replica_on_snapshot_chunk(kb_replica_receive_t *rx, const Carls__ReplSnapshotChunk *c, zmq_msg_t *data)
{
    if (!rx->active || c->index != rx->next_chunk || !s_snapshot_path_ok(c->path)) {
        LOG_ERROR("replication: snapshot chunk %u (%s) out of order or not a snapshot file; starting again",
                  c->index, c->path);
        return -1;
    }
    char path[1300];
    snprintf(path, sizeof path, "%s/%s", rx->dir, c->path);
    int fd = open(path, O_WRONLY | O_CREAT | O_CLOEXEC | (c->offset == 0 ? O_TRUNC : 0), 0600);
    size_t len = zmq_msg_size(data);
    bool ok = fd >= 0 && pwrite(fd, zmq_msg_data(data), len, (off_t)c->offset) == (ssize_t)len &&
              (!c->file_end || fsync(fd) == 0);
    int e = errno;
    if (fd >= 0)
        close(fd);
    if (!ok) {
        LOG_ERROR("replication: writing %s: %s", path, strerror(e));
        return -1;
    }
    rx->next_chunk++;
    return 0;
}

/* End: the snapshot is checked (every file's CRC-32); a sound one waits for the server to stop and restore
 * it. Returns 1 then, -1 when it must start again. */
int kb_replica_on_snapshot_end(kb_replica_t *self, kb_replica_receive_t *rx, const Carls__ReplSnapshotEnd *e)
{
    if (!rx->active || e->chunks != rx->next_chunk)
        return -1;
    carls_fsync_dir(rx->dir);
    kb_snapshot_info_t info;
    if (kb_snapshot_check(self->data_dir, rx->name, true, &info) != KB_SNAPSHOT_OK || !info.valid) {
        LOG_ERROR("replication: the snapshot received is not sound: %s", info.problem);
        kb_snapshot_info_free(&info);
        return -1;
    }
    kb_snapshot_info_free(&info);
    kb_replica_catch_up_t *cu = carls_xmalloc(sizeof *cu);
    *cu = rx->pending;
    cu->data_dir = kb_replica_dup(self->data_dir);
    snprintf(cu->name, sizeof cu->name, "%s", rx->name);
    cu->shard_index = self->shard_index;
    cu->shard_count = self->shard_count;
    pthread_mutex_lock(&self->mutex);
    self->catch_up = cu;
    pthread_mutex_unlock(&self->mutex);
    LOG_INFO("replication: snapshot %s received and checked; the server restarts on it", rx->name);
    if (self->server_stop)
        *self->server_stop = 1;
    return 1;
}

kb_replica_catch_up_t *kb_replica_take_catch_up(kb_replica_t *self)
{
    pthread_mutex_lock(&self->mutex);
    kb_replica_catch_up_t *cu = self->catch_up;
    self->catch_up = NULL;
    pthread_mutex_unlock(&self->mutex);
    return cu;
}

int kb_replica_catch_up_apply(const kb_replica_catch_up_t *cu, char *err, size_t errlen)
{
    /* Whatever this member held is replaced: rounds no acknowledged write needs (a diverged member's) go. */
    if (kb_snapshot_restore(cu->data_dir, cu->name, cu->shard_index, cu->shard_count, err, errlen) != 0)
        return -1;
    if (kb_term_save(cu->data_dir, &cu->state, err, errlen) != 0)
        return -1;
    char dir[1200];
    snprintf(dir, sizeof dir, "%s/snapshots/%s", cu->data_dir, cu->name);
    s_remove_tree(dir);
    LOG_INFO("restored the primary's snapshot %s (term %" PRIu64 ")", cu->name, cu->state.term);
    return 0;
}

void kb_replica_catch_up_free(kb_replica_catch_up_t **cu_p)
{
    if (!cu_p || !*cu_p)
        return;
    free((*cu_p)->data_dir);
    free(*cu_p);
    *cu_p = NULL;
}
