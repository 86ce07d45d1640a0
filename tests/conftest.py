"""Shared test setup.

Tests never run in the repository root. They start the CLI as `python -m loadgen`, and
Python puts the working directory first on sys.path: from the repository root, a
subprocess would import the source folder (which has no built extension after a plain
`pip install .`) instead of the installed package. A session-wide directory covers
module- and session-scoped fixtures; each test then gets its own.
"""

import os

import pytest


@pytest.fixture(scope="session", autouse=True)
def _session_cwd(tmp_path_factory):
    previous = os.getcwd()
    os.chdir(tmp_path_factory.mktemp("cwd"))
    yield
    os.chdir(previous)


@pytest.fixture(autouse=True)
def _isolated_cwd(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
