"""Loads libcarls_client.so and declares its API (client/kb_ffi.h) to cffi in ABI mode: no compiler runs.

Where the library is looked for, first found wins:
  1. $CARLS_CLIENT_LIB, a path to the library file;
  2. beside this file (a copy that `pip install ./python` bundles when it finds a built one);
  3. the build trees of the source tree this package sits in (build/, build-release/, then any build*/):
     so `PYTHONPATH=python python3 ...` works straight after `cmake --build build`;
  4. the system's library path (libcarls_client.so.1, after `cmake --install`).
"""
import glob
import os

import cffi

# The declarations of client/kb_ffi.h, without its comments and preprocessor lines (tests/python checks
# that the two agree).
CDEF = """
typedef struct kb_ffi kb_ffi_t;
enum {
    KB_FFI_OK = 0,
    KB_FFI_ETIMEOUT = -1,
    KB_FFI_ESTATUS = -2,
    KB_FFI_EINVAL = -3,
    KB_FFI_EIO = -4,
    KB_FFI_EMALFORMED = -5,
};
enum { KB_FFI_MAX_PUSHES = 64 };
kb_ffi_t *kb_ffi_open(const char *endpoints, int timeout_ms, int retries, const char *key_file,
                      const char *server_key_file, char *err, size_t errlen);
int kb_ffi_log_level(const char *level);
void kb_ffi_close(kb_ffi_t **self_p);
const char *kb_ffi_last_error(const kb_ffi_t *self);
int kb_ffi_last_status(const kb_ffi_t *self);
const char *kb_ffi_status_name(int status);
uint32_t kb_ffi_shards(const kb_ffi_t *self);
void kb_ffi_set_read_replicas(kb_ffi_t *self, uint32_t staleness_ms);
int kb_ffi_create_table(kb_ffi_t *self, const char *table, const char *settings, bool if_not_exists);
int kb_ffi_drop_table(kb_ffi_t *self, const char *table, bool if_exists);
int kb_ffi_table_info(kb_ffi_t *self, const char *table, uint32_t *dim_out, int *kind_out);
void kb_ffi_forget_tables(kb_ffi_t *self);
int kb_ffi_list_tables_json(kb_ffi_t *self, const char **json_out);
int kb_ffi_stats_json(kb_ffi_t *self, uint32_t shard, const char *table, const char **json_out);
int kb_ffi_checkpoint_json(kb_ffi_t *self, const char **json_out);
int kb_ffi_lookup(kb_ffi_t *self, const char *table, const void *data, size_t data_len, const uint64_t *ends,
                  size_t n, uint32_t dim, bool no_create, float *values_out, uint64_t *versions_out,
                  int64_t *updated_at_ms_out, uint64_t *frequencies_out);
int kb_ffi_put(kb_ffi_t *self, const char *table, const void *data, size_t data_len, const uint64_t *ends,
               size_t n, uint32_t dim, const float *values, uint64_t version);
int kb_ffi_push_gradients(kb_ffi_t *self, const char *table, const void *data, size_t data_len,
                          const uint64_t *ends, size_t n, uint32_t dim, const float *gradients);
int kb_ffi_push_gradients_send(kb_ffi_t *self, const char *table, const void *data, size_t data_len,
                               const uint64_t *ends, size_t n, uint32_t dim, const float *gradients);
int kb_ffi_wait_pushes(kb_ffi_t *self);
size_t kb_ffi_pushes_in_flight(const kb_ffi_t *self);
int kb_ffi_knn(kb_ffi_t *self, const char *table, const float *queries, size_t nq, uint32_t dim, uint32_t k,
               float *scores_out);
int kb_ffi_knn_by_key(kb_ffi_t *self, const char *table, const void *data, size_t data_len, const uint64_t *ends,
                      size_t nq, uint32_t k, bool exclude_self, float *scores_out);
int kb_ffi_sample(kb_ffi_t *self, const char *table, const void *data, size_t data_len, const uint64_t *ends,
                  size_t n_pos, uint32_t n, const char *strategy, uint64_t seed, size_t cap, size_t *count_out,
                  float *probabilities_out, uint8_t *is_positive_out, double *mass_out, uint64_t *rows_out);
void kb_ffi_result_keys(const kb_ffi_t *self, const char **data_out, size_t *len_out, const uint64_t **ends_out,
                        size_t *n_out, bool *has_nul_out);
int kb_ffi_get_features_json(kb_ffi_t *self, const char *table, const void *data, size_t data_len,
                             const uint64_t *ends, size_t n, const char **json_out);
int kb_ffi_put_features(kb_ffi_t *self, const char *table, const void *message, size_t message_len);
"""

SONAME = "libcarls_client.so.1"

ffi = cffi.FFI()
ffi.cdef(CDEF)


def _candidates():
    env = os.environ.get("CARLS_CLIENT_LIB")
    if env:
        yield env
        return
    here = os.path.dirname(os.path.abspath(__file__))
    yield os.path.join(here, SONAME)
    root = os.path.dirname(os.path.dirname(here))
    builds = [os.path.join(root, "build"), os.path.join(root, "build-release")]
    # A sanitizer build cannot be loaded into a Python that was not started under its runtime.
    builds += sorted(d for d in glob.glob(os.path.join(root, "build*")) if d not in builds and "asan" not in d)
    for d in builds:
        yield os.path.join(d, "client", SONAME)
    yield SONAME


def _load():
    tried = []
    for path in _candidates():
        if os.sep in path and not os.path.exists(path):
            tried.append(path + " (no such file)")
            continue
        try:
            return ffi.dlopen(path), path
        except OSError as e:
            tried.append("%s (%s)" % (path, e))
    raise ImportError("carls: cannot load the client library libcarls_client.so; build it (cmake --build build) "
                      "or point CARLS_CLIENT_LIB at it. Tried: " + "; ".join(tried))


lib, library_path = _load()
