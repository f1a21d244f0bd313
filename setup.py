# SPDX-License-Identifier: MIT
"""The build step behind pyproject.toml: the package is python/kiln (pure Python) plus kiln._kiln,
which the project's own CMake builds (the library linked in whole, no tests, tools or benchmarks)
for the Python running this build. The version is the library's (include/kiln/kiln.h)."""

import glob
import os
import re
import shutil
import subprocess
import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

ROOT = os.path.dirname(os.path.abspath(__file__))


def version():
    with open(os.path.join(ROOT, "include", "kiln", "kiln.h"), encoding="utf-8") as f:
        return re.search(r'#define KILN_VERSION_STRING "([^"]+)"', f.read()).group(1)


class CMakeExtension(Extension):
    def __init__(self, name):
        super().__init__(name, sources=[])


class CMakeBuild(build_ext):
    """Configure and build the `kiln_python` target, then put the module where setuptools wants
    it. The runtime libraries it links (liburing, libcurl, libxxhash, libcrypto) must be on the
    machine, as their -dev packages are for the build (README.md, "Python")."""

    def build_extension(self, ext):
        build = os.path.join(os.path.abspath(self.build_temp), "cmake")
        config = [
            "-DCMAKE_BUILD_TYPE=Release",
            "-DKILN_BUILD_TESTS=OFF",
            "-DKILN_BUILD_TOOLS=OFF",
            "-DKILN_BUILD_BENCH=OFF",
            "-DKILN_PYTHON=ON",
            f"-DKILN_PYTHON_EXECUTABLE={sys.executable}",
        ]
        jobs = str(os.cpu_count() or 1)
        try:
            subprocess.check_call(["cmake", "-S", ROOT, "-B", build] + config)
            subprocess.check_call(["cmake", "--build", build, "--target", "kiln_python", "-j",
                                   jobs])
        except subprocess.CalledProcessError as e:
            raise RuntimeError(
                "building kiln._kiln with CMake failed (above); it needs a C compiler, cmake, "
                "pkg-config, the -dev packages of liburing, libxxhash, libcurl and libcrypto, and "
                f"{sys.executable}'s headers and numpy (Debian: scripts/setup-debian.sh, "
                "python3-dev python3-numpy)") from e
        built = glob.glob(os.path.join(build, "python", "kiln", "_kiln*.so"))
        if len(built) != 1:
            raise RuntimeError(f"the build made {len(built)} kiln._kiln modules, not one: "
                               f"{built}")
        out = self.get_ext_fullpath(ext.name)
        os.makedirs(os.path.dirname(out), exist_ok=True)
        shutil.copyfile(built[0], out)


# Not build/ (CMake's default build directory in a checkout, README.md) and nothing in python/:
# what setuptools makes goes under build-setuptools/, which git ignores.
os.makedirs(os.path.join(ROOT, "build-setuptools"), exist_ok=True)

setup(
    version=version(),
    options={"build": {"build_base": "build-setuptools"},
             "egg_info": {"egg_base": "build-setuptools"}},
    packages=["kiln", "kiln.safetensors"],
    package_dir={"": "python"},
    ext_modules=[CMakeExtension("kiln._kiln")],
    cmdclass={"build_ext": CMakeBuild},
)
