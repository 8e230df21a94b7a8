/* kb_client's blocking helpers (contract in kb_client.h): each is the kb_cluster call of the same name on a
 * one-shard cluster over the client (kb_cluster_over), so that requests are built, checked and answered in
 * one place (kb_cluster.c) while kb_client.c stays the transport. */
#include "kb_client.h"

#include "kb_cluster.h"

/* Ends a blocking helper's run on its one-shard cluster: a failure the cluster found (arguments it refused,
 * an answer that does not fit the request) becomes the client's; the transport's own failures already are,
 * with the same text and status. */
static int s_over_done(kb_client_t *self, kb_cluster_t **cluster_p, int rc)
{
    if (rc != 0)
        kb_client_set_last_error(self, kb_cluster_last_status(*cluster_p), kb_cluster_last_error(*cluster_p));
    kb_cluster_destroy(cluster_p);
    return rc;
}

int kb_client_create_table(kb_client_t *self, const char *table, const Carls__TableConfig *cfg,
                           bool if_not_exists)
{
    kb_cluster_t *cluster = kb_cluster_over(self);
    return s_over_done(self, &cluster, kb_cluster_create_table(cluster, table, cfg, if_not_exists));
}

int kb_client_drop_table(kb_client_t *self, const char *table, bool if_exists)
{
    kb_cluster_t *cluster = kb_cluster_over(self);
    return s_over_done(self, &cluster, kb_cluster_drop_table(cluster, table, if_exists));
}

int kb_client_list_tables(kb_client_t *self, Carls__Response **list_out)
{
    kb_cluster_t *cluster = kb_cluster_over(self);
    return s_over_done(self, &cluster, kb_cluster_list_tables(cluster, list_out));
}

int kb_client_lookup(kb_client_t *self, const char *table, const kb_key_t *keys, size_t n, uint32_t dim,
                     float *values_out, kb_row_meta_t *meta_out)
{
    return kb_client_lookup_ex(self, table, keys, n, dim, false, values_out, meta_out);
}

int kb_client_lookup_ex(kb_client_t *self, const char *table, const kb_key_t *keys, size_t n, uint32_t dim,
                        bool no_create, float *values_out, kb_row_meta_t *meta_out)
{
    kb_cluster_t *cluster = kb_cluster_over(self);
    return s_over_done(self, &cluster,
                       kb_cluster_lookup_ex(cluster, table, keys, n, dim, no_create, values_out, meta_out));
}

int kb_client_put(kb_client_t *self, const char *table, const kb_key_t *keys, size_t n, uint32_t dim,
                  const float *values, uint64_t version)
{
    kb_cluster_t *cluster = kb_cluster_over(self);
    return s_over_done(self, &cluster, kb_cluster_put(cluster, table, keys, n, dim, values, version));
}

int kb_client_push_gradients(kb_client_t *self, const char *table, const kb_key_t *keys, size_t n, uint32_t dim,
                             const float *gradients)
{
    kb_cluster_t *cluster = kb_cluster_over(self);
    return s_over_done(self, &cluster, kb_cluster_push_gradients(cluster, table, keys, n, dim, gradients));
}

int kb_client_stats(kb_client_t *self, const char *table, Carls__Response **stats_out)
{
    kb_cluster_t *cluster = kb_cluster_over(self);
    return s_over_done(self, &cluster, kb_cluster_stats(cluster, 0, table, stats_out));
}

int kb_client_checkpoint(kb_client_t *self)
{
    kb_cluster_t *cluster = kb_cluster_over(self);
    return s_over_done(self, &cluster, kb_cluster_checkpoint(cluster, NULL));
}
