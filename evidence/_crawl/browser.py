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
(``_crawl.render.Renderer`` does). Inside ``keep_browsers()`` a browser its owner is done
with keeps running for the next owner started with the same executable and flags (a
program that runs crawl after crawl; the test suite): the process and its pipe outlive
the owner's event loop, and the next owner reads on from where it stopped.

The browser always runs with a fresh profile in a temporary directory, removed when it
ends (one left by a killed crawl is removed when the next browser starts:
``_crawl.scratch``), and with the flags that keep it from contacting any host of its own
accord (background networking, component updates, sync).

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
import select
import shutil
import signal
import threading
from collections.abc import AsyncIterator, Iterator
from typing import Any

import anyio
import anyio.abc
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

from .._errors import BrowserError
from .scratch import ScratchDir

__all__ = ["PROFILE_PREFIX", "Browser", "Page", "find_browser", "keep_browsers"]

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
    """One headless Chromium process and its DevTools pipe. Use ``async with``.

    Inside ``keep_browsers()``, ``start`` takes a kept browser started with the same
    executable and flags, if there is one, and ``close`` leaves a healthy browser there
    for the next instead of ending it."""

    def __init__(self, *, executable: str | None = None, user_agent: str | None = None,
                 timeout: float = 30.0, extra_flags: tuple[str, ...] = ()) -> None:
        self.executable = find_browser(executable)
        self.user_agent = user_agent
        self.timeout = timeout
        self.extra_flags = extra_flags
        self.version = ""  # "Chrome/156.0.8078.114", once started
        self.kept = False  # started by an earlier owner and kept for this one
        self._process: _Process | None = None
        self._waiters: dict[int, _Waiter] = {}
        self._sessions: dict[str, MemoryObjectSendStream[dict[str, Any]]] = {}
        self._gone: BrowserError | None = None
        self._write_lock = anyio.Lock()
        self._own: anyio.abc.TaskGroup
        self._pump_scope = anyio.CancelScope()
        self._pumped = anyio.Event()
        self._exited = anyio.Event()

    @property
    def gone(self) -> bool:
        return self._gone is not None

    @property
    def pid(self) -> int:
        return self._process.pid if self._process is not None else 0

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

    def _args(self) -> tuple[str, ...]:
        """The command line but for the profile: what a kept browser must match."""
        args = [self.executable, *FLAGS, *self.extra_flags]
        if self.user_agent:
            args.append(f"--user-agent={self.user_agent}")
        return tuple(args)

    async def start(self, task_group: anyio.abc.TaskGroup) -> None:
        """Start the browser (or take a kept one); its pipe is read by a task in
        ``task_group`` until ``close``."""
        self._process = _KEPT.take(self._args())
        self.kept = self._process is not None
        if self._process is not None:  # it answered its first owner; a dead one is restarted
            task_group.start_soon(self._pump)  # by the renderer, as any that dies
            self.version = self._process.version
            return
        self._process = _Process.spawn(self._args())
        task_group.start_soon(self._pump)
        try:
            info = await self.send("Browser.getVersion",
                                   timeout=max(self.timeout, START_TIMEOUT))
        except BaseException:
            await self.close()
            raise
        self.version = self._process.version = str(info.get("product", ""))

    async def close(self) -> None:
        """Ask the browser to quit (killing it after 5 s), then release its pipe and profile;
        inside ``keep_browsers()``, a browser with no page open is kept instead."""
        process = self._process
        if process is None:
            return
        with anyio.CancelScope(shield=True):
            keep = (not self.gone and not self._sessions and bool(process.version)
                    and _KEPT.open and await self._no_context_left())  # version: it started
            if not keep:
                if not self.gone:
                    with contextlib.suppress(BrowserError):
                        await self.send("Browser.close", timeout=5.0)
                with anyio.move_on_after(5.0):
                    await self._exited.wait()
                self.kill()
                with anyio.move_on_after(5.0):
                    await self._exited.wait()
            self._pump_scope.cancel()  # the reader stops between two reads
            await self._pumped.wait()
            self._fail(BrowserError("the browser was closed", gone=True))
            self._process = None
            if not keep:
                process.release()
                return
            kept, ending = _KEPT.keep(process)  # not if it exited, or none is kept now
            for other in ending if kept else [process]:
                await anyio.to_thread.run_sync(other.end)

    async def _no_context_left(self) -> bool:
        """Dispose of every browser context still open (each page's is disposed when the
        page closes; this is for one that was not): a kept browser keeps nothing of its
        owner's pages. False if the browser does not do it."""
        try:
            left = (await self.send("Target.getBrowserContexts", timeout=5.0))
            for context in left.get("browserContextIds", []):
                await self.send("Target.disposeBrowserContext",
                                {"browserContextId": context}, timeout=5.0)
        except BrowserError:
            return False
        return not self.gone

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
        if self._process is not None and not self._exited.is_set():
            self._process.kill()

    async def _wait_exit(self) -> None:
        assert self._process is not None
        await anyio.wait_readable(self._process.pidfd)
        self._process.reap()
        self._exited.set()

    async def _read_loop(self) -> None:
        process = self._process
        assert process is not None
        buffer = process.unread  # kept with the process: a kept browser's next owner reads on
        try:
            while True:
                await anyio.wait_readable(process.from_browser)
                try:
                    data = os.read(process.from_browser, 1 << 20)
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
        assert self._process is not None
        command_id = next(self._process.ids)
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
                    await anyio.wait_writable(self._process.to_browser)
                    try:
                        view = view[os.write(self._process.to_browser, view):]
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
                # Shielded: a page left by a render that ran out of time (a cancelled
                # scope) would otherwise live on, its scripts running, as long as the
                # browser does.
                with anyio.CancelScope(shield=True):
                    if not self.gone:
                        with contextlib.suppress(BrowserError):
                            await self.send("Target.closeTarget", {"targetId": target},
                                            timeout=5.0)
        finally:
            with anyio.CancelScope(shield=True):
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


