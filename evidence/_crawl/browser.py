"""Headless Chromium, driven over the DevTools protocol on a pipe.

    async with Browser(executable="/usr/bin/chromium") as browser:
        page = await browser.new_page(proxy="http://127.0.0.1:8123")
        await page.send("Page.enable")
        ...
        await page.close()

The browser is started with ``--remote-debugging-pipe``: it reads commands from its fd 3
and writes answers and events to its fd 4, each a JSON text ended by a NUL byte. No port
is opened, so nothing but this process can drive it, and no websocket library is needed.
The child's fds 3 and 4 are set with ``posix_spawn`` file actions (no shell, no
``preexec_fn``: the crawl runs threads, and a fork between threads may deadlock).

Every command waits for its answer at most ``timeout`` seconds (the first, the start's, at
least ``START_TIMEOUT``: a short render timeout bounds a page, not a cold start of Chromium
on a loaded machine, which can take several seconds); a browser that does not
answer, or whose pipe closes (it crashed or was killed), raises ``BrowserError`` with
``gone=True`` and every later command fails at once. The owner then starts a new one
(``_crawl.render.Renderer`` does). The browser always runs with a fresh profile in a
temporary directory, removed on close (one left by a killed crawl is removed when the next
browser starts: ``_crawl.scratch``), and with the flags that keep it from contacting
any host of its own accord (background networking, component updates, sync).

Pages are opened in browser contexts of their own (``Target.createBrowserContext``): no
cookie, cache or storage is shared between two pages, and each context can send all its
traffic to a proxy of its own (``proxyServer``), which is how the recording proxy knows
which render a request belongs to.
"""

from __future__ import annotations

import contextlib
import fcntl
import itertools
import json
import os
import shutil
import signal
from collections.abc import AsyncIterator
from typing import Any

import anyio
import anyio.abc
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

from .._errors import BrowserError
from .scratch import ScratchDir

__all__ = ["PROFILE_PREFIX", "Browser", "Page", "find_browser"]

#: A browser profile's directory name, in the temporary directory.
PROFILE_PREFIX = "evidence-browser-"

#: Flags every browser gets: headless, no sandbox (CI and containers run as root), and no
#: traffic of its own (updates, sync, safe browsing lists, metrics, default apps).
FLAGS = (
    "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
    "--disable-default-apps", "--disable-extensions", "--disable-breakpad",
    "--disable-client-side-phishing-detection", "--disable-domain-reliability",
    "--metrics-recording-only", "--no-default-browser-check", "--no-pings",
    "--mute-audio", "--hide-scrollbars", "--disable-dev-shm-usage",
    "--remote-debugging-pipe",
)
_CANDIDATES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
_MAX_MESSAGE = 512 * 1024 * 1024  # a full-page screenshot of a long page is large


# How long a starting browser may take to answer its first command, whatever the render
# timeout: Chromium's start took over 3 s on a loaded 2-core machine (the hung-page test,
# with a 3 s render timeout, failed its run there: "did not answer Browser.getVersion").
START_TIMEOUT = 60.0


def find_browser(executable: str | None = None) -> str:
    """The browser to run: ``executable`` if given (a path or a name on PATH), else the
    first of chromium, chromium-browser, google-chrome found on PATH."""
    for name in (executable,) if executable else _CANDIDATES:
        found = shutil.which(name)
        if found:
            return found
    if executable:
        raise BrowserError(f"browser {executable!r} is not an executable file or on PATH",
                           hint="give the path of a Chromium executable with --browser")
    raise BrowserError("no Chromium browser found on PATH (looked for "
                       f"{', '.join(_CANDIDATES)})",
                       hint="install it (Debian: apt-get install chromium) or give its path "
                       "with --browser")


