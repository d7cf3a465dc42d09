"""The edges of a tenant's isolation from the server's own network and from other sites (issue
35): webhook endpoints that hide a private IPv4 address in an IPv6 one, /mcp/ called by a page
of another origin, and request bodies past the cap. The ASGI tests talk to the site's own ASGI
application (grundlag_site.asgi), daphne's view of it, with channels' and asgiref's
communicators."""

from __future__ import annotations

import json
from typing import Any

import pytest
from channels.db import database_sync_to_async
from channels.testing import ApplicationCommunicator, HttpCommunicator, WebsocketCommunicator
from django.conf import settings as django_settings
from django.contrib.auth.models import User
from django.test import Client

from actions import engine, notify
from actions.models import DeliveryAttempt, Run, Team, Webhook
from actions.notify import webhook
from grundlag_site.asgi import application
from tests.test_settings import start_with

pytestmark = pytest.mark.django_db

PRIVATE = "resolves to a private, loopback or link-local address"


# Webhooks: an IPv6 address is as public as the IPv4 address it carries.

# Each carries a loopback, private or link-local IPv4 address.
EMBEDDING_A_PRIVATE_ADDRESS = [
    "::127.0.0.1",  # IPv4-compatible, ::/96
    "::a00:1",  # the same, 10.0.0.1
    "::ffff:0:a00:1",  # SIIT's IPv4-translated, ::ffff:0:0:0/96: 10.0.0.1
    "64:ff9b:1::a9fe:a9fe",  # NAT64's local-use prefix (RFC 8215): 169.254.169.254
    "64:ff9b:1::808:808",  # the same prefix is a site's own translator, whatever it carries
    "64:ff9b::a9fe:a9fe",  # NAT64's well-known prefix: 169.254.169.254
    "2002:7f00:1::1",  # 6to4: 127.0.0.1
    "2002:c0a8:101::1",  # 6to4: 192.168.1.1
    "2001:0:808:808::80ff:fffe",  # Teredo, server 8.8.8.8, client 127.0.0.1 (stored inverted)
    "2001:0:a00:1::f7f7:fbfb",  # Teredo, server 10.0.0.1, client 8.8.4.4
    "::ffff:169.254.169.254",  # IPv4-mapped
    "2600::5efe:a00:1",  # ISATAP: 10.0.0.1
    "2600::200:5efe:7f00:1",  # ISATAP, the universal/local bit set: 127.0.0.1
    "fec0::1",  # site-local (deprecated, still routed inside some networks)
    "3fff::1",  # documentation (RFC 9637)
    "5f00::1",  # SRv6 SIDs (RFC 9602)
]
# Each carries a public IPv4 address: as public as it.
EMBEDDING_A_PUBLIC_ADDRESS = [
    "2002:808:808::1",  # 6to4: 8.8.8.8
    "64:ff9b::808:808",  # NAT64's well-known prefix: 8.8.8.8
    "2001:0:808:808::f7f7:fbfb",  # Teredo, server 8.8.8.8, client 8.8.4.4
    "::ffff:8.8.8.8",  # IPv4-mapped
    "2600::5efe:808:808",  # ISATAP: 8.8.8.8
]


@pytest.mark.parametrize("address", EMBEDDING_A_PRIVATE_ADDRESS)
def test_an_ipv6_address_carrying_a_private_ipv4_address_is_no_endpoint(address: str) -> None:
    assert PRIVATE in webhook.url_problem(f"http://[{address}]/hook")


@pytest.mark.parametrize("address", [*EMBEDDING_A_PUBLIC_ADDRESS, "2606:4700:4700::1111"])
def test_an_ipv6_address_carrying_a_public_ipv4_address_is_an_endpoint(address: str) -> None:
    assert webhook.url_problem(f"http://[{address}]/hook") == ""


def register(client: Client, key: str, url: str) -> Any:
    return client.post(
        "/api/webhooks",
        json.dumps({"url": url, "events": ["interrupt.created"]}),
        content_type="application/json",
        headers={"Authorization": f"Bearer {key}"},
    )


