from __future__ import annotations

from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.urls import include, path

from actions.api import api
from actions.web import health
from actions.web.auth import LoginForm

urlpatterns = [
    path("", include("actions.web.urls")),
    path("api/", api.urls),
    path("login/", auth_views.LoginView.as_view(form_class=LoginForm), name="login"),
    path("logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("admin/", admin.site.urls),
    path("healthz", health.healthz, name="healthz"),  # under ASGI, answered before Django
    path("readyz", health.readyz, name="readyz"),
    path("metrics", health.metrics, name="metrics"),
]