class Browser:
    """One headless Chromium process and its DevTools pipe. Use ``async with``."""

    def __init__(self, *, executable: str | None = None, user_agent: str | None = None,
                 timeout: float = 30.0, extra_flags: tuple[str, ...] = ()) -> None:
        self.executable = find_browser(executable)
        self.user_agent = user_agent
        self.timeout = timeout
        self.extra_flags = extra_flags
        self.version = ""  # "Chrome/156.0.8078.114", once started
        self.pid = 0
        self._ids = itertools.count(1)
        self._waiters: dict[int, _Waiter] = {}
        self._sessions: dict[str, MemoryObjectSendStream[dict[str, Any]]] = {}
        self._gone: BrowserError | None = None
        self._write_lock = anyio.Lock()
        self._profile: ScratchDir | None = None
        self._to_browser = self._from_browser = -1
        self._pidfd = -1
        self._own: anyio.abc.TaskGroup
        self._pump_scope = anyio.CancelScope()
        self._pumped = anyio.Event()
        self._exited = anyio.Event()

    @property
    def gone(self) -> bool:
        return self._gone is not None

    async def __aenter__(self) -> Browser:
        self._own = anyio.create_task_group()
        await self._own.__aenter__()
        try:
            await self.start(self._own)
        except BaseException as exc:
            await self._own.__aexit__(type(exc), exc, exc.__traceback__)
            raise
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()
        await self._own.__aexit__(None, None, None)

    async def start(self, task_group: anyio.abc.TaskGroup) -> None:
        """Start the browser; its pipe is read by a task in ``task_group`` until ``close``."""
        self._spawn()
        task_group.start_soon(self._pump)
        try:
            info = await self.send("Browser.getVersion",
                                   timeout=max(self.timeout, START_TIMEOUT))
        except BaseException:
            await self.close()
            raise
        self.version = str(info.get("product", ""))

    async def close(self) -> None:
        """Ask the browser to quit (killing it after 5 s), then release its pipe and profile."""
        with anyio.CancelScope(shield=True):
            if not self.gone:
                with contextlib.suppress(BrowserError):
                    await self.send("Browser.close", timeout=5.0)
            with anyio.move_on_after(5.0):
                await self._exited.wait()
            self.kill()
            with anyio.move_on_after(5.0):
                await self._exited.wait()
            self._pump_scope.cancel()
            await self._pumped.wait()
        self._fail(BrowserError("the browser was closed", gone=True))
        for fd in (self._to_browser, self._from_browser, self._pidfd):
            if fd >= 0:
                with contextlib.suppress(OSError):
                    os.close(fd)
        self._to_browser = self._from_browser = self._pidfd = -1
        if self._profile is not None:
            self._profile.remove()
            self._profile = None

    async def _pump(self) -> None:
        """Read the pipe and reap the process, until ``close`` cancels it."""
        try:
            with self._pump_scope:
                async with anyio.create_task_group() as tg:
                    tg.start_soon(self._read_loop)
                    tg.start_soon(self._wait_exit)
        finally:
            self._pumped.set()

    def kill(self) -> None:
        """SIGKILL the browser (a hung one); its pipe then closes and every command fails."""
        if self.pid and not self._exited.is_set():
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGKILL)

    def _spawn(self) -> None:
        self._profile = ScratchDir(PROFILE_PREFIX)
        args = [self.executable, *FLAGS, f"--user-data-dir={self._profile.path}",
                *self.extra_flags]
        if self.user_agent:
            args.append(f"--user-agent={self.user_agent}")
        args.append("about:blank")
        down_r, down_w = os.pipe()  # we write commands; the browser reads them on fd 3
        up_r, up_w = os.pipe()  # the browser writes on fd 4; we read
        # Above fd 4 first: a dup2 onto itself would keep close-on-exec set.
        child_in = fcntl.fcntl(down_r, fcntl.F_DUPFD_CLOEXEC, 10)
        child_out = fcntl.fcntl(up_w, fcntl.F_DUPFD_CLOEXEC, 10)
        for fd in (down_r, up_w):
            os.close(fd)
        log = self._profile.path / "browser.log"
        try:
            self.pid = os.posix_spawn(self.executable, args, os.environ, file_actions=[
                (os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0),
                (os.POSIX_SPAWN_OPEN, 1, str(log), os.O_WRONLY | os.O_CREAT, 0o600),
                (os.POSIX_SPAWN_DUP2, 1, 2),
                (os.POSIX_SPAWN_DUP2, child_in, 3),
                (os.POSIX_SPAWN_DUP2, child_out, 4),
            ])
        except OSError as exc:
            for fd in (down_w, up_r):
                os.close(fd)
            self._profile.remove()
            self._profile = None
            raise BrowserError(f"cannot start {self.executable}: {exc.strerror}", gone=True,
                               hint="check that the browser runs: chromium --version") from exc
        finally:
            os.close(child_in)
            os.close(child_out)
        self._to_browser, self._from_browser = down_w, up_r
        os.set_blocking(down_w, False)
        os.set_blocking(up_r, False)
        self._pidfd = os.pidfd_open(self.pid)

    async def _wait_exit(self) -> None:
        await anyio.wait_readable(self._pidfd)
        os.waitpid(self.pid, 0)
        self._exited.set()

    async def _read_loop(self) -> None:
        buffer = bytearray()
        try:
            while True:
                await anyio.wait_readable(self._from_browser)
                try:
                    data = os.read(self._from_browser, 1 << 20)
                except BlockingIOError:
                    continue
                if not data:
                    break
                buffer += data
                start = 0
                while (end := buffer.find(b"\0", start)) >= 0:
                    self._dispatch(bytes(buffer[start:end]))
                    start = end + 1
                del buffer[:start]
                if len(buffer) > _MAX_MESSAGE:
                    break
        except OSError:
            pass
        self._fail(BrowserError("the browser closed its DevTools pipe (it exited or crashed)",
                                gone=True, hint="it is restarted for the next page"))

    def _dispatch(self, raw: bytes) -> None:
        try:
            message = json.loads(raw)
        except ValueError:
            return
        if "id" in message:
            waiter = self._waiters.pop(message["id"], None)
            if waiter is not None:
                waiter.resolve(message)
            return
        session = message.get("sessionId")
        stream = self._sessions.get(session) if session else None
        if stream is not None:
            with contextlib.suppress(anyio.WouldBlock, anyio.BrokenResourceError,
                                     anyio.ClosedResourceError):
                stream.send_nowait(message)
        elif message.get("method") == "Target.detachedFromTarget":
            gone = message.get("params", {}).get("sessionId")
            stream = self._sessions.pop(gone, None)
            if stream is not None:
                stream.close()

    def _fail(self, error: BrowserError) -> None:
        if self._gone is None:
            self._gone = error
        for waiter in list(self._waiters.values()):
            waiter.resolve(error)
        self._waiters.clear()
        for stream in self._sessions.values():
            stream.close()
        self._sessions.clear()

    async def send(self, method: str, params: dict[str, Any] | None = None, *,
                   session_id: str | None = None, timeout: float | None = None) -> Any:
        """Send one command; return its result, or raise ``BrowserError``."""
        if self._gone is not None:
            raise self._gone
        command_id = next(self._ids)
        message: dict[str, Any] = {"id": command_id, "method": method, "params": params or {}}
        if session_id is not None:
            message["sessionId"] = session_id
        waiter = self._waiters[command_id] = _Waiter()
        data = json.dumps(message, separators=(",", ":")).encode() + b"\0"
        limit = self.timeout if timeout is None else timeout
        with anyio.move_on_after(limit) as scope:
            async with self._write_lock:
                view = memoryview(data)
                while view:
                    await anyio.wait_writable(self._to_browser)
                    try:
                        view = view[os.write(self._to_browser, view):]
                    except BlockingIOError:
                        continue
                    except OSError as exc:
                        self._fail(BrowserError(f"writing to the browser failed: {exc}",
                                                gone=True))
                        raise self._gone from exc  # type: ignore[misc]
            await waiter.event.wait()
        if scope.cancelled_caught:
            self._waiters.pop(command_id, None)
            error = BrowserError(f"the browser did not answer {method} within {limit:g} s",
                                 gone=True, hint="a hung browser is killed and restarted")
            self._fail(error)
            self.kill()
            raise error
        answer = waiter.result
        if isinstance(answer, BrowserError):
            raise answer
        assert answer is not None
        if "error" in answer:
            error = answer["error"]
            raise BrowserError(f"{method}: {error.get('message', error)}",
                               hint="see the browser's DevTools protocol documentation")
        return answer.get("result", {})

    @contextlib.asynccontextmanager
    async def page(self, *, proxy: str | None = None,
                   bypass: str = "<-loopback>") -> AsyncIterator[Page]:
        """A new tab in a new browser context (``proxy``: where all its traffic goes;
        ``bypass``: which hosts skip it; Chromium's default skips loopback, so the
        default here says "none: loopback too")."""
        params: dict[str, Any] = {"disposeOnDetach": True}
        if proxy:
            params |= {"proxyServer": proxy, "proxyBypassList": bypass}
        context = (await self.send("Target.createBrowserContext", params))["browserContextId"]
        try:
            target = (await self.send("Target.createTarget", {
                "url": "about:blank", "browserContextId": context}))["targetId"]
            session = (await self.send("Target.attachToTarget", {
                "targetId": target, "flatten": True}))["sessionId"]
            send, receive = anyio.create_memory_object_stream[dict[str, Any]](10_000)
            self._sessions[session] = send
            page = Page(self, session, target, receive)
            try:
                yield page
            finally:
                self._sessions.pop(session, None)
                send.close()
                receive.close()
                if not self.gone:
                    with contextlib.suppress(BrowserError):
                        await self.send("Target.closeTarget", {"targetId": target},
                                        timeout=5.0)
        finally:
            if not self.gone:
                with contextlib.suppress(BrowserError):
                    await self.send("Target.disposeBrowserContext",
                                    {"browserContextId": context}, timeout=5.0)


