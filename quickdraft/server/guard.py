"""What a browser page must not make the server do: the Host check against DNS rebinding, and
JSON bodies only (a cross-site form or ``text/plain`` POST needs no CORS preflight).

A page on another site can point its own name at 127.0.0.1 (DNS rebinding) and then read
whatever the server answers, since the browser deems it that site's origin; its requests
still carry that site's name in ``Host``. So a server without API keys answers only the names
it is reached by on its own machine: ``localhost``, ``127.0.0.1``, ``[::1]`` and the address it
is bound to, at its port; bound to every interface (``0.0.0.0``, ``::``), also any IP address
(a name is what rebinding needs; an address cannot be rebound). ``--allowed-hosts`` replaces
that list (``*``: any Host). With API keys the check applies only where ``--allowed-hosts`` is
given: a rebinding page cannot send a key, and such a server is often reached through names it
cannot know (a proxy's, a load balancer's).
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass

from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from quickdraft.server.protocol import ApiError

LOOPBACK = ("localhost", "127.0.0.1", "[::1]")
WILDCARDS = ("0.0.0.0", "::", "")


@dataclass(frozen=True, slots=True)
class HostRules:
    """Host headers a server answers. names: (name, port or None for any port), names in
    lower case, IPv6 addresses in brackets; any_ip: also any IP address at ``ip_port``
    (None: any port); everything: no check."""

    names: frozenset[tuple[str, int | None]] = frozenset()
    any_ip: bool = False
    ip_port: int | None = None
    everything: bool = False

    @classmethod
    def parse(cls, entries: tuple[str, ...]) -> HostRules:
        """From ``--allowed-hosts``' entries: ``name`` or ``name:port``, ``*`` for any; a
        ValueError naming allowed_hosts for an entry that is neither."""
        if "*" in entries:
            return cls(everything=True)
        names = set()
        for entry in entries:
            split = _split(entry.strip())
            if split is None:
                raise ValueError(f"allowed_hosts: {entry!r} is not a host name or host:port (or *)")
            names.add(split)
        if not names:
            raise ValueError("allowed_hosts: give at least one host, or * for any")
        return cls(frozenset(names))

    @classmethod
    def bound(cls, host: str, port: int | None) -> HostRules:
        """The default: the loopback names and ``host`` at ``port`` (None: any port); any IP
        address too when ``host`` is a wildcard address."""
        wildcard = host in WILDCARDS
        names = {(name, port) for name in LOOPBACK}
        if not wildcard:
            name = f"[{host}]" if ":" in host and not host.startswith("[") else host
            names.add((name.lower(), port))
        return cls(frozenset(names), any_ip=wildcard, ip_port=port)

    def allows(self, header: str | None) -> bool:
        if self.everything:
            return True
        split = None if header is None else _split(header)
        if split is None:
            return False
        name, port = split
        if (name, None) in self.names or (name, port) in self.names:
            return True
        if port is None and (name, 80) in self.names:  # a browser omits the default port
            return True
        return self.any_ip and _is_ip(name) and self.ip_port in (None, port or 80)


def _split(text: str) -> tuple[str, int | None] | None:
    """(name in lower case, port or None) of ``name[:port]`` (``[v6][:port]``); None when
    it is not that."""
    if not text:
        return None
    name, port = text, None
    if text.startswith("["):
        end = text.find("]")
        if end < 0:
            return None
        name, rest = text[: end + 1], text[end + 1 :]
        if rest:
            if not rest.startswith(":"):
                return None
            port = rest[1:]
    elif text.count(":") > 1:  # an IPv6 address without brackets: ambiguous, refused
        return None
    elif ":" in text:
        name, port = text.rsplit(":", 1)
    if port is not None and not (port.isdigit() and 0 < int(port) < 65536):
        return None
    if not name or any(c.isspace() or c in "/@?#" for c in name):
        return None
    return name.lower(), None if port is None else int(port)


def _is_ip(name: str) -> bool:
    try:
        ipaddress.ip_address(name.strip("[]"))
    except ValueError:
        return False
    return True


class HostGuard:
    """ASGI middleware: a request whose Host the rules do not allow gets 421 and one line
    saying so, before any route runs."""

    def __init__(self, app: ASGIApp, rules: HostRules):
        self.app, self.rules = app, rules

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or self.rules.everything:
            await self.app(scope, receive, send)
            return
        host = next((v.decode("latin-1") for k, v in scope["headers"] if k == b"host"), None)
        if self.rules.allows(host):
            await self.app(scope, receive, send)
            return
        shown = "none" if host is None else repr(host[:100])
        error = ApiError(
            421,
            f"Host: {shown} is not a name this server answers to (a page may have pointed its "
            "own name here); start the server with --allowed-hosts to allow it",
            "Host",
            code="host_not_allowed",
        )
        await JSONResponse(error.body(), status_code=421)(scope, receive, send)


def require_json(content_type: str | None) -> None:
    """A 415 unless the body is declared ``application/json`` (charset and other parameters
    allowed): a browser sends a cross-site POST of another type without asking first."""
    media = (content_type or "").split(";", 1)[0].strip().lower()
    if media != "application/json":
        shown = "none" if not content_type else repr(content_type[:100])
        raise ApiError(415, f"Content-Type: must be application/json, got {shown}", "Content-Type")