@pytest.mark.parametrize(
    "address", ["::127.0.0.1", "::ffff:0:a00:1", "64:ff9b:1::a9fe:a9fe", "2002:7f00:1::1"]
)
def test_registering_an_endpoint_that_hides_a_private_address_is_refused(
    client: Client, token_key: str, address: str
) -> None:
    response = register(client, token_key, f"https://[{address}]:8443/hook")
    assert response.status_code == 422 and PRIVATE in response.json()["detail"], response.content
    assert not Webhook.objects.exists()


def test_an_endpoint_embedding_a_public_address_is_registered(client: Client, token_key: str) -> None:
    for address in EMBEDDING_A_PUBLIC_ADDRESS:
        assert register(client, token_key, f"https://[{address}]/hook").status_code == 201
    assert Webhook.objects.count() == len(EMBEDDING_A_PUBLIC_ADDRESS)


def test_an_endpoint_that_hides_a_private_address_gets_no_delivery(team: Team, reviewer: User) -> None:
    # Registered before the check knew these forms: the check at delivery refuses it as well.
    Webhook.objects.create(team=team, url="http://[::ffff:0:7f00:1]:9/hook", events=["interrupt.created"])
    engine.start_run("send_invoice", {"invoice_id": "E-1", "amount": 5.0}, team, reviewer)
    notify.dispatch()
    (attempt,) = DeliveryAttempt.objects.all()
    assert not attempt.ok and attempt.status_code is None
    assert attempt.error.startswith("refused:") and PRIVATE in attempt.error


def test_the_admin_refuses_to_point_an_endpoint_at_a_private_address(
    admin_client: Client, team: Team
) -> None:
    public = "https://[2002:808:808::1]/hook"  # 6to4 carrying 8.8.8.8
    hook = Webhook.objects.create(team=team, url=public, events=["interrupt.created"])
    page = f"/admin/actions/webhook/{hook.pk}/change/"
    form = {"team": team.pk, "events": '["interrupt.created"]'}
    for url in ("http://[::ffff:0:a00:1]/hook", "http://127.0.0.1:9/hook", "ftp://[2002:808:808::1]/"):
        response = admin_client.post(page, {**form, "url": url})
        assert response.status_code == 200, url  # the form again, saying why
        assert PRIVATE in response.content.decode() or "http:// or https://" in response.content.decode(), url
    hook.refresh_from_db()
    assert hook.url == public
    response = admin_client.post(page, {**form, "url": "https://[64:ff9b::808:808]/hook"})
    assert response.status_code == 302
    hook.refresh_from_db()
    assert hook.url == "https://[64:ff9b::808:808]/hook"


# /mcp/ and the live websocket: pages of the allowed origins only.


# The MCP endpoint's session manager runs in a task of the loop of the first call, for the
# process's life (as in daphne's one loop): the calls of these tests share one loop.
in_one_loop = pytest.mark.asyncio(loop_scope="module")


def mcp_call(key: str, text: str, origin: str | None = None) -> HttpCommunicator:
    """A tools/call of the tests' `noted` action, as one POST to /mcp/."""
    body = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "tools/call",
        "params": {"name": "noted", "arguments": {"text": text}},
    }
    headers = [
        (b"host", b"testserver"),
        (b"authorization", f"Bearer {key}".encode()),
        (b"content-type", b"application/json"),
        (b"accept", b"application/json, text/event-stream"),
        (b"mcp-protocol-version", b"2025-11-25"),
    ]
    if origin is not None:
        headers.append((b"origin", origin.encode()))
    return HttpCommunicator(application, "POST", "/mcp/", body=json.dumps(body).encode(), headers=headers)


