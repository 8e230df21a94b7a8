"""carls.Client against a real kb-server: every method, the forms keys take, and errors as exceptions."""
import os
import re
import signal
import socket
import subprocess
import time

import numpy as np
import pytest

import carls
from conftest import ROOT, Server


def test_library_comes_from_this_build():
    # CTest points CARLS_CLIENT_LIB at the build's library; the package must load that one.
    if "CARLS_CLIENT_LIB" in os.environ:
        assert os.path.realpath(carls.library_path) == os.path.realpath(os.environ["CARLS_CLIENT_LIB"])


def test_cdef_matches_header():
    """The cffi declarations are client/kb_ffi.h's, comments and preprocessor lines aside."""
    from carls._ffi import CDEF
    text = open(os.path.join(ROOT, "client", "kb_ffi.h")).read()
    text = re.sub(r"/\*.*?\*/", "", text, flags=re.S)
    text = "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("#"))

    def norm(s):
        return re.sub(r"\s+", " ", s).replace("( ", "(").replace(" )", ")").strip()

    def decls(s):
        return sorted(norm(d) for d in norm(s).split(";") if d.strip())

    assert decls(CDEF) == decls(text)


def test_tables_create_list_drop(bank, table_name):
    bank.create_table(table_name, dim=8, optimizer="adagrad", lr=0.05, update="immediate", init="uniform",
                      init_scale=0.1, seed=7, settings={"lazy.outlier_rule": "none"})
    tables = {t["name"]: t for t in bank.list_tables()}
    cfg = tables[table_name]["config"]
    assert cfg["dim"] == 8 and cfg["kind"] == "embedding"
    assert cfg["optimizer"]["kind"] == "adagrad" and cfg["optimizer"]["learning_rate"] == pytest.approx(0.05)
    assert cfg["lazy"]["policy"] == "immediate" and cfg["lazy"]["outlier_rule"] == "none"
    assert cfg["init"] == "uniform" and cfg["init_seed"] == 7
    assert bank.dim(table_name) == 8
    with pytest.raises(carls.AlreadyExists) as e:
        bank.create_table(table_name, dim=8)
    assert e.value.status == "ALREADY_EXISTS"
    bank.create_table(table_name, dim=8, optimizer="adagrad", lr=0.05, update="immediate", init="uniform",
                      init_scale=0.1, seed=7, settings={"lazy.outlier_rule": "none"}, if_not_exists=True)
    bank.drop_table(table_name)
    assert table_name not in {t["name"] for t in bank.list_tables()}
    with pytest.raises(carls.NotFound):
        bank.drop_table(table_name)
    bank.drop_table(table_name, if_exists=True)


def test_put_lookup_meta(bank, table_name):
    bank.create_table(table_name, dim=4)
    values = np.arange(12, dtype=np.float32).reshape(3, 4) / 7
    bank.put(table_name, ["a", "b", "c"], values, version=42)
    got, versions, updated, freq = bank.lookup(table_name, ["c", "a", "b", "a"], meta=True)
    assert got.dtype == np.float32 and got.shape == (4, 4)
    np.testing.assert_array_equal(got, values[[2, 0, 1, 0]])
    assert versions.tolist() == [42] * 4
    assert (updated > 0).all() and (freq >= 1).all()
    # float64 rows are taken (as float32); a 1-row lookup is still 2-D
    bank.put(table_name, ["d"], np.ones((1, 4)))
    assert bank.lookup(table_name, ["d"]).shape == (1, 4)
    assert bank.lookup(table_name, []).shape == (0, 4)


def test_no_create_inserts_nothing(bank, table_name):
    bank.create_table(table_name, dim=2, init="uniform", init_scale=0.5, seed=3)
    first = bank.lookup(table_name, ["x"], no_create=True)
    assert bank.stats(table_name)["tables"][0]["rows"] == 0
    created = bank.lookup(table_name, ["x"])
    np.testing.assert_array_equal(first, created)  # the initial value, derived from the key and seed
    assert bank.stats(table_name)["tables"][0]["rows"] == 1


