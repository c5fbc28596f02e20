"""Build hook: copies the C header (and, if asked, the shared library) into the
package, and records the repository the package was built from so that an
installed package finds target/{release,debug}/libgradwire.so there.

  pip install ./python                          # header copied, library found in the repo at run time
  GRADWIRE_BUNDLE_LIB=path/to/libgradwire.so pip install ./python   # also bundles the library
"""

import json
import os
import shutil

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)


class BuildPy(build_py):
    def run(self):
        super().run()
        dest = os.path.join(self.build_lib, "gradwire")
        os.makedirs(dest, exist_ok=True)
        header = os.path.join(REPO, "capi", "include", "gradwire.h")
        if os.path.isfile(header):
            shutil.copyfile(header, os.path.join(dest, "gradwire.h"))
        lib = os.environ.get("GRADWIRE_BUNDLE_LIB")
        if lib:
            shutil.copyfile(lib, os.path.join(dest, "libgradwire.so"))
        info = {"repo": REPO if os.path.isfile(header) else None}
        with open(os.path.join(dest, "_build_info.json"), "w") as f:
            json.dump(info, f)


setup(cmdclass={"build_py": BuildPy})