@in_one_loop
@pytest.mark.parametrize("origin", ["http://evil.example", "null", "http://localhost.evil.example"])
async def test_mcp_refuses_a_page_of_another_origin_before_anything_runs(
    token_key: str, ran: list[str], origin: str
) -> None:
    response = await mcp_call(token_key, "from a foreign page", origin).get_response(timeout=10)
    assert response["status"] == 403
    assert json.loads(response["body"])["error_description"] == "Origin not allowed"
    assert ran == [] and not await Run.objects.aexists()


@pytest.mark.django_db(transaction=True)  # served by a server on another thread, with its own connection
@in_one_loop
async def test_mcp_runs_a_call_without_an_origin(token_key: str, ran: list[str]) -> None:
    response = await mcp_call(token_key, "from a program").get_response(timeout=10)
    assert response["status"] == 200 and b'"noted\\": \\"from a program\\"' in response["body"]
    assert ran == ["from a program"]


@pytest.mark.django_db(transaction=True)  # served by a server on another thread, with its own connection
@in_one_loop
async def test_mcp_runs_a_call_from_a_page_of_the_site(token_key: str, ran: list[str]) -> None:
    site = django_settings.GRUNDLAG_BASE_URL  # its origin is allowed by default, as the hosts are
    for origin in (site, "http://testserver", "https://localhost:8443"):
        response = await mcp_call(token_key, origin, origin).get_response(timeout=10)
        assert response["status"] == 200, response["body"]
    assert ran == [site, "http://testserver", "https://localhost:8443"]


@pytest.mark.django_db(transaction=True)  # served by a server on another thread, with its own connection
@in_one_loop
async def test_mcp_follows_the_allowed_origins_setting(token_key: str, ran: list[str], settings: Any) -> None:
    settings.GRUNDLAG_ALLOWED_ORIGINS = ["https://approvals.example.com"]
    allowed = await mcp_call(token_key, "allowed", "https://approvals.example.com").get_response(timeout=10)
    assert allowed["status"] == 200
    other_port = await mcp_call(token_key, "no", "https://approvals.example.com:8443").get_response(
        timeout=10
    )
    no_longer = await mcp_call(token_key, "no", "http://testserver").get_response(timeout=10)
    assert other_port["status"] == no_longer["status"] == 403
    assert ran == ["allowed"]


@database_sync_to_async
def session_cookie(user: User) -> bytes:
    client = Client()
    client.force_login(user)
    return f"sessionid={client.cookies['sessionid'].value}".encode()


async def socket_from(origin: bytes, cookie: bytes) -> tuple[bool, WebsocketCommunicator]:
    communicator = WebsocketCommunicator(
        application, "/ws/inbox/", headers=[(b"cookie", cookie), (b"origin", origin)]
    )
    connected, _ = await communicator.connect()
    return connected, communicator


@pytest.mark.django_db(transaction=True)  # served by a server on another thread, with its own connection
async def test_the_live_socket_admits_the_same_origins_as_mcp(team: Team, reviewer: User) -> None:
    cookie = await session_cookie(reviewer)
    # The site's address, and a host of ALLOWED_HOSTS on any port (`make run`, the test servers).
    for origin in (django_settings.GRUNDLAG_BASE_URL, "http://127.0.0.1:54321"):
        connected, communicator = await socket_from(origin.encode(), cookie)
        assert connected and (await communicator.receive_json_from())["event"] == "hello"
        await communicator.disconnect()
    # A reviewer's own session, from a page elsewhere: refused all the same.
    connected, _ = await socket_from(b"http://evil.example", cookie)
    assert not connected


@pytest.mark.parametrize(
    "origins", ["ftp://files.example.com", "https://example.com/path", "https://", "http://example.com:port"]
)
def test_an_allowed_origin_that_is_no_origin_stops_the_process_naming_the_variable(origins: str) -> None:
    result = start_with(GRUNDLAG_ALLOWED_ORIGINS=origins)
    assert result.returncode != 0
    assert "ImproperlyConfigured: GRUNDLAG_ALLOWED_ORIGINS" in result.stderr


# Bodies past the cap: 413 before the app reads them.

CAP = django_settings.DATA_UPLOAD_MAX_MEMORY_SIZE
CHUNK = 64 * 1024


