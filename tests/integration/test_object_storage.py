"""Results to object storage (loadgen.storage): ``--output s3://bucket/prefix`` for run and
sweep, readers of such URLs (report, compare, load_results), retries, the completion
marker written last, and the local copy kept when an upload fails. Against a real S3
API: moto's server on 127.0.0.1 (tests/servers/s3.py)."""

from __future__ import annotations

import csv
import hashlib
import io
import json
import os
import uuid
from pathlib import Path

import pytest

from loadgen.storage import MARKER, TRIES_ENV, RemoteOutput, StorageError
from tests.servers.s3 import running_s3
from tests.helpers import clean_env, run_cli

RUN = ["--sut", "null", "--target-qps", "1000", "--duration-s", "0.3", "--no-html"]
SWEEP = ["--scenario", "concurrency", "--duration-s", "0.2", "--max-issue-delay-ms", "100", "--no-html"]


@pytest.fixture(scope="module")
def s3(tmp_path_factory):
    with running_s3(str(tmp_path_factory.mktemp("moto"))) as server:
        yield server


@pytest.fixture
def bucket(s3):
    name = f"b-{uuid.uuid4().hex[:12]}"
    s3.create_bucket(name)
    return name


def cli(server, tmp_path, *args, timeout=120, **extra):
    """`python -m loadgen ARGS` with the server's environment; staging folders in tmp_path."""
    env = clean_env(**server.env, TMPDIR=str(tmp_path), **extra)
    return run_cli(*args, timeout=timeout, env=env)


def staged(tmp_path: Path):
    return sorted(p.name for p in tmp_path.glob("loadgen-output-*"))


def error_lines(stderr: str):
    return [line for line in stderr.splitlines() if line.startswith("error:")]


def check_marker(s3, bucket: str, prefix: str) -> dict:
    """The upload's manifest, each file checked against the object's bytes."""
    manifest = json.loads(s3.get(bucket, f"{prefix}/{MARKER}"))
    assert manifest["schema"] == "loadgen.upload/1"
    for name, entry in manifest["files"].items():
        data = s3.get(bucket, f"{prefix}/{name}")
        assert (len(data), hashlib.sha256(data).hexdigest()) == (entry["size"], entry["sha256"]), name
    return manifest["files"]


def test_a_run_lands_in_the_bucket_and_report_reads_it_back(s3, bucket, tmp_path, monkeypatch):
    url = f"s3://{bucket}/runs/r1"
    for _ in range(2):  # the second run adds a row to the results.csv already there
        proc = cli(s3, tmp_path, "run", *RUN, "--output", url)
        assert proc.returncode in (0, 1), proc.stderr
        assert f"uploaded 4 files and {MARKER} to {url}" in proc.stdout
    assert s3.keys(bucket) == [f"runs/r1/{n}" for n in (MARKER, "latency.hlog", "result.json", "results.csv",
                                                          "summary.txt")]
    assert sorted(check_marker(s3, bucket, "runs/r1")) == ["latency.hlog", "result.json", "results.csv", "summary.txt"]
    assert len(list(csv.DictReader(io.StringIO(s3.get(bucket, "runs/r1/results.csv").decode())))) == 2
    assert staged(tmp_path) == []  # the staging folder is removed once uploaded

    stored = json.loads(s3.get(bucket, "runs/r1/result.json"))
    proc = cli(s3, tmp_path, "report", url, "--json")
    assert proc.returncode == (0 if stored["valid"] else 1), proc.stderr
    assert json.loads(proc.stdout) == stored

    for name, value in s3.env.items():
        monkeypatch.setenv(name, value)
    import loadgen

    frame = loadgen.load_results(url)
    assert list(frame["path"]) == [f"{url}/result.json"]
    assert frame["counts.completed"].iloc[0] == stored["counts"]["completed"]

    proc = cli(s3, tmp_path, "merge", url, "--output", f"s3://{bucket}/merged", "--quiet",
               "--storage-option", f"endpoint_url={s3.endpoint}")
    assert proc.returncode in (0, 1), proc.stderr
    assert "result.json" in check_marker(s3, bucket, "merged")
    merged = json.loads(s3.get(bucket, "merged/result.json"))
    assert merged["counts"]["completed"] == stored["counts"]["completed"]

    # An object that is not the one the marker lists is refused, in one line.
    s3.put(bucket, "runs/r1/result.json", json.dumps(stored).encode())
    proc = cli(s3, tmp_path, "report", url)
    assert proc.returncode == 2
    assert error_lines(proc.stderr) == proc.stderr.strip().splitlines()
    assert f"its upload's {MARKER} lists (size or SHA-256 differ)" in proc.stderr


