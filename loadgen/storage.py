"""Results in object storage: ``--output s3://bucket/prefix`` (or any fsspec URL: gs://,
az://, file://, ...) and readers of such URLs.

A command whose ``--output`` is a URL writes its files to a local staging folder as it
would to a local ``--output`` (:func:`stage_output`), then uploads them (:func:`publish`)
through fsspec: every file with bounded retries and backoff, the main documents
(``result.json``, ``sweep.jsonl``) last, and last of all :data:`MARKER`, a manifest of
every file with its size and SHA-256. An earlier marker is deleted before the first file,
so that a reader never takes a partial upload for a complete one: readers
(:func:`local_copies`) refuse a URL without a marker, and check each file they download
against it. A failed upload keeps the staging folder and names it.

Credentials come from the usual places (for S3: the ``AWS_*`` environment variables,
``~/.aws``, fsspec's configuration); ``--storage-option KEY=VALUE`` (or
``LOADGEN_STORAGE_OPTION``, ``;``-separated) passes filesystem options such as
``endpoint_url``. fsspec and s3fs are the ``s3`` extra: ``pip install 'loadgen[s3]'``.
The values of options whose key names a secret (:data:`SECRET_OPTION_WORDS`) are redacted
from everything a run writes (:func:`storage_secrets`).
"""

from __future__ import annotations

import contextlib
import json
import os
import posixpath
import shutil
import sys
import tempfile
import time
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple

from loadgen.files import HLOG_LIMIT_BYTES, MIB, RESULT_LIMIT_BYTES, open_bounded, size_text

__all__ = ["MARKER", "MARKER_SCHEMA", "STORAGE_ENV", "TRIES_ENV", "LocalCopies", "RemoteOutput", "StorageError",
           "SECRET_OPTION_WORDS", "is_remote", "local_copies", "parse_storage_options", "publish", "stage_output",
           "storage_secrets", "with_remote_io"]

#: The completion marker, written last: a JSON manifest of the upload's files.
MARKER = "_SUCCESS"
MARKER_SCHEMA = "loadgen.upload/1"
#: Filesystem options for readers (and the default of ``--storage-option``).
STORAGE_ENV = "LOADGEN_STORAGE_OPTION"
#: A ``--storage-option`` whose key holds one of these words (case-insensitive, anywhere:
#: ``key``, ``secret``, ``client_kwargs.aws_session_token``) carries a secret.
SECRET_OPTION_WORDS = ("key", "secret", "token", "password", "credential", "session")
_MIN_SECRET_CHARS = 4  # a shorter value is redacted with its key (``key=1``), not wherever it appears
#: How many times each object is tried before the upload fails (default :data:`TRIES`).
TRIES_ENV = "LOADGEN_STORAGE_TRIES"
TRIES = 5
BACKOFF_S = 0.5  # before the second try; doubled each time, at most BACKOFF_MAX_S
BACKOFF_MAX_S = 8.0
#: The files a sweep's folder and a run's are read by, uploaded last (in this order).
_MAIN_FILES = ("sweep.json", "sweep.csv", "sweep.jsonl", "result.json")
_INSTALL = "pip install 'loadgen[s3]'"
_CHUNK = MIB


class StorageError(ValueError):
    """Object storage cannot be written or read as asked; the message is one line."""


def is_remote(path: Any) -> bool:
    """Whether ``path`` is a URL for fsspec (``scheme://...``) rather than a local path."""
    if not isinstance(path, str):
        return False
    scheme, sep, _ = path.partition("://")
    return bool(sep) and scheme.replace("+", "").replace("-", "").isalnum() and len(scheme) > 1


