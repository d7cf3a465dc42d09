"""Login throttling (django-axes): failures of one username from one client address lock that
pair out; the client's address comes from X-Forwarded-For only through a trusted proxy."""

from __future__ import annotations

import time
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.core.cache import cache
from django.core.management import call_command
from django.test import Client

pytestmark = pytest.mark.django_db

PROXY = "127.0.0.1"  # trusted by default (TRUSTED_PROXIES)
WRONG = "Please enter a correct username and password"


@pytest.fixture(autouse=True)
def _three_attempts(settings: Any) -> None:
    settings.AXES_FAILURE_LIMIT = 3
    cache.clear()  # the spray counters live in the cache


def login(username: str, password: str, *, peer: str = PROXY, forwarded: str | None = None) -> Any:
    extra: dict[str, Any] = {"REMOTE_ADDR": peer}
    if forwarded is not None:
        extra["HTTP_X_FORWARDED_FOR"] = forwarded
    return Client().post("/login/", {"username": username, "password": password}, **extra)


def test_repeated_failures_lock_the_username_at_that_address_with_a_clear_page(reviewer: User) -> None:
    for _ in range(2):
        assert WRONG in login("reviewer1", "wrong", forwarded="203.0.113.5").content.decode()
    assert login("reviewer1", "wrong", forwarded="203.0.113.5").status_code == 429, "the third locks"
    refused = login("reviewer1", "pw-reviewer1", forwarded="203.0.113.5")
    assert refused.status_code == 429
    assert "Too many failed attempts. Wait 15 minutes" in refused.content.decode()
    assert 'name="username"' in refused.content.decode(), "the login page, not a bare error"
    call_command("axes_reset")
    assert login("reviewer1", "pw-reviewer1", forwarded="203.0.113.5").status_code == 302


def test_behind_the_proxy_one_clients_failures_lock_out_no_one_else(
    reviewer: User, second_reviewer: User
) -> None:
    for _ in range(5):
        login("reviewer1", "wrong", forwarded="203.0.113.5")
    assert login("reviewer1", "pw-reviewer1", forwarded="198.51.100.7").status_code == 302
    assert login("reviewer2", "pw-reviewer2", forwarded="203.0.113.5").status_code == 302
    assert login("reviewer1", "pw-reviewer1", forwarded="203.0.113.5").status_code == 429


def test_a_client_that_is_not_a_trusted_proxy_cannot_choose_its_address(reviewer: User) -> None:
    for n in range(3):
        login("reviewer1", "wrong", peer="192.0.2.9", forwarded=f"10.0.0.{n}")
    assert login("reviewer1", "pw-reviewer1", peer="192.0.2.9", forwarded="10.0.0.99").status_code == 429
    assert login("reviewer1", "pw-reviewer1", peer="192.0.2.10").status_code == 302


def test_a_forged_hop_before_the_proxy_does_not_choose_the_address_either(reviewer: User) -> None:
    """The client writes the left of the header; the proxy appends the address it saw."""
    for n in range(3):
        login("reviewer1", "wrong", forwarded=f"10.9.9.{n}, 203.0.113.5")
    assert login("reviewer1", "pw-reviewer1", forwarded="10.9.9.99, 203.0.113.5").status_code == 429


def test_look_alike_usernames_share_one_counter(reviewer: User) -> None:
    for name in ("ｒeviewer1", "Reviewer1", " reviewer1"):  # a full-width r, a capital, a space
        login(name, "wrong", forwarded="203.0.113.5")
    assert login("reviewer1", "pw-reviewer1", forwarded="203.0.113.5").status_code == 429


def test_the_admin_signs_in_on_the_sites_page_so_it_is_throttled_too(db: Any) -> None:
    User.objects.create_superuser("root", password="pw-root-1234")
    to_admin = Client().get("/admin/")
    assert to_admin.status_code == 302 and to_admin["Location"] == "/admin/login/?next=/admin/"
    sent = Client().get(to_admin["Location"])
    assert sent.status_code == 302 and sent["Location"] == "/login/?next=/admin/"
    for _ in range(3):
        Client().post("/login/", {"username": "root", "password": "x"}, REMOTE_ADDR="192.0.2.1")
    refused = Client().post(
        "/login/", {"username": "root", "password": "pw-root-1234"}, REMOTE_ADDR="192.0.2.1"
    )
    assert refused.status_code == 429
    # Nor is there another way in: the admin's own form answers with the site's page.
    assert Client().post("/admin/login/", {"username": "root", "password": "pw-root-1234"}).status_code == 302


def test_one_address_spraying_many_usernames_is_slowed_down_briefly(
    reviewer: User, second_reviewer: User, settings: Any
) -> None:
    settings.GRUNDLAG_LOGIN_ADDRESS_ATTEMPTS = 4
    settings.GRUNDLAG_LOGIN_SPRAY_COOLOFF_SECONDS = 1
    for n in range(4):  # one guess per username: under every per-pair limit
        login(f"user{n}", "Summer2025!", forwarded="203.0.113.5")
    refused = login("reviewer2", "pw-reviewer2", forwarded="203.0.113.5")
    assert (
        refused.status_code == 200 and "Too many failed logins from your network" in refused.content.decode()
    )
    assert login("reviewer2", "pw-reviewer2", forwarded="198.51.100.7").status_code == 302, "others log in"
    time.sleep(1.2)
    assert login("reviewer2", "pw-reviewer2", forwarded="203.0.113.5").status_code == 302, "not for long"


def test_many_addresses_guessing_one_username_are_slowed_down_briefly(reviewer: User, settings: Any) -> None:
    settings.GRUNDLAG_LOGIN_USER_ATTEMPTS = 4
    settings.GRUNDLAG_LOGIN_SPRAY_COOLOFF_SECONDS = 1
    for n in range(4):
        login("reviewer1", f"guess-{n}", forwarded=f"2001:db8:{n}::1")
    assert (
        "Too many failed logins"
        in login("reviewer1", "pw-reviewer1", forwarded="192.0.2.50").content.decode()
    )
    time.sleep(1.2)
    assert login("reviewer1", "pw-reviewer1", forwarded="192.0.2.50").status_code == 302


def test_an_ipv6_host_cannot_multiply_its_attempts_by_changing_its_address(
    reviewer: User, settings: Any
) -> None:
    settings.GRUNDLAG_LOGIN_ADDRESS_ATTEMPTS = 3
    for n in range(3):
        login(f"user{n}", "x", forwarded=f"2001:db8:1:2::{n + 1}")
    refused = login("reviewer1", "pw-reviewer1", forwarded="2001:db8:1:2::99")
    assert "Too many failed logins from your network" in refused.content.decode()
