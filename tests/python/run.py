"""CTest's entry to the Python tests: skips (exit 77, with the reason) where the Python side cannot run,
else runs pytest on this folder. Usage: python3 run.py [pytest args]."""
import os
import sys

SKIP = 77

if os.environ.get("CARLS_SANITIZE") == "ON":
    print("skipped: a sanitizer build's libcarls_client.so cannot be loaded into python3 (the C side of the "
          "library is tested under the sanitizers by test_kb_ffi)")
    sys.exit(SKIP)
missing = []
for mod, package in (("numpy", "python3-numpy"), ("cffi", "python3-cffi"), ("pytest", "python3-pytest")):
    try:
        __import__(mod)
    except ImportError:
        missing.append(package)
if missing:
    print("skipped: %s lacks %s (scripts/setup.sh installs them)" % (sys.executable, ", ".join(missing)))
    sys.exit(SKIP)
try:
    import torch  # noqa: F401
except ImportError:
    print("note: no torch (python3-torch): the carls.torch tests are skipped")

import pytest  # noqa: E402

sys.exit(pytest.main(["-q", "-p", "no:cacheprovider", "-rs", os.path.dirname(os.path.abspath(__file__))]
                     + sys.argv[1:]))
