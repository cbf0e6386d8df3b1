"""The crawl process's C heap: glibc's ``malloc`` kept from growing with the pages crawled
(issue 35 point 2, flat memory).

Python's own allocator serves objects up to 512 bytes; everything larger, and everything
SQLite, lexbor and the hashing libraries allocate, comes from the C library's ``malloc``.
Two of glibc's defaults made a crawl's resident set climb for tens of thousands of pages
while the memory actually in use stayed level (``malloc_info`` at 10,000 and 24,000 pages
of the benchmark site: in use flat, free-but-resident 10 MB more in the commit thread's
arena and 5 MB more in the main one):

- the *dynamic mmap threshold*: a block of 128 KiB or more starts out in a mapping of its
  own, returned to the system when freed, but each such free raises the threshold to that
  block's size (up to 32 MiB). After the first large buffer (a pack's batched ``writev``
  of up to a MiB, a large page or message) every later one of that size comes from the
  heap instead, between the small long-lived blocks, and once freed it stays resident
  as a hole the heap cannot give back;
- one *arena per thread*, up to eight per core: the commit thread, the event loop's
  helper threads (DNS, reads of stored captures) each grow an arena of their own, each
  with its own holes.

``bound_heap`` fixes both, once, before the process starts its threads: the threshold at
``MMAP_THRESHOLD`` (fixed: setting it turns the dynamic raise off), and at most
``ARENA_MAX`` arenas (the main one and one the threads share; the GIL lets one thread at
a time run Python, so they hardly contend). Measured on the 100,000-page benchmark in
docs/benchmarks.md ("Writes and memory over a crawl"). Only the long-lived processes the
``evidence`` command starts call it (a crawl and its worker processes, a worker host,
the writer service): a program that crawls through the library keeps its own allocator
settings. Elsewhere than glibc it does nothing.
"""

from __future__ import annotations

import ctypes
import os

__all__ = ["ARENA_MAX", "MMAP_THRESHOLD", "bound_heap"]

# glibc's <malloc.h> parameter numbers for mallopt().
_M_MMAP_THRESHOLD = -3
_M_ARENA_MAX = -8

# Blocks this large or larger get a mapping of their own, unmapped when freed: glibc's own
# starting value, kept. A crawl maps about 2.5 such blocks a page (lexbor's 324 KiB chunk
# for each parse, 260 KiB socket reads): under strace, 1,500 pages made 3,822 mmap, 3,604
# munmap and 1,810 brk calls, where glibc's defaults made 6,099 brk calls, growing and
# trimming the heap's top around the same blocks (system time 0.07 s against 0.06 s).
MMAP_THRESHOLD = 128 * 1024
# The main arena and one for every other thread.
ARENA_MAX = 2


def bound_heap() -> bool:
    """Set the mmap threshold and the arena limit of this process's ``malloc``; False
    where the C library is not glibc (nothing is changed)."""
    try:
        if not os.confstr("CS_GNU_LIBC_VERSION"):
            return False
        mallopt = ctypes.CDLL(None).mallopt
    except (ValueError, OSError, AttributeError):  # not glibc
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    return bool(mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(
        mallopt(_M_ARENA_MAX, ARENA_MAX))
