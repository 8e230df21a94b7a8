"""carls: Python client of the carls-c knowledge bank (kb-server), a thin skin over libcarls_client.so.

    import carls
    with carls.Client("tcp://127.0.0.1:7000") as bank:
        bank.create_table("words", dim=16, optimizer="sgd", lr=0.1, update="immediate")
        rows = bank.lookup("words", ["cat", "dog"])          # numpy (2, 16) float32; unseen keys get rows
        bank.push_gradients("words", ["cat", "dog"], grads)  # the bank's optimizer takes the step

Keys are str (UTF-8; undecodable bytes round-trip through surrogateescape) or bytes. Rows go in and out as
numpy float32 arrays of shape (n, dim), without a Python loop per row. Every failure is an exception of
carls.Error's family: NotFound, InvalidArgument, AlreadyExists, Unavailable (the bank is down or shutting
down), ... carrying the server's status. docs/PYTHON.md has the whole API.
"""
import json
from collections import namedtuple

import numpy as np

from . import _wire
from ._ffi import ffi, lib, library_path

__all__ = [
    "Client", "Sample", "Error", "NotFound", "InvalidArgument", "AlreadyExists", "Unavailable", "TooLarge",
    "ReadOnly", "ResourceExhausted", "ServerError", "ProtocolError", "library_path", "set_log_level",
]

_ENC = "utf-8"
_ERRORS = "surrogateescape"


# ---- errors --------------------------------------------------------------------------------------------------

class Error(Exception):
    """A failed call. status: the server's status name ("NOT_FOUND", ...) when the server answered one, else
    None; code: the library's KB_FFI_E* code (negative)."""

    def __init__(self, message, status=None, code=None):
        super().__init__(message)
        self.status = status
        self.code = code


class NotFound(Error, LookupError):
    """An unknown table (NOT_FOUND), or a sample of an empty bank."""


class InvalidArgument(Error, ValueError):
    """Arguments the server (INVALID_ARGUMENT) or this package refused: wrong dimension, empty key, NaN..."""


class AlreadyExists(Error):
    """create_table of a name that exists (ALREADY_EXISTS)."""


class Unavailable(Error, ConnectionError):
    """The bank did not answer (down, unreachable: every retry timed out) or is shutting down (UNAVAILABLE)."""


class TooLarge(Error, ValueError):
    """A message, batch or dimension above the server's limits (TOO_LARGE)."""


class ReadOnly(Error):
    """A write sent to a read-only server (READ_ONLY)."""


class ResourceExhausted(Error):
    """The server is at its --max-memory and refused to create rows (RESOURCE_EXHAUSTED)."""


class ServerError(Error):
    """Any other status of the server (INTERNAL, MALFORMED, UNSUPPORTED_VERSION, UNIMPLEMENTED)."""


class ProtocolError(Error):
    """An answer that does not decode or fit the request, or a ZeroMQ failure."""


_BY_STATUS = {
    "NOT_FOUND": NotFound, "INVALID_ARGUMENT": InvalidArgument, "ALREADY_EXISTS": AlreadyExists,
    "UNAVAILABLE": Unavailable, "TOO_LARGE": TooLarge, "READ_ONLY": ReadOnly,
    "RESOURCE_EXHAUSTED": ResourceExhausted,
}
_BY_CODE = {lib.KB_FFI_ETIMEOUT: Unavailable, lib.KB_FFI_EINVAL: InvalidArgument, lib.KB_FFI_EIO: ProtocolError,
            lib.KB_FFI_EMALFORMED: ProtocolError}


def set_log_level(level):
    """The threshold of the client library's log lines on stderr (its warnings when it resends after a
    timeout, ...): "debug", "info", "warn", "error" or "off". $CARLS_LOG_LEVEL sets it too."""
    if lib.kb_ffi_log_level(str(level).encode()) != 0:
        raise InvalidArgument("set_log_level: %r is not debug, info, warn, error or off" % (level,),
                              code=lib.KB_FFI_EINVAL)


# ---- arguments ---------------------------------------------------------------------------------------------------

