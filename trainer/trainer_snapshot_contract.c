/* TEMPORARY stand-in for h20b's bank snapshot API (see trainer_snapshot_contract.h). */
#include "trainer_snapshot_contract.h"

#include "util.h"

int kb_cluster_snapshot(kb_cluster_t *self, const char *name, char *err, size_t errlen)
{
    (void)self;
    return carls_errorf(err, errlen, -1, "snapshot %s: this build has no bank snapshot API yet", name);
}

int kb_cluster_snapshot_delete(kb_cluster_t *self, const char *name, char *err, size_t errlen)
{
    (void)self;
    return carls_errorf(err, errlen, -1, "snapshot %s: this build has no bank snapshot API yet", name);
}
