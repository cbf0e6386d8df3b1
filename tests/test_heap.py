"""The crawl process's malloc settings (``_crawl.heap``, issue 35 point 2: flat memory).

glibc's defaults let a crawl's resident set climb with the pages crawled while the memory
in use stayed level: a freed large block raised the mmap threshold, so later large blocks
came from the heap and stayed resident once freed, and each thread grew an arena of its
own. Each test starts a fresh interpreter (the settings are the process's) that runs the
``crawl`` command (``--print-config``: the settings are made before anything else), or
not, then makes the allocations that show them with glibc's own counters.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux") or "CS_GNU_LIBC_VERSION" not in os.confstr_names
    or not os.confstr("CS_GNU_LIBC_VERSION"), reason="glibc's malloc only")

PROBE = """
import contextlib, ctypes, io, re, sys, tempfile, threading
COMMANDS = {  # each ends at once: the settings are made first, before anything can fail
    "crawl": (["crawl", "--print-config", "--store", tempfile.mkdtemp() + "/s",
               "http://127.0.0.1:9/"], 0),
    "serve": (["serve", tempfile.mkdtemp() + "/s"], 2),  # nothing to listen on
    "worker": (["worker", "--connect", "127.0.0.1:9", "--token-file", "/nonexistent"], 2),
}
if sys.argv[1] in COMMANDS:
    from evidence._cli.main import main
    argv, status = COMMANDS[sys.argv[1]]
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        assert main(argv) == status
libc = ctypes.CDLL(None)

class Mallinfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks",
        "fordblks", "keepcost")]

libc.mallinfo2.restype = Mallinfo2
big = bytearray(8 << 20)  # mapped on its own; freeing it raises a dynamic threshold
del big
before = libc.mallinfo2().hblks  # blocks mapped by the interpreter's start, still in use
blocks = [bytearray(1 << 20) for _ in range(4)]
mapped = libc.mallinfo2().hblks - before

ready, done = threading.Barrier(9), threading.Event()
def hold():
    kept = [bytearray(4096) for _ in range(8)]  # from malloc: over pymalloc's 512 bytes
    ready.wait()
    done.wait()
threads = [threading.Thread(target=hold) for _ in range(8)]
for t in threads:
    t.start()
ready.wait()
libc.fopen.restype = ctypes.c_void_p
libc.fopen.argtypes = [ctypes.c_char_p, ctypes.c_char_p]
libc.malloc_info.argtypes = [ctypes.c_int, ctypes.c_void_p]
libc.fclose.argtypes = [ctypes.c_void_p]
with tempfile.NamedTemporaryFile("r") as f:
    stream = libc.fopen(f.name.encode(), b"w")
    libc.malloc_info(0, stream)
    libc.fclose(stream)
    arenas = len(re.findall(r'<heap nr="', f.read()))
done.set()
for t in threads:
    t.join()
print(mapped, arenas)
"""


def probe(mode: str) -> tuple[int, int]:
    """(blocks of 1 MiB mapped on their own after an 8 MiB one was freed, malloc's arenas
    with 8 threads holding blocks) in a new interpreter, after ``mode``."""
    done = subprocess.run([sys.executable, "-c", PROBE, mode], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    mapped, arenas = map(int, done.stdout.split())
    return mapped, arenas


@pytest.mark.parametrize("command", ["crawl", "serve", "worker"])
def test_a_long_lived_process_maps_large_blocks_on_their_own_and_keeps_two_arenas(
        command: str) -> None:
    """A crawl, the writer service and a worker host (each long-lived, each reading and
    parsing pages or messages in threads)."""
    mapped, arenas = probe(command)
    assert mapped >= 4  # each 1 MiB block: returned to the system when freed
    assert arenas <= 2


def test_without_such_a_command_glibc_s_defaults_hold() -> None:
    """The control: what the probe shows of a process that kept glibc's defaults, so the
    test above cannot pass by the probe's own doing."""
    mapped, arenas = probe("none")
    assert mapped == 0  # the threshold rose to 8 MiB: the 1 MiB blocks came from the heap
    assert arenas > 2
