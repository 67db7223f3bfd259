"""`Authorization: Bearer dlq_...`: a personal token, acting as its user (accounts/tokens.py)."""

from __future__ import annotations

from typing import Any

from django.views.decorators.debug import sensitive_variables
from drf_spectacular.extensions import OpenApiAuthenticationExtension
from rest_framework.authentication import BaseAuthentication, get_authorization_header
from rest_framework.exceptions import AuthenticationFailed
from rest_framework.request import Request

from dlqconsole.accounts import tokens
from dlqconsole.accounts.models import ApiToken

SCHEMES = ("bearer", "token")


class TokenAuthentication(BaseAuthentication):
    # Django's error reports that show each frame's variables hide every variable here (the header, the token).
    @sensitive_variables()
    def authenticate(self, request: Request) -> tuple[Any, ApiToken] | None:
        header = get_authorization_header(request).split()
        if not header or header[0].decode("latin-1").lower() not in SCHEMES:
            return None  # another scheme, or none: the session may still authenticate
        if len(header) != 2:
            raise AuthenticationFailed("Send the token as `Authorization: Bearer <token>`.")
        try:
            plaintext = header[1].decode("ascii")
        except UnicodeDecodeError:
            raise AuthenticationFailed("This is not a dlqconsole API token (dlq_...).") from None
        token, why = tokens.authenticate(plaintext)
        if token is None:
            raise AuthenticationFailed(why)
        return token.user, token

    def authenticate_header(self, request: Request) -> str:
        return 'Bearer realm="dlqconsole"'


class TokenScheme(OpenApiAuthenticationExtension):
    """The schema's security scheme for TokenAuthentication (the docs page's "Authorize" takes a token)."""

    target_class = TokenAuthentication
    name = "token"

    def get_security_definition(self, auto_schema: Any) -> dict[str, str]:
        return {"type": "http", "scheme": "bearer", "bearerFormat": "dlq_<prefix>_<secret>"}
