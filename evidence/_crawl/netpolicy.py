"""Where a crawl may connect: its network policy (issue 30).

A crawled page names URLs, and so do its redirects, a sitemap, a robots.txt and the scripts
of a rendered page. Without a rule any of them makes the crawler (or the browser, through
the render proxy) request a service of the machine or the network it runs on:
127.0.0.1:6379, an admin page on 10.0.0.1, the cloud's metadata service at
169.254.169.254; and the reply becomes evidence. So every connection the crawler's HTTP
client (``_crawl.http``) opens is decided here, on the address it connects to:

- the host is resolved (``Resolver``; a literal address is itself), each address is
  checked, and the connection goes to a checked address, never to the name again: a DNS
  answer that changes between the check and the connection (DNS rebinding) cannot slip
  through;
- an address that is not global unicast is refused (``refusal``): loopback, private
  (RFC 1918), shared (100.64.0.0/10, carrier-grade NAT), link-local (169.254.0.0/16 and
  fe80::/10: the metadata services), unique-local (fc00::/7), multicast, unspecified,
  and the other ranges of IANA's special-purpose registries (documentation, benchmarking,
  192.0.0.0/24, 240.0.0.0/4...). An IPv6 address that carries an IPv4 one (IPv4-mapped
  ``::ffff:a.b.c.d``, NAT64 ``64:ff9b::/96``, 6to4 ``2002::/16``) is judged by that
  IPv4 address. Python's ``ipaddress`` flags are not used: before 3.13 they call
  ``::ffff:127.0.0.1``, 6to4 forms of loopback and 192.0.0.192 global;
- unless one of the operator's ``allow`` networks (``--allow-network CIDR``) holds it;
- or it is a seed's own origin: a seed naming such an address (``http://127.0.0.1:8000/``,
  or a name resolving to one, like ``http://localhost:8000/``) may be fetched there, at
  the addresses its host had when first resolved in this process; the same address on
  another port, or another scheme, is refused like any other.

The resolution is evidence too (issue 33): ``lookup`` gives, with the addresses, the answer
as a ``DnsAnswer`` (the name, every address in the resolver's order, when, and the
resolver's source: ``getaddrinfo``; ``hosts-file`` when the system's ``/etc/nsswitch.conf``
consults files first and ``/etc/hosts`` lists the name, so that is where the answer came
from; ``given`` for a resolver the caller gave). ``getaddrinfo`` gives no TTL, so none is
recorded. The connection that uses the answer carries it into its attempts' records.

A refused connection raises ``Refused`` before anything is sent; the attempt is recorded
(``skipped``, with the reason ``network: ...``), never dropped. The policy is built from
the crawl's configuration (``allow_network`` and the seeds, recorded with the session), so
a worker process or host builds the same one.
"""

from __future__ import annotations

import ipaddress
import os
import socket
from collections.abc import Awaitable, Callable, Iterable
from typing import NamedTuple
from urllib.parse import urlsplit

import anyio

from .._errors import EvidenceError
from .._model.messages import DnsAnswer, ResolverSource, new_id, utc_now

__all__ = ["NetworkPolicy", "Origin", "Refused", "Resolver", "hosts_source", "origin_of",
           "parse_network", "refusal", "system_resolver"]

Address = ipaddress.IPv4Address | ipaddress.IPv6Address
Network = ipaddress.IPv4Network | ipaddress.IPv6Network
#: A host name and port to the addresses it resolves to, in the order to try them.
Resolver = Callable[[str, int], Awaitable[list[str]]]


class Origin(NamedTuple):
    scheme: str
    host: str  # lower case, IDNA-encoded, IPv6 without brackets (as _crawl.http connects)
    port: int


class Refused(Exception):
    """A connection the policy does not allow (nothing was sent)."""


def _nets(*pairs: tuple[str, str]) -> list[tuple[Network, str]]:
    return [(ipaddress.ip_network(net), what) for net, what in pairs]