def _keys(keys, what="keys"):
    """(data, ends, n) for kb_ffi: keys joined by NULs (ends NULL), or concatenated with their end offsets when
    some key holds a NUL."""
    if isinstance(keys, (str, bytes)):
        raise TypeError("%s: a list of keys, not one %s" % (what, type(keys).__name__))
    if isinstance(keys, np.ndarray):
        keys = keys.tolist()
    n = len(keys)
    try:
        data = "\0".join(keys).encode(_ENC, _ERRORS)
    except TypeError:
        try:
            data = b"\0".join(keys)
        except TypeError:
            data = None
    if data is not None and data.count(0) == max(n - 1, 0) and (n > 0 or data == b""):
        return data, ffi.NULL, n
    enc = []
    for i, k in enumerate(keys):
        if isinstance(k, str):
            enc.append(k.encode(_ENC, _ERRORS))
        elif isinstance(k, (bytes, bytearray, memoryview)):
            enc.append(bytes(k))
        else:
            raise TypeError("%s: key %d is a %s, not str or bytes" % (what, i, type(k).__name__))
    ends = np.cumsum(np.fromiter(map(len, enc), np.uint64, n), dtype=np.uint64)
    return b"".join(enc), ends, n


def _key_args(keys, what="keys"):
    """(data, ends, n) as the kb_ffi calls take them: _keys, with the end offsets as a uint64_t pointer."""
    data, ends, n = _keys(keys, what)
    return data, (ends if ends is ffi.NULL else ffi.from_buffer("uint64_t[]", ends)), n


def _rows(values, n, dim, what):
    """values as a C-contiguous float32 array of shape (n, dim); TypeError / InvalidArgument otherwise."""
    a = np.asarray(values)
    if a.dtype != np.float32:
        if a.dtype.kind != "f":
            raise TypeError("%s: dtype %s, expected float32" % (what, a.dtype))
        a = a.astype(np.float32)
    if a.shape != (n, dim):
        raise InvalidArgument("%s: shape %s, expected (%d, %d) (keys, table dim)" % (what, a.shape, n, dim),
                              code=lib.KB_FFI_EINVAL)
    return np.ascontiguousarray(a)


def _decode_key(s):
    """A key from kb_json's bytes rule (one character per byte) back to str."""
    return s.encode("latin-1").decode(_ENC, _ERRORS)


Sample = namedtuple("Sample", "keys probabilities is_positive mass rows")
Sample.__doc__ = """What Client.sample draws: keys (the positives first, then the candidates), per key the
probability that one draw from the whole bank picks it (float32 array) and whether it is a positive (bool
array), the bank's sampling mass and the rows drawn from."""


# ---- the client ------------------------------------------------------------------------------------------------------

