"""Shared pytest setup for kiln's Python tests: every test starts from the same random state and
ends with the engine drained (no op of one test still running when the next starts or at exit)."""
import os
import shutil
import tempfile

import numpy as np
import pytest

# Kernels compile into a disk cache of the test run's own (read on every compile), removed at the
# end: the tests see cold compiles and leave the user's ~/.cache/kiln alone.
_cache_dir = tempfile.mkdtemp(prefix="kiln-pytest-cache-")
os.environ["KILN_CACHE_DIR"] = _cache_dir

import kiln
from kiln import nd


@pytest.fixture(autouse=True)
def _seeded():
    nd.random.seed(0)
    np.random.seed(0)
    yield
    kiln.waitall()


@pytest.fixture(autouse=True, scope="session")
def _own_kernel_cache():
    yield
    shutil.rmtree(_cache_dir, ignore_errors=True)