# IANA's IPv4 special-purpose registry, every range not globally reachable (and multicast,
# and 192.0.0.0/24 whole: 192.0.0.192 is a cloud metadata address).
_V4 = _nets(
    ("0.0.0.0/8", "unspecified (this network)"), ("10.0.0.0/8", "private"),
    ("100.64.0.0/10", "shared (carrier-grade NAT)"), ("127.0.0.0/8", "loopback"),
    ("169.254.0.0/16", "link-local"), ("172.16.0.0/12", "private"),
    ("192.0.0.0/24", "special-purpose"), ("192.0.2.0/24", "documentation"),
    ("192.88.99.0/24", "reserved"), ("192.168.0.0/16", "private"),
    ("198.18.0.0/15", "benchmarking"), ("198.51.100.0/24", "documentation"),
    ("203.0.113.0/24", "documentation"), ("224.0.0.0/4", "multicast"),
    ("240.0.0.0/4", "reserved"))
_V6 = _nets(
    ("::/128", "unspecified"), ("::1/128", "loopback"), ("fe80::/10", "link-local"),
    ("fc00::/7", "unique-local"), ("ff00::/8", "multicast"), ("fec0::/10", "site-local"),
    ("2001::/23", "special-purpose"), ("2001:db8::/32", "documentation"),
    ("3fff::/20", "documentation"), ("5f00::/16", "special-purpose"))
_GLOBAL_UNICAST = ipaddress.IPv6Network("2000::/3")
_NAT64 = ipaddress.IPv6Network("64:ff9b::/96")


def _embedded(address: ipaddress.IPv6Address) -> ipaddress.IPv4Address | None:
    """The IPv4 address an IPv6 one carries (mapped, NAT64, 6to4), if any."""
    if address.ipv4_mapped is not None:
        return address.ipv4_mapped
    if address in _NAT64:
        return ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
    return address.sixtofour


def refusal(address: Address) -> str | None:
    """Why a crawl refuses ``address`` by default, in words, or None if it is global."""
    if isinstance(address, ipaddress.IPv6Address):
        inner = _embedded(address)
        if inner is not None:
            why = refusal(inner)
            if why is None and address.ipv4_mapped is not None:
                return None  # the kernel connects to the IPv4 address itself
            return None if why is None else f"{why} (as {inner})"
        for net, what in _V6:
            if address in net:
                return what
        return None if address in _GLOBAL_UNICAST else "reserved"
    for net, what in _V4:
        if address in net:
            return what
    return None


def parse_network(text: str) -> Network:
    """A CIDR as ``--allow-network`` takes it (a bare address is a /32 or /128)."""
    try:
        return ipaddress.ip_network(text.strip(), strict=False)
    except ValueError:
        raise EvidenceError(f"--allow-network {text!r} is not a network",
                            hint="give a CIDR such as 127.0.0.0/8, 10.1.2.0/24 or fd00::/8, "
                            "or a single address") from None


def origin_of(url: str) -> Origin:
    """The origin a URL is connected to, as ``_crawl.http`` names it."""
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    host = parts.hostname or ""
    if not host.isascii():
        host = host.encode("idna").decode("ascii")
    return Origin(scheme, host, parts.port or (443 if scheme == "https" else 80))


async def system_resolver(host: str, port: int) -> list[str]:
    """The system's answer (getaddrinfo), each address once, in its order."""
    infos = await anyio.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return list(dict.fromkeys(str(info[4][0]) for info in infos))


HOSTS = "/etc/hosts"
NSSWITCH = "/etc/nsswitch.conf"


def _hosts_first(nsswitch: str) -> bool:
    """Whether the system resolver consults the hosts file before anything else (glibc's
    default when nsswitch.conf has no ``hosts:`` line: ``files dns``)."""
    try:
        with open(nsswitch, encoding="utf-8", errors="replace") as f:
            lines = f.read().splitlines()
    except OSError:
        return True
    for line in lines:
        key, _, sources = line.partition("#")[0].partition(":")
        if key.strip() == "hosts":
            words = sources.split()
            return bool(words) and words[0] == "files"
    return True