def test_a_sweep_lands_in_the_bucket_and_resumes_from_it(s3, bucket, tmp_path, monkeypatch):
    url = f"s3://{bucket}/sweeps/s1"
    cmd = ["sweep", *SWEEP, "--vary", "concurrency=1,2", "--output", url]
    proc = cli(s3, tmp_path, *cmd)
    assert proc.returncode in (0, 1), proc.stderr
    files = check_marker(s3, bucket, "sweeps/s1")
    points = sorted(n for n in files if n.startswith("points/") and n.endswith("/result.json"))
    assert len(points) == 2
    assert {"sweep.json", "sweep.jsonl", "sweep.csv"} <= set(files)
    assert not any(n.startswith(".") or "/." in n for n in files)  # the sweep's lock stays local

    again = cli(s3, tmp_path, *cmd)  # resumed from the bucket: nothing left to run
    assert again.returncode == proc.returncode, again.stderr
    assert "2 done earlier, 0 to run" in again.stdout
    assert staged(tmp_path) == []

    # A point's result.json by its own URL: found through the sweep's marker above it.
    proc = cli(s3, tmp_path, "report", f"{url}/{points[0]}", "--json")
    stored = json.loads(s3.get(bucket, f"sweeps/s1/{points[0]}"))
    assert proc.returncode == (0 if stored["valid"] else 1), proc.stderr
    assert json.loads(proc.stdout) == stored
    proc = cli(s3, tmp_path, "compare", url, url)
    assert proc.returncode == 0, proc.stderr

    for name, value in s3.env.items():
        monkeypatch.setenv(name, value)
    import loadgen

    frame = loadgen.load_results(url)  # a row per point, each named by its URL
    assert sorted(frame["path"]) == [f"{url}/{p}" for p in points]
    frame = loadgen.load_sweep(url)  # the sweep's own reader takes the URL too
    assert sorted(frame["path"]) == [f"{url}/{p}" for p in points] and sorted(frame["concurrency"]) == [1, 2]


def test_the_marker_is_written_after_every_file_and_a_reader_refuses_an_upload_without_it(
        s3, bucket, tmp_path, monkeypatch):
    for name, value in s3.env.items():
        monkeypatch.setenv(name, value)
    remote = RemoteOutput(f"s3://{bucket}/up", {"endpoint_url": s3.endpoint})
    remote.check()
    local = Path(remote.stage())
    for name in ("result.json", "sweep.jsonl", "points/p1/result.json", "points/p1/summary.txt", "other.txt",
                 ".sweep.lock"):
        (local / name).parent.mkdir(parents=True, exist_ok=True)
        (local / name).write_text(name)
    order = []

    def put(name):
        order.append(name)
        assert (f"up/{MARKER}" in s3.keys(bucket)) == (name == MARKER), order  # never before the last file

    remote.upload(on_put=put)
    assert order == ["other.txt", "points/p1/summary.txt", "points/p1/result.json", "sweep.jsonl", "result.json",
                     MARKER]
    remote.discard()
    assert sorted(check_marker(s3, bucket, "up")) == sorted(order[:-1])

    s3.client.delete_object(Bucket=bucket, Key=f"up/{MARKER}")  # as an upload under way, or one that failed
    proc = cli(s3, tmp_path, "report", f"s3://{bucket}/up")
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == error_lines(proc.stderr)
    assert f"holds no complete loadgen upload (no {MARKER}" in proc.stderr