def parse_storage_options(items: Sequence[str], what: str = "--storage-option") -> Dict[str, Any]:
    """``KEY=VALUE`` items as fsspec filesystem options: ``true``/``false`` and integers
    converted, ``a.b=v`` nested (``client_kwargs.region_name=eu-west-1``)."""
    options: Dict[str, Any] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise StorageError(f"{what}: must be KEY=VALUE, like endpoint_url=http://127.0.0.1:9000; got {item!r}")
        value: Any = raw
        if raw.lower() in ("true", "false"):
            value = raw.lower() == "true"
        elif raw.lstrip("-").isdigit():
            value = int(raw)
        *parents, last = key.split(".")
        node = options
        for name in parents:
            child = node.setdefault(name, {})
            if not isinstance(child, dict):
                raise StorageError(f"{what}: {key!r}: {name} is given both as a value and as a table")
            node = child
        node[last] = value
    return options


def storage_secrets(items: Sequence[str]) -> List[str]:
    """What a redactor replaces for ``--storage-option`` items (each may hold several,
    ``;``-separated, as :data:`STORAGE_ENV` does): the value of each option whose key names
    a secret (:data:`SECRET_OPTION_WORDS`), so that ``secret=...`` is recorded as
    ``secret=[REDACTED]``; a value shorter than 4 characters with its key, ``KEY=VALUE``
    (on its own it would redact every ``1`` of a document)."""
    out: List[str] = []
    for item in (part for items_text in items for part in str(items_text).split(";")):
        key, sep, value = item.partition("=")
        if sep and value.strip() and any(word in key.lower() for word in SECRET_OPTION_WORDS):
            out.append(value if len(value.strip()) >= _MIN_SECRET_CHARS else item.strip())
    return out


def env_storage_options() -> Dict[str, Any]:
    """The options of :data:`STORAGE_ENV` (``;``-separated ``KEY=VALUE``)."""
    raw = os.environ.get(STORAGE_ENV, "")
    return parse_storage_options([s.strip() for s in raw.split(";") if s.strip()], STORAGE_ENV)


def _reason(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0]}" if text else type(e).__name__


def _filesystem(url: str, options: Dict[str, Any], what: str) -> Tuple[Any, str]:
    """(the fsspec filesystem, the path in it) of ``url``; a missing package names the extra."""
    try:
        from fsspec.core import url_to_fs
    except ImportError:
        raise StorageError(f"{what} {url}: object storage needs fsspec (and s3fs for s3://): {_INSTALL}") from None
    try:
        fs, path = url_to_fs(url, skip_instance_cache=True, **options)
    except ImportError as e:
        raise StorageError(f"{what} {url}: {_reason(e)}; for s3:// {_INSTALL}") from None
    except (ValueError, TypeError) as e:
        raise StorageError(f"{what} {url}: {_reason(e)}") from None
    return fs, str(path).rstrip("/")


def _is_local(fs: Any) -> bool:
    protocol = fs.protocol if isinstance(fs.protocol, (tuple, list)) else (fs.protocol,)
    return "file" in protocol or "local" in protocol


def _tries() -> int:
    raw = os.environ.get(TRIES_ENV)
    if raw is None:
        return TRIES
    try:
        n = int(raw)
    except ValueError:
        n = 0
    if not 1 <= n <= 100:
        raise StorageError(f"{TRIES_ENV}: must be a whole number from 1 to 100, got {raw!r}")
    return n


def _retrying(action: Callable[[], Any], what: str, say: Callable[[str], None]) -> Any:
    """``action()``, tried up to :func:`_tries` times with doubling backoff; the last
    error as a :class:`StorageError` naming ``what`` and the number of tries."""
    tries = _tries()
    for attempt in range(1, tries + 1):
        try:
            return action()
        except Exception as e:  # every error of a store: its client's, the network's, a missing bucket
            if attempt == tries:
                raise StorageError(f"{what}: {_reason(e)} (tried {tries} times)") from None
            delay = min(BACKOFF_S * 2 ** (attempt - 1), BACKOFF_MAX_S)
            say(f"{what}: {_reason(e)}; try {attempt + 1} of {tries} in {delay:g} s")
            time.sleep(delay)
    raise AssertionError("unreachable")


