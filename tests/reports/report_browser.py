"""A minimal headless-Chromium driver for the browser test: the DevTools protocol over
--remote-debugging-pipe (JSON messages separated by NUL bytes on fds 3 and 4; no websocket, no
extra package), and a PNG decoder for screenshots."""

from __future__ import annotations

import base64
import fcntl
import json
import os
import select
import shutil
import struct
import subprocess
import time
import zlib
from pathlib import Path

CHROMIUM_CANDIDATES = ("/usr/bin/chromium", "chromium", "chromium-browser")
FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--no-first-run", "--remote-debugging-pipe")


class BrowserUnavailable(Exception):
    """Chromium is not installed or did not start (the test skips with this message)."""


def find_chromium() -> str:
    for name in CHROMIUM_CANDIDATES:
        path = shutil.which(name)
        if path:
            return path
    raise BrowserUnavailable("no chromium executable (tried " + ", ".join(CHROMIUM_CANDIDATES) +
                             "); install Debian's `chromium` package (.ci/run does when run as root)")


def _high(fd: int) -> int:
    """`fd` moved to a close-on-exec descriptor >= 10."""
    high = fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 10)
    os.close(fd)
    return high


class Browser:
    """One headless Chromium with one page session; `events` collects every protocol event."""

    def __init__(self, profile_dir: Path, timeout_s: float = 60.0):
        self.timeout_s = timeout_s
        exe = find_chromium()
        to_child, self._write = os.pipe()
        self._read, from_child = os.pipe()
        ends = [_high(to_child), _high(from_child)]     # out of the way of fds 3 and 4

        def plumb():                                     # in the child: the pipe ends become fds 3 and 4
            os.dup2(ends[0], 3)
            os.dup2(ends[1], 4)
        try:
            self.proc = subprocess.Popen([exe, *FLAGS, f"--user-data-dir={profile_dir}", "about:blank"],
                                         preexec_fn=plumb, close_fds=False, stdin=subprocess.DEVNULL,
                                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        except OSError as exc:
            raise BrowserUnavailable(f"{exe} could not be started: {exc}") from None
        finally:
            for fd in ends:
                os.close(fd)
        self._buffer, self._next_id, self.events = b"", 0, []
        try:
            version = self.call("Browser.getVersion", timeout_s=30.0)
        except (TimeoutError, BrokenPipeError, EOFError) as exc:
            raise BrowserUnavailable(f"{exe} did not answer the DevTools protocol ({type(exc).__name__}): "
                                     f"{self._stderr_tail()}") from None
        self.version = version.get("product", "")
        target = self.call("Target.createTarget", {"url": "about:blank"})["targetId"]
        self.session = self.call("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]

    # ---- protocol
    def call(self, method: str, params: dict | None = None, session: str | None = None,
             timeout_s: float | None = None) -> dict:
        self._next_id += 1
        message = {"id": self._next_id, "method": method, "params": params or {}}
        if session:
            message["sessionId"] = session
        os.write(self._write, json.dumps(message).encode() + b"\0")
        deadline = time.monotonic() + (timeout_s or self.timeout_s)
        while True:
            reply = self._receive(deadline)
            if reply.get("id") == self._next_id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply.get("result", {})
            if "method" in reply:
                self.events.append(reply)

    def page(self, method: str, params: dict | None = None) -> dict:
        return self.call(method, params, session=self.session)

    def wait_for(self, method: str, timeout_s: float | None = None) -> dict:
        deadline = time.monotonic() + (timeout_s or self.timeout_s)
        for event in self.events:
            if event.get("method") == method:
                return event
        while True:
            event = self._receive(deadline)
            if "method" in event:
                self.events.append(event)
                if event["method"] == method:
                    return event

    def _receive(self, deadline: float) -> dict:
        while b"\0" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("no DevTools message in time")
            ready, _, _ = select.select([self._read], [], [], left)
            if ready:
                chunk = os.read(self._read, 1 << 20)
                if not chunk:
                    raise EOFError("chromium closed the DevTools pipe")
                self._buffer += chunk
        message, self._buffer = self._buffer.split(b"\0", 1)
        return json.loads(message)

    def evaluate(self, expression: str):
        result = self.page("Runtime.evaluate", {"expression": expression, "returnByValue": True,
                                                "awaitPromise": True})
        if "exceptionDetails" in result:
            raise RuntimeError(f"page script failed: {result['exceptionDetails']}")
        return result["result"].get("value")

    def screenshot(self, clip: dict | None = None) -> bytes:
        params = {"format": "png"}
        if clip:
            params["clip"] = {**clip, "scale": 1}
        return base64.b64decode(self.page("Page.captureScreenshot", params)["data"])

    def _stderr_tail(self) -> str:
        try:
            self.proc.wait(timeout=2)
            text = self.proc.stderr.read().decode(errors="replace").strip().splitlines()
            return " | ".join(text[-3:]) or f"exit code {self.proc.returncode}"
        except subprocess.TimeoutExpired:
            return "still running, no answer"

    def close(self) -> None:
        try:
            self.call("Browser.close", timeout_s=5.0)
        except Exception:   # noqa: BLE001 - closing is best effort; the process is killed below
            pass
        for fd in (self._write, self._read):
            try:
                os.close(fd)
            except OSError:
                pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.proc.stderr.close()


# ------------------------------------------------------------------ PNG

def decode_png(data: bytes) -> tuple[int, int, int, bytes]:
    """(width, height, channels, raw rows without filter bytes) of an 8-bit, non-interlaced
    greyscale / RGB / RGBA PNG."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    pos, idat, header = 8, [], None
    while pos < len(data):
        length, kind = struct.unpack(">I4s", data[pos:pos + 8])
        body = data[pos + 8:pos + 8 + length]
        if kind == b"IHDR":
            header = struct.unpack(">IIBBBBB", body)
        elif kind == b"IDAT":
            idat.append(body)
        pos += 12 + length
    width, height, depth, colour, _, _, interlace = header
    assert depth == 8 and interlace == 0 and colour in (0, 2, 6), f"unsupported PNG {header}"
    channels = {0: 1, 2: 3, 6: 4}[colour]
    return width, height, channels, _unfilter(zlib.decompress(b"".join(idat)), width * channels, height, channels)


def _unfilter(raw: bytes, stride: int, height: int, bpp: int) -> bytes:
    out, prev = bytearray(), bytearray(stride)
    for y in range(height):
        kind, line = raw[y * (stride + 1)], bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        if kind == 1:
            for i in range(bpp, stride):
                line[i] = (line[i] + line[i - bpp]) & 255
        elif kind == 2:
            line = bytearray((a + b) & 255 for a, b in zip(line, prev))
        elif kind == 3:
            for i in range(stride):
                line[i] = (line[i] + ((line[i - bpp] if i >= bpp else 0) + prev[i]) // 2) & 255
        elif kind == 4:
            for i in range(stride):
                a, b, c = (line[i - bpp] if i >= bpp else 0), prev[i], (prev[i - bpp] if i >= bpp else 0)
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
        out += line
        prev = line
    return bytes(out)


def colour_histogram(png: bytes) -> dict[tuple[int, ...], int]:
    width, height, channels, pixels = decode_png(png)
    counts: dict[tuple[int, ...], int] = {}
    for k in range(0, len(pixels), channels):
        key = tuple(pixels[k:k + 3]) if channels >= 3 else (pixels[k],) * 3
        counts[key] = counts.get(key, 0) + 1
    return counts
