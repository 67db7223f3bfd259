"""The API as its schema describes it, read generically: the schema is valid OpenAPI 3 and holds every call of the
URL contract (docs/api.md); every change it lists refuses a viewer's token and a read-only token (403) and anonymous
callers (401); every
list it lists answers a viewer; and every error is JSON, never a page."""

from __future__ import annotations

import functools
import re
from collections.abc import Callable
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client
from drf_spectacular.generators import SchemaGenerator
from drf_spectacular.validation import validate_schema
from rest_framework.test import APIClient

from dlqconsole.accounts.tokens import create_token
from tests.api.conftest import api_client, token_for
from tests.conftest import client_for

pytestmark = pytest.mark.django_db

ApiFor = Callable[[User], APIClient]
METHODS = ("get", "post", "put", "patch", "delete")
# The calls the API promises (docs/api.md, "Resources"); path parameters are written {id} whatever their name.
CONTRACT = {
    ("get", "/api/v1/queues/"),
    ("get", "/api/v1/dead-letters/"),
    ("get", "/api/v1/dead-letters/{id}/"),
    ("get", "/api/v1/patterns/"),
    ("get", "/api/v1/patterns/{id}/"),
    ("post", "/api/v1/patterns/{id}/triage/"),
    ("post", "/api/v1/patterns/merge/"),
    ("post", "/api/v1/patterns/{id}/split/"),
    ("get", "/api/v1/operations/"),
    ("post", "/api/v1/operations/"),
    ("get", "/api/v1/operations/{id}/"),
    ("post", "/api/v1/operations/{id}/start/"),
    ("post", "/api/v1/operations/{id}/pause/"),
    ("post", "/api/v1/operations/{id}/resume/"),
    ("post", "/api/v1/operations/{id}/rate/"),
    ("post", "/api/v1/operations/{id}/cancel/"),
    ("get", "/api/v1/alerts/"),
    ("get", "/api/v1/alerts/{id}/"),
    ("post", "/api/v1/alerts/{id}/acknowledge/"),
    ("post", "/api/v1/alerts/{id}/silence/"),
    ("get", "/api/v1/audit/"),
}
PARAMETER = re.compile(r"\{[^}/]+\}")


@functools.cache
def schema() -> dict[str, Any]:
    """The schema as /api/v1/openapi.json serves it (generated once for the module's tests)."""
    return SchemaGenerator().get_schema(request=None, public=True)


def operations(*, changes: bool) -> list[tuple[str, str]]:
    """(method, path) of every change (changes=True) or every read in the schema."""
    return sorted(
        (method, path)
        for path, item in schema()["paths"].items()
        for method in METHODS
        if method in item and (method != "get") == changes
    )


def filled(path: str) -> str:
    return PARAMETER.sub("1", path)


def is_json_error(response: Any, *, media_type: str = "application/json") -> bool:
    if response["Content-Type"] != media_type:
        return False
    body = response.json()
    return isinstance(body, dict) and bool(body.get("detail")) and bool(body.get("code"))


def test_the_schema_is_served_to_a_token_and_is_valid_openapi_3(viewer: User) -> None:
    response = api_client(token_for(viewer)).get("/api/v1/openapi.json")

    assert response.status_code == 200
    assert response["Content-Type"].startswith("application/") and "json" in response["Content-Type"]
    served = response.json()
    validate_schema(served)
    assert served["openapi"].startswith("3.")
    assert served["components"]["securitySchemes"]["token"] == {
        "type": "http",
        "scheme": "bearer",
        "bearerFormat": "dlq_<prefix>_<secret>",
    }


def test_the_schema_is_not_served_anonymously() -> None:
    response = api_client().get("/api/v1/openapi.json")

    # Its errors are JSON as the schema is, in the schema's media type.
    assert response.status_code == 401 and is_json_error(response, media_type="application/vnd.oai.openapi+json")


def test_the_schema_holds_every_call_of_the_contract() -> None:
    listed = {(method, PARAMETER.sub("{id}", path)) for method, path in operations(changes=False)}
    listed |= {(method, PARAMETER.sub("{id}", path)) for method, path in operations(changes=True)}

    assert sorted(CONTRACT - listed) == []