def _warn(text: str) -> None:
    print(f"warning: {text}", file=sys.stderr, flush=True)


def _digest(path: str) -> Tuple[int, str]:
    """(size, SHA-256 hex) of a staged file."""
    import hashlib  # here and below: what an upload needs is imported for an upload

    h = hashlib.sha256()
    size = 0
    with open_bounded(path, what="--output", limit_bytes=1 << 50) as f:
        while True:
            chunk = f.read(_CHUNK)
            if not chunk:
                return size, h.hexdigest()
            size += len(chunk)
            h.update(chunk)


def _staged_files(local: str) -> List[str]:
    """The staged files, relative and '/'-separated, in upload order: the others first,
    then the points' result.json, then the folder's own main documents, sweep.jsonl and
    result.json last. Hidden files (a lock, a temporary file) stay local."""
    found: List[str] = []
    for root, dirs, names in os.walk(local):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        rel = os.path.relpath(root, local)
        found.extend(posixpath.join(*([] if rel == "." else rel.split(os.sep)), n)
                     for n in sorted(names) if not n.startswith("."))

    def order(name: str) -> Tuple[int, int, str]:
        top = "/" not in name
        if top and name in _MAIN_FILES:
            return 2, _MAIN_FILES.index(name), name
        return (1 if posixpath.basename(name) == "result.json" else 0), 0, name

    return sorted(found, key=order)


def _read_marker(fs: Any, base: str) -> Optional[Dict[str, Dict[str, Any]]]:
    """The files of the complete upload at ``base`` (None when it has no marker)."""
    path = f"{base}/{MARKER}" if base else MARKER
    try:
        with fs.open(path, "rb") as f:
            data = f.read(RESULT_LIMIT_BYTES + 1)
    except (FileNotFoundError, IsADirectoryError):
        return None
    if len(data) > RESULT_LIMIT_BYTES:
        raise StorageError(f"{path} holds more than {size_text(RESULT_LIMIT_BYTES)}: not a loadgen upload marker")
    try:
        doc = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        doc = None
    files = doc.get("files") if isinstance(doc, dict) and doc.get("schema") == MARKER_SCHEMA else None
    if not isinstance(files, dict):
        raise StorageError(f"{path} is not a loadgen upload marker (no 'schema': '{MARKER_SCHEMA}' with 'files')")
    return files


def _download(fs: Any, remote: str, local: str, entry: Dict[str, Any], limit: int, shown: str) -> None:
    """Copies ``remote`` to ``local``, at most ``limit`` bytes, checked against its entry
    in the marker (size and SHA-256)."""
    import hashlib

    os.makedirs(os.path.dirname(local), exist_ok=True)
    h = hashlib.sha256()
    size = 0
    with fs.open(remote, "rb") as src, open(local, "wb") as dst:
        while True:
            chunk = src.read(min(_CHUNK, limit + 1 - size))
            if not chunk:
                break
            size += len(chunk)
            if size > limit:
                raise StorageError(f"{shown} holds more than {size_text(limit)}, the limit for a result file")
            h.update(chunk)
            dst.write(chunk)
    if size != entry.get("size") or h.hexdigest() != entry.get("sha256"):
        raise StorageError(f"{shown} is not the file its upload's {MARKER} lists (size or SHA-256 differ): "
                           "it changed since, or another upload is under way")


def _limit(name: str) -> int:
    return HLOG_LIMIT_BYTES if name.endswith(".hlog") else RESULT_LIMIT_BYTES


