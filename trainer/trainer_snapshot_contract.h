/* TEMPORARY, until helper h20b's bank snapshot API is merged: its contract (client/kb_cluster.h), so the
 * trainer builds against it. trainer_snapshot_contract.c answers every call with an error. Both files go when
 * kb_cluster_snapshot lands. */
#ifndef TRAINER_SNAPSHOT_CONTRACT_H
#define TRAINER_SNAPSHOT_CONTRACT_H

#include "kb_cluster.h"

#include <stddef.h>

/* Snapshots every shard at one cut as name. 0, or -1 with err. */
int kb_cluster_snapshot(kb_cluster_t *self, const char *name, char *err, size_t errlen);
/* Deletes snapshot name on every shard. 0, or -1 with err. */
int kb_cluster_snapshot_delete(kb_cluster_t *self, const char *name, char *err, size_t errlen);

#endif
