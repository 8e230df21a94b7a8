/* The service edge of a table's configuration: carls.TableConfig (the wire, and the form the bank's store keeps
 * configs in) to and from kb_table_config_t, so the table itself never sees a protobuf message. Only the
 * wire's shape is handled here (enums, absent messages); defaults and ranges are kb_table_config_finish's. */
#ifndef KB_TABLE_CONFIG_H
#define KB_TABLE_CONFIG_H

#include "carls.pb-c.h"
#include "kb_table.h"

#include <stddef.h>
#include <stdint.h>

/* Maps a wire config into *out and completes it (kb_table_config_finish): unknown enum values are
 * refused. Returns 0, or -1 with a message in err. */
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

/* The packed carls.TableConfig the bank's store keeps for a table (malloc'd; the caller frees it). */
uint8_t *kb_table_config_pack(const kb_table_config_t *cfg, size_t *len);

/* A config read back from kb_table_config_pack's bytes, checked as a create_table's would be (against the
 * default max_dim). Returns 0, or -1 with a message in err. */
int kb_table_config_unpack(const uint8_t *bytes, size_t len, kb_table_config_t *out, char *err, size_t errlen);

#endif
