"""``--tokenizer PATH_OR_NAME``: a Hugging Face tokenizer, loaded from local files only.

A ``tokenizer.json`` file, or a directory holding one, is read with the ``tokenizers``
package; any other name goes to ``transformers.AutoTokenizer`` (when installed) with
``HF_HUB_OFFLINE=1``, so that it comes from the local cache or not at all.
"""

from __future__ import annotations

import os
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Iterator, List, Optional, Sequence

from loadgen.files import TOKENIZER_LIMIT_BYTES, read_text

if TYPE_CHECKING:  # numpy is imported where it is used
    import numpy as np

__all__ = ["Tokenizer", "load_tokenizer"]


@contextmanager
def _offline() -> Iterator[None]:
    saved = {k: os.environ.get(k) for k in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")}
    os.environ.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


class Tokenizer:
    """A loaded tokenizer: encode, decode, and the ids that prompts are built from.

    Args:
        name: what ``--tokenizer`` gave.
        impl: a ``tokenizers.Tokenizer`` or a ``transformers`` tokenizer.
    """

    def __init__(self, name: str, impl: Any) -> None:
        self.name = name
        self._impl = impl
        self._fast = hasattr(impl, "encode_batch")  # tokenizers.Tokenizer
        self._pool: Optional[np.ndarray] = None

    def encode(self, text: str) -> List[int]:
        """The token ids of ``text``, without special tokens."""
        if self._fast:
            return list(self._impl.encode(text, add_special_tokens=False).ids)
        return list(self._impl.encode(text, add_special_tokens=False))

    def count(self, text: str) -> int:
        """How many tokens ``text`` is."""
        return len(self.encode(text))

    def decode(self, ids: Sequence[int]) -> str:
        """The text of token ids, special tokens left out."""
        return str(self._impl.decode([int(i) for i in ids], skip_special_tokens=True))

    def word_ids(self) -> np.ndarray:
        """Ids of the ordinary tokens (their text is letters or digits): what prompts
        are drawn from, so that a decoded prompt re-encodes to about as many tokens."""
        import numpy as np

        if self._pool is None:
            vocab = self._impl.get_vocab()
            keep = []
            for i in vocab.values():
                text = self.decode([i]).strip()
                if text and text.isalnum() and text.isascii():
                    keep.append(i)
            if not keep:
                raise ValueError(f"--tokenizer {self.name}: no token of its vocabulary is a plain word")
            self._pool = np.asarray(sorted(keep), dtype=np.int64)
        return self._pool


def load_tokenizer(spec: str) -> Tokenizer:
    """The tokenizer ``--tokenizer`` names: a tokenizer.json file or a directory with one
    (``tokenizers``), else a local path or cached name for ``transformers``.

    Raises:
        ValueError: not found locally, or the package it needs is not installed; the
            message says which and what to install.
    """
    path = os.path.expanduser(spec)
    file = os.path.join(path, "tokenizer.json") if os.path.isdir(path) else path
    if os.path.isfile(file):
        try:
            import tokenizers
        except ImportError:
            raise ValueError(f"--tokenizer {spec}: reading tokenizer.json needs the 'tokenizers' package "
                             "(pip install 'loadgen[llm]')") from None
        text = read_text(file, what="--tokenizer", limit_bytes=TOKENIZER_LIMIT_BYTES)
        try:
            return Tokenizer(spec, tokenizers.Tokenizer.from_str(text))
        except Exception as e:  # tokenizers raises its own Exception subclass
            raise ValueError(f"--tokenizer {spec}: cannot read {file}: {e}") from None
    try:
        import transformers
    except ImportError:
        raise ValueError(f"--tokenizer {spec}: no tokenizer.json there, and loading a name needs 'transformers' "
                         "(not installed); give a path to tokenizer.json or its directory") from None
    with _offline():
        try:
            impl = transformers.AutoTokenizer.from_pretrained(spec)
        except Exception as e:  # OSError, ValueError, ... from the hub client
            raise ValueError(f"--tokenizer {spec}: not found as a path or in the local Hugging Face cache "
                             f"(nothing is downloaded): {str(e).splitlines()[0] if str(e) else type(e).__name__}"
                             ) from None
    return Tokenizer(spec, impl)
