"""What an ``s3://`` URL names: a bucket, a prefix, and where the objects are
(``S3Location``), and the client configuration it gives with the environment's
credentials (``S3Location.config``).

Apart from the store it opens (``s3.py``): the CLI, the archive transfers and the
PostgreSQL store read a URL, and check one, without a store.
"""

from __future__ import annotations

import re
import urllib.parse
from collections.abc import Mapping
from typing import Any

from .._errors import ArtifactError
from .s3client import DEFAULT_OUTAGE_DEADLINE, S3Config

__all__ = ["OUTAGE_DEADLINE_ENV", "S3Location"]

_BUCKET_RE = re.compile(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]")
_PREFIX_RE = re.compile(r"[A-Za-z0-9._-]+(/[A-Za-z0-9._-]+)*")
_PARAMS = ("endpoint", "region", "ca")
OUTAGE_DEADLINE_ENV = "EVIDENCE_S3_OUTAGE_DEADLINE"  # seconds (S3Config.outage_deadline)


class S3Location:
    """A parsed ``s3://bucket[/prefix][?endpoint=URL&region=NAME&ca=FILE]``.

    The query parameters are the options that say where the objects are; credentials never
    go in the URL (it is recorded in the store): they come from the environment.
    """

    def __init__(self, url: str) -> None:
        parts = urllib.parse.urlsplit(url)
        if parts.scheme != "s3":
            raise ArtifactError(f"{url!r} is not an s3:// URL",
                                hint="give --artifacts s3://BUCKET/PREFIX")
        if "@" in parts.netloc:
            raise ArtifactError("an s3:// URL must not hold credentials (it is recorded in "
                                "the store)", hint="set AWS_ACCESS_KEY_ID and "
                                "AWS_SECRET_ACCESS_KEY in the environment instead")
        bucket, prefix = parts.netloc, parts.path.strip("/")
        if not _BUCKET_RE.fullmatch(bucket):
            raise ArtifactError(f"{url!r}: {bucket!r} is not a valid bucket name",
                                hint="a bucket name is 3-63 characters of a-z, 0-9, '.', '-'")
        if prefix and not _PREFIX_RE.fullmatch(prefix):
            raise ArtifactError(f"{url!r}: the prefix {prefix!r} may hold only letters, "
                                "digits, '.', '_', '-' and single '/'",
                                hint="choose a simpler prefix, e.g. s3://bucket/crawls/site")
        params = dict(urllib.parse.parse_qsl(parts.query, keep_blank_values=True))
        unknown = sorted(set(params) - set(_PARAMS))
        if unknown:
            raise ArtifactError(f"s3://{bucket}/{prefix}: unknown option {unknown[0]!r} (the "
                                "URL's options are not shown: one may hold a secret)",
                                hint="the options are endpoint=URL, region=NAME, ca=FILE")
        endpoint = params.get("endpoint")
        if endpoint is not None and not endpoint.startswith(("http://", "https://")):
            raise ArtifactError(f"{url!r}: endpoint {endpoint!r} is not an http(s) URL",
                                hint="e.g. endpoint=https://s3.eu-west-1.amazonaws.com")
        self.bucket, self.prefix, self.params = bucket, prefix, params

    @property
    def url(self) -> str:
        """The canonical form (what the store records): no credentials, options sorted."""
        query = urllib.parse.urlencode(sorted(self.params.items()), safe=":/")
        path = f"/{self.prefix}" if self.prefix else ""
        return f"s3://{self.bucket}{path}" + (f"?{query}" if query else "")

    def config(self, environ: Mapping[str, str], **options: Any) -> S3Config:
        """The client's configuration: the URL's options first, then the usual AWS_*
        variables of ``environ`` (read only here, when the user names an s3:// store), and
        ``EVIDENCE_S3_OUTAGE_DEADLINE``: how long a request rides through an outage. That
        one is not a URL option: it is how patient this process is, not where the objects
        are, and the URL is recorded in the store."""
        endpoint = (self.params.get("endpoint") or environ.get("AWS_ENDPOINT_URL_S3")
                    or environ.get("AWS_ENDPOINT_URL"))
        if not endpoint:
            raise ArtifactError(
                f"{self.url}: no S3 endpoint is given",
                hint="set AWS_ENDPOINT_URL (e.g. https://s3.eu-west-1.amazonaws.com), or add "
                "?endpoint=URL to the s3:// URL")
        access, secret = environ.get("AWS_ACCESS_KEY_ID"), environ.get("AWS_SECRET_ACCESS_KEY")
        if not access or not secret:
            raise ArtifactError(f"{self.url}: no S3 credentials in the environment",
                                hint="set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY")
        region = (self.params.get("region") or environ.get("AWS_REGION")
                  or environ.get("AWS_DEFAULT_REGION") or "us-east-1")
        if OUTAGE_DEADLINE_ENV in environ and "outage_deadline" not in options:
            options["outage_deadline"] = _outage_deadline(environ[OUTAGE_DEADLINE_ENV])
        return S3Config(endpoint=endpoint.rstrip("/"), bucket=self.bucket, region=region,
                        access_key=access, secret_key=secret,
                        session_token=environ.get("AWS_SESSION_TOKEN", ""),
                        ca_file=self.params.get("ca") or environ.get("AWS_CA_BUNDLE") or None,
                        **options)


def _outage_deadline(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 <= value < float("inf"):
        raise ArtifactError(f"{OUTAGE_DEADLINE_ENV}={text!r} is not a number of seconds",
                            hint=f"set it to how long a request to the object store may keep "
                            f"retrying an outage, e.g. {OUTAGE_DEADLINE_ENV}=300 (default "
                            f"{DEFAULT_OUTAGE_DEADLINE:g}; 0: no retry)")
    return value
