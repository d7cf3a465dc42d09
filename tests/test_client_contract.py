"""The Python client (clients/python) and the API's OpenAPI document agree: every operation the
client calls is in the document with the answer the client reads, each of the client's models
has exactly the fields of its schema, and the package installs with pip from its directory."""

from __future__ import annotations

import dataclasses
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from django.test import Client

import grundlag_client

CLIENT_DIR = Path(__file__).resolve().parent.parent / "clients" / "python"


@pytest.fixture(scope="module")
def document() -> dict[str, Any]:
    response = Client().get("/api/openapi.json")
    assert response.status_code == 200
    body: dict[str, Any] = response.json()
    return body


def answer_schema(operation: dict[str, Any]) -> str:
    ok = operation["responses"]["200"]["content"]["application/json"]["schema"]
    return str(ok["$ref"]).rsplit("/", 1)[-1]


@pytest.mark.parametrize("name", sorted(grundlag_client.OPERATIONS))
def test_every_operation_the_client_calls_is_in_the_document(document: dict[str, Any], name: str) -> None:
    method, path, schema = grundlag_client.OPERATIONS[name]
    assert path in document["paths"], f"{name}: {path} is not in the API"
    operation = document["paths"][path].get(method)
    assert operation is not None, f"{name}: {method.upper()} {path} is not in the API"
    assert answer_schema(operation) == schema


def test_every_client_method_is_an_operation_it_declares() -> None:
    declared = set(grundlag_client.OPERATIONS)
    methods = {name for name in vars(grundlag_client.Client) if not name.startswith("_")}
    helpers = {"close", "wait", "wait_for_approval", "request_approval"}
    assert methods - helpers == declared


MODELS = [
    grundlag_client.Run,
    grundlag_client.Interrupt,
    grundlag_client.Requires,
    grundlag_client.Approval,
    grundlag_client.RunSummary,
    grundlag_client.InterruptSummary,
]


@pytest.mark.parametrize("model", MODELS, ids=lambda model: model.__name__)
def test_each_model_has_the_fields_of_its_schema(document: dict[str, Any], model: type[Any]) -> None:
    schema = document["components"]["schemas"][model.SCHEMA]
    assert {each.name for each in dataclasses.fields(model)} == set(schema["properties"])
    # A field the API always sends is one the model cannot be made without, and the reverse.
    required_by_model = {
        each.name
        for each in dataclasses.fields(model)
        if each.default is dataclasses.MISSING and each.default_factory is dataclasses.MISSING
    }
    assert required_by_model <= set(schema.get("required", []))


def test_the_list_pages_are_what_the_client_pages_through(document: dict[str, Any]) -> None:
    for page, item in (("RunPage", "RunListItem"), ("InterruptPage", "InterruptListItem")):
        properties = document["components"]["schemas"][page]["properties"]
        assert set(properties) == {"items", "next"}
        assert properties["items"]["items"]["$ref"].endswith(f"/{item}")


@pytest.mark.slow  # pip builds and installs it
def test_the_package_installs_with_pip_from_its_directory(tmp_path: Path) -> None:
    # From a copy: a build writes beside the sources (build/, *.egg-info), not in the checkout.
    source = shutil.copytree(
        CLIENT_DIR, tmp_path / "client", ignore=shutil.ignore_patterns("build", "*.egg-info")
    )
    target = tmp_path / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(target), str(source)],
        check=True, capture_output=True, timeout=300,
    )  # fmt: skip
    assert (target / "grundlag_client" / "py.typed").exists()
    probe = "import grundlag_client, sys; print(grundlag_client.__file__)"
    found = subprocess.run(
        [sys.executable, "-c", probe], cwd=tmp_path, env={"PYTHONPATH": str(target)},
        check=True, capture_output=True, text=True, timeout=60,
    ).stdout  # fmt: skip
    assert found.startswith(str(target))


# Transactional: the WSGI application closes the connection at the end of each request.
@pytest.mark.django_db(transaction=True)
def test_every_call_the_client_makes_is_one_the_api_takes(token_key: str, reviewer: Any, team: Any) -> None:
    """Through the real API in this process (its WSGI app): request bodies are refused with 422
    when they carry a field the API does not know, so each call passing is the agreement."""
    import httpx
    from django.core.wsgi import get_wsgi_application

    from actions.models import Policy

    Policy.objects.create(team=team, action="send_invoice", requester_may_approve=True)
    transport = httpx.WSGITransport(app=get_wsgi_application())
    with grundlag_client.Client("http://testserver", token_key, transport=transport) as client:
        run = client.start_run("send_invoice", {"invoice_id": "C-1", "amount": 1}, wait=5)
        assert run.interrupt is not None
        assert client.get_run(run.id).status == "interrupted"
        assert client.resume(run.interrupt.id, {"approved": True}, wait=5).status == "completed"
        second = client.start_run("send_invoice", {"invoice_id": "C-2", "amount": 1}, wait=5)
        assert second.interrupt is not None
        assert client.reject(second.interrupt.id, "no", wait=5).status == "rejected"
        third = client.start_run("send_invoice", {"invoice_id": "C-3", "amount": 1}, wait=5)
        assert client.cancel(third.id).status == "cancelled"
        assert len(list(client.runs(action="send_invoice", limit=2))) == 3
        assert list(client.interrupts(status="pending")) == []
        approval = client.create_approval(
            "Ship it?",
            {"version": "2"},
            answer_schema={"type": "object", "properties": {"when": {"type": "string"}}},
            deadline_seconds=900,
            default_answer={"when": "now"},
        )
        assigned = client.create_approval("Ship it too?", approvals_required=1, assignees=["reviewer1"])
        assert approval.status == "pending" and assigned.assignees == ["reviewer1"]
        assert client.get_approval(approval.id).decided_via == ""
        assert client.cancel_approval(approval.id).status == "cancelled"
