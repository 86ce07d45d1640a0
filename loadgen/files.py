"""Reading the files a user names (results, config files, traces, datasets, logs), each
read bounded.

Every file loadgen reads because a user named it goes through this module: it is read
whole with :func:`read_bytes` or :func:`read_text`, or streamed with
:func:`open_bounded`, and never past a limit of its kind (the ``*_LIMIT_BYTES``
constants). A regular file larger than its limit is refused before any of it is read; a
file whose size ``stat`` cannot tell (``/dev/zero``, a pipe, a file still growing) is
read up to the limit and one byte more, then refused. Whatever goes wrong (a missing
file, a folder, no permission, too large, not UTF-8 text) is one
:class:`InputFileError` whose one-line message names how the file was given (its flag),
the file, and for a size, the limit.
"""

from __future__ import annotations

import io
import os
import stat
from typing import IO, Any, Optional, Union

__all__ = ["CERT_LIMIT_BYTES", "CONFIG_LIMIT_BYTES", "DATASET_LIMIT_BYTES", "HLOG_LIMIT_BYTES", "PAYLOAD_LIMIT_BYTES",
           "RESULT_LIMIT_BYTES", "SWEEP_LIMIT_BYTES", "TEMPLATE_LIMIT_BYTES",
           "TOKENIZER_LIMIT_BYTES", "TOOLS_LIMIT_BYTES", "TRACE_LIMIT_BYTES", "FileTooLargeError", "InputFileError", "open_bounded",
           "read_bytes", "read_text", "size_text"]

MIB = 1 << 20
#: A result document (``report``, ``merge``, ``compare``), and the results.csv a run
#: appends to.
RESULT_LIMIT_BYTES = 64 * MIB
#: A sweep folder's sweep.json or sweep.jsonl (``report``, ``compare``, ``merge``, a
#: resumed ``sweep``): a line of up to a result document per point, thousands of points.
SWEEP_LIMIT_BYTES = 1024 * MIB
#: A config file (``--config``, ``--points``, ``TestSettings.FromConfig``'s mlperf.conf
#: and user.conf).
CONFIG_LIMIT_BYTES = 64 * MIB
#: A request template or payload (``--request-template``, ``--payload``).
TEMPLATE_LIMIT_BYTES = 64 * MIB
#: Samples or request bodies (``--payload``: ``.npy``, ``.npz``, ``.jsonl`` or raw lines).
PAYLOAD_LIMIT_BYTES = 256 * MIB
#: A certificate bundle (``--ca-file``).
CERT_LIMIT_BYTES = 16 * MIB
#: An arrival trace (``--trace``): 64 Mi offsets as a ``.npy`` of int64.
TRACE_LIMIT_BYTES = 512 * MIB
#: An LLM dataset (``--dataset``): ShareGPT's common file is about 650 MiB.
DATASET_LIMIT_BYTES = 1024 * MIB
#: A tools file (``--tools``): function schemas, a few KiB each.
TOOLS_LIMIT_BYTES = 64 * MIB
#: A tokenizer.json (``--tokenizer``): the largest vocabularies' are tens of MiB.
TOKENIZER_LIMIT_BYTES = 256 * MIB
#: An HdrHistogram interval log (``hlog``), streamed line by line: days of 1-s intervals.
HLOG_LIMIT_BYTES = 4096 * MIB

PathLike = Union[str, "os.PathLike[str]"]


class InputFileError(ValueError):
    """A file a user named cannot be read as asked; the message is one line,
    ``"{what}: {problem}"``, naming how it was given (the flag), the file, and what is
    wrong.

    Attributes:
        what: how the file was given (its flag).
        problem: the message without ``what``, for a caller that names the flag itself.
    """

    def __init__(self, what: str, problem: str) -> None:
        self.what, self.problem = what, problem
        super().__init__(f"{what}: {problem}")


class FileTooLargeError(InputFileError):
    """A file over the limit of its kind."""


def size_text(n: int) -> str:
    """``n`` bytes for a message: '64 MiB', '1.5 GiB', '812 bytes'."""
    for unit, scale in (("GiB", 1 << 30), ("MiB", MIB), ("KiB", 1 << 10)):
        if n >= scale:
            value = n / scale
            return f"{value:.0f} {unit}" if value == int(value) else f"{value:.1f} {unit}"
    return f"{n} bytes"