class RemoteOutput:
    """A URL given as ``--output``, staged in a local folder (:attr:`local`) until
    :meth:`upload`.

    Attributes:
        url: the URL as given.
        local: the local staging folder the command writes to.
        done: the upload finished, or its failure was reported (the folder named).
    """

    def __init__(self, url: str, storage_options: Dict[str, Any], what: str = "--output") -> None:
        self.url, self.what = url, what
        self.fs, self.root = _filesystem(url, storage_options, what)
        self.local = ""
        self.done = False
        self._earlier: Dict[str, Dict[str, Any]] = {}

    def check(self) -> None:
        """Fails (:class:`StorageError`) unless a probe object can be written and removed
        at the URL: before anything runs, like a local ``--output``."""
        import uuid

        probe = f"{self.root}/.loadgen-probe-{uuid.uuid4().hex}"
        try:
            if _is_local(self.fs):
                self.fs.makedirs(self.root, exist_ok=True)
            self.fs.pipe_file(probe, b"")
            self.fs.rm_file(probe)
        except Exception as e:  # the store's own errors: no bucket, no permission, no server
            raise StorageError(f"{self.what}: cannot write to {self.url}: {_reason(e)}") from None

    def stage(self, seed: Optional[Sequence[str]] = ()) -> str:
        """Makes the local staging folder, with the files of the complete upload already
        at the URL named in ``seed`` (None: all of them but report.html's and those over
        the result limit): a sweep resumes from them, results.csv gains a row. Returns
        the folder."""
        self.local = tempfile.mkdtemp(prefix="loadgen-output-")
        self.fs.invalidate_cache()
        earlier = _read_marker(self.fs, self.root) or {}
        for rel, entry in sorted(earlier.items()):
            wanted = (not rel.endswith(".html") and int(entry.get("size", 0)) <= _limit(rel)) if seed is None \
                else rel in seed
            if wanted:
                _download(self.fs, f"{self.root}/{rel}", os.path.join(self.local, *rel.split("/")), entry,
                          _limit(rel), f"{self.url.rstrip('/')}/{rel}")
        self._earlier = earlier
        return self.local

    def upload(self, say: Callable[[str], None] = _warn,
               on_put: Optional[Callable[[str], None]] = None) -> List[str]:
        """Uploads the staged files: the earlier marker deleted first, every file (each
        tried :data:`TRIES` times), the main documents last, then :data:`MARKER` listing
        them and the earlier upload's files not replaced. ``on_put(name)`` is called after
        each object (the marker included). Returns the names uploaded.

        Raises:
            StorageError: an object could not be written; no marker was written.
        """
        names = _staged_files(self.local)
        marker = f"{self.root}/{MARKER}"
        shown = f"{self.what}: uploading to {self.url}"

        def drop_marker() -> None:
            if self.fs.exists(marker):
                self.fs.rm_file(marker)

        self.fs.invalidate_cache()
        _retrying(drop_marker, f"{shown}: removing the earlier {MARKER}", say)
        files = {rel: entry for rel, entry in self._earlier.items() if rel not in names}
        for rel in names:
            local = os.path.join(self.local, *rel.split("/"))
            size, sha = _digest(local)
            target = f"{self.root}/{rel}"

            def put(local: str = local, target: str = target) -> None:
                if _is_local(self.fs):
                    self.fs.makedirs(posixpath.dirname(target), exist_ok=True)
                self.fs.put_file(local, target)

            _retrying(put, f"{shown}: {rel}", say)
            files[rel] = {"size": size, "sha256": sha}
            if on_put is not None:
                on_put(rel)
        doc = {"schema": MARKER_SCHEMA, "created": time.time(), "files": dict(sorted(files.items()))}
        data = (json.dumps(doc, indent=1) + "\n").encode("utf-8")
        _retrying(lambda: self.fs.pipe_file(marker, data), f"{shown}: {MARKER}", say)
        if on_put is not None:
            on_put(MARKER)
        return names

    def discard(self) -> None:
        """Removes the staging folder."""
        shutil.rmtree(self.local, ignore_errors=True)

    def keep_note(self) -> None:
        """At the command's end: when the staging folder holds files that were neither
        uploaded nor reported, says where they are; removes it when it holds none."""
        if self.done or not self.local:
            return
        self.done = True
        if _staged_files(self.local):
            _warn(f"{self.what} {self.url}: nothing was uploaded; the files written are kept in {self.local}")
        else:
            self.discard()


