/* The service edge of a table's configuration: carls.TableConfig (the wire, and the form the bank's store keeps
 * configs in) to and from kb_table_config_t. Validation and the defaults of fields left zero on the wire
 * (proto/carls.proto) live here, so the table itself never sees a protobuf message. */
#ifndef KB_TABLE_CONFIG_H
#define KB_TABLE_CONFIG_H

#include "carls.pb-c.h"
#include "kb_table.h"

#include <stddef.h>
#include <stdint.h>

/* Validates a wire config and fills defaults into *out. Returns 0, or -1 with a message in err. */
int kb_table_config_from_proto(const Carls__TableConfig *in, uint32_t max_dim, kb_table_config_t *out, char *err,
                               size_t errlen);

/* A config in wire form with storage for its nested messages; `config` points into the rest (and its knn
 * spec into the kb_table_config_t it was made from, which must outlive it). */
typedef struct {
    Carls__TableConfig config;
    Carls__OptimizerConfig optimizer;
    Carls__LazyUpdateConfig lazy;
    Carls__KnnConfig knn;
    Carls__AdmissionConfig admission;
    Carls__EvictionConfig eviction;
} kb_table_config_wire_t;

/* Writes a config to wire form. */
void kb_table_config_to_proto(const kb_table_config_t *in, kb_table_config_wire_t *out);

#endif
