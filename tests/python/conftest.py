"""pytest configuration for the fused_layernorm tests.

Run from the repository root: ``python -m pytest tests/python``.
Inputs are random but seeded per test (from the test id); set FLN_TEST_SEED=<n>
to draw a different set of inputs for every test.
"""
import fcntl
import gc
import os
import sys
import tempfile

import pytest
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from helpers import requires_cuda, seed_from  # noqa: E402


def pytest_configure(config):
    config.addinivalue_line(
        "markers",
        "sanitize: small, fast CUDA tests selected for compute-sanitizer runs "
        "(compute-sanitizer python -m pytest tests/python -m sanitize)",
    )
    config.addinivalue_line("markers", "slow: large tests (seconds each)")
    config.addinivalue_line(
        "markers",
        "big_memory: needs several GB of GPU memory; parallel workers (pytest -n) run such "
        "tests one at a time (a file lock), so that they do not run the GPU out of memory",
    )


@pytest.fixture(params=["cpu", pytest.param("cuda", marks=requires_cuda)])
def device(request):
    """Every device the tests can run on; cuda params skip without CUDA."""
    return request.param


@pytest.fixture
def seed(request):
    """A per-test seed derived from the test id (reproducible, distinct per test)."""
    return seed_from(request.node.nodeid)


@pytest.fixture(autouse=True)
def _seed_global_rng(seed):
    # Helpers draw from explicit generators; this covers anything using the global RNG.
    torch.manual_seed(seed)


@pytest.fixture(autouse=True)
def _one_big_memory_test_at_a_time(request):
    if request.node.get_closest_marker("big_memory") is None:
        yield
        return
    with open(os.path.join(tempfile.gettempdir(), "fused_layernorm_big_memory.lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            # Give the memory back before the next such test, which may be another process's.
            gc.collect()
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
            fcntl.flock(lock, fcntl.LOCK_UN)