def http_scope(path: str, headers: list[tuple[bytes, bytes]]) -> dict[str, Any]:
    return {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": [(b"host", b"testserver"), *headers],
        "client": ("127.0.0.1", 40000),
        "server": ("testserver", 80),
    }


async def response_of(communicator: ApplicationCommunicator) -> tuple[int, dict[bytes, bytes], bytes]:
    start = await communicator.receive_output(timeout=10)
    assert start["type"] == "http.response.start"
    body = b""
    while True:
        message = await communicator.receive_output(timeout=10)
        body += message.get("body", b"")
        if not message.get("more_body", False):
            return start["status"], dict(start["headers"]), body


def said(path: str, content_type: bytes, body: bytes) -> str:
    """The refusal's text: the API's error shape under /api/ and /mcp/, plain text elsewhere."""
    if path == "/slack/interactions":
        assert content_type.startswith(b"text/plain")
        return body.decode()
    assert content_type == b"application/json"
    return str(json.loads(body)["detail"])


PATHS = ["/api/runs", "/mcp/", "/slack/interactions"]


@pytest.mark.parametrize("path", PATHS)
async def test_a_body_declared_over_the_cap_is_refused_before_any_of_it_arrives(
    path: str, token_key: str, ran: list[str]
) -> None:
    declared = 300 * 1024 * 1024
    headers = [
        (b"authorization", f"Bearer {token_key}".encode()),
        (b"content-type", b"application/json"),
        (b"content-length", str(declared).encode()),
    ]
    communicator = ApplicationCommunicator(application, http_scope(path, headers))
    # Not a byte of the body is sent: an app that waited for it would never answer.
    status, response_headers, body = await response_of(communicator)
    assert status == 413
    text = said(path, response_headers[b"content-type"], body)
    assert text == f"the request body is {declared} bytes; the limit is {CAP} bytes"
    assert ran == [] and not await Run.objects.aexists()


@pytest.mark.parametrize("path", PATHS)
async def test_a_streamed_body_is_refused_once_past_the_cap_and_read_no_further(
    path: str, token_key: str, ran: list[str]
) -> None:
    headers = [
        (b"authorization", f"Bearer {token_key}".encode()),
        (b"content-type", b"application/json"),
        (b"transfer-encoding", b"chunked"),
    ]
    communicator = ApplicationCommunicator(application, http_scope(path, headers))
    sent = CAP // CHUNK + 6
    for _ in range(sent):
        await communicator.send_input({"type": "http.request", "body": b"x" * CHUNK, "more_body": True})
    status, response_headers, body = await response_of(communicator)
    assert status == 413
    assert (
        said(path, response_headers[b"content-type"], body)
        == f"the request body is over the limit of {CAP} bytes"
    )
    # Read up to one byte past the cap, and no further.
    assert communicator.input_queue.qsize() == sent - (CAP // CHUNK + 1)
    assert ran == [] and not await Run.objects.aexists()


@pytest.mark.django_db(transaction=True)  # served by a server on another thread, with its own connection
async def test_a_streamed_body_within_the_cap_reaches_the_api_whole(token_key: str, ran: list[str]) -> None:
    headers = [
        (b"authorization", f"Bearer {token_key}".encode()),
        (b"content-type", b"application/json"),
        (b"transfer-encoding", b"chunked"),
    ]
    communicator = ApplicationCommunicator(application, http_scope("/api/runs", headers))
    body = json.dumps({"action": "noted", "input": {"text": "in pieces" + " " * (CAP // 2)}}).encode()
    pieces = [body[i : i + CHUNK] for i in range(0, len(body), CHUNK)]
    for n, piece in enumerate(pieces):
        await communicator.send_input(
            {"type": "http.request", "body": piece, "more_body": n < len(pieces) - 1}
        )
    status, _, answer = await response_of(communicator)
    assert status < 300, answer
    assert [text.strip() for text in ran] == ["in pieces"]
