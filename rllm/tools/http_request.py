"""An HTTP request tool: GET or POST a URL and return the status and the (truncated) body as text.

The body is read as a stream and cut at ``max_bytes``, so a huge download cannot exhaust memory;
HTML is reduced to its visible text. Failures (bad URL, timeout, unreachable host, a refused
destination) come back as text the agent can read, never as exceptions. No request is made to a
scheme other than http(s).

Only public addresses are reached: the host is resolved first and the request refused when any
of its addresses is loopback, private (RFC 1918, fc00::/7, CGNAT), link-local (169.254.0.0/16,
fe80::/10, so cloud metadata endpoints), multicast, unspecified or otherwise not globally
routable, including IPv4 addresses embedded in IPv6 ones. The connection then goes to the address
that was checked (the name is not resolved again, so DNS rebinding cannot swap it), with the
original ``Host`` header and TLS server name. Redirects are followed here, at most five, each hop
checked the same way. ``allowed_networks`` lets chosen networks through (for example a local
test server or an intranet service the agent is meant to use).

The client comes from ``rllm.transport.open_client``, one per call: a policy's request is sent
once (no retries), never over a connection pooled for another host.
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
import socket
from collections.abc import Iterable, Sequence
from html.parser import HTMLParser
from typing import Any

import httpx
from strands import tool

from rllm.errors import BlockedDestinationError
from rllm.transport import open_client

__all__ = ["fetch_url", "html_to_text", "make_http_request_tool", "parse_networks", "resolve_public"]

_USER_AGENT = "rllm-agent/0.1 (+https://github.com/rllm-org/rllm)"
_MAX_REDIRECTS = 5
_REDIRECT_STATUSES = {301, 302, 303, 307, 308}
_CREDENTIAL_HEADERS = {"authorization", "cookie", "proxy-authorization"}
IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network


def _embedded_ipv4(address: IPAddress) -> list[IPAddress]:
    """IPv4 addresses carried inside an IPv6 one (mapped, 6to4, Teredo client)."""
    if not isinstance(address, ipaddress.IPv6Address):
        return []
    embedded = [address.ipv4_mapped, address.sixtofour, address.teredo[1] if address.teredo else None]
    return [a for a in embedded if a is not None]


def _address_problem(address: IPAddress) -> str | None:
    """Why ``address`` is not a public destination, or ``None`` when it is."""
    for candidate in (*_embedded_ipv4(address), address):
        for kind in ("loopback", "link_local", "unspecified", "multicast", "private", "reserved"):
            if getattr(candidate, f"is_{kind}"):
                return kind.replace("_", "-")
        if not candidate.is_global:
            return "not globally routable"
    return None


def parse_networks(networks: Iterable[str]) -> tuple[IPNetwork, ...]:
    """``"127.0.0.1"``, ``"10.0.0.0/8"``, ``"::1"`` ... as networks; raises ``ValueError`` on a bad one."""
    return tuple(ipaddress.ip_network(n.strip(), strict=False) for n in networks)


async def resolve_public(host: str, port: int, allowed: Sequence[IPNetwork] = ()) -> str:
    """The address to connect to for ``host``: resolved once, every address checked.

    Raises ``BlockedDestinationError`` when any address of ``host`` is not public and not in
    ``allowed``, and ``OSError`` when the name does not resolve.
    """
    try:
        addresses = [ipaddress.ip_address(host.strip("[]"))]
    except ValueError:
        infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
        # sockaddr[0] is the address text for AF_INET/AF_INET6 (typeshed also allows an int for other families)
        addresses = list(dict.fromkeys(ipaddress.ip_address(str(info[4][0]).split("%", 1)[0]) for info in infos))
    if not addresses:
        raise OSError(f"{host} has no address")
    for address in addresses:
        problem = _address_problem(address)
        if problem and not any(address.version == net.version and address in net for net in allowed):
            shown = host if host == str(address) else f"{host} ({address})"
            raise BlockedDestinationError(
                f"{shown} is a {problem} address; http_request only reaches public internet hosts")
    return str(addresses[0])
_SKIPPED_TAGS = {"script", "style", "noscript", "template", "svg", "head"}
_BLOCK_TAGS = {"p", "div", "br", "li", "tr", "h1", "h2", "h3", "h4", "h5", "h6", "section", "article", "table",
               "ul", "ol", "pre", "blockquote", "title"}


class _TextExtractor(HTMLParser):
    """Collects the visible text of an HTML document, one block element per line."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.parts: list[str] = []
        self._skipping = 0

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag in _SKIPPED_TAGS:
            self._skipping += 1
        elif tag in _BLOCK_TAGS:
            self.parts.append("\n")

    def handle_endtag(self, tag: str) -> None:
        if tag in _SKIPPED_TAGS and self._skipping:
            self._skipping -= 1
        elif tag in _BLOCK_TAGS:
            self.parts.append("\n")

    def handle_data(self, data: str) -> None:
        if not self._skipping:
            self.parts.append(data)


def html_to_text(html: str) -> str:
    """The visible text of ``html`` with blank runs collapsed."""
    parser = _TextExtractor()
    parser.feed(html)
    parser.close()
    lines = (" ".join(line.split()) for line in "".join(parser.parts).splitlines())
    return "\n".join(line for line in lines if line)


