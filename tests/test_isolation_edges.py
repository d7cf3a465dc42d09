"""The edges of a tenant's isolation from the server's own network and from other sites (issue
35): webhook endpoints that hide a private IPv4 address in an IPv6 one."""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client

from actions import engine, notify
from actions.models import DeliveryAttempt, Team, Webhook
from actions.notify import webhook

pytestmark = pytest.mark.django_db(transaction=True)

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
]
# Each carries a public IPv4 address: as public as it.
EMBEDDING_A_PUBLIC_ADDRESS = [
    "2002:808:808::1",  # 6to4: 8.8.8.8
    "64:ff9b::808:808",  # NAT64's well-known prefix: 8.8.8.8
    "2001:0:808:808::f7f7:fbfb",  # Teredo, server 8.8.8.8, client 8.8.4.4
    "::ffff:8.8.8.8",  # IPv4-mapped
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