def _in_hosts(host: str, hosts: str) -> bool:
    try:
        with open(hosts, encoding="utf-8", errors="replace") as f:
            lines = f.read().splitlines()
    except OSError:
        return False
    wanted = host.lower().rstrip(".")
    return any(wanted in (name.lower().rstrip(".") for name in line.partition("#")[0].split()[1:])
               for line in lines)


def hosts_source(host: str, *, hosts: str = HOSTS, nsswitch: str = NSSWITCH) -> ResolverSource:
    """Where the system resolver's answer for ``host`` came from: ``hosts-file`` when the
    hosts file is consulted first and lists the name (it answers then), else
    ``getaddrinfo`` (DNS, or another NSS source)."""
    if os.path.exists(hosts) and _hosts_first(nsswitch) and _in_hosts(host, hosts):
        return "hosts-file"
    return "getaddrinfo"


def _address(text: str) -> Address:
    return ipaddress.ip_address(text.partition("%")[0])  # a scope id is not the address


class NetworkPolicy:
    """Decides which addresses a crawl's connections may go to (the module docstring)."""

    def __init__(self, *, allow: Iterable[str] = (), seeds: Iterable[str] = (),
                 resolver: Resolver | None = None) -> None:
        self.allow = tuple(parse_network(text) for text in allow)
        self.seed_origins = frozenset(origin_of(seed) for seed in seeds)
        self.resolver = resolver or system_resolver
        # A seed origin's addresses not allowed otherwise, as its host first resolved.
        self._pinned: dict[Origin, frozenset[Address]] = {}

    def refused(self, address: Address) -> str | None:
        """Why a connection to ``address`` is refused (a seed's origin aside), or None."""
        why = refusal(address)
        if why is None:
            return None
        mapped = address.ipv4_mapped if isinstance(address, ipaddress.IPv6Address) else None
        if any(address in net or (mapped is not None and mapped in net) for net in self.allow):
            return None
        return why

    async def addresses(self, origin: Origin) -> list[str]:
        """The addresses a connection to ``origin`` may go to, in the order to try them;
        ``Refused`` if there is none (OSError if the host does not resolve)."""
        return (await self.lookup(origin))[0]

    async def lookup(self, origin: Origin) -> tuple[list[str], DnsAnswer | None]:
        """``addresses``, and the resolver's whole answer (None for an address literal):
        the name is resolved once, and that answer is what the connection records."""
        answer: DnsAnswer | None = None
        try:
            texts = [origin.host] if _address(origin.host) else []
        except ValueError:
            resolved_at = utc_now()
            texts = await self.resolver(origin.host, origin.port)
            source: ResolverSource = "given"
            if self.resolver is system_resolver:
                source = hosts_source(origin.host)
            answer = DnsAnswer(resolution_id=new_id("dns-"), host=origin.host,
                               port=origin.port, resolved_at=resolved_at, source=source,
                               addresses=[t[:64] for t in texts])
        found = {text: _address(text) for text in texts}  # a link-local one keeps its %scope
        if origin in self.seed_origins and origin not in self._pinned:
            self._pinned[origin] = frozenset(a for a in found.values() if self.refused(a))
        pinned = self._pinned.get(origin, frozenset())
        usable = [text for text, a in found.items() if a in pinned or self.refused(a) is None]
        if usable:
            return usable, answer
        if not found:
            raise OSError(f"{origin.host} resolves to no address")
        first = next(iter(found.values()))
        named = "" if str(first) == origin.host else f"{origin.host} resolves to "
        raise Refused(f"network: {named}{first}, {self.refused(first)}, is not allowed "
                      f"(only a seed's own origin or --allow-network reaches it)")
