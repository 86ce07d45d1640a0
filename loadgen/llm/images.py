"""Image inputs of vision chat requests (``--images DIR``, ``--images-per-request N``).

The folder's images (``.png``, ``.jpg``, ``.jpeg``, ``.webp``, ``.gif``) are read and
base64-encoded once, before the run, each as a ``data:`` URL whose MIME type comes from
the file's first bytes (a file whose bytes are no image of those kinds is refused). Each
prepared chat body's last user message then holds its text and N image parts, the
images drawn with the run's sample seed (a stream of its own, so that the prompts drawn
from the seed stay those of a run without images). A conversation's images go with its
first turn only: the history sent with the later turns holds that message's text.
"""

from __future__ import annotations

import base64
import dataclasses
import os
from typing import Any, Dict, List, Optional

from loadgen.files import InputFileError, read_bytes, size_text

__all__ = ["IMAGE_LIMIT_BYTES", "IMAGE_SUFFIXES", "ImageSet", "attach_images", "image_mime", "load_images",
           "text_only"]

#: The file names read as images, by suffix (any case).
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".webp", ".gif")
#: The largest image file read (servers' own limits are near 20 MiB).
IMAGE_LIMIT_BYTES = 64 << 20
# Added to the sample seed for the images' own draw.
_IMAGES_STREAM = 0x696D61676573  # "images"


def image_mime(data: bytes) -> Optional[str]:
    """The MIME type of an image from its first bytes (PNG, JPEG, GIF, WebP); None for
    anything else."""
    if data.startswith(b"\x89PNG\r\n\x1a\n"):
        return "image/png"
    if data.startswith(b"\xff\xd8\xff"):
        return "image/jpeg"
    if data.startswith((b"GIF87a", b"GIF89a")):
        return "image/gif"
    if len(data) >= 12 and data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "image/webp"
    return None


@dataclasses.dataclass
class ImageSet:
    """A folder's images, encoded: each one's ``data:`` URL and its size in bytes."""

    folder: str
    names: List[str]
    urls: List[str]
    sizes: List[int]

    def describe(self, per_request: int) -> Dict[str, Any]:
        """The result's ``llm.images`` before the run (``count`` and ``bytes`` sent are
        added as the requests go)."""
        return {"folder": self.folder, "folder_files": len(self.urls), "folder_bytes": sum(self.sizes),
                "per_request": per_request}


def load_images(folder: str) -> ImageSet:
    """Reads and encodes every image of ``folder`` (sorted by name).

    Raises:
        ValueError: the folder is missing, is not a folder, holds no image file, or one
            of its image files cannot be read or is no image (one line, naming it).
    """
    what = f"--images {folder}"
    if not os.path.exists(folder):
        raise ValueError(f"{what}: no such folder")
    if not os.path.isdir(folder):
        raise ValueError(f"{what}: not a folder (give a folder of .png, .jpg, .jpeg, .webp or .gif files)")
    try:
        entries = sorted(os.listdir(folder))
    except OSError as e:
        raise ValueError(f"{what}: cannot read the folder: {e.strerror}") from None
    names = [n for n in entries if n.lower().endswith(IMAGE_SUFFIXES) and os.path.isfile(os.path.join(folder, n))]
    if not names:
        held = "it is empty" if not entries else f"it holds {len(entries)} files, none of them"
        raise ValueError(f"{what}: no image: {held} .png, .jpg, .jpeg, .webp or .gif")
    urls, sizes = [], []
    for name in names:
        path = os.path.join(folder, name)
        try:
            data = read_bytes(path, what=what, limit_bytes=IMAGE_LIMIT_BYTES)
        except InputFileError as e:
            raise ValueError(str(e)) from None
        mime = image_mime(data)
        if mime is None:
            raise ValueError(f"{what}: {name} is not a PNG, JPEG, WebP or GIF image (its first bytes say so)")
        urls.append(f"data:{mime};base64,{base64.b64encode(data).decode('ascii')}")
        sizes.append(len(data))
    return ImageSet(os.path.abspath(folder), names, urls, sizes)


def attach_images(bodies: List[Dict[str, Any]], images: ImageSet, per_request: int, seed: int,
                  max_bytes: int, where: str) -> List[int]:
    """Gives each chat body's last user message ``per_request`` image parts after its
    text, drawn with ``seed``; returns each body's image bytes.

    Raises:
        ValueError: the bodies would hold more than ``max_bytes`` of encoded images
            (``where`` names the options to lower), or a body has no user message.
    """
    import numpy as np

    drawn = np.random.default_rng([seed, _IMAGES_STREAM]).integers(0, len(images.urls), (len(bodies), per_request))
    encoded = sum(len(images.urls[j]) for j in drawn.ravel())
    if encoded > max_bytes:
        raise ValueError(f"{where}: {len(bodies):,} prepared requests of {per_request} images would hold about "
                         f"{size_text(encoded)} of encoded images, over the {size_text(max_bytes)} loadgen builds "
                         "before a run; lower --sample-count (sample indices wrap around the requests) or "
                         "--images-per-request, or use smaller images")
    out = []
    for i, body in enumerate(bodies):
        message = _last_user_message(body, i)
        parts: List[Dict[str, Any]] = [{"type": "text", "text": message["content"]}]
        parts += [{"type": "image_url", "image_url": {"url": images.urls[j]}} for j in drawn[i]]
        message["content"] = parts
        out.append(sum(images.sizes[j] for j in drawn[i]))
    return out


def _last_user_message(body: Dict[str, Any], i: int) -> Dict[str, Any]:
    messages: List[Dict[str, Any]] = body.get("messages") or []
    for message in reversed(messages):
        if message.get("role") == "user" and isinstance(message.get("content"), str):
            found: Dict[str, Any] = message
            return found
    raise ValueError(f"--images: request {i + 1} has no user message with text to add images to")


def text_only(message: Dict[str, Any]) -> Dict[str, Any]:
    """``message`` with its images left out (its text parts joined), for the history of
    a conversation's later turns; the message itself when it has none."""
    content = message.get("content")
    if not isinstance(content, list):
        return message
    text = "".join(p.get("text", "") for p in content if isinstance(p, dict) and p.get("type") == "text")
    return {**message, "content": text}