class _Process:
    """A started browser: its process, its pipe and its profile. It belongs to one
    ``Browser`` at a time, or to the kept ones (``keep_browsers``), and can outlive the
    event loop of the ``Browser`` that started it: its pipe is plain file descriptors, and
    command ids go on counting from one owner to the next, so an answer meant for an
    earlier owner is never taken for a later one's."""

    def __init__(self, args: tuple[str, ...], pid: int, to_browser: int, from_browser: int,
                 profile: ScratchDir) -> None:
        self.args = args
        self.pid = pid
        self.pidfd = os.pidfd_open(pid)
        self.to_browser = to_browser
        self.from_browser = from_browser
        self.profile: ScratchDir | None = profile
        self.ids = itertools.count(1)
        self.unread = bytearray()  # the start of a message not yet read whole
        self.version = ""
        self.reaped = False

    @classmethod
    def spawn(cls, args: tuple[str, ...]) -> _Process:
        profile = ScratchDir(PROFILE_PREFIX)
        argv = [args[0], f"--user-data-dir={profile.path}", *args[1:], "about:blank"]
        down_r, down_w = os.pipe()  # we write commands; the browser reads them on fd 3
        up_r, up_w = os.pipe()  # the browser writes on fd 4; we read
        # Above fd 4 first: a dup2 onto itself would keep close-on-exec set.
        child_in = fcntl.fcntl(down_r, fcntl.F_DUPFD_CLOEXEC, 10)
        child_out = fcntl.fcntl(up_w, fcntl.F_DUPFD_CLOEXEC, 10)
        for fd in (down_r, up_w):
            os.close(fd)
        log = profile.path / "browser.log"
        try:
            pid = os.posix_spawn(args[0], argv, os.environ, file_actions=[
                (os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0),
                (os.POSIX_SPAWN_OPEN, 1, str(log), os.O_WRONLY | os.O_CREAT, 0o600),
                (os.POSIX_SPAWN_DUP2, 1, 2),
                (os.POSIX_SPAWN_DUP2, child_in, 3),
                (os.POSIX_SPAWN_DUP2, child_out, 4),
            ])
        except OSError as exc:
            for fd in (down_w, up_r):
                os.close(fd)
            profile.remove()
            raise BrowserError(f"cannot start {args[0]}: {exc.strerror}", gone=True,
                               hint="check that the browser runs: chromium --version") from exc
        finally:
            os.close(child_in)
            os.close(child_out)
        os.set_blocking(down_w, False)
        os.set_blocking(up_r, False)
        return cls(args, pid, down_w, up_r, profile)

    def exited(self) -> bool:
        """Whether the process has ended (its pidfd is readable), without waiting."""
        return self.reaped or bool(select.select([self.pidfd], [], [], 0)[0])

    def kill(self) -> None:
        if not self.reaped:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGKILL)

    def reap(self) -> None:
        if not self.reaped:
            with contextlib.suppress(ChildProcessError):
                os.waitpid(self.pid, 0)
            self.reaped = True

    def end(self, grace: float = 5.0) -> None:
        """End it from any thread, without an event loop: Chromium quits when its DevTools
        pipe closes; one still running after ``grace`` seconds is killed."""
        if self.to_browser >= 0:
            os.close(self.to_browser)
            self.to_browser = -1
        if not self.reaped and not select.select([self.pidfd], [], [], grace)[0]:
            self.kill()
        self.reap()
        self.release()

    def release(self) -> None:
        """Close the pipe and remove the profile (the process has ended)."""
        for fd in (self.to_browser, self.from_browser, self.pidfd):
            if fd >= 0:
                with contextlib.suppress(OSError):
                    os.close(fd)
        self.to_browser = self.from_browser = self.pidfd = -1
        if self.profile is not None:
            self.profile.remove()
            self.profile = None


