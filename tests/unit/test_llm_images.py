"""The image inputs of vision chat (loadgen/llm/images.py) without a server: MIME types
from the first bytes, the seeded draw, the bound on what is built, and the history's text."""

from __future__ import annotations

import base64

import pytest

from loadgen.llm.images import attach_images, image_mime, load_images, text_only

PNG = b"\x89PNG\r\n\x1a\n" + bytes(40)
JPEG = b"\xff\xd8\xff\xdb" + bytes(40)
GIF = b"GIF87a" + bytes(40)
WEBP = b"RIFF\x10\x00\x00\x00WEBPVP8L" + bytes(30)


@pytest.mark.parametrize("data, mime", [(PNG, "image/png"), (JPEG, "image/jpeg"), (GIF, "image/gif"),
                                        (WEBP, "image/webp"), (b"RIFF\x10\x00\x00\x00WAVEfmt ", None),
                                        (b"<svg", None), (b"", None)])
def test_the_mime_type_comes_from_the_first_bytes(data, mime):
    assert image_mime(data) == mime


def _folder(tmp_path):
    for name, data in (("a.png", PNG), ("b.JPG", JPEG), ("c.gif", PNG + b"other"), ("d.webp", WEBP)):
        (tmp_path / name).write_bytes(data)
    (tmp_path / "e.txt").write_text("no image")
    return load_images(str(tmp_path))


def test_a_folder_is_read_sorted_typed_by_bytes_and_encoded(tmp_path):
    images = _folder(tmp_path)
    assert images.names == ["a.png", "b.JPG", "c.gif", "d.webp"]
    assert images.urls[2].startswith("data:image/png;base64,")  # a PNG named .gif
    assert base64.b64decode(images.urls[3].split(",", 1)[1]) == WEBP
    assert images.describe(2) == {"folder": str(tmp_path), "folder_files": 4,
                                  "folder_bytes": 2 * len(PNG) + 5 + len(JPEG) + len(WEBP), "per_request": 2}


def _bodies(n):
    return [{"messages": [{"role": "system", "content": "s"}, {"role": "user", "content": f"q{i}"}]}
            for i in range(n)]


def test_images_are_drawn_with_the_seed_after_the_last_user_messages_text(tmp_path):
    images = _folder(tmp_path)
    a, b, c = _bodies(50), _bodies(50), _bodies(50)
    sizes = attach_images(a, images, 3, seed=7, max_bytes=1 << 20, where="w")
    attach_images(b, images, 3, seed=7, max_bytes=1 << 20, where="w")
    attach_images(c, images, 3, seed=8, max_bytes=1 << 20, where="w")
    assert a == b and a != c
    for i, body in enumerate(a):
        parts = body["messages"][1]["content"]
        assert body["messages"][0]["content"] == "s" and parts[0] == {"type": "text", "text": f"q{i}"}
        assert [p["type"] for p in parts[1:]] == ["image_url"] * 3
        urls = [p["image_url"]["url"] for p in parts[1:]]
        assert sizes[i] == sum(images.sizes[images.urls.index(u)] for u in urls)
    assert len({p["image_url"]["url"] for body in a for p in body["messages"][1]["content"][1:]}) == 4


def test_more_encoded_images_than_the_bound_are_refused_before_any_body_changes(tmp_path):
    images = _folder(tmp_path)
    bodies = _bodies(100)
    with pytest.raises(ValueError, match="over the 1 KiB loadgen builds before a run; lower --sample-count"):
        attach_images(bodies, images, 4, seed=1, max_bytes=1024, where="--images x")
    assert bodies == _bodies(100)


def test_missing_empty_and_imageless_folders_are_refused(tmp_path):
    with pytest.raises(ValueError, match="no such folder"):
        load_images(str(tmp_path / "none"))
    with pytest.raises(ValueError, match="no image: it is empty"):
        load_images(str(tmp_path))
    (tmp_path / "x.png").write_bytes(b"plain text")
    with pytest.raises(ValueError, match="x.png is not a PNG, JPEG, WebP or GIF image"):
        load_images(str(tmp_path))


def test_the_history_keeps_a_messages_text_without_its_images():
    message = {"role": "user", "content": [{"type": "text", "text": "look"},
                                           {"type": "image_url", "image_url": {"url": "data:,"}}]}
    assert text_only(message) == {"role": "user", "content": "look"}
    plain = {"role": "user", "content": "hi"}
    assert text_only(plain) is plain
