"""Shared test setup.

Every test runs in its own temporary working directory. Tests start the CLI as
`python -m loadgen`, and Python puts the working directory first on sys.path: run from
the repository root, a subprocess would import the source folder (which has no built
extension after a plain `pip install .`) instead of the installed package.
"""

import pytest


@pytest.fixture(autouse=True)
def _isolated_cwd(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
