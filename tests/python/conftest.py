"""Fixtures of the Python tests: real kb-server processes on loopback (as tests/lib/server_harness does for
the C tests), each with its own data directory, stopped with SIGTERM and required to exit 0.

Where things are: $CARLS_BIN_DIR (kb-server; CTest sets it to the build's bin/), else build/bin of this
source tree. The package is imported from python/ (CTest sets PYTHONPATH) and loads the build's library
($CARLS_CLIENT_LIB)."""
import itertools
import os
import shutil
import signal
import subprocess
import tempfile
import time

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BIN_DIR = os.environ.get("CARLS_BIN_DIR", os.path.join(ROOT, "build", "bin"))


class Server:
    """One kb-server on tcp://127.0.0.1:* with extra args."""

    def __init__(self, *args):
        self.dir = tempfile.mkdtemp(prefix="carls-py-")
        ep_file = os.path.join(self.dir, "endpoint")
        self.log = open(os.path.join(self.dir, "log"), "wb")
        self.proc = subprocess.Popen(
            [os.path.join(BIN_DIR, "kb-server"), "--listen", "tcp://127.0.0.1:*", "--data",
             os.path.join(self.dir, "data"), "--endpoint-file", ep_file, "--durability", "interval:100", *args],
            stdout=self.log, stderr=subprocess.STDOUT)
        # The server writes the endpoint file once bound; waiting for it is not a timed assertion.
        deadline = time.monotonic() + 20
        while not (os.path.exists(ep_file) and open(ep_file).read().strip()):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError("kb-server did not start; its log:\n" + self.log_text())
            time.sleep(0.02)
        self.endpoint = open(ep_file).read().strip()

    def log_text(self):
        with open(os.path.join(self.dir, "log"), "rb") as f:
            return f.read().decode(errors="replace")

    def stop(self, sig=signal.SIGTERM):
        """Stops the server; its exit status."""
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        rc = self.proc.wait()
        self.log.close()
        return rc

    def cleanup(self):
        rc = self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)
        return rc


@pytest.fixture(scope="session")
def server():
    s = Server()
    yield s
    assert s.cleanup() == 0, "kb-server exited uncleanly; its log:\n" + s.log_text()


@pytest.fixture(scope="session")
def shards():
    """Two kb-servers serving the two shards of one bank."""
    pair = [Server("--shard", "0/2"), Server("--shard", "1/2")]
    yield pair
    for s in pair:
        assert s.cleanup() == 0, "kb-server exited uncleanly; its log:\n" + s.log_text()


@pytest.fixture
def bank(server):
    import carls
    with carls.Client(server.endpoint, timeout_ms=10000) as c:
        yield c


_names = itertools.count()


@pytest.fixture
def table_name(request):
    """A table name of its own for each test."""
    return "t%d_%s" % (next(_names), request.node.name.split("[")[0][-40:])
