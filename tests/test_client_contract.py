"""The Python client (clients/python) and the API's OpenAPI document agree: every operation the
client calls is in the document with the answer the client reads, each of the client's models
has exactly the fields of its schema, and the package installs with pip from its directory."""

from __future__ import annotations

import dataclasses
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


def test_the_package_installs_with_pip_from_its_directory(tmp_path: Path) -> None:
    target = tmp_path / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps",
         "--target", str(target), str(CLIENT_DIR)],
        check=True, capture_output=True, timeout=300,
    )  # fmt: skip
    assert (target / "grundlag_client" / "py.typed").exists()
    probe = "import grundlag_client, sys; print(grundlag_client.__file__)"
    found = subprocess.run(
        [sys.executable, "-c", probe], cwd=tmp_path, env={"PYTHONPATH": str(target)},
        check=True, capture_output=True, text=True, timeout=60,
    ).stdout  # fmt: skip
    assert found.startswith(str(target))