class Page:
    """One tab: its commands go to its session, its events arrive in ``events``."""

    def __init__(self, browser: Browser, session_id: str, target_id: str,
                 events: MemoryObjectReceiveStream[dict[str, Any]]) -> None:
        self.browser = browser
        self.session_id = session_id
        self.target_id = target_id
        self.events = events

    async def send(self, method: str, params: dict[str, Any] | None = None, *,
                   timeout: float | None = None) -> Any:
        return await self.browser.send(method, params, session_id=self.session_id,
                                       timeout=timeout)

    async def evaluate(self, expression: str, *, timeout: float | None = None) -> Any:
        """The value of a JavaScript expression in the page (returned by value)."""
        result = await self.send("Runtime.evaluate", {
            "expression": expression, "returnByValue": True, "awaitPromise": True},
            timeout=timeout)
        if "exceptionDetails" in result:
            text = result["exceptionDetails"].get("text", "exception")
            raise BrowserError(f"evaluating in the page failed: {text}")
        return result.get("result", {}).get("value")


class _Waiter:
    __slots__ = ("event", "result")

    def __init__(self) -> None:
        self.event = anyio.Event()
        self.result: dict[str, Any] | BrowserError | None = None

    def resolve(self, result: dict[str, Any] | BrowserError) -> None:
        if not self.event.is_set():
            self.result = result
            self.event.set()