def test_key_forms(bank, table_name):
    """str, bytes (also not UTF-8), keys holding NUL bytes and numpy string arrays name the same rows."""
    bank.create_table(table_name, dim=2)
    keys = ["plain", "caf\u00e9", b"\xff\xfe raw", b"nul\x00inside", "x"]
    values = np.arange(10, dtype=np.float32).reshape(5, 2)
    bank.put(table_name, keys, values)
    np.testing.assert_array_equal(bank.lookup(table_name, keys), values)
    as_bytes = [k.encode() if isinstance(k, str) else k for k in keys]
    np.testing.assert_array_equal(bank.lookup(table_name, as_bytes), values)
    np.testing.assert_array_equal(bank.lookup(table_name, np.array(["plain", "x"])), values[[0, 4]])
    np.testing.assert_array_equal(bank.lookup(table_name, np.array([b"plain", b"x"])), values[[0, 4]])
    # keys come back from the bank as str; undecodable bytes through surrogateescape, and back
    s = bank.sample(table_name, 0, positives=[b"\xff\xfe raw"])
    assert s.keys == ["\udcff\udcfe raw"]
    np.testing.assert_array_equal(bank.lookup(table_name, s.keys), values[[2]])


def test_push_gradients_immediate_sgd(bank, table_name):
    bank.create_table(table_name, dim=3, optimizer="sgd", lr=0.5, update="immediate", init="uniform",
                      init_scale=1.0, seed=11)
    before = bank.lookup(table_name, ["a", "b"])
    g = np.array([[1, 2, 3], [-4, 0, 0.5]], np.float32)
    bank.push_gradients(table_name, ["a", "b"], g)
    np.testing.assert_allclose(bank.lookup(table_name, ["a", "b"]), before - 0.5 * g, rtol=1e-6, atol=1e-7)


def test_push_gradients_lazy_average(bank, table_name):
    """Lazy update: the pending gradients of a key are averaged into one step, applied by the next lookup."""
    bank.create_table(table_name, dim=2, optimizer="sgd", lr=1.0, update="lazy", max_age_ms=3600000,
                      settings={"lazy.outlier_rule": "none"})
    bank.push_gradients(table_name, ["k", "k"], np.array([[1, 0], [3, 2]], np.float32))
    np.testing.assert_allclose(bank.lookup(table_name, ["k"]), [[-2, -1]])


def test_knn(bank, table_name):
    bank.create_table(table_name, dim=2, knn="Flat", metric="l2")
    bank.put(table_name, ["p", "q", "r"], np.array([[0, 0], [1, 0], [5, 5]], np.float32))
    keys, scores = bank.knn(table_name, np.array([[0.9, 0], [5, 4]], np.float32), 2)
    if keys[0] == [] or len(keys[0]) < 2:  # the index is built in the background: wait for it
        import time
        for _ in range(200):
            time.sleep(0.05)
            keys, scores = bank.knn(table_name, np.array([[0.9, 0], [5, 4]], np.float32), 2)
            if len(keys[0]) == 2:
                break
    assert keys == [["q", "p"], ["r", "q"]]
    np.testing.assert_allclose(scores[0], [0.01, 0.81], rtol=1e-5)
    np.testing.assert_allclose(scores[1], [1.0, 32.0], rtol=1e-5)
    keys, scores = bank.knn_by_key(table_name, ["p"], 2)
    assert keys == [["q", "r"]]
    np.testing.assert_allclose(scores[0], [1.0, 50.0], rtol=1e-5)
    with pytest.raises(carls.InvalidArgument):
        bank.knn(table_name, np.zeros((1, 3), np.float32), 2)  # wrong dim


def test_sample(bank, table_name):
    bank.create_table(table_name, dim=1)
    bank.put(table_name, ["a", "b", "c", "d"], np.zeros((4, 1), np.float32))
    s = bank.sample(table_name, 5, strategy="uniform", positives=["a", "zz"], seed=9)
    assert len(s.keys) == 7 and s.keys[:2] == ["a", "zz"]
    assert s.is_positive.tolist() == [True, True] + [False] * 5
    assert set(s.keys[2:]) <= {"a", "b", "c", "d"}
    np.testing.assert_allclose(s.probabilities, 0.25)  # uniform: 1 / rows for every key
    assert s.rows == 4 and s.mass == 4
    assert bank.sample(table_name, 5, positives=["a", "zz"], seed=9).keys == s.keys  # seeded
    with pytest.raises(carls.InvalidArgument):
        bank.sample(table_name, 1, strategy="sideways")


