from __future__ import annotations

from typing import Any

from django.utils import timezone
from oauth2_provider.oauth2_validators import OAuth2Validator


class Validator(OAuth2Validator):  # type: ignore[misc]  # the library ships no hints
    """The claims a company's provider sends (email, preferred_username, groups), and two users
    whose ID tokens are wrong on purpose: the site must refuse them."""

    oidc_claim_scope = {**OAuth2Validator.oidc_claim_scope, "groups": "openid"}

    def get_additional_claims(self, request: Any) -> dict[str, Any]:
        user = request.user
        return {
            "email": user.email,
            "email_verified": True,
            "preferred_username": user.username,
            "given_name": user.first_name,
            "groups": sorted(user.groups.values_list("name", flat=True)),
        }

    def finalize_id_token(
        self, id_token: dict[str, Any], token: Any, token_handler: Any, request: Any
    ) -> str:
        if request.user.username == "wrong-audience":
            id_token["aud"] = "another-application"
        if request.user.username == "expired":
            id_token["iat"] = int(timezone.now().timestamp()) - 7200
        return str(super().finalize_id_token(id_token, token, token_handler, request))

    def get_id_token_dictionary(self, token: Any, token_handler: Any, request: Any) -> Any:
        claims, expiration = super().get_id_token_dictionary(token, token_handler, request)
        if request.user.username == "expired":
            claims["exp"] = int(timezone.now().timestamp()) - 3600
        return claims, expiration
