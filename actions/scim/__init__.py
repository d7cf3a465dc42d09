"""SCIM 2.0 (RFC 7643, 7644) at /scim/v2/: the company's directory provisions the site's users
and groups (Okta, Entra ID, Keycloak...). The protocol is the python-scim project's server
(scim2-server: validation, PATCH, filters, sorting, paging, ETags), over a storage whose
resources are the engine's (actions.engine.directory), which the site's users and memberships
follow. Authenticated by an API token with the ``scim`` scope, which only staff make."""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Generator
from contextlib import contextmanager, nullcontext
from functools import cache
from typing import Any

from django.db import DataError, IntegrityError, transaction
from django.http import HttpRequest, HttpResponse
from django.views.decorators.csrf import csrf_exempt
from scim2_models import (
    AuthenticationScheme,
    Bulk,
    ChangePassword,
    ETag,
    Filter,
    ForbiddenException,
    InvalidValueException,
    Patch,
    Resource,
    ResourceType,
    SCIMException,
    ScimProvider,
    ServiceProviderConfig,
    Sort,
    UnauthorizedException,
    UniquenessException,
)
from scim2_server.handler import ScimHandler
from scim2_server.memory import InMemoryStorage
from scim2_server.requests import ScimRequest
from scim2_server.routing import Operation
from scim2_server.service import ScimService
from scim2_server.utils import load_default_resource_types, load_default_schemas

from actions import engine
from actions.models import ApiToken, Scope

logger = logging.getLogger(__name__)

BASE_PATH = "/scim/v2"
# At most this many resources in a page of a search.
MAX_RESULTS = 200


@cache
def service() -> ScimService:
    """What the site serves: the standard User (with the enterprise extension) and Group."""
    config = ServiceProviderConfig(
        patch=Patch(supported=True),
        bulk=Bulk(supported=False, max_operations=0, max_payload_size=0),
        filter=Filter(supported=True, max_results=MAX_RESULTS),
        change_password=ChangePassword(supported=False),
        sort=Sort(supported=True),
        etag=ETag(supported=True),
        authentication_schemes=[
            AuthenticationScheme(
                type="oauthbearertoken",
                name="API token",
                description="An API token of the site's with the scim scope (Authorization: Bearer ...)",
                primary=True,
            )
        ],
    )
    provider = ScimProvider.from_discovery(
        load_default_schemas().values(), load_default_resource_types().values(), config=config
    )
    return ScimService(provider)


class DirectoryStorage(InMemoryStorage):
    """The directory's resources, served as the in-memory storage serves them (filters,
    sorting, paging, uniqueness, versions), read from the database for each operation and
    written through the engine in that operation's transaction. Each operation reads every
    resource of the directory: a company's directory, not a web's."""

    def __init__(self, scim: ScimService, *, writes: bool) -> None:
        super().__init__()
        self.scim = scim
        self.writes = writes

    @contextmanager
    def operation(self) -> Generator[None]:
        # A write holds the directory (the transaction's lock) from its read to its last write;
        # a read takes no lock (on SQLite, holding the site's write lock while it parses).
        with transaction.atomic() if self.writes else nullcontext():
            if self.writes:
                engine.directory.lock()
            loaded: list[Resource[Any]] = []
            for resource_type in self.scim.provider.resource_types:
                model = self.scim.get_model(resource_type)
                loaded += [
                    model.model_validate(payload)
                    for payload in engine.directory.resources(str(resource_type.name))
                ]
            self.resources = loaded
            yield

    def next_version(self) -> str:
        return f'W/"{uuid.uuid4().hex[:16]}"'  # unique across processes and requests

    def create(self, resource_type: ResourceType, resource: Resource[Any]) -> Resource[Any]:
        created = super().create(resource_type, resource)
        _save(resource_type, created)
        return created

    def update(
        self, resource_type: ResourceType, resource: Resource[Any], *, expected_version: str | None = None
    ) -> Resource[Any]:
        updated = super().update(resource_type, resource, expected_version=expected_version)
        _save(resource_type, updated)
        return updated

    def delete(
        self, resource_type: ResourceType, resource_id: str, *, expected_version: str | None = None
    ) -> None:
        super().delete(resource_type, resource_id, expected_version=expected_version)
        engine.directory.delete(str(resource_type.name), resource_id)


def _save(resource_type: ResourceType, resource: Resource[Any]) -> None:
    payload = json.loads(resource.model_dump_json())
    try:
        engine.directory.save(str(resource_type.name), payload)
    except engine.InvalidInput as exc:
        if any(error.get("type") == "uniqueness" for error in exc.errors):
            raise UniquenessException(detail=str(exc)) from None
        raise InvalidValueException(detail=str(exc)) from None


@csrf_exempt
def endpoint(request: HttpRequest, path: str = "") -> HttpResponse:
    """Every SCIM request: authenticated (but /ServiceProviderConfig), then served."""
    scim = service()
    scim_request = ScimRequest(
        method=request.method or "GET",
        base_url=request.build_absolute_uri(BASE_PATH),
        path=f"/{path}",
        query=request.GET.dict(),
        headers=list(request.headers.items()),
        body=request.body,
    )
    try:
        if scim.match(scim_request).operation is not Operation.service_provider_config:
            token = engine.authenticate(ApiToken.key_in(request.headers.get("Authorization", "")))
            if token is None:
                raise UnauthorizedException(detail="An API token with the scim scope is required (Bearer)")
            if not token.allows([Scope.SCIM]):
                raise ForbiddenException(detail="This token needs the scope scim")
            scim_request.subject = token
        storage = DirectoryStorage(scim, writes=scim_request.method.upper() not in ("GET", "HEAD"))
        response = ScimHandler(scim, storage).handle(scim_request)
    except SCIMException as exc:
        response = scim.error_response(exc)
    except IntegrityError:  # a username another process took at the same moment
        response = scim.error_response(UniquenessException(detail="the resource is another's here"))
    except DataError as exc:  # a value longer than its column
        response = scim.error_response(
            InvalidValueException(detail=f"a value does not fit: {type(exc).__name__}")
        )
    answer = HttpResponse(
        json.dumps(response.body) if response.body is not None else b"", status=int(response.status)
    )
    for name, value in response.headers.items():
        answer[name] = value
    return answer