class Client:
    """A client of one bank: endpoints is one "tcp://host:port" or a list of them in shard order (a bank
    sharded over several kb-servers). A shard replicated on several kb-servers is given as the list of its
    members, or as one string with "|" between them: [["tcp://a:1", "tcp://b:2"], "tcp://c:3|tcp://d:4"] is
    two shards of two members each; the client follows each shard's primary (docs/REPLICATION.md). timeout_ms
    per attempt, retries after a timeout; with curve_key (this client's secret key file, from kb-keygen) and
    server_key (the server's public key file) the connection is CURVE-encrypted. With read_replica_ms > 0,
    reads of a replicated shard (lookups with no_create, knn, sample, feature reads, the table list) go to a
    follower that was caught up with its primary at most that many ms ago, else to the primary
    (docs/REPLICATION.md section 5).
    One Client is used from one thread at a time."""

    def __init__(self, endpoints, timeout_ms=5000, retries=2, curve_key=None, server_key=None, read_replica_ms=0):
        if isinstance(endpoints, (list, tuple)):
            endpoints = ",".join("|".join(s) if isinstance(s, (list, tuple)) else s for s in endpoints)
        if not isinstance(endpoints, str):
            raise TypeError("endpoints: a str, a list of str, or a list of lists of str (the members of each "
                            "shard), not %s" % type(endpoints).__name__)
        self._h = ffi.NULL
        err = ffi.new("char[]", 512)
        h = lib.kb_ffi_open(endpoints.encode(), int(timeout_ms), int(retries),
                            curve_key.encode() if curve_key else ffi.NULL,
                            server_key.encode() if server_key else ffi.NULL, err, 512)
        if h == ffi.NULL:
            raise InvalidArgument("carls.Client(%r): %s" % (endpoints, ffi.string(err).decode(_ENC, "replace")),
                                  code=lib.KB_FFI_EINVAL)
        self._h = h
        if not 0 <= int(read_replica_ms) <= 0xFFFFFFFF:
            self.close()
            raise InvalidArgument("carls.Client: read_replica_ms %r is not 0..2**32-1" % (read_replica_ms,),
                                  code=lib.KB_FFI_EINVAL)
        lib.kb_ffi_set_read_replicas(h, int(read_replica_ms))
        self._dims = {}
        self.endpoints = endpoints
        self._options = dict(timeout_ms=timeout_ms, retries=retries, curve_key=curve_key, server_key=server_key,
                             read_replica_ms=read_replica_ms)

    def clone(self):
        """A new client of the same bank with the same options (one per thread)."""
        return Client(self.endpoints, **self._options)

    # -- life --

    def close(self):
        """Closes the connections (idempotent). Pushes still in flight (push_gradients(wait=False) without a
        flush) are dropped unseen: they may or may not have been applied."""
        if self._h != ffi.NULL:
            p = ffi.new("kb_ffi_t **", self._h)
            self._h = ffi.NULL
            lib.kb_ffi_close(p)

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        try:
            if exc_type is None and self._h != ffi.NULL:
                self.flush()  # a with block that ends normally has its pushes applied
        finally:
            self.close()

    def __del__(self):
        self.close()

    def _handle(self):
        if self._h == ffi.NULL:
            raise InvalidArgument("carls.Client: used after close()", code=lib.KB_FFI_EINVAL)
        return self._h

    def _raise(self, rc, table=None):
        """Raises the exception for return code rc of the last call."""
        if table is not None:
            self._dims.pop(table, None)
        msg = ffi.string(lib.kb_ffi_last_error(self._h)).decode(_ENC, "replace")
        if rc == lib.KB_FFI_ESTATUS:
            status = ffi.string(lib.kb_ffi_status_name(lib.kb_ffi_last_status(self._h))).decode()
            raise _BY_STATUS.get(status, ServerError)(msg, status=status, code=rc)
        raise _BY_CODE.get(rc, Error)(msg, code=rc)

    def _json(self, rc, out):
        if rc != 0:
            self._raise(rc)
        return json.loads(ffi.string(out[0]).decode(_ENC, "replace"))

    @property
    def shards(self):
        """Number of shards (endpoints)."""
        return lib.kb_ffi_shards(self._handle())

    # -- tables --

    def create_table(self, name, dim=None, optimizer="sgd", lr=0.1, update="lazy", max_age_ms=None, init=None,
                     knn=None, metric=None, *, kind="embedding", init_scale=None, seed=None, max_pending=None,
                     admission=None, min_frequency=None, eviction=None, max_rows=None, settings=None,
                     if_not_exists=False):
        """Creates a table on every shard. An embedding table needs dim; optimizer sgd|momentum|adagrad|adam
        with learning rate lr; update lazy|immediate (lazy: pushed gradients are averaged per key and applied
        after max_age_ms or on the next lookup); init zeros|uniform|normal (init_scale, seed); knn a FAISS index
        spec ("Flat", "IVF256,Flat", "HNSW32") with metric ip|l2|cosine. kind="feature" makes a table of
        feature records (only admission and eviction apply). settings: more TableConfig fields by dotted path,
        {"lazy.outlier_rule": "none", "optimizer.beta1": 0.8}."""
        s = {"kind": kind}
        if kind == "embedding":
            if dim is None:
                raise InvalidArgument("create_table %s: an embedding table needs dim" % name, code=lib.KB_FFI_EINVAL)
            s.update({"dim": dim, "optimizer.kind": optimizer, "optimizer.learning_rate": lr, "lazy.policy": update,
                      "lazy.max_age_ms": max_age_ms, "lazy.max_pending": max_pending, "init": init,
                      "init_scale": init_scale, "init_seed": seed, "knn.spec": knn, "knn.metric": metric})
        else:
            vector_only = {"dim": dim, "knn": knn, "metric": metric, "max_age_ms": max_age_ms, "init": init,
                           "init_scale": init_scale, "seed": seed, "max_pending": max_pending}
            given = [k for k, v in vector_only.items() if v is not None]
            if given:
                raise InvalidArgument("create_table %s: %s do not apply to a %s table" % (name, ", ".join(given), kind),
                                      code=lib.KB_FFI_EINVAL)
        s.update({"admission.kind": admission, "admission.min_frequency": min_frequency, "eviction.kind": eviction,
                  "eviction.max_rows": max_rows})
        s.update(settings or {})
        lines = []
        for path, v in s.items():
            if v is None:
                continue
            v = ("true" if v else "false") if isinstance(v, bool) else repr(v) if isinstance(v, float) else str(v)
            if "\n" in v:
                raise InvalidArgument("create_table %s: setting %s holds a newline" % (name, path),
                                      code=lib.KB_FFI_EINVAL)
            lines.append("%s=%s" % (path, v))
        rc = lib.kb_ffi_create_table(self._handle(), name.encode(), "\n".join(lines).encode(), bool(if_not_exists))
        self._dims.pop(name, None)
        if rc != 0:
            self._raise(rc)

    def drop_table(self, name, if_exists=False):
        """Drops the table on every shard."""
        self._dims.pop(name, None)
        rc = lib.kb_ffi_drop_table(self._handle(), name.encode(), bool(if_exists))
        if rc != 0:
            self._raise(rc)

    def list_tables(self):
        """Every table: a list of {"name", "config" (carls.proto's TableConfig as a dict), "rows"}."""
        out = ffi.new("const char **")
        return self._json(lib.kb_ffi_list_tables_json(self._handle(), out), out).get("tables", [])

    def stats(self, table=None, shard=0):
        """The shard's counters (carls.proto's StatsResult as a dict), of table or of every table."""
        out = ffi.new("const char **")
        rc = lib.kb_ffi_stats_json(self._handle(), int(shard), table.encode() if table else ffi.NULL, out)
        return self._json(rc, out)

    def checkpoint(self):
        """Commits every shard's rows and checkpoints its store; one {"committed_epoch", "rows"} per shard."""
        out = ffi.new("const char **")
        return self._json(lib.kb_ffi_checkpoint_json(self._handle(), out), out)

    def dim(self, table):
        """The table's dimension (0 for a feature table); cached, dropped after an error on the table."""
        d = self._dims.get(table)
        if d is None:
            dim = ffi.new("uint32_t *")
            rc = lib.kb_ffi_table_info(self._handle(), table.encode(), dim, ffi.NULL)
            if rc != 0:
                self._raise(rc, table)
            d = self._dims[table] = dim[0]
        return d

    def _vector_dim(self, table, what):
        """The dim of an embedding table; InvalidArgument naming the call for a feature table."""
        d = self.dim(table)
        if d == 0:
            raise InvalidArgument("%s: %s is a feature table (its records: get_features, put_features)" % (what, table),
                                  code=lib.KB_FFI_EINVAL)
        return d

    # -- rows --

    def lookup(self, table, keys, no_create=False, meta=False):
        """The rows of keys: a (len(keys), dim) float32 array. Unseen keys get rows (their initial value),
        unless no_create. With meta, returns (values, versions, updated_at_ms, frequencies), the last three
        arrays of len(keys)."""
        h = self._handle()
        dim = self._vector_dim(table, "lookup")
        data, ends_p, n = _key_args(keys)
        values = np.empty((n, dim), np.float32)
        if n == 0:
            e = np.empty(0, np.uint64)
            return (values, e, e.astype(np.int64), e.copy()) if meta else values
        if meta:
            versions, updated, freq = np.empty(n, np.uint64), np.empty(n, np.int64), np.empty(n, np.uint64)
            m = (ffi.from_buffer("uint64_t[]", versions), ffi.from_buffer("int64_t[]", updated),
                 ffi.from_buffer("uint64_t[]", freq))
        else:
            m = (ffi.NULL, ffi.NULL, ffi.NULL)
        rc = lib.kb_ffi_lookup(h, table.encode(), data, len(data), ends_p, n, dim, bool(no_create),
                               ffi.from_buffer("float[]", values), *m)
        if rc != 0:
            self._raise(rc, table)
        return (values, versions, updated, freq) if meta else values

    def _row_write_args(self, table, keys, rows, op, what):
        """What a write of one float32 row per key (put, push_gradients) passes: (handle, data, ends, n, dim,
        rows), the rows checked against the keys and the table's dim."""
        h = self._handle()
        dim = self._vector_dim(table, op)
        data, ends_p, n = _key_args(keys)
        return h, data, ends_p, n, dim, _rows(rows, n, dim, "%s %s: %s" % (op, table, what))

    def put(self, table, keys, values, version=0):
        """Writes rows: values (len(keys), dim) float32, tagged with version."""
        h, data, ends_p, n, dim, values = self._row_write_args(table, keys, values, "put", "values")
        if n == 0:
            return
        rc = lib.kb_ffi_put(h, table.encode(), data, len(data), ends_p, n, dim, ffi.from_buffer("float[]", values),
                            int(version))
        if rc != 0:
            self._raise(rc, table)

    def push_gradients(self, table, keys, grads, wait=True):
        """Pushes one gradient row per key, (len(keys), dim) float32; the table's optimizer applies them (at
        once with update="immediate", averaged per key with "lazy"). With wait=False the call returns once
        the rows are sent, without waiting for the bank's acknowledgement: flush() collects them (and raises
        the first failure), as does a later push once 64 are in flight; until then a lookup may be answered
        before the push is applied."""
        h, data, ends_p, n, dim, grads = self._row_write_args(table, keys, grads, "push_gradients", "gradients")
        if n == 0:
            return
        push = lib.kb_ffi_push_gradients if wait else lib.kb_ffi_push_gradients_send
        rc = push(h, table.encode(), data, len(data), ends_p, n, dim, ffi.from_buffer("float[]", grads))
        if rc != 0:
            self._raise(rc, table)

    def flush(self):
        """Waits for every push_gradients(wait=False) in flight; raises the first that failed."""
        rc = lib.kb_ffi_wait_pushes(self._handle())
        if rc != 0:
            self._raise(rc)

    @property
    def pushes_in_flight(self):
        """push_gradients(wait=False) calls not collected yet."""
        return lib.kb_ffi_pushes_in_flight(self._handle())

    # -- nearest neighbours, sampling --

    def _result_keys(self):
        data, size, ends, n, has_nul = (ffi.new("const char **"), ffi.new("size_t *"), ffi.new("const uint64_t **"),
                                        ffi.new("size_t *"), ffi.new("bool *"))
        lib.kb_ffi_result_keys(self._h, data, size, ends, n, has_nul)
        if n[0] == 0:
            return []
        blob = ffi.unpack(data[0], size[0])
        if not has_nul[0]:
            return blob.decode(_ENC, _ERRORS).split("\0")
        e = np.frombuffer(ffi.buffer(ends[0], 8 * n[0]), np.uint64)
        starts = np.concatenate(([0], e[:-1] + 1))
        return [blob[s:t].decode(_ENC, _ERRORS) for s, t in zip(starts.tolist(), e.tolist())]

    @staticmethod
    def _per_query(keys, scores, nq, k):
        """Per query: the keys found (empty slots dropped) and their scores."""
        out_keys, out_scores = [], []
        for q in range(nq):
            row = keys[q * k:(q + 1) * k]
            found = len(row) - row.count("") if "" in row else len(row)
            out_keys.append(row[:found])
            out_scores.append(scores[q, :found])
        return out_keys, out_scores

    def knn(self, table, vectors, k):
        """The k rows nearest to each query vector (nq, dim), best first: (keys, scores), a list per query of
        the keys found and a float32 array of their scores (the metric's; for l2 the squared distance)."""
        h = self._handle()
        dim = self._vector_dim(table, "knn")
        q = np.asarray(vectors)
        if q.ndim == 1:
            q = q.reshape(1, -1)
        q = _rows(q, q.shape[0], dim, "knn %s: vectors" % table)
        nq = q.shape[0]
        scores = np.zeros((nq, k), np.float32)
        rc = lib.kb_ffi_knn(h, table.encode(), ffi.from_buffer("float[]", q), nq, dim, int(k),
                            ffi.from_buffer("float[]", scores))
        if rc != 0:
            self._raise(rc, table)
        return self._per_query(self._result_keys(), scores, nq, k)

    def knn_by_key(self, table, keys, k, exclude_self=True):
        """The k rows nearest to each key's current row, as knn; with exclude_self a key never answers itself."""
        h = self._handle()
        data, ends_p, n = _key_args(keys)
        scores = np.zeros((n, k), np.float32)
        rc = lib.kb_ffi_knn_by_key(h, table.encode(), data, len(data), ends_p, n, int(k), bool(exclude_self),
                                   ffi.from_buffer("float[]", scores))
        if rc != 0:
            self._raise(rc, table)
        return self._per_query(self._result_keys(), scores, n, k)

    def sample(self, table, n, strategy="uniform", positives=(), seed=0):
        """Draws n candidate keys (with replacement) from the whole bank by strategy uniform|log-uniform|unigram,
        after the positives; a Sample with each key's probability per draw (for a sampled-softmax correction)."""
        h = self._handle()
        data, ends_p, npos = _key_args(list(positives), "positives")
        cap = npos + int(n)
        probs, pos = np.zeros(cap, np.float32), np.zeros(cap, np.uint8)
        count, mass, rows = ffi.new("size_t *"), ffi.new("double *"), ffi.new("uint64_t *")
        rc = lib.kb_ffi_sample(h, table.encode(), data, len(data), ends_p, npos, int(n), strategy.encode(), int(seed),
                               cap, count, ffi.from_buffer("float[]", probs), ffi.from_buffer("uint8_t[]", pos),
                               mass, rows)
        if rc != 0:
            self._raise(rc, table)
        c = count[0]
        return Sample(self._result_keys(), probs[:c], pos[:c].astype(bool), mass[0], rows[0])

    # -- feature records --

    def get_features(self, table, keys):
        """The feature records of keys: per key None (no record) or a dict with neighbors (keys), weights,
        label (int, float or None), confidence, data (bytes), version and updated_at_ms."""
        h = self._handle()
        data, ends_p, n = _key_args(keys)
        out = ffi.new("const char **")
        records = self._json(lib.kb_ffi_get_features_json(h, table.encode(), data, len(data), ends_p, n, out), out)
        result = []
        for r in records:
            if not r.get("found"):
                result.append(None)
                continue
            label = r.get("int_label", r.get("float_label"))
            result.append({
                "neighbors": [_decode_key(k) for k in r.get("neighbor_keys", [])],
                "weights": r.get("neighbor_weights", []),
                "label": label,
                "confidence": r.get("label_confidence", 0.0),
                "data": r.get("data", "").encode("latin-1"),
                "version": r.get("version", 0),
                "updated_at_ms": r.get("updated_at_ms", 0),
            })
        return result

    def put_features(self, table, records):
        """Replaces feature records: records maps key -> dict (neighbors, weights, label, confidence, data,
        version; each optional), or is a list of (key, dict) pairs."""
        items = list(records.items()) if isinstance(records, dict) else list(records)
        keys = [k for k, _ in items]
        data, ends, n = _keys(keys)
        if ends is ffi.NULL:
            enc_keys = data.split(b"\0") if n else []
        else:
            e = [0] + ends.tolist()
            enc_keys = [data[e[i]:e[i + 1]] for i in range(n)]

        def enc(k):
            return k.encode(_ENC, _ERRORS) if isinstance(k, str) else bytes(k)

        allowed = {"neighbors", "weights", "label", "confidence", "data", "version"}
        packed = []
        for key, r in items:
            extra = set(r) - allowed
            if extra:
                raise InvalidArgument("put_features %s: key %r: unknown fields %s (known: %s)"
                                      % (table, key, ", ".join(sorted(extra)), ", ".join(sorted(allowed))),
                                      code=lib.KB_FFI_EINVAL)
            packed.append(_wire.feature_record(encode=enc, **r))
        msg = _wire.feature_put(enc_keys, packed)
        rc = lib.kb_ffi_put_features(self._handle(), table.encode(), msg, len(msg))
        if rc != 0:
            self._raise(rc, table)