class _Kept:
    """The browsers kept between owners while ``keep_browsers()`` is open (any thread)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._depth = 0
        self._most = 0
        self._idle: list[_Process] = []  # the least recently kept first

    @property
    def open(self) -> bool:
        return self._depth > 0

    def take(self, args: tuple[str, ...]) -> _Process | None:
        """A kept browser started with ``args``, still running, or None."""
        with self._lock:
            found = next((p for p in self._idle if p.args == args), None)
            if found is not None:
                self._idle.remove(found)
        if found is not None and found.exited():
            found.end()
            return None
        return found

    def keep(self, process: _Process) -> tuple[bool, list[_Process]]:
        """Keep ``process`` for the next owner (not if it has exited or none is kept now),
        and the ones it pushes out (the least recently kept beyond ``most``) to be ended."""
        if process.exited():
            return False, []
        with self._lock:
            if self._depth == 0:
                return False, []
            self._idle.append(process)
            evicted = self._idle[:-self._most]
            del self._idle[:-self._most]
        return True, evicted

    def enter(self, most: int) -> None:
        with self._lock:
            self._depth += 1
            self._most = max(self._most, most)

    def leave(self) -> None:
        ending: list[_Process] = []
        with self._lock:
            self._depth -= 1
            if self._depth == 0:
                ending, self._idle, self._most = self._idle, [], 0
        for process in ending:
            process.end()


_KEPT = _Kept()


@contextlib.contextmanager
def keep_browsers(most: int = 2) -> Iterator[None]:
    """Keep the browsers that crawls close, for the next crawls in this process.

    Chromium takes a second or two of CPU to start. Inside this block a browser that a
    crawl's renderer (or any ``Browser``) is done with stays running, up to ``most`` of them
    (the least recently used is ended first), and the next one started with the same
    executable and flags takes it instead of starting another. Nothing of a render outlives
    its page: each page has a browser context of its own, disposed when it closes (cookies,
    storage, cache). A kept browser that has exited is not taken. Leaving the outermost
    block ends every kept browser and removes its profile. Blocks may nest, in any thread.
    """
    if most < 1:
        raise ValueError(f"keep_browsers: most must be 1 or more, not {most}")
    _KEPT.enter(most)
    try:
        yield
    finally:
        _KEPT.leave()