def stage_output(holder: Any, storage_options: Sequence[str], stack: contextlib.ExitStack,
                 seed: Optional[Sequence[str]] = ()) -> Optional[RemoteOutput]:
    """For a URL in ``holder.output`` (run options, or a command's arguments): checks that
    it can be written, stages it in a local folder (see :meth:`RemoteOutput.stage`) and
    sets ``holder.output`` to that folder; ``stack`` says, at its close, where files that
    were not uploaded are. None (nothing changed) for a local ``--output``.

    Raises:
        StorageError: the URL cannot be written, or fsspec (or its filesystem) is missing.
    """
    url = getattr(holder, "output", None)
    if not is_remote(url):
        return None
    options = {**env_storage_options(), **parse_storage_options(storage_options)}
    remote = RemoteOutput(str(url), options)
    remote.check()
    stack.callback(remote.keep_note)
    try:
        holder.output = remote.stage(seed)
    except Exception as e:  # the earlier upload's files could not be read back
        raise StorageError(f"--output {url}: reading the earlier upload: {_reason(e)}") from None
    return remote


def publish(remote: Optional[RemoteOutput], body: Callable[[], int], quiet: bool, json_out: bool) -> int:
    """``body()`` (the command's end: its files are written to the staging folder), then
    the upload. Returns ``body``'s exit code; 2 when the upload failed, with one line
    naming the error and the staging folder, which is kept (nothing measured is lost)."""
    if remote is None:
        return body()
    try:
        code = body()
    except BrokenPipeError:  # stdout closed: the files are written, they are uploaded all the same
        _upload_or_keep(remote, quiet=True)
        raise
    return code if _upload_or_keep(remote, quiet=quiet, json_out=json_out) else 2


def _upload_or_keep(remote: RemoteOutput, quiet: bool, json_out: bool = False) -> bool:
    remote.done = True
    try:
        names = remote.upload()
    except StorageError as e:
        print(f"error: {e}; the files are kept in {remote.local}", file=sys.stderr, flush=True)
        return False
    remote.discard()
    if not quiet:
        print(f"uploaded {len(names)} files and {MARKER} to {remote.url} (staged in {remote.local}, now removed)",
              file=sys.stderr if json_out else sys.stdout, flush=True)
    return True


class LocalCopies:
    """Local paths for paths and URLs: a URL's files downloaded into a temporary folder.

    Attributes:
        paths: the local path of each path given, in order (local ones unchanged).
    """

    def __init__(self, folder: str) -> None:
        self.folder = folder
        self.paths: List[str] = []
        self._urls: List[Tuple[str, str]] = []  # (local root, URL)

    def url_of(self, path: str) -> str:
        """``path`` as the user named it: a file of a downloaded URL as a URL."""
        for local, url in self._urls:
            if path == local or path.startswith(local + os.sep):
                rest = os.path.relpath(path, local).replace(os.sep, "/")
                return url if rest == "." else f"{url.rstrip('/')}/{rest}"
        return path

    def add(self, path: str, what: str) -> str:
        """The local path of ``path``: a URL's complete upload (or the part of it under
        the URL) downloaded first, each file within its limit and checked against the
        upload's marker."""
        if not is_remote(path):
            self.paths.append(path)
            return path
        fs, root = _filesystem(path, env_storage_options(), what)
        local = os.path.join(self.folder, str(len(self._urls)))
        try:
            files = _find_upload(fs, root, path, what)
            for rel, (remote, entry) in files.items():
                target = os.path.join(local, *rel.split("/")) if rel else local
                _download(fs, remote, target, entry, _limit(remote), f"{what} {path}: {remote}")
        except StorageError:
            raise
        except Exception as e:  # the store's own errors: no bucket, no permission, no server
            raise StorageError(f"{what}: cannot read {path}: {_reason(e)}") from None
        self._urls.append((local, path))
        self.paths.append(local)
        return local


