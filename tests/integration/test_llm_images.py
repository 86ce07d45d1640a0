"""Image inputs of vision chat (``--images DIR``, ``--images-per-request N``) against the
scripted server, which records each image part as it arrived (MIME type, decoded bytes'
count and SHA-256): on the native and the asyncio client the same images arrive, with
the MIME type of their bytes, and the result's ``llm.images`` counts them; a
conversation sends them with its first turn only; bad folders and non-chat targets are
refused in one line."""

from __future__ import annotations

import collections
import hashlib
import struct
import zlib

import pytest

from tests.helpers import run_cli
from tests.integration.test_net_servers import run_doc
from tests.servers.scripted_proc import start_scripted

ENGINES = ("native", "asyncio")
LOAD = ("--model", "m", "--scenario", "concurrency", "--concurrency", "2", "--input-tokens", "8", "--seed", "5")


def png_bytes(width: int, height: int, rgb: tuple) -> bytes:
    """A real PNG of one colour."""
    def part(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    rows = b"".join(b"\x00" + bytes(rgb) * width for _ in range(height))
    return (b"\x89PNG\r\n\x1a\n" + part(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0))
            + part(b"IDAT", zlib.compress(rows)) + part(b"IEND", b""))


GIF = (b"GIF89a\x01\x00\x01\x00\x80\x00\x00\x00\x00\x00\xff\xff\xff!\xf9\x04\x01\x00\x00\x00\x00,\x00\x00\x00"
       b"\x00\x01\x00\x01\x00\x00\x02\x02D\x01\x00;")


def image_folder(tmp_path):
    """A folder of four images (one a GIF named .png: its bytes say what it is) and a
    text file that is no image; returns it and {sha256: (mime, size)}."""
    folder = tmp_path / "images"
    folder.mkdir()
    files = {"a.png": (png_bytes(3, 2, (200, 10, 10)), "image/png"),
             "b.jpg": (b"\xff\xd8\xff\xe0\x00\x10JFIF\x00" + bytes(range(200)) + b"\xff\xd9", "image/jpeg"),
             "c.webp": (b"RIFF\x24\x00\x00\x00WEBPVP8 " + bytes(28), "image/webp"),
             "looks.png": (GIF, "image/gif")}
    for name, (data, _) in files.items():
        (folder / name).write_bytes(data)
    (folder / "notes.txt").write_text("not an image\n")
    truth = {hashlib.sha256(data).hexdigest(): (mime, len(data)) for data, mime in files.values()}
    return folder, truth


@pytest.mark.integration
def test_images_arrive_as_sent_with_their_mime_type_and_are_counted_on_both_clients(tmp_path):
    folder, truth = image_folder(tmp_path)
    with start_scripted(tmp_path, "--ttft-ms", "2", "--itl-ms", "0.5", "--tokens", "4") as srv:
        docs = {e: run_doc("--sut", f"openai+{srv.url}/v1/chat/completions", "--http-engine", e, *LOAD,
                           "--query-count", "10", "--sample-count", "5", "--images", str(folder),
                           "--images-per-request", "2") for e in ENGINES}
        log = srv.stats()["completion_log"]
    assert len(log) == 20
    drawn = {}
    for e, entries in (("native", log[:10]), ("asyncio", log[10:])):
        assert docs[e]["network"]["http_engine"] == e
        for entry in entries:
            assert len(entry["images"]) == 2, entry
            for image in entry["images"]:
                assert image["sha256"] in truth, image
                assert (image["mime"], image["bytes"]) == truth[image["sha256"]]
            assert entry["prompt_words"] == 8  # the text part: the images are no words
        images = docs[e]["llm"]["images"]
        assert images["count"] == 20
        assert images["bytes"] == sum(i["bytes"] for x in entries for i in x["images"])
        assert images["folder_files"] == 4 and images["per_request"] == 2
        assert images["folder_bytes"] == sum(size for _, size in truth.values())
        assert images["folder"] == str(folder)
        drawn[e] = collections.Counter(tuple(i["sha256"] for i in x["images"]) for x in entries)
    # Drawn with the sample seed: both clients sent the same requests' images.
    assert drawn["native"] == drawn["asyncio"]
    # The draw is no constant: more than one image was used.
    assert len({sha for pair in drawn["native"] for sha in pair}) > 1


@pytest.mark.integration
def test_a_conversation_sends_its_images_with_the_first_turn_only(tmp_path):
    folder, truth = image_folder(tmp_path)
    with start_scripted(tmp_path, "--ttft-ms", "2", "--itl-ms", "0.5", "--tokens", "4", "--log-messages") as srv:
        docs = {e: run_doc("--sut", f"openai+{srv.url}/v1/chat/completions", "--http-engine", e, *LOAD,
                           "--query-count", "8", "--turns", "2", "--images", str(folder)) for e in ENGINES}
        log = srv.stats()["completion_log"]
    assert len(log) == 16
    for e, entries in (("native", log[:8]), ("asyncio", log[8:])):
        firsts = [x for x in entries if len(x["messages"]) == 1]
        later = [x for x in entries if len(x["messages"]) > 1]
        # Each conversation's first turn opens it; how many second turns fit in the 8
        # queries depends on when their first turns end.
        assert len(firsts) + len(later) == 8 and len(firsts) >= 4 and later, e
        assert all(len(x["images"]) == 1 and x["images"][0]["sha256"] in truth for x in firsts)
        # The second turn's history holds the first message's text, not its image.
        assert all(x["images"] == [] and isinstance(x["messages"][0]["content"], str) for x in later)
        assert docs[e]["llm"]["images"]["count"] == len(firsts)
        assert docs[e]["llm"]["images"]["bytes"] == sum(x["images"][0]["bytes"] for x in firsts)


@pytest.mark.integration
def test_bad_image_folders_and_targets_are_refused_in_one_line(tmp_path):
    folder, _ = image_folder(tmp_path)
    empty = tmp_path / "empty"
    empty.mkdir()
    texts = tmp_path / "texts"
    texts.mkdir()
    (texts / "a.txt").write_text("x")
    fake = tmp_path / "fake"
    fake.mkdir()
    (fake / "photo.png").write_text("this is text, not a PNG")
    with start_scripted(tmp_path, "--ttft-ms", "1", "--itl-ms", "0.5", "--tokens", "2") as srv:
        chat = f"openai+{srv.url}/v1/chat/completions"
        cases = [((chat, tmp_path / "missing"), "no such folder"),
                 ((chat, empty), "no image: it is empty"),
                 ((chat, texts), "no image"),
                 ((chat, fake), "photo.png is not a PNG, JPEG, WebP or GIF image"),
                 ((f"openai+{srv.url}/v1/completions", folder), "not an OpenAI /v1/chat/completions target")]
        for (url, images), message in cases:
            proc = run_cli("run", "--sut", url, "--model", "m", "--query-count", "2", "--images", str(images),
                           "--ready-timeout-s", "5")
            assert proc.returncode == 2, (url, images, proc.stderr)
            lines = proc.stderr.strip().splitlines()
            assert len(lines) == 1 and "--images" in lines[0] and message in lines[0], proc.stderr
            assert "Traceback" not in proc.stderr
