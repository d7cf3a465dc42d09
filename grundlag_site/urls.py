from __future__ import annotations

from django.contrib import admin
from django.urls import include, path
from django.views.generic import RedirectView

from actions import scim
from actions.api import api
from actions.web import health, receipts, sso

urlpatterns = [
    path("", include("actions.web.urls")),
    path("api/", api.urls),
    path("login/", sso.Login.as_view(), name="login"),
    path("login/link/<str:token>/", sso.link_sign_in, name="sign-in-link"),
    path("logout/", sso.logout, name="logout"),
    # Single sign-on: off to the identity provider, and back (actions.web.sso).
    path("oidc/authenticate/", sso.SignIn.as_view(), name="oidc_authentication_init"),
    path("oidc/callback/", sso.Callback.as_view(), name="oidc_authentication_callback"),
    # The admin signs in where everyone does: one page, its throttling and single sign-on.
    path("admin/login/", RedirectView.as_view(pattern_name="login", query_string=True)),
    path("admin/", admin.site.urls),
    # SCIM 2.0: the company's directory provisions users and groups (actions.scim).
    path("scim/v2", scim.endpoint),
    path("scim/v2/<path:path>", scim.endpoint),
    path(".well-known/jwks.json", receipts.jwks, name="jwks"),
    path("healthz", health.healthz, name="healthz"),  # under ASGI, answered before Django
    path("readyz", health.readyz, name="readyz"),
    path("metrics", health.metrics, name="metrics"),
]