async def fetch_url(
    url: str,
    method: str = "GET",
    body: str | None = None,
    headers: dict[str, str] | None = None,
    *,
    timeout: float = 20.0,
    max_bytes: int = 2 * 1024 * 1024,
    max_chars: int = 20_000,
    allowed_networks: Iterable[str] = (),
) -> str:
    """Perform the request and describe the response as text (see the module docstring).

    ``timeout`` bounds the whole exchange, redirects and name resolution included.
    """
    method = method.upper().strip()
    if method not in ("GET", "POST"):
        return f"Error: unsupported method {method!r}; use GET or POST"
    try:
        parsed_url = httpx.URL(url)
    except (httpx.InvalidURL, TypeError) as error:
        return f"Error: invalid URL {url!r}: {error}"
    if parsed_url.scheme not in ("http", "https"):
        return f"Error: only http and https URLs are supported, not {url!r}"
    request_headers = {"User-Agent": _USER_AGENT, **(headers or {})}
    content: bytes | None = None
    if body is not None and method == "POST":
        content = body.encode("utf-8")
        if not any(k.lower() == "content-type" for k in request_headers):
            try:
                json.loads(body)
                request_headers["Content-Type"] = "application/json"
            except ValueError:
                request_headers["Content-Type"] = "text/plain; charset=utf-8"
    try:
        allowed = parse_networks(allowed_networks)
    except ValueError as error:
        return f"Error: bad allowed_networks entry: {error}"
    try:
        response, final_url, data, truncated = await asyncio.wait_for(
            _fetch(method, parsed_url, request_headers, content, allowed, timeout, max_bytes), timeout)
    except (asyncio.TimeoutError, httpx.TimeoutException):
        return f"Error: the request to {url} timed out after {timeout:g} s"
    except BlockedDestinationError as error:
        return f"Error: refused to fetch {url}: {error}"
    except httpx.HTTPError as error:
        return f"Error: the request to {url} failed: {type(error).__name__}: {error}"
    except OSError as error:
        return f"Error: the request to {url} failed: {type(error).__name__}: {error}"
    encoding = response.encoding or "utf-8"
    content_type = response.headers.get("content-type", "")
    text = bytes(data).decode(encoding, errors="replace")
    if "html" in content_type.lower():
        text = html_to_text(text)
    header = (f"HTTP {response.status_code} {response.reason_phrase}\nURL: {final_url}\n"
              f"content-type: {content_type or '-'}")
    if truncated:
        header += f"\n[body cut at {max_bytes:,} bytes]"
    if len(text) > max_chars:
        text = text[:max_chars] + f"\n[text truncated to {max_chars:,} of {len(text):,} characters]"
    return f"{header}\n\n{text}"


async def _fetch(
    method: str,
    url: httpx.URL,
    headers: dict[str, str],
    content: bytes | None,
    allowed: Sequence[IPNetwork],
    timeout: float,
    max_bytes: int,
) -> tuple[httpx.Response, httpx.URL, bytes, bool]:
    """Send the request, following redirects one checked hop at a time; returns the final response and body."""
    # A client of its own per call, never a shared pool: a pooled connection to the same address could
    # carry a request for another host name over TLS verified for the first one.
    async with open_client(timeout=timeout, follow_redirects=False) as client:
        for _hop in range(_MAX_REDIRECTS + 1):
            if url.scheme not in ("http", "https"):
                raise BlockedDestinationError(f"a redirect leads to {url}, which is not http(s)")
            address = await resolve_public(url.host, url.port or (443 if url.scheme == "https" else 80), allowed)
            pinned = url.copy_with(host=address)
            request = client.build_request(method, pinned, headers={**headers, "Host": url.netloc.decode("ascii")},
                                           content=content, extensions={"sni_hostname": url.host})
            response = await client.send(request, stream=True)
            try:
                location = response.headers.get("location")
                if response.status_code not in _REDIRECT_STATUSES or not location:
                    data, truncated = await _read_capped(response, max_bytes)
                    return response, url, data, truncated
            finally:
                await response.aclose()
            next_url = url.join(location)
            if (next_url.scheme, next_url.host, next_url.port) != (url.scheme, url.host, url.port):
                headers = {k: v for k, v in headers.items() if k.lower() not in _CREDENTIAL_HEADERS}
            if (response.status_code in (301, 302) and method == "POST") or response.status_code == 303:
                method, content = "GET", None
                headers = {k: v for k, v in headers.items() if k.lower() != "content-type"}
            url = next_url
    raise httpx.TooManyRedirects(f"more than {_MAX_REDIRECTS} redirects", request=request)


async def _read_capped(response: httpx.Response, max_bytes: int) -> tuple[bytes, bool]:
    data = bytearray()
    async for chunk in response.aiter_bytes():
        data.extend(chunk)
        if len(data) > max_bytes:
            del data[max_bytes:]
            return bytes(data), True
    return bytes(data), False


def make_http_request_tool(
    *,
    timeout: float = 20.0,
    max_bytes: int = 2 * 1024 * 1024,
    max_chars: int = 20_000,
    allowed_networks: Iterable[str] = (),
) -> Any:
    """An ``http_request`` Strands tool with the given timeout and size caps.

    ``allowed_networks`` (addresses or CIDR networks) may be reached although they are not public.
    """
    allowed_networks = tuple(allowed_networks)
    parse_networks(allowed_networks)  # a bad entry fails here, not in the agent's first call

    @tool(name="http_request")
    async def http_request(url: str, method: str = "GET", body: str | None = None,
                           headers: dict[str, str] | None = None) -> str:
        """Fetch a URL over HTTP(S) and return the status line and the response body as text (HTML reduced to text).

        Args:
            url: The http:// or https:// URL.
            method: "GET" (default) or "POST".
            body: Request body for POST (JSON is sent as application/json).
            headers: Extra request headers.
        """
        return await fetch_url(url, method, body, headers, timeout=timeout, max_bytes=max_bytes, max_chars=max_chars,
                               allowed_networks=allowed_networks)

    return http_request