def _find_upload(fs: Any, root: str, url: str, what: str) -> Dict[str, Tuple[str, Dict[str, Any]]]:
    """{path under ``url`` ('' for the file itself): (the object, its marker entry)} of
    the nearest complete upload at or above ``root`` that holds it; the readers'
    files only (report.html and request records over the result limit are left)."""
    fs.invalidate_cache()
    base = root
    while True:
        files = _read_marker(fs, base)
        if files is not None:
            rel = root[len(base):].strip("/")
            found: Dict[str, Tuple[str, Dict[str, Any]]] = {}
            for name, entry in files.items():
                if name.endswith(".html") or (int(entry.get("size", 0)) > _limit(name)
                                              and posixpath.basename(name) not in _MAIN_FILES):
                    continue
                if name == rel:
                    found[""] = (f"{base}/{name}", entry)
                elif not rel or name.startswith(rel + "/"):
                    found[name[len(rel):].lstrip("/")] = (f"{base}/{name}", entry)
            if found:
                return found
            raise StorageError(f"{what}: {url} is not in the upload at {base} (its {MARKER} lists no such file)")
        parent = posixpath.dirname(base)
        if parent in (base, "", "/"):
            break
        base = parent
    raise StorageError(f"{what}: {url} holds no complete loadgen upload (no {MARKER} at it or above: the upload "
                       "is unfinished or failed, or it is not loadgen's output)")


@contextlib.contextmanager
def local_copies(paths: Sequence[str], what: str) -> Iterator[LocalCopies]:
    """Local copies of ``paths``' URLs (see :meth:`LocalCopies.add`), removed at the end.

    Raises:
        StorageError: a URL has no complete upload, cannot be read, a file is over its
            limit, or fsspec is missing.
    """
    folder = ""
    try:
        if any(is_remote(p) for p in paths):
            folder = tempfile.mkdtemp(prefix="loadgen-input-")
        copies = LocalCopies(folder)
        for p in paths:
            copies.add(p, what)
        yield copies
    finally:
        if folder:
            shutil.rmtree(folder, ignore_errors=True)


#: The arguments of each command that name results to read: (attribute, how it is named).
#: merge's --output is staged here too (run, sweep and find-peak stage theirs, which may
#: also come from --config or the environment).
_INPUT_ARGS = {"report": (("paths", "report RESULT_OR_DIR"),), "hlog": (("paths", "hlog FILE"),),
               "merge": (("paths", "merge RESULT_OR_DIR"),),
               "compare": (("base", "compare BASE"), ("new", "compare NEW"))}


def with_remote_io(args: Any, handler: Callable[[Any], int]) -> int:
    """``handler(args)`` (report, hlog, compare, merge) with the URLs among its input
    arguments replaced by local copies, and merge's ``--output`` URL staged and
    published (:func:`publish`). A URL that cannot be read or written is a usage error."""
    from loadgen.cli.common import UsageError

    command = getattr(args, "command", None) or ""
    with contextlib.ExitStack() as stack:
        try:
            for attr, what in _INPUT_ARGS.get(command, ()):
                value = getattr(args, attr, None)
                values = [str(v) for v in value] if isinstance(value, list) else [str(value)]
                if any(is_remote(v) for v in values):
                    copies = stack.enter_context(local_copies(values, what))
                    setattr(args, attr, copies.paths if isinstance(value, list) else copies.paths[0])
            remote = None
            if command == "merge":
                remote = stage_output(args, getattr(args, "storage_option", None) or [], stack, seed=("results.csv",))
        except StorageError as e:
            raise UsageError(str(e)) from None
        as_json = bool(getattr(args, "json", False))
        return publish(remote, lambda: handler(args), bool(getattr(args, "quiet", False)) or as_json, as_json)