def _too_large(what: str, path: str, limit_bytes: int, size: Optional[int] = None) -> FileTooLargeError:
    limit = size_text(limit_bytes)
    if size is not None:
        return FileTooLargeError(what, f"{path} is {size_text(size)}, over the {limit} limit for {what}")
    return FileTooLargeError(what, f"{path} holds more than {limit}, the limit for {what}")


def _os_error(what: str, path: str, e: OSError) -> InputFileError:
    if isinstance(e, IsADirectoryError):
        return InputFileError(what, f"{path} is a folder, not a file")
    return InputFileError(what, f"cannot read {path}: {e.strerror or e}")


class _BoundedRaw(io.RawIOBase):
    """An unbuffered binary file that raises :class:`InputFileError` once a read reaches
    past ``limit_bytes`` into it. It gives no ``fileno()``, so that readers such as
    numpy's read through it rather than around it."""

    def __init__(self, raw: io.FileIO, what: str, path: str, limit_bytes: int) -> None:
        super().__init__()
        self._raw, self._what, self._path, self._limit = raw, what, path, limit_bytes
        self._pos = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return self._raw.seekable()

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        self._pos = self._raw.seek(offset, whence)
        return self._pos

    def tell(self) -> int:
        return self._pos

    def readinto(self, buffer: Any) -> int:
        view = memoryview(buffer).cast("B")
        want = min(len(view), self._limit + 1 - self._pos)
        try:
            n = self._raw.readinto(view[:want]) or 0
        except OSError as e:  # such as EISDIR, or EIO
            raise _os_error(self._what, self._path, e) from None
        self._pos += n
        if self._pos > self._limit:
            raise _too_large(self._what, self._path, self._limit)
        return n

    def readall(self) -> bytes:
        out = bytearray()
        chunk = bytearray(MIB)
        while True:
            n = self.readinto(chunk)
            if not n:
                return bytes(out)
            out += memoryview(chunk)[:n]

    def close(self) -> None:
        try:
            self._raw.close()
        finally:
            super().close()


def open_bounded(path: PathLike, *, what: str, limit_bytes: int) -> IO[bytes]:
    """``path`` opened for reading bytes, bounded: a regular file over ``limit_bytes`` is
    refused here, and a read that reaches past ``limit_bytes`` of any other raises.

    Args:
        path: the file the user named.
        what: how it was given, for messages: its flag (``--trace``), or the command and
            its argument (``hlog FILE``).
        limit_bytes: the most that is read.

    Returns:
        A buffered binary file object (a context manager); its reads raise
        :class:`InputFileError` past the limit.

    Raises:
        InputFileError: the file cannot be opened, is a folder, or is over the limit.
    """
    name = os.fspath(path)
    try:
        raw = io.FileIO(name, "r")
    except OSError as e:
        raise _os_error(what, name, e) from None
    except ValueError as e:  # a NUL in the name
        raise InputFileError(what, f"cannot read {name!r}: {e}") from None
    try:
        st = os.fstat(raw.fileno())
        if stat.S_ISDIR(st.st_mode):
            raise InputFileError(what, f"{name} is a folder, not a file")
        if stat.S_ISREG(st.st_mode) and st.st_size > limit_bytes:
            raise _too_large(what, name, limit_bytes, st.st_size)
    except BaseException:
        raw.close()
        raise
    return io.BufferedReader(_BoundedRaw(raw, what, name, limit_bytes))


def read_bytes(path: PathLike, *, what: str, limit_bytes: int) -> bytes:
    """The bytes of ``path``, at most ``limit_bytes`` of them (:func:`open_bounded`).

    Raises:
        InputFileError: the file cannot be read, is a folder, or is over the limit.
    """
    name = os.fspath(path)
    with open_bounded(name, what=what, limit_bytes=limit_bytes) as f:
        return f.read()


def read_text(path: PathLike, *, what: str, limit_bytes: int) -> str:
    """The text of ``path``: UTF-8 (a byte-order mark is dropped), at most ``limit_bytes``.

    Raises:
        InputFileError: the file cannot be read, is over the limit, or is not UTF-8 text
            (naming the byte).
    """
    name = os.fspath(path)
    data = read_bytes(name, what=what, limit_bytes=limit_bytes)
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise InputFileError(what, f"{name} is not UTF-8 text (byte {e.start})") from None
