"""http_request stays off private networks: after DNS resolution, on every redirect, with an explicit allow-list."""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlparse

import pytest

from rllm import errors
from rllm.errors import BlockedDestinationError
from rllm.tools import make_http_request_tool
from rllm.tools.http_request import resolve_public


class _Handler(BaseHTTPRequestHandler):
    def log_message(self, *args: object) -> None:
        pass

    def _reply(self) -> None:
        url = urlparse(self.path)
        if url.path == "/redirect":
            self.send_response(int(parse_qs(url.query).get("status", ["302"])[0]))
            self.send_header("Location", parse_qs(url.query)["to"][0])
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        length = int(self.headers.get("Content-Length") or 0)
        body = json.dumps({"method": self.command, "path": self.path, "host": self.headers["Host"],
                           "auth": self.headers.get("Authorization"),
                           "body": self.rfile.read(length).decode() if length else None}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = _reply  # noqa: N815


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    httpd.daemon_threads = True
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


def _body(result: str) -> dict:
    assert result.startswith("HTTP 200"), result
    return json.loads(result.split("\n\n", 1)[1])


@pytest.mark.parametrize(
    ("url", "kind"),
    [("http://127.0.0.1:{port}/", "loopback"), ("http://localhost:{port}/", "loopback"),
     ("http://[::1]:{port}/", "loopback"), ("http://169.254.169.254/latest/meta-data/", "link-local"),
     ("http://10.1.2.3/", "private"), ("http://172.16.0.1/", "private"), ("http://192.168.0.1/", "private"),
     ("http://[fd00:ec2::254]/", "private"), ("http://[fe80::1]/", "link-local"),
     ("http://[::ffff:127.0.0.1]/", "loopback"), ("http://[2002:7f00:1::]/", "loopback"),
     ("http://0.0.0.0:{port}/", "unspecified"), ("http://224.0.0.1/", "multicast"),
     ("http://100.100.100.200/", "not globally routable")],
)
async def test_private_loopback_link_local_and_multicast_are_refused(server: str, url: str, kind: str) -> None:
    url = url.format(port=server.split(":")[1])
    result = await make_http_request_tool(timeout=5)(url=url)
    assert result.startswith(f"Error: refused to fetch {url}: ") and f"is a {kind} address" in result


async def test_the_allow_list_lets_chosen_networks_through(server: str) -> None:
    result = await make_http_request_tool(allowed_networks=["127.0.0.0/8"])(url=f"http://{server}/x")
    assert _body(result)["path"] == "/x"
    assert (await make_http_request_tool(allowed_networks=["127.0.0.2"])(url=f"http://{server}/")).startswith(
        "Error: refused")
    with pytest.raises(ValueError):
        make_http_request_tool(allowed_networks=["not-a-network"])


async def test_every_redirect_hop_is_checked(server: str) -> None:
    http_request = make_http_request_tool(allowed_networks=["127.0.0.1"], timeout=5)
    followed = await http_request(url=f"http://{server}/redirect?to=/final")
    assert _body(followed)["path"] == "/final" and f"\nURL: http://{server}/final\n" in followed
    port = server.split(":")[1]
    for target in ("http://169.254.169.254/latest/meta-data/", f"http://127.0.0.2:{port}/",
                   "http://10.0.0.1/", "http://[::1]/"):
        result = await http_request(url=f"http://{server}/redirect?to={target}")
        assert result.startswith(f"Error: refused to fetch http://{server}/redirect"), (target, result)
    result = await http_request(url=f"http://{server}/redirect?to=file:///etc/passwd")
    assert "not http(s)" in result


async def test_redirects_change_method_and_drop_credentials_like_a_browser(server: str) -> None:
    http_request = make_http_request_tool(allowed_networks=["127.0.0.1"])
    see_other = await http_request(url=f"http://{server}/redirect?status=303&to=/next", method="POST", body="{}",
                                   headers={"Authorization": "Bearer t"})
    assert _body(see_other)["method"] == "GET" and _body(see_other)["auth"] == "Bearer t"  # same origin keeps it
    kept = await http_request(url=f"http://{server}/redirect?status=307&to=/next", method="POST", body="{}")
    assert (_body(kept)["method"], _body(kept)["body"]) == ("POST", "{}")
    many = await http_request(url=f"http://{server}/redirect?to=/redirect%3Fto%3D/redirect%253Fto%253D/a")
    assert _body(many)["path"] == "/a"


async def test_the_checked_address_is_the_one_connected_to(server: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A name resolving to a public and a private address is refused; an allowed one is pinned, Host kept."""
    host, port = server.split(":")
    real = socket.getaddrinfo

    def fake(name: str, *args: object, **kwargs: object) -> list:
        if name == "rebind.example":
            return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", ("93.184.215.14", 0)),
                    (socket.AF_INET, socket.SOCK_STREAM, 6, "", ("127.0.0.1", 0))]
        if name == "pinned.example":
            return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (host, 0))]
        return real(name, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", fake)
    with pytest.raises(BlockedDestinationError, match=r"rebind.example \(127.0.0.1\) is a loopback address") as refused:
        await resolve_public("rebind.example", 80)
    # The policy's doing (it asked for the address): an rllm error, neither infrastructure nor configuration.
    assert isinstance(refused.value, errors.ToolAccessDeniedError) and isinstance(refused.value, PermissionError)
    assert not isinstance(refused.value, (errors.InfrastructureError, errors.ConfigurationError))
    result = await make_http_request_tool(allowed_networks=[host])(url=f"http://pinned.example:{port}/p")
    assert _body(result)["host"] == f"pinned.example:{port}" and "\nURL: http://pinned.example:" in result
    cross = await make_http_request_tool(allowed_networks=[host])(
        url=f"http://{server}/redirect?to=http://pinned.example:{port}/o", headers={"Authorization": "Bearer t"})
    assert _body(cross)["host"] == f"pinned.example:{port}" and _body(cross)["auth"] is None  # other origin


async def test_public_addresses_pass_the_check() -> None:
    assert await resolve_public("93.184.215.14", 80) == "93.184.215.14"
    assert await resolve_public("2606:4700:4700::1111", 443) == "2606:4700:4700::1111"
