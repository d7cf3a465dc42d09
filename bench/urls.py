"""The app's URLs plus /bench/bare-update/<id>/: a bare Django view doing one UPDATE, through the
same middleware (session, CSRF, auth), as the baseline for decision throughput."""

from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.urls import path
from django.views.decorators.http import require_POST

from actions.models import Interrupt
from grundlag_site.urls import urlpatterns as site_urlpatterns


@login_required
@require_POST
def bare_update(request: HttpRequest, pk: int) -> HttpResponse:
    Interrupt.objects.filter(pk=pk).update(reason="bare")
    return HttpResponse(status=204)


urlpatterns = [path("bench/bare-update/<int:pk>/", bare_update), *site_urlpatterns]