def test_an_upload_to_a_missing_bucket_is_retried_then_fails_in_one_line(s3, tmp_path, monkeypatch):
    for name, value in s3.env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv(TRIES_ENV, "3")
    remote = RemoteOutput("s3://no-such-bucket/p", {"endpoint_url": s3.endpoint})
    local = Path(remote.stage())
    (local / "result.json").write_text("{}")
    said = []
    with pytest.raises(StorageError, match=r"uploading to s3://no-such-bucket/p: result.json: .*\(tried 3 times\)"):
        remote.upload(say=said.append)
    assert len(said) == 2 and "try 2 of 3 in 0.5 s" in said[0] and "try 3 of 3 in 1 s" in said[1], said
    assert (local / "result.json").read_text() == "{}"  # the local copy is kept
    remote.discard()

    # From the command line the bucket is checked before anything runs: exit 2, one line.
    proc = cli(s3, tmp_path, "run", *RUN, "--output", "s3://no-such-bucket/p")
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == error_lines(proc.stderr)
    assert "--output: cannot write to s3://no-such-bucket/p: " in proc.stderr
    assert proc.stdout == ""
    assert staged(tmp_path) == []


def test_a_server_stopped_mid_upload_fails_it_without_a_marker_and_keeps_the_files(tmp_path, monkeypatch):
    with running_s3(str(tmp_path)) as s3:
        for name, value in s3.env.items():
            monkeypatch.setenv(name, value)
        monkeypatch.setenv(TRIES_ENV, "2")
        s3.create_bucket("bkt")
        remote = RemoteOutput("s3://bkt/p", {"endpoint_url": s3.endpoint})
        local = Path(remote.stage())
        for name in ("a.txt", "b.txt", "result.json"):
            (local / name).write_text(name)
        order = []

        def put(name):
            order.append(name)
            s3.process.kill()  # the store goes away after the first object

        with pytest.raises(StorageError, match=r"s3://bkt/p: b\.txt: .*\(tried 2 times\)"):
            remote.upload(say=lambda line: None, on_put=put)
        assert order == ["a.txt"]  # no marker: a reader takes nothing for complete
        assert sorted(p.name for p in local.iterdir()) == ["a.txt", "b.txt", "result.json"]
        remote.discard()


def test_a_sweep_whose_upload_fails_exits_2_naming_the_kept_files(tmp_path):
    with running_s3(str(tmp_path)) as s3:
        s3.create_bucket("bkt")
        # The hook ends the store once the point has run: the upload after the sweep fails.
        proc = cli(s3, tmp_path, "sweep", *SWEEP, "--vary", "concurrency=1", "--output", "s3://bkt/s",
                   "--after-point", f"kill -9 {s3.process.pid}", **{TRIES_ENV: "2"})
    assert proc.returncode == 2, proc.stderr
    [line] = error_lines(proc.stderr)
    assert line.startswith("error: --output: uploading to s3://bkt/s: ") and "(tried 2 times)" in line
    kept = line.rsplit("; the files are kept in ", 1)[1]
    assert os.path.dirname(kept) == str(tmp_path)
    assert os.path.isfile(os.path.join(kept, "sweep.jsonl"))
    assert [p for p in Path(kept).glob("points/*/result.json")]
    assert "try 2 of 2" in proc.stderr