def test_features(bank, table_name):
    bank.create_table(table_name, kind="feature")
    bank.put_features(table_name, {
        "a": {"neighbors": ["b", "c\u00e9"], "weights": [0.5, 0.25], "label": -3, "confidence": 0.75,
              "data": b"\x00\xff\n", "version": 5},
        "z": {"label": 1.5},
    })
    a, z, missing = bank.get_features(table_name, ["a", "z", "nope"])
    assert missing is None
    assert a["neighbors"] == ["b", "c\u00e9"] and a["weights"] == [0.5, 0.25]
    assert a["label"] == -3 and a["confidence"] == 0.75 and a["data"] == b"\x00\xff\n" and a["version"] == 5
    assert a["updated_at_ms"] > 0
    assert z["label"] == 1.5 and z["neighbors"] == [] and z["data"] == b""
    with pytest.raises(carls.InvalidArgument, match="is a feature table"):
        bank.lookup(table_name, ["a"])
    with pytest.raises(carls.InvalidArgument):
        bank.put_features(table_name, {"a": {"colour": "red"}})
    with pytest.raises(ValueError):
        bank.put_features(table_name, {"a": {"neighbors": ["b"], "weights": [1, 2]}})


def test_stats_and_checkpoint(bank, table_name):
    bank.create_table(table_name, dim=2)
    bank.lookup(table_name, ["a", "b", "c"])
    st = bank.stats(table_name)
    assert [t["name"] for t in st["tables"]] == [table_name]
    assert st["tables"][0]["rows"] == 3 and st["tables"][0]["lookups"] == 3
    assert st["requests"] > 0 and st["uptime_ms"] >= 0
    cp = bank.checkpoint()
    assert len(cp) == 1 and cp[0]["rows"] >= 3


def test_bad_input_raises_and_bank_keeps_serving(bank, table_name):
    bank.create_table(table_name, dim=2)
    with pytest.raises(carls.NotFound) as e:
        bank.lookup("no_such_table", ["a"])
    assert e.value.status == "NOT_FOUND" and "no_such_table" in str(e.value)
    with pytest.raises(TypeError, match="dtype int64"):
        bank.put(table_name, ["a"], np.zeros((1, 2), np.int64))
    with pytest.raises(carls.InvalidArgument, match=r"shape \(1, 3\), expected \(1, 2\)"):
        bank.put(table_name, ["a"], np.zeros((1, 3), np.float32))
    with pytest.raises(carls.InvalidArgument, match=r"shape \(2,\)"):
        bank.push_gradients(table_name, ["a"], np.zeros(2, np.float32))
    with pytest.raises(carls.InvalidArgument) as e:
        bank.put(table_name, ["a"], np.array([[np.nan, 0]], np.float32))
    assert e.value.status == "INVALID_ARGUMENT"
    with pytest.raises(carls.InvalidArgument, match="key 0 is empty"):
        bank.lookup(table_name, [""])  # refused by the client library before sending
    with pytest.raises(TypeError):
        bank.lookup(table_name, "abc")
    with pytest.raises(TypeError, match="key 1 is a int"):
        bank.lookup(table_name, ["a", 5])
    with pytest.raises(carls.InvalidArgument, match="optimizer.kind: 'sgdx' is none of sgd"):
        bank.create_table(table_name + "x", dim=2, optimizer="sgdx")
    with pytest.raises(carls.InvalidArgument, match="has no field 'bogus'"):
        bank.create_table(table_name + "x", dim=2, settings={"lazy.bogus": 1})
    with pytest.raises(carls.InvalidArgument, match="needs dim"):
        bank.create_table(table_name + "x")
    # after all that, the bank still serves
    bank.put(table_name, ["a"], np.ones((1, 2), np.float32))
    np.testing.assert_array_equal(bank.lookup(table_name, ["a"]), [[1, 1]])


def test_closed_client_and_bad_endpoints(server):
    c = carls.Client(server.endpoint)
    c.close()
    c.close()
    with pytest.raises(carls.InvalidArgument, match="after close"):
        c.list_tables()
    with pytest.raises(carls.InvalidArgument):
        carls.Client("")
    with pytest.raises(carls.InvalidArgument):
        carls.Client([server.endpoint, server.endpoint])  # a repeated endpoint


