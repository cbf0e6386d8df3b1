#!/usr/bin/env python3
"""The S3 client's cost per request (issue 16): our SigV4 client against obstore.

Starts SeaweedFS (``evidence.testing.seaweed``) on 127.0.0.1, then, one thread each:
``--objects`` puts of distinct ``--size``-byte bodies through ``S3ArtifactStore.put``
(conditional create with Content-MD5 and x-amz-checksum-sha256, BLAKE3 of the body) and
as many ``HEAD``s (``check``); then the same through obstore (``put(mode="create")`` with
``checksum_algorithm="SHA256"``, and ``head``) when it is installed (``pip install
obstore``; it is not a dependency), else says so. Prints requests per second and CPU
milliseconds per request (this process's rusage).

Options: --objects N (500), --size BYTES (4000), --quick (100 objects).
"""

from __future__ import annotations

import argparse
import os
import resource
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from evidence._store.s3 import open_s3
from evidence.testing.seaweed import SeaweedS3


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _timed(label: str, n: int, work) -> None:
    wall0, cpu0 = time.perf_counter(), _cpu()
    work()
    wall, cpu = time.perf_counter() - wall0, _cpu() - cpu0
    print(f"{label:28} {n / wall:8.0f} /s   {1000 * cpu / n:6.3f} CPU ms each", flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--objects", type=int, default=500, help="objects put, then headed")
    parser.add_argument("--size", type=int, default=4000, help="bytes per object")
    parser.add_argument("--quick", action="store_true", help="100 objects")
    args = parser.parse_args()
    n = 100 if args.quick else args.objects
    bodies = [os.urandom(args.size) for _ in range(n)]
    with tempfile.TemporaryDirectory(prefix="bench-s3client-") as tmp, \
            SeaweedS3.start(tmp) as server:
        print(f"SeaweedFS weed mini on 127.0.0.1; {n} objects of {args.size} bytes; "
              f"load {os.getloadavg()[0]:.1f}")
        store = open_s3(server.url("ours"), create=True, read_only=False,
                        environ=server.environ)
        refs = []
        _timed("ours: put (create, 2 sums)", n,
               lambda: refs.extend(store.put("body", body) for body in bodies))
        _timed("ours: head", n, lambda: [store.check(ref) for ref in refs])
        store.close()
        try:
            import obstore
            from obstore.store import S3Store
        except ImportError:
            print("obstore: not installed (pip install obstore to compare)")
            return 0
        other = S3Store(server.bucket, prefix="obstore", endpoint=server.endpoint,
                        access_key_id=server.environ["AWS_ACCESS_KEY_ID"],
                        secret_access_key=server.environ["AWS_SECRET_ACCESS_KEY"],
                        region="us-east-1", client_options={"allow_http": True},
                        virtual_hosted_style_request=False, checksum_algorithm="SHA256")
        _timed(f"obstore {obstore.__version__}: put (create)", n,
               lambda: [obstore.put(other, f"body/{i}", body, mode="create")
                        for i, body in enumerate(bodies)])
        _timed(f"obstore {obstore.__version__}: head", n,
               lambda: [obstore.head(other, f"body/{i}") for i in range(n)])
    return 0


if __name__ == "__main__":
    sys.exit(main())