def test_without_fsspec_the_error_names_the_extra(tmp_path):
    blocked = tmp_path / "blocked"
    blocked.mkdir()
    (blocked / "fsspec.py").write_text("raise ImportError('No module named fsspec')\n")
    env = clean_env(PYTHONPATH=str(blocked), TMPDIR=str(tmp_path))
    for args in (["report", "s3://b/p"], ["run", *RUN, "--output", "s3://b/p"]):
        proc = run_cli(*args, env=env)
        assert proc.returncode == 2, proc.stderr
        assert proc.stderr.strip().splitlines() == error_lines(proc.stderr)
        assert "pip install 'loadgen[s3]'" in proc.stderr


def test_file_urls_go_through_fsspec_too(tmp_path):
    url = f"file://{tmp_path}/out"
    env = clean_env(TMPDIR=str(tmp_path))
    proc = run_cli("run", *RUN, "--output", url, env=env)
    assert proc.returncode in (0, 1), proc.stderr
    assert (tmp_path / "out" / MARKER).is_file()
    stored = json.loads((tmp_path / "out" / "result.json").read_text())
    proc = run_cli("report", url, "--json", env=env)
    assert proc.returncode == (0 if stored["valid"] else 1), proc.stderr
    assert json.loads(proc.stdout) == stored


def _stored_texts(s3, bucket: str, prefix: str):
    """(key, text) of every object under ``prefix``."""
    return [(key, s3.get(bucket, key).decode(errors="replace")) for key in s3.keys(bucket, prefix)]


def test_secret_storage_options_are_used_but_never_written(s3, bucket, tmp_path):
    key_id, secret, token = "AKIAQ7Zr4Wm2Xb9Kp3Td", "Hs8Lq2Vz6Nc4Rw0Yt5Jk", "Fg3Pn7Xc1Vb5Mq9Zw2Ld"
    options = [f"endpoint_url={s3.endpoint}", f"key={key_id}", f"secret={secret}",
               f"client_kwargs.aws_session_token={token}", "config_kwargs.retries.max_attempts=3"]
    flags = [x for o in options for x in ("--storage-option", o)]
    url = f"s3://{bucket}/runs/secret"
    proc = cli(s3, tmp_path, "run", *RUN, "--output", url, *flags)
    assert proc.returncode in (0, 1), proc.stderr
    assert f"uploaded 4 files and {MARKER} to {url}" in proc.stdout  # the credentials were taken
    doc = json.loads(s3.get(bucket, "runs/secret/result.json"))
    recorded = [f"endpoint_url={s3.endpoint}", "key=[REDACTED]", "secret=[REDACTED]",
                "client_kwargs.aws_session_token=[REDACTED]", "config_kwargs.retries.max_attempts=3"]
    assert doc["settings"]["effective"]["storage_option"] == recorded
    assert doc["settings"]["given"]["storage_option"] == recorded

    # A sweep's files hold none either; a resume with other credentials is not refused
    # (the storage options are not part of what a point ran).
    url = f"s3://{bucket}/sweeps/secret"
    cmd = ["sweep", *SWEEP, "--vary", "concurrency=1,2", "--output", url]
    proc = cli(s3, tmp_path, *cmd, *flags)
    assert proc.returncode in (0, 1), proc.stderr
    other = [f"endpoint_url={s3.endpoint}", "key=AKIAOTHER", "secret=another-secret", "token=ab"]
    again = cli(s3, tmp_path, *cmd, *[x for o in other for x in ("--storage-option", o)])
    assert again.returncode == proc.returncode, again.stderr
    assert "2 done earlier, 0 to run" in again.stdout
    texts = [("run stdout", proc.stdout + again.stdout), ("run stderr", proc.stderr + again.stderr),
             *_stored_texts(s3, bucket, "runs/secret"), *_stored_texts(s3, bucket, "sweeps/secret")]
    assert len(texts) > 10
    for name, text in texts:
        for planted in (key_id, secret, token, "another-secret"):
            assert planted not in text, f"{name} holds {planted}"
    point = json.loads(s3.get(bucket, next(k for k, _ in texts if k.endswith("/result.json") and "points/" in k)))
    assert "secret=[REDACTED]" in point["settings"]["effective"]["storage_option"]
