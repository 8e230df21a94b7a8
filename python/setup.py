"""pip install ./python: the carls package, with the libcarls_client.so of a build bundled when one is found
($CARLS_CLIENT_LIB, else build/ or build-release/ of this source tree), so the installed package needs no
path to the build. Without one the package looks for the library at import (carls/_ffi.py). Nothing is
fetched: the dependencies (numpy, cffi; torch for carls.torch) come from Debian's python3-* packages."""
import os
import shutil

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = os.path.dirname(os.path.abspath(__file__))
SONAME = "libcarls_client.so.1"


def built_library():
    env = os.environ.get("CARLS_CLIENT_LIB")
    if env:
        if not os.path.exists(env):
            raise SystemExit("setup.py: CARLS_CLIENT_LIB=%s: no such file" % env)
        return env
    for build in ("build", "build-release"):
        path = os.path.join(os.path.dirname(HERE), build, "client", SONAME)
        if os.path.exists(path):
            return path
    return None


class BuildWithLibrary(build_py):
    """build_py, plus a copy of the built library beside the package's modules."""

    def run(self):
        super().run()
        lib = built_library()
        if lib:
            dest = os.path.join(self.build_lib, "carls", SONAME)
            shutil.copyfile(os.path.realpath(lib), dest)
            print("carls: bundling %s" % lib)
        else:
            print("carls: no built libcarls_client.so found; the package will look for it when imported")


setup(
    name="carls",
    version="1.0.0",
    description="Python client of the carls-c knowledge bank, with a PyTorch DynamicEmbedding",
    packages=["carls"],
    python_requires=">=3.9",
    install_requires=["numpy", "cffi"],
    extras_require={"torch": ["torch"]},
    cmdclass={"build_py": BuildWithLibrary},
    zip_safe=False,
)
