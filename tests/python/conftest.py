"""Shared pytest setup for kiln's Python tests: every test starts from the same random state and
ends with the engine drained (no op of one test still running when the next starts or at exit)."""
import numpy as np
import pytest

import kiln
from kiln import nd


@pytest.fixture(autouse=True)
def _seeded():
    nd.random.seed(0)
    np.random.seed(0)
    yield
    kiln.waitall()
