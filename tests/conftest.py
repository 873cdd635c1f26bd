"""Fixtures shared by the test files."""

import os
import sys

import pytest
import torch

# Without a GPU, zoo's Triton kernels run in Triton's interpreter on CPU tensors; it is chosen when a kernel is
# defined, so before zoo is imported.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

_network_blocked = False


def _refuse_network(event: str, args) -> None:
    if _network_blocked and event in ("socket.connect", "socket.getaddrinfo", "socket.gethostbyname"):
        raise RuntimeError(f"network access during a no-network test: {event}{args}")


# Audit hooks cannot be removed, so one hook is installed for the session and the fixture switches it on.
sys.addaudithook(_refuse_network)


@pytest.fixture
def no_network():
    """Socket connects and name lookups raise while the test runs (use with `pytest.mark.usefixtures`)."""
    global _network_blocked
    _network_blocked = True
    yield
    _network_blocked = False


def pytest_collection_modifyitems(config, items):
    """Test ids must be the same in every process: pytest-xdist (as on a GPU machine) refuses a run whose workers
    collect different ids, and an object's default repr (`<function <lambda> at 0x7f...>`) differs per process.
    The order, too: the slow tests first, in a stable sort."""
    unstable = [item.nodeid for item in items if " at 0x" in item.nodeid]
    if unstable:
        raise pytest.UsageError(f"test ids that hold a memory address (give the parametrize ids): {unstable[:3]}")
    # The tests marked slow (multi-process and end-to-end runs, the suite's longest) first: the two processes share
    # them from the start and finish on the short tests, rather than one process ending on a long tail alone.
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)


def pytest_collection_finish(session):
    # the launch starts now, beside the tests, where a selected test reads it
    if any("distributed_runs" in getattr(item, "fixturenames", ()) for item in session.items):
        from distributed_launch import start

        start(session.config._tmp_path_factory)


def pytest_sessionfinish(session, exitstatus):
    launch = sys.modules.get("distributed_launch")
    if launch is not None:
        launch.finish(interrupted=exitstatus == pytest.ExitCode.INTERRUPTED)


@pytest.fixture(scope="session")
def distributed_runs(tmp_path_factory):
    """The suite's one torchrun launch (tests/distributed_worker.py, made by tests/distributed_launch.py): started
    once collection ends, in one pytest-xdist worker; the tests read its files. A `Launch`: the runs' folder, status
    and output, and `check(job)` for a test to fail with the run that stopped it."""
    # imported here, not above: it imports zoo, which must come after TRITON_INTERPRET is set
    from distributed_launch import shared_launch

    return shared_launch(tmp_path_factory)
