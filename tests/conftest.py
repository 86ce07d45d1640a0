"""Shared test setup.

tests/unit holds the fast tests (no subprocess, no server, no network); every test under
tests/integration starts processes or servers and is marked ``integration`` here, by its
path, so ``pytest tests/unit`` and ``pytest -m "not integration"`` both run the fast set.

Tests never run in the repository root. They start the CLI as `python -m loadgen`, and
Python puts the working directory first on sys.path: from the repository root, a
subprocess would import the source folder (which has no built extension after a plain
`pip install .`) instead of the installed package. A session-wide directory covers
module- and session-scoped fixtures; each test then gets its own.

Under pytest-xdist (``pytest -n 2``, the README's command; ``--dist loadfile`` in
pyproject.toml keeps each file, and its module-scoped servers, on one worker) a test
marked ``alone`` runs while no other test does: it times events to the millisecond, and
the other workers' load would be in its figures. The tests it waits for end first, and
no test starts until it is done (``turnstile`` in tests/helpers.py).
"""

import os
from pathlib import Path

import pytest

INTEGRATION = Path(__file__).resolve().parent / "integration"


def pytest_collection_modifyitems(items):
    for item in items:
        if INTEGRATION in Path(str(item.path)).resolve().parents:
            item.add_marker(pytest.mark.integration)


@pytest.fixture(autouse=True)
def _alone_when_marked(request, tmp_path_factory):
    """Under pytest-xdist, a test marked ``alone`` runs while no other test does."""
    if "PYTEST_XDIST_WORKER" not in os.environ:
        yield
        return
    # A worker's base folder is popen-gw<N> in the run's own, which its workers share.
    from tests.helpers import turnstile

    with turnstile(tmp_path_factory.getbasetemp().parent, request.node.get_closest_marker("alone") is not None):
        yield


@pytest.fixture(scope="session", autouse=True)
def _session_cwd(tmp_path_factory):
    previous = os.getcwd()
    os.chdir(tmp_path_factory.mktemp("cwd"))
    yield
    os.chdir(previous)


@pytest.fixture(autouse=True)
def _isolated_cwd(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)


@pytest.fixture
def serve():
    """``serve(route)`` starts a small HTTP/1.1 server thread on 127.0.0.1 whose
    ``route(method, path, head, sock)`` answers each request (see
    ``tests/helpers.py``); every one started is stopped after the test."""
    from tests.helpers import _Server

    servers = []

    def start(route):
        servers.append(_Server(route))
        return servers[-1]

    yield start
    for server in servers:
        server.stop()
