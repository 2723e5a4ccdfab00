"""A headless Chromium driven over the Chrome DevTools Protocol through a pipe (``--remote-debugging-pipe``:
commands on file descriptor 3, answers and events on 4, each a JSON text ended by a NUL byte) — no port, no
websocket library, no browser download: Debian's ``chromium`` package is enough.

    with Chromium() as browser:
        page = browser.open("file:///tmp/report.html")
        page.wait_for("document.querySelectorAll('svg').length >= 3")
        page.evaluate("document.title"); page.errors; page.requests

:attr:`Page.errors` collects console errors, uncaught exceptions and failed loads; :attr:`Page.requests` every
URL the page asked the network for (a self-contained page asks for none but its own ``file:``/``data:`` URLs).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import queue
import shutil
import subprocess
import tempfile
import threading
import time
from typing import Any

#: the flags a headless Chromium needs on a closed network as root (its background connections are refused)
FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-dev-shm-usage", "--hide-scrollbars", "--mute-audio")


def executable() -> str | None:
    """Path of an installed Chromium (Debian's ``chromium``), or None."""
    for name in ("chromium", "chromium-browser", "google-chrome"):
        path = shutil.which(name)
        if path:
            return path
    return None


def _above(fd: int, low: int = 10) -> int:
    """``fd`` moved to a number of at least ``low``."""
    new = fcntl.fcntl(fd, fcntl.F_DUPFD, low)
    os.close(fd)
    return new


class BrowserError(RuntimeError):
    """The browser answered a command with an error, or did not answer in time."""


class Chromium:
    """A headless Chromium process and its DevTools pipe (a context manager)."""

    def __init__(self, path: str | None = None, *, timeout: float = 30.0) -> None:
        exe = path or executable()
        if exe is None:
            raise FileNotFoundError("chromium is not installed")
        self.timeout = timeout
        self._profile = tempfile.mkdtemp(prefix="tracekit-chromium-")
        cmd_r, self._cmd_w = os.pipe()  # we write commands; the browser reads them as fd 3
        self._out_r, out_w = os.pipe()  # the browser writes to fd 4; we read
        cmd_r, out_w = _above(cmd_r), _above(out_w)  # never 3 or 4 themselves: the shell moves them there
        script = f'exec "$0" "$@" 3<&{cmd_r} 4>&{out_w} {cmd_r}<&- {out_w}>&-'
        self.proc = subprocess.Popen(["/bin/bash", "-c", script, exe, *FLAGS, f"--user-data-dir={self._profile}",
                                      "--remote-debugging-pipe", "about:blank"],
                                     pass_fds=(cmd_r, out_w), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.PIPE)
        os.close(cmd_r)
        os.close(out_w)
        self._next = 0
        self._lock = threading.Lock()
        self._answers: dict[int, queue.Queue[dict[str, Any]]] = {}
        self._listeners: dict[str, list[queue.Queue[dict[str, Any]]]] = {}
        self.stderr = b""
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        self._stderr_reader = threading.Thread(target=self._read_stderr, daemon=True)
        self._stderr_reader.start()

    # -------------------------------------------------------------- the pipe

    def _read(self) -> None:
        buf = b""
        with os.fdopen(self._out_r, "rb", buffering=0) as f:
            while True:
                chunk = f.read(65536)
                if not chunk:
                    break
                buf += chunk
                *messages, buf = buf.split(b"\0")
                for raw in messages:
                    self._dispatch(json.loads(raw))
        for q in list(self._answers.values()):  # the browser is gone: wake whoever waits
            q.put({"error": {"message": "the browser closed its pipe"}})

    def _read_stderr(self) -> None:
        assert self.proc.stderr is not None
        self.stderr = self.proc.stderr.read()

    def _dispatch(self, msg: dict[str, Any]) -> None:
        if "id" in msg:
            q = self._answers.get(msg["id"])
            if q is not None:
                q.put(msg)
            return
        with self._lock:
            targets = list(self._listeners.get(msg.get("sessionId", ""), []))
        for q in targets:
            q.put(msg)

    def send(self, method: str, params: dict[str, Any] | None = None, session: str | None = None,
             timeout: float | None = None) -> dict[str, Any]:
        """Send one command and wait for its result (raises :class:`BrowserError` on an error answer)."""
        with self._lock:
            self._next += 1
            mid = self._next
            q: queue.Queue[dict[str, Any]] = queue.Queue()
            self._answers[mid] = q
        msg: dict[str, Any] = {"id": mid, "method": method, "params": params or {}}
        if session:
            msg["sessionId"] = session
        os.write(self._cmd_w, json.dumps(msg).encode() + b"\0")
        try:
            answer = q.get(timeout=timeout or self.timeout)
        except queue.Empty:
            raise BrowserError(f"{method}: no answer in {timeout or self.timeout:g} s") from None
        finally:
            self._answers.pop(mid, None)
        if "error" in answer:
            raise BrowserError(f"{method}: {answer['error'].get('message')}")
        return answer.get("result", {})

    def listen(self, session: str) -> queue.Queue[dict[str, Any]]:
        """A queue that receives every event of ``session``."""
        q: queue.Queue[dict[str, Any]] = queue.Queue()
        with self._lock:
            self._listeners.setdefault(session, []).append(q)
        return q

    # -------------------------------------------------------------- pages

    def open(self, url: str, *, width: int = 1280, height: int = 900) -> Page:
        """A new tab showing ``url``, once its load event has fired."""
        target = self.send("Target.createTarget", {"url": "about:blank"})["targetId"]
        session = self.send("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        page = Page(self, session)
        for domain in ("Page", "Runtime", "Log", "Network"):
            self.send(f"{domain}.enable", session=session)
        self.send("Emulation.setDeviceMetricsOverride", {"width": width, "height": height, "deviceScaleFactor": 1,
                                                         "mobile": False}, session=session)
        page.navigate(url)
        return page

    def close(self) -> None:
        with contextlib.suppress(OSError, BrowserError):
            self.send("Browser.close", timeout=5)
        with contextlib.suppress(OSError):
            os.close(self._cmd_w)
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        shutil.rmtree(self._profile, ignore_errors=True)

    def __enter__(self) -> Chromium:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Page:
    """One tab: what it logged, and JavaScript evaluated in it."""

    def __init__(self, browser: Chromium, session: str) -> None:
        self.browser = browser
        self.session = session
        self.events = browser.listen(session)
        #: console errors, uncaught exceptions and failed loads, as text
        self.errors: list[str] = []
        #: every URL requested by the page
        self.requests: list[str] = []
        self.loaded = False

    def _drain(self, timeout: float = 0.0) -> None:
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            try:
                msg = self.events.get(timeout=max(left, 0.0)) if left > 0 else self.events.get_nowait()
            except queue.Empty:
                return
            self._event(msg)

    def _event(self, msg: dict[str, Any]) -> None:
        method, p = msg.get("method"), msg.get("params", {})
        if method == "Page.loadEventFired":
            self.loaded = True
        elif method == "Runtime.consoleAPICalled" and p.get("type") in ("error", "assert"):
            self.errors.append("console: " + " ".join(str(a.get("value", a.get("description", "")))
                                                      for a in p.get("args", [])))
        elif method == "Runtime.exceptionThrown":
            d = p.get("exceptionDetails", {})
            self.errors.append("exception: " + str(d.get("exception", {}).get("description") or d.get("text")))
        elif method == "Log.entryAdded" and p.get("entry", {}).get("level") == "error":
            e = p["entry"]
            self.errors.append(f"log: {e.get('text')} {e.get('url', '')}".strip())
        elif method == "Network.requestWillBeSent":
            self.requests.append(p.get("request", {}).get("url", ""))
        elif method == "Network.loadingFailed":
            self.errors.append(f"load failed: {p.get('errorText')}")

    def navigate(self, url: str, timeout: float | None = None) -> None:
        """Go to ``url`` and wait for its load event (:attr:`errors` and :attr:`requests` start anew)."""
        self.loaded = False
        self._drain()
        self.errors.clear()
        self.requests.clear()
        self.browser.send("Page.navigate", {"url": url}, session=self.session)
        deadline = time.monotonic() + (timeout or self.browser.timeout)
        while not self.loaded:
            if time.monotonic() > deadline:
                raise BrowserError(f"{url}: no load event in {timeout or self.browser.timeout:g} s")
            self._drain(0.05)

    def evaluate(self, expression: str) -> Any:
        """The value of a JavaScript expression (promises awaited)."""
        r = self.browser.send("Runtime.evaluate", {"expression": expression, "returnByValue": True,
                                                   "awaitPromise": True}, session=self.session)
        self._drain()
        if "exceptionDetails" in r:
            raise BrowserError(f"{expression}: {r['exceptionDetails'].get('text')}")
        return r.get("result", {}).get("value")

    def wait_for(self, expression: str, timeout: float = 20.0) -> float:
        """Wait until ``expression`` is truthy; returns the seconds waited (raises on timeout)."""
        t0 = time.monotonic()
        while not self.evaluate(expression):
            if time.monotonic() - t0 > timeout:
                raise BrowserError(f"{expression}: still false after {timeout:g} s")
            self._drain(0.02)
        return time.monotonic() - t0

    def settle(self, seconds: float = 0.2) -> None:
        """Collect the events of the next ``seconds`` (late console errors)."""
        self._drain(seconds)
