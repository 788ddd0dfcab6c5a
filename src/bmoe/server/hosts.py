"""The Host-header allow-list, against DNS rebinding.

A page on another site can point its own DNS name at this machine and then call the server from
the visitor's browser; the browser still sends the page's name in the Host header. So the server
answers only the names it is really reached by: localhost and loopback addresses always (a page
cannot make a browser send those for its own name), its --host when that is a specific name or
address, and the names in --allowed-hosts; ``*`` answers every Host.
"""

from __future__ import annotations

import ipaddress
import re

ANY = "*"
_NAME = re.compile(r"[a-z0-9_]([a-z0-9_.-]*[a-z0-9_])?")
_PORT = re.compile(r"[0-9]{1,5}")


def _ip(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(text)
    except ValueError:
        return None


def normalize(name: str) -> str | None:
    """One host (no port) as the allow-list compares it: a name lower case without its final dot,
    an address in its short form (IPv6 without brackets); None if it is neither."""
    if name.startswith("[") and name.endswith("]"):
        ip = _ip(name[1:-1])
        return str(ip) if ip is not None and ip.version == 6 else None
    ip = _ip(name)
    if ip is not None:
        return str(ip)
    name = name.lower()
    name = name[:-1] if name.endswith(".") else name
    return name if _NAME.fullmatch(name) else None


def host_of(header: str) -> str | None:
    """The host part of a Host header ("name", "name:port", "[v6]:port"), normalized; None if the
    header is not one of those."""
    if header.startswith("["):
        end = header.find("]")
        host, rest = header[: end + 1], header[end + 1 :]
        if end < 0 or (rest and not (rest[:1] == ":" and _PORT.fullmatch(rest[1:]))):
            return None
        return normalize(host)
    host, colon, port = header.partition(":")
    if colon and not _PORT.fullmatch(port):
        return None
    return normalize(host) if ":" not in host else None


def is_local(host: str) -> bool:
    ip = _ip(host)
    return host == "localhost" if ip is None else ip.is_loopback


def parse_allowed(value: str) -> tuple[str, ...]:
    """--allowed-hosts' value: names or addresses separated by commas, without ports; ``*`` for
    every host. Raises ValueError naming the entry it cannot read."""
    out: list[str] = []
    for entry in (e.strip() for e in value.split(",")):
        if entry == ANY:
            return (ANY,)
        name = normalize(entry) if entry else None
        if name is None:
            raise ValueError(
                f"{entry!r} is not a host name or address (give names without a scheme or port, "
                f"separated by commas, or * for every host)"
            )
        if name not in out:
            out.append(name)
    return tuple(out)


def bound_name(host: str) -> str | None:
    """--host as an allow-list entry: None when it is every address (0.0.0.0, ::) or a loopback
    one (always answered anyway)."""
    name = normalize(host)
    if name is None or is_local(name):
        return None
    ip = _ip(name)
    return None if ip is not None and ip.is_unspecified else name


class HostCheck:
    """Whether a Host header may be answered, given the extra names (ServerSettings.allowed_hosts)."""

    def __init__(self, allowed: tuple[str, ...]) -> None:
        self.any = ANY in allowed
        self.names = frozenset(n for n in (normalize(a) for a in allowed if a != ANY) if n is not None)

    def allows(self, header: str | None) -> bool:
        if self.any:
            return True
        host = host_of(header) if header is not None else None
        return host is not None and (is_local(host) or host in self.names)
