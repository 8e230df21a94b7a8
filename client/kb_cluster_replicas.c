/* The cluster's reads from followers (kb_cluster_set_read_replicas, contract in kb_cluster.h;
 * docs/REPLICATION.md section 5): which member a read goes to, and its fall-back to the shard's own client.
 * Every request to one shard goes through kb_cluster_send_to and kb_cluster_wait_from (kb_cluster_internal.h),
 * which are plain kb_client_send and kb_client_wait unless read replicas are on and the request is a read. */
#include "kb_cluster.h"
#include "kb_cluster_internal.h"

#include "log.h"
#include "protocol.h"
#include "util.h"

#include <assert.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Whether req only reads, so a follower may answer it: lookups that create nothing, knn, sample, feature
 * records, scans, and the table list (the configs those reads need: dim, metric). */
static bool s_is_read(const Carls__Request *req)
{
    switch (req->op_case) {
    case CARLS__REQUEST__OP_LOOKUP:
        return req->lookup && req->lookup->no_create;
    case CARLS__REQUEST__OP_KNN:
    case CARLS__REQUEST__OP_SAMPLE:
    case CARLS__REQUEST__OP_FEATURE_GET:
    case CARLS__REQUEST__OP_SCAN:
    case CARLS__REQUEST__OP_LIST_TABLES:
        return true;
    default:
        return false;
    }
}

/* The client of member endpoint among the readers r of the shard whose own client is own, opened when it is
 * new (the cluster's options, one attempt of own's failover timeout, no retry). NULL when it cannot be. */
static kb_client_t *s_reader_of(kb_cluster_t *self, kb_cluster_readers_t *r, const kb_client_t *own,
                                const char *endpoint)
{
    for (size_t i = 0; i < r->n; i++)
        if (strcmp(r->endpoint[i], endpoint) == 0)
            return r->client[i];
    if (r->n == KB_CLIENT_MAX_MEMBERS)
        return NULL;
    kb_client_options_t opts = self->read_opts;
    opts.timeout_ms = kb_client_failover_timeout_ms(own);
    opts.retries = 0;
    kb_client_t *c = kb_client_new(endpoint, &opts);
    if (!c)
        return NULL;
    r->endpoint[r->n] = carls_xmalloc(strlen(endpoint) + 1);
    strcpy(r->endpoint[r->n], endpoint);
    r->client[r->n++] = c;
    return c;
}

/* The follower a read of shard s goes to: the next member, in turn, that the shard's client is not using
 * (that one is the primary once a write found it). NULL when the shard has one member. */
static kb_client_t *s_reader(kb_cluster_t *self, uint32_t s)
{
    kb_client_t *own = self->clients[s];
    size_t n = kb_client_members(own);
    if (n < 2)
        return NULL;
    kb_cluster_readers_t *r = &self->readers[s];
    char current[512];
    snprintf(current, sizeof current, "%s", kb_client_member(own));
    for (size_t k = 0; k < n; k++) {
        size_t i = (r->next + k) % n;
        const char *member = kb_client_member_at(own, i);
        if (strcmp(member, current) == 0)
            continue;
        r->next = i + 1;
        return s_reader_of(self, r, own, member);
    }
    return NULL;
}

int kb_cluster_send_to(kb_cluster_t *self, uint32_t s, Carls__Request *req, kb_client_t **to, uint64_t *id)
{
    *to = self->clients[s];
    kb_client_t *reader = self->read_staleness_ms && s_is_read(req) ? s_reader(self, s) : NULL;
    if (reader) {
        req->max_staleness_ms = self->read_staleness_ms;
        if (kb_client_send(reader, req, id) == 0) {
            *to = reader;
            return 0;
        }
    }
    return kb_client_send(self->clients[s], req, id);
}

int kb_cluster_wait_from(kb_cluster_t *self, uint32_t s, Carls__Request *req, kb_client_t *to, uint64_t *id,
                         Carls__Response__ResultCase want, Carls__Response **resp)
{
    *resp = NULL;
    int rc = kb_client_wait(to, *id, resp);
    if (to == self->clients[s])
        return rc;
    if (rc == 0 && (*resp)->result_case == want) {
        self->replica_served++;
        return 0;
    }
    /* The follower is behind its bound (STALE), failed, or did not answer in its short attempt: the shard's
     * own client asks again, with the same bound (a primary ignores it). */
    LOG_DEBUG("kb_cluster: shard %u: the read replica %s %s; asking %s", s, kb_client_member(to),
              rc == 0 ? "answered with another result" : kb_client_last_error(to), kb_client_member(self->clients[s]));
    if (*resp)
        carls__response__free_unpacked(*resp, NULL);
    *resp = NULL;
    self->replica_fell_back++;
    self->requests++;
    rc = kb_client_send(self->clients[s], req, id);
    return rc != 0 ? rc : kb_client_wait(self->clients[s], *id, resp);
}

int kb_cluster_set_read_replicas(kb_cluster_t *self, uint32_t staleness_ms)
{
    assert(self);
    kb_cluster_clear_error(self);
    if (self->borrowed) {
        kb_cluster_set_error(self, "read replicas: not for a cluster over a client of the caller's "
                                   "(kb_cluster_over); open it with kb_cluster_new");
        return KB_CLIENT_EINVAL;
    }
    if (staleness_ms && !self->readers)
        self->readers = carls_xcalloc(self->n, sizeof *self->readers);
    self->read_staleness_ms = staleness_ms;
    return 0;
}

void kb_cluster_replica_reads(const kb_cluster_t *self, uint64_t *served, uint64_t *fell_back)
{
    assert(self);
    *served = self->replica_served;
    *fell_back = self->replica_fell_back;
}

void kb_cluster_readers_free(kb_cluster_t *self)
{
    for (uint32_t s = 0; self->readers && s < self->n; s++) {
        kb_cluster_readers_t *r = &self->readers[s];
        for (size_t i = 0; i < r->n; i++) {
            kb_client_destroy(&r->client[i]);
            free(r->endpoint[i]);
        }
    }
    free(self->readers);
    self->readers = NULL;
}