def test_every_call_has_a_readable_operation_id_and_a_tag() -> None:
    problems = []
    seen: set[str] = set()
    for method, path in operations(changes=False) + operations(changes=True):
        described = schema()["paths"][path][method]
        operation_id = described.get("operationId", "")
        if not re.fullmatch(r"[a-z][a-z0-9_]*", operation_id) or operation_id in seen:
            problems.append(f"{method.upper()} {path}: operationId {operation_id!r}")
        if not described.get("tags"):
            problems.append(f"{method.upper()} {path}: no tag")
        seen.add(operation_id)

    assert problems == []


def test_every_change_refuses_a_viewers_token_a_read_only_token_and_anonymous_callers(
    viewer: User, admin_user: User
) -> None:
    as_viewer, anonymous = api_client(token_for(viewer)), api_client()
    read_only = api_client(create_token(user=admin_user, name="read-only", read_only=True)[1])
    callers = (("viewer", as_viewer, 403), ("read-only admin", read_only, 403), ("anonymous", anonymous, 401))
    problems = []

    for method, path in operations(changes=True):
        url = filled(path)
        for who, client, status in callers:
            response = getattr(client, method)(url, {}, format="json")
            if response.status_code != status or not is_json_error(response):
                problems.append(f"{method.upper()} {url} as {who}: {response.status_code} {response['Content-Type']}")

    assert operations(changes=True), "the schema lists no change at all"
    assert problems == []


def test_every_list_answers_a_viewers_token_with_json(viewer: User) -> None:
    client = api_client(token_for(viewer))
    lists = [path for method, path in operations(changes=False) if not PARAMETER.search(path)]
    problems = []

    for path in lists:
        response = client.get(path)
        if response.status_code != 200 or response["Content-Type"] != "application/json":
            problems.append(f"GET {path}: {response.status_code} {response['Content-Type']}")

    assert "/api/v1/audit/" in lists and "/api/v1/alerts/" in lists
    assert problems == []


def test_every_error_is_json(api_for: ApiFor, viewer: User, settings: Any) -> None:
    client = api_for(viewer)
    answers = {
        400: client.get("/api/v1/alerts/", {"state": "burning"}),
        401: api_client().get("/api/v1/alerts/"),
        403: client.post("/api/v1/alerts/1/acknowledge/"),
        404: client.get("/api/v1/alerts/999999999/"),
        405: client.get("/api/v1/alerts/1/acknowledge/"),
    }
    unknown = client.get("/api/v1/nothing/here/")
    settings.DLQ_API_TOKEN_RATE = "1/1h"
    limited = api_for(viewer)
    limited.get("/api/v1/audit/")
    answers[429] = limited.get("/api/v1/audit/")

    assert {status: answer.status_code for status, answer in answers.items()} == {status: status for status in answers}
    assert [status for status, answer in answers.items() if not is_json_error(answer)] == []
    assert unknown.status_code == 404 and is_json_error(unknown)
    assert answers[401]["WWW-Authenticate"].startswith("Bearer") and int(answers[429]["Retry-After"]) > 0


def test_the_docs_page_is_for_signed_in_people_and_its_assets_are_served(viewer: User, client: Client) -> None:
    signed_out = client.get("/api/v1/docs/")
    page = client_for(viewer).get("/api/v1/docs/")

    assert signed_out.status_code == 302 and signed_out["Location"].startswith("/login/?next=/api/v1/docs/")
    assert page.status_code == 200
    html = page.content.decode()
    assets = re.findall(r'(?:src|href)="(/static/drf_spectacular_sidecar/[^"]+)"', html)
    assert any(asset.endswith("swagger-ui-bundle.js") for asset in assets)
    assert "<script>" not in html  # no inline script: the Content Security Policy allows scripts from 'self' only


def test_every_read_refuses_a_parameter_it_does_not_know(admin_user: User) -> None:
    """A misspelt filter (`?stauts=`) is a 400 naming it, never a list of everything. The ids do not exist: the
    parameters are checked before the object is looked up."""
    client = api_client(token_for(admin_user))
    problems = []

    for _, path in operations(changes=False):
        response = client.get(filled(path), {"stauts": "parked"})
        if response.status_code != 400 or not is_json_error(response) or "stauts" not in response.json()["detail"]:
            problems.append(f"GET {path}?stauts=parked: {response.status_code} {response.content[:200]!r}")

    assert len(operations(changes=False)) >= 10
    assert problems == []