def test_bank_down_is_unavailable():
    """A bank that does not answer is carls.Unavailable (a ConnectionError), after the retries."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()  # nothing listens there now
    with carls.Client("tcp://127.0.0.1:%d" % port, timeout_ms=100, retries=1) as c:
        with pytest.raises(carls.Unavailable) as e:
            c.list_tables()
        assert isinstance(e.value, ConnectionError) and e.value.status is None


def test_server_stopped_mid_session():
    srv = Server()
    try:
        with carls.Client(srv.endpoint, timeout_ms=200, retries=0) as c:
            c.create_table("t", dim=2)
            c.lookup("t", ["a"])
            assert srv.stop() == 0
            with pytest.raises(carls.Unavailable):
                c.lookup("t", ["a"])
    finally:
        srv.cleanup()


def test_sharded_bank(shards):
    eps = [s.endpoint for s in shards]
    with carls.Client(eps) as bank:
        assert bank.shards == 2
        bank.create_table("sharded", dim=3, update="immediate", lr=1.0)
        keys = ["key%d" % i for i in range(40)]
        values = np.random.default_rng(1).standard_normal((40, 3)).astype(np.float32)
        bank.put("sharded", keys, values)
        np.testing.assert_array_equal(bank.lookup("sharded", keys[::-1]), values[::-1])
        per_shard = [bank.stats("sharded", shard=i)["tables"][0]["rows"] for i in range(2)]
        assert sum(per_shard) == 40 and min(per_shard) > 0  # both shards hold some
        assert [t["rows"] for t in bank.list_tables() if t["name"] == "sharded"] == [40]
        bank.push_gradients("sharded", keys, np.ones((40, 3), np.float32))
        np.testing.assert_allclose(bank.lookup("sharded", keys), values - 1, rtol=1e-6)
        assert len(bank.checkpoint()) == 2
        with pytest.raises(carls.InvalidArgument):
            bank.stats(shard=2)
    # the endpoints in the wrong order: each server refuses the other's keys
    with carls.Client(eps[::-1]) as wrong:
        with pytest.raises(carls.Error):
            wrong.lookup("sharded", keys)


def test_set_log_level():
    carls.set_log_level("error")
    carls.set_log_level("info")
    with pytest.raises(carls.InvalidArgument, match="'loud' is not debug"):
        carls.set_log_level("loud")


def test_curve(tmp_path):
    """With curve_key and server_key the client talks to a CURVE server that admits its key; without them
    the server never answers (Unavailable)."""
    import subprocess
    from conftest import BIN_DIR
    allow = tmp_path / "allow"
    allow.mkdir()
    for name in ("server", "alice"):
        subprocess.run([os.path.join(BIN_DIR, "kb-keygen"), str(tmp_path / name)], check=True,
                       capture_output=True)
    os.rename(tmp_path / "alice.pub", allow / "alice.pub")
    try:
        srv = Server("--curve-secret", str(tmp_path / "server.key"), "--curve-allow", str(allow))
    except RuntimeError as e:
        if "CURVE" in str(e):
            pytest.skip("libzmq lacks CURVE")
        raise
    try:
        with carls.Client(srv.endpoint, curve_key=str(tmp_path / "alice.key"),
                          server_key=str(tmp_path / "server.pub")) as c:
            c.create_table("secret", dim=2)
            assert c.lookup("secret", ["a"]).shape == (1, 2)
        carls.set_log_level("error")  # the resend warnings of the plain client below
        try:
            with carls.Client(srv.endpoint, timeout_ms=200, retries=0) as plain:
                with pytest.raises(carls.Unavailable):
                    plain.list_tables()
        finally:
            carls.set_log_level("info")
        with pytest.raises(carls.InvalidArgument, match="both"):
            carls.Client(srv.endpoint, curve_key=str(tmp_path / "alice.key"))
        with pytest.raises(carls.InvalidArgument, match="nope.key"):
            carls.Client(srv.endpoint, curve_key=str(tmp_path / "nope.key"), server_key=str(tmp_path / "server.pub"))
    finally:
        assert srv.cleanup() == 0


def test_push_gradients_without_waiting(bank, table_name):
    """wait=False: up to 64 pushes in flight, flush() collects them; a failure shows at flush."""
    bank.create_table(table_name, dim=2, optimizer="sgd", lr=1.0, update="immediate")
    for _ in range(100):
        bank.push_gradients(table_name, ["a"], np.ones((1, 2), np.float32), wait=False)
    assert bank.pushes_in_flight == 64
    bank.flush()
    assert bank.pushes_in_flight == 0
    np.testing.assert_array_equal(bank.lookup(table_name, ["a"]), [[-100, -100]])
    bank.push_gradients(table_name, ["a"], np.array([[np.nan, 0]], np.float32), wait=False)
    bank.push_gradients(table_name, ["a"], np.ones((1, 2), np.float32), wait=False)
    with pytest.raises(carls.InvalidArgument) as e:
        bank.flush()
    assert e.value.status == "INVALID_ARGUMENT"
    bank.flush()  # nothing left in flight
    np.testing.assert_array_equal(bank.lookup(table_name, ["a"]), [[-101, -101]])


def test_replicated_shard_members():
    """A shard's members as a list of lists or a "|" string: writes go to the primary whichever member is
    named first, and after kill -9 of the primary and promotion of the follower (kbctl replica promote) the
    same client writes on."""
    # Acknowledged only once the follower has it (K = 1 counts followers of sync durability; the later flag
    # wins over the fixture's).
    primary = Server("--durability", "sync", "--min-replicas", "1")
    follower = Server("--durability", "sync", "--replica-of", primary.endpoint)
    try:
        with carls.Client([[follower.endpoint, primary.endpoint]], timeout_ms=5000) as c:
            assert c.shards == 1
            c.create_table("rep", dim=2, init="zeros")
            c.put("rep", ["a"], np.array([[1, 2]], dtype=np.float32))
            with carls.Client("%s | %s" % (primary.endpoint, follower.endpoint)) as c2:
                np.testing.assert_array_equal(c2.lookup("rep", ["a"]), [[1, 2]])
            assert primary.stop(signal.SIGKILL) == -signal.SIGKILL
            subprocess.run([os.path.join(os.environ.get("CARLS_BIN_DIR", os.path.join(ROOT, "build", "bin")),
                                         "kbctl"), "--kb", follower.endpoint, "replica", "promote", "--term", "2"],
                           check=True, stdout=subprocess.DEVNULL)
            c.put("rep", ["b"], np.array([[3, 4]], dtype=np.float32))
        with carls.Client(follower.endpoint) as c3:
            np.testing.assert_array_equal(c3.lookup("rep", ["a", "b"], no_create=True), [[1, 2], [3, 4]])
        with pytest.raises(TypeError):
            carls.Client([[follower.endpoint, 7]])
    finally:
        follower.cleanup()
        primary.cleanup()


def test_read_replica_ms():
    """Client(read_replica_ms=N): a lookup without creating rows is answered by the follower, also while the
    primary does not answer (SIGSTOP), as long as the follower was caught up less than N ms ago."""
    primary = Server("--durability", "sync", "--min-replicas", "1")
    follower = Server("--durability", "sync", "--replica-of", primary.endpoint)
    try:
        with carls.Client([[primary.endpoint, follower.endpoint]], timeout_ms=10000, read_replica_ms=5000) as c:
            c.create_table("rr", dim=2, init="zeros")
            c.put("rr", ["a"], np.array([[1, 2]], dtype=np.float32))  # on the follower once acknowledged
            time.sleep(0.5)  # and a heartbeat (every 100 ms) has told the new follower it is caught up
            os.kill(primary.proc.pid, signal.SIGSTOP)
            try:
                t0 = time.monotonic()
                np.testing.assert_array_equal(c.lookup("rr", ["a"], no_create=True), [[1, 2]])
                # Not the primary's 10 s attempt and then the follower: the follower at once.
                assert time.monotonic() - t0 < 5
            finally:
                os.kill(primary.proc.pid, signal.SIGCONT)
        with pytest.raises(carls.InvalidArgument):
            carls.Client(primary.endpoint, read_replica_ms=-1)
    finally:
        follower.cleanup()
        primary.cleanup()
