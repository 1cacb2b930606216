"""pip install --no-build-isolation .  (into a venv made with --system-site-packages)

Builds kiln._C with CMake (the build directory is $KILN_BUILD_DIR, default build/) and installs
the kiln package with it. There is no PyPI here: numpy and friends come from Debian.
"""
import os
import shutil
import subprocess
import sys

from setuptools import Extension, find_packages, setup
from setuptools.command.build_ext import build_ext

ROOT = os.path.dirname(os.path.abspath(__file__))


class CMakeBuild(build_ext):
    def build_extension(self, ext):
        build = os.environ.get("KILN_BUILD_DIR", os.path.join(ROOT, "build"))
        if not os.path.exists(os.path.join(build, "build.ninja")):
            subprocess.check_call(["cmake", "-S", ROOT, "-B", build, "-G", "Ninja",
                                   f"-DPython_EXECUTABLE={sys.executable}"])
        subprocess.check_call(["cmake", "--build", build, "--target", "kiln_python"])
        built = os.path.join(build, "python", "kiln")
        so = [f for f in os.listdir(built) if f.startswith("_C") and f.endswith(".so")]
        if not so:
            raise RuntimeError(f"kiln._C was not built in {built}")
        dst = self.get_ext_fullpath(ext.name)
        os.makedirs(os.path.dirname(dst), exist_ok=True)
        shutil.copyfile(os.path.join(built, so[0]), dst)


setup(
    name="kiln",
    version="0.1.0",
    description="Eager convenience with compiled speed: a deep-learning runtime and graph compiler",
    package_dir={"": "python"},
    packages=find_packages("python"),
    ext_modules=[Extension("kiln._C", sources=[])],
    cmdclass={"build_ext": CMakeBuild},
    python_requires=">=3.9",
    install_requires=["numpy"],
)
