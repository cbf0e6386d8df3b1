"""A throwaway RFC 3161 time-stamping authority for tests: ``openssl ts -reply`` over HTTP.

    with TestTSA.start() as tsa:
        tsa.url          # http://127.0.0.1:<port>/tsr: POST a query, get a response
        tsa.root_pem     # the root certificate a verifier names (--tsa-root)
        tsa.cert_pem     # the TSA's own certificate (--tsa-cert)

At start it makes, with the ``openssl`` command, a private CA of its own (a root
certificate) and a TSA certificate that root issues (extended key usage timeStamping,
critical, as RFC 3161 section 2.3 requires), each with a new P-256 key, in a temporary
directory. Each POST is answered by running ``openssl ts -reply`` on the query, one at a
time (the serial number file is openssl's), so the tokens are real ones, signed by a real
TSA implementation that is not this project's. The server listens on 127.0.0.1 only.

Nothing here is silent: a missing ``openssl`` or a step that fails raises ``TSAError`` with
the command's output, and the test that needed it fails with it (never skips).
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import TracebackType

__all__ = ["TSAError", "TestTSA"]

POLICY = "1.3.6.1.4.1.55555.1.1"  # a policy OID of this test TSA's (arbitrary, private arc)
_QUERY = "application/timestamp-query"
_REPLY = "application/timestamp-reply"
_MAX_QUERY = 64 * 1024

_CONFIG = """\
[ tsa ]
default_tsa = tsa_config

[ tsa_config ]
dir = {dir}
serial = $dir/serial
crypto_device = builtin
signer_cert = $dir/tsa.pem
certs = $dir/tsa.pem
signer_key = $dir/tsa.key
signer_digest = sha256
default_policy = {policy}
digests = sha256, sha384, sha512
accuracy = secs:1
clock_precision_digits = 0
ordering = yes
tsa_name = yes
ess_cert_id_chain = no
ess_cert_id_alg = sha256
"""


class TSAError(RuntimeError):
    """The test TSA could not be made or started; says why."""


def _openssl(*args: str, cwd: Path, stdin: bytes | None = None) -> bytes:
    try:
        done = subprocess.run(["openssl", *args], cwd=cwd, input=stdin, capture_output=True,
                              timeout=60, check=False)
    except FileNotFoundError:
        raise TSAError("the openssl command is not installed (apt-get install openssl)") \
            from None
    if done.returncode != 0:
        raise TSAError(f"openssl {' '.join(args)} failed ({done.returncode}): "
                       f"{done.stderr.decode(errors='replace').strip()}")
    return done.stdout


def make_authority(directory: Path) -> None:
    """The CA and the TSA certificate, keys and openssl configuration, in ``directory``."""
    d = directory
    ec = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes")
    _openssl("req", "-x509", *ec, "-keyout", "root.key", "-out", "root.pem", "-days", "3650",
             "-subj", "/CN=evidence test TSA root", "-addext",
             "basicConstraints=critical,CA:TRUE", "-addext",
             "keyUsage=critical,keyCertSign,cRLSign", cwd=d)
    _openssl("req", "-new", *ec, "-keyout", "tsa.key", "-out", "tsa.csr", "-subj",
             "/CN=evidence test TSA", cwd=d)
    (d / "tsa.ext").write_text("basicConstraints=critical,CA:FALSE\n"
                               "keyUsage=critical,digitalSignature\n"
                               "extendedKeyUsage=critical,timeStamping\n")
    _openssl("x509", "-req", "-in", "tsa.csr", "-CA", "root.pem", "-CAkey", "root.key",
             "-CAcreateserial", "-out", "tsa.pem", "-days", "3650", "-extfile", "tsa.ext",
             cwd=d)
    (d / "serial").write_text("01\n")
    (d / "tsa.cnf").write_text(_CONFIG.format(dir=d, policy=POLICY))


class TestTSA:
    """A running test TSA; ``close`` (or leaving the ``with``) stops it."""

    __test__ = False  # not a pytest test class, whatever its name

    def __init__(self, directory: Path, server: ThreadingHTTPServer,
                 thread: threading.Thread, owned: tempfile.TemporaryDirectory[str] | None
                 ) -> None:
        self.directory = directory
        self._server = server
        self._thread = thread
        self._owned = owned
        port = server.server_address[1]
        self.url = f"http://127.0.0.1:{port}/tsr"
        self.root_pem = directory / "root.pem"
        self.cert_pem = directory / "tsa.pem"
        self.requests = 0

    @classmethod
    def start(cls, directory: Path | None = None) -> TestTSA:
        if shutil.which("openssl") is None:
            raise TSAError("the openssl command is not installed (apt-get install openssl)")
        owned = None
        if directory is None:
            owned = tempfile.TemporaryDirectory(prefix="evidence-tsa-")
            where = Path(owned.name)
        else:
            where = directory
        try:
            make_authority(where)
            lock = threading.Lock()
            holder: list[TestTSA] = []

            class Handler(BaseHTTPRequestHandler):
                def do_POST(self) -> None:
                    length = int(self.headers.get("Content-Length") or 0)
                    if self.headers.get("Content-Type") != _QUERY or not 0 < length <= \
                            _MAX_QUERY:
                        self.send_error(400, "expected one application/timestamp-query")
                        return
                    query = self.rfile.read(length)
                    with lock:
                        holder[0].requests += 1
                        try:
                            reply = _reply(where, query)
                        except TSAError as exc:
                            self.send_error(500, str(exc)[:200])
                            return
                    self.send_response(200)
                    self.send_header("Content-Type", _REPLY)
                    self.send_header("Content-Length", str(len(reply)))
                    self.end_headers()
                    self.wfile.write(reply)

                def log_message(self, format: str, *args: object) -> None:
                    pass  # the tests' output stays theirs

            server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        except BaseException:
            if owned is not None:
                owned.cleanup()
            raise
        thread = threading.Thread(target=server.serve_forever, name="test-tsa", daemon=True)
        tsa = cls(where, server, thread, owned)
        holder.append(tsa)
        thread.start()
        return tsa

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()
        if self._owned is not None:
            self._owned.cleanup()

    def __enter__(self) -> TestTSA:
        return self

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()


def _reply(directory: Path, query: bytes) -> bytes:
    (directory / "query.tsq").write_bytes(query)
    _openssl("ts", "-reply", "-config", "tsa.cnf", "-queryfile", "query.tsq", "-out",
             "reply.tsr", cwd=directory)
    return (directory / "reply.tsr").read_bytes()
