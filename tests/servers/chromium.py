"""Headless Chromium for the HTML report tests, driven over the DevTools protocol.

:func:`find_chromium` gives the ``chromium`` binary (installing Debian's package with
``tests/servers/install_chromium.sh`` when it is missing). :class:`Browser` starts one
headless Chromium with the network cut off (a dead proxy, every host name unresolvable,
and DevTools' offline emulation), opens pages in it, and gathers what a page logged as an
error, every request it tried that was not for a local file, screenshots and the values
of expressions. Every wait is bounded; the browser is ended by its own PID (and its
process group, which it leads).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

from tests.servers.procs import REPO, ServerProcess, install_lock

__all__ = ["Browser", "PageLoad", "find_chromium"]

_INSTALLED: Dict[str, Optional[str]] = {}


def find_chromium(timeout_s: float = 600.0) -> Optional[str]:
    """The path of ``chromium``; when it is not on PATH, install_chromium.sh is run once per
    process (its output in ``<repo>/.servers/chromium.install.log``), unless
    LOADGEN_TEST_NO_INSTALL is set. None when there is none."""
    if "chromium" in _INSTALLED:
        return _INSTALLED["chromium"]
    found = shutil.which("chromium")
    if found is None and os.environ.get("LOADGEN_TEST_NO_INSTALL", "") in ("", "0"):
        with install_lock("chromium"), open(os.path.join(REPO, ".servers", "chromium.install.log"), "wb") as log:
            try:
                subprocess.run(["bash", os.path.join(REPO, "tests", "servers", "install_chromium.sh")],
                               stdout=log, stderr=subprocess.STDOUT, timeout=timeout_s, cwd=REPO, check=False)
            except subprocess.TimeoutExpired:
                pass
        found = shutil.which("chromium")
    _INSTALLED["chromium"] = found
    return found


@dataclass
class PageLoad:
    """What opening a page gave: the errors it logged (console errors, uncaught
    exceptions, failed loads), the URLs it asked for that were not local files, and how
    long it took until the page said it was ready."""

    errors: List[str] = field(default_factory=list)
    requests: List[str] = field(default_factory=list)
    ready_s: float = 0.0


class Browser:
    """One headless Chromium, offline, and its first page over the DevTools protocol.

    Args:
        binary: the chromium executable.
        width: the viewport's width in CSS pixels.
        timeout_s: bound on starting and on each protocol call.
    """

    def __init__(self, binary: str, width: int = 1280, timeout_s: float = 30.0) -> None:
        import websocket  # the test extra's websocket-client

        self.width = width
        self.timeout_s = timeout_s
        self._profile = tempfile.mkdtemp(prefix="loadgen-chromium-")
        argv = [binary, "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--no-first-run", "--no-default-browser-check", "--disable-extensions", "--mute-audio",
                "--disable-background-networking", "--disable-component-update", "--disable-sync",
                "--proxy-server=127.0.0.1:9", "--proxy-bypass-list=<-loopback>",
                "--host-resolver-rules=MAP * ~NOTFOUND", "--remote-debugging-port=0",
                "--hide-scrollbars", "--force-color-profile=srgb", "--force-device-scale-factor=1",
                f"--user-data-dir={self._profile}", f"--window-size={width},900", "about:blank"]
        # Its own session, its output in the profile, stopped with its whole group.
        self.process = ServerProcess(argv, os.path.join(self._profile, "chromium.log"))
        self._id = 0
        self._events: List[Dict[str, Any]] = []
        try:
            port = self._wait_port()
            page = self._page_socket_url(port)
            self._ws = websocket.create_connection(page, timeout=timeout_s, suppress_origin=True)
            for method in ("Page.enable", "Runtime.enable", "Log.enable", "Network.enable"):
                self.call(method)
            self.call("Network.emulateNetworkConditions", offline=True, latency=0,
                      downloadThroughput=-1, uploadThroughput=-1)
        except BaseException:
            self.close()
            raise

    # ------------------------------------------------------------------ start-up

    def _wait_port(self) -> int:
        path = os.path.join(self._profile, "DevToolsActivePort")
        deadline = time.monotonic() + self.timeout_s
        while time.monotonic() < deadline:
            if not self.process.alive():
                raise RuntimeError(f"chromium exited with {self.process.proc.returncode}: {self.log_tail()}")
            try:
                with open(path, encoding="ascii") as f:
                    first = f.readline().strip()
                if first:
                    return int(first)
            except (OSError, ValueError):
                pass
            time.sleep(0.05)
        raise RuntimeError(f"chromium did not open its DevTools port within {self.timeout_s:g} s: {self.log_tail()}")

    def _page_socket_url(self, port: int) -> str:
        deadline = time.monotonic() + self.timeout_s
        while time.monotonic() < deadline:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=self.timeout_s) as r:
                targets = json.loads(r.read())
            pages = [t for t in targets if t.get("type") == "page"]
            if pages:
                return str(pages[0]["webSocketDebuggerUrl"])
            time.sleep(0.05)
        raise RuntimeError("chromium shows no page target")

    def log_tail(self, n_bytes: int = 3000) -> str:
        """The end of the browser's own output."""
        return self.process.log_tail(n_bytes)

    # ------------------------------------------------------------------ protocol

    def call(self, method: str, **params: Any) -> Dict[str, Any]:
        """Sends one protocol command and returns its result; events that arrive before
        the answer are kept for :meth:`open`. RuntimeError on a protocol error."""
        self._id += 1
        self._ws.send(json.dumps({"id": self._id, "method": method, "params": params}))
        deadline = time.monotonic() + self.timeout_s
        while time.monotonic() < deadline:
            message = json.loads(self._ws.recv())
            if message.get("id") == self._id:
                if "error" in message:
                    raise RuntimeError(f"{method}: {message['error']}")
                return dict(message.get("result", {}))
            if "method" in message:
                self._events.append(message)
        raise TimeoutError(f"{method}: no answer within {self.timeout_s:g} s")

    def evaluate(self, expression: str) -> Any:
        """The value of a JavaScript expression in the page (awaited when a promise)."""
        result = self.call("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)
        if "exceptionDetails" in result:
            raise RuntimeError(f"{expression!r} threw: {result['exceptionDetails']}")
        return result["result"].get("value")

    def open(self, url: str, ready: str = "true", timeout_s: float = 30.0) -> PageLoad:
        """Navigates to ``url`` and waits (at most ``timeout_s``) until the expression
        ``ready`` is true; returns the errors and outside requests seen meanwhile."""
        self._events.clear()
        start = time.monotonic()
        self.call("Page.navigate", url=url)
        deadline = start + timeout_s
        while not self.evaluate(f"document.readyState === 'complete' && !!({ready})"):
            if time.monotonic() > deadline:
                raise TimeoutError(f"{url} was not ready ({ready}) within {timeout_s:g} s")
            time.sleep(0.05)
        load = PageLoad(ready_s=time.monotonic() - start)
        self.evaluate("new Promise(r => requestAnimationFrame(() => requestAnimationFrame(r)))")
        for event in self._events:
            _note(event, load)
        return load

    def screenshot(self, measure: str = "null", width: Optional[int] = None) -> Tuple[bytes, Any]:
        """A PNG of the whole page (the viewport ``width`` wide, by default the browser's,
        and stretched to the page's height), and the value of ``measure`` evaluated in
        that same layout (such as the elements' rectangles in page pixels)."""
        import base64

        width = width or self.width
        self.call("Emulation.setDeviceMetricsOverride", width=width, height=900, deviceScaleFactor=1, mobile=False)
        self.evaluate("new Promise(r => setTimeout(() => requestAnimationFrame(() => requestAnimationFrame(r)), 200))")
        height = int(self.evaluate("Math.ceil(document.documentElement.scrollHeight)"))
        self.call("Emulation.setDeviceMetricsOverride", width=width, height=height, deviceScaleFactor=1, mobile=False)
        self.evaluate("new Promise(r => setTimeout(() => requestAnimationFrame(() => requestAnimationFrame(r)), 300))")
        try:
            value = self.evaluate(measure)
            shot = self.call("Page.captureScreenshot", format="png", captureBeyondViewport=True)
        finally:
            self.call("Emulation.clearDeviceMetricsOverride")
        return base64.b64decode(shot["data"]), value

    def emulate_print(self, on: bool = True) -> None:
        """Lays the page out with its print style sheet (or the screen's again)."""
        self.call("Emulation.setEmulatedMedia", media="print" if on else "")

    def print_pdf(self) -> bytes:
        """The page printed to PDF (A4), as the print stylesheet lays it out."""
        import base64

        pdf = self.call("Page.printToPDF", paperWidth=8.27, paperHeight=11.69, printBackground=True)
        return base64.b64decode(pdf["data"])

    def close(self) -> None:
        """Ends the browser (SIGTERM, then SIGKILL to its process group) and removes its profile."""
        ws = getattr(self, "_ws", None)
        if ws is not None:
            try:
                ws.close()
            except OSError:
                pass
        self.process.stop(grace_s=5.0)
        shutil.rmtree(self._profile, ignore_errors=True)

    def __enter__(self) -> "Browser":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _note(event: Dict[str, Any], load: PageLoad) -> None:
    """Adds an event's error or outside request to ``load``."""
    method, params = event["method"], event.get("params", {})
    if method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert"):
        load.errors.append("console: " + " ".join(str(a.get("value", a.get("description", "")))
                                                  for a in params.get("args", [])))
    elif method == "Runtime.exceptionThrown":
        details = params.get("exceptionDetails", {})
        load.errors.append("exception: " + str(details.get("exception", {}).get("description") or details.get("text")))
    elif method == "Log.entryAdded" and params.get("entry", {}).get("level") == "error":
        entry = params["entry"]
        load.errors.append(f"log: {entry.get('text')} {entry.get('url', '')}".strip())
    elif method == "Network.requestWillBeSent":
        url = params.get("request", {}).get("url", "")
        if not url.startswith(("file:", "data:", "blob:", "about:")):
            load.requests.append(url)


def _main() -> None:
    """``python -m tests.servers.chromium REPORT.html OUT.png``: a screenshot of a report
    (as docs/report.png is made), cut to --max-height and reduced to --colors colours."""
    import argparse
    import io
    from pathlib import Path

    from PIL import Image

    parser = argparse.ArgumentParser(description=_main.__doc__)
    parser.add_argument("page")
    parser.add_argument("png")
    parser.add_argument("--width", type=int, default=1100)
    parser.add_argument("--max-height", type=int, default=2400)
    parser.add_argument("--colors", type=int, default=64)
    args = parser.parse_args()
    binary = find_chromium()
    if binary is None:
        raise SystemExit("chromium is not installed (tests/servers/install_chromium.sh)")
    with Browser(binary, width=args.width) as browser:
        load = browser.open(Path(args.page).resolve().as_uri(), ready="document.body && document.body.dataset.ready")
        if load.errors or browser.evaluate("document.body.dataset.ready") != "1":
            raise SystemExit(f"{args.page} did not draw: {load.errors}")
        png, _ = browser.screenshot()
    image = Image.open(io.BytesIO(png)).convert("RGB")
    image = image.crop((0, 0, image.width, min(image.height, args.max_height)))
    image.quantize(colors=args.colors).save(args.png, optimize=True)
    print(f"wrote {args.png}: {image.width}x{image.height}, {os.path.getsize(args.png) // 1024} KiB")


if __name__ == "__main__":
    _main()
