"""/api/v1/: each resource module brings its own urlpatterns; the schema and the docs page; JSON 404 for the rest."""

from __future__ import annotations

from django.contrib.auth.decorators import login_not_required, login_required
from django.urls import include, path, re_path
from django.views.decorators.csrf import csrf_exempt
from drf_spectacular.views import SpectacularJSONAPIView, SpectacularSwaggerSplitView

from dlqconsole.api import alerts, audit, deadletters, errors, operations, patterns, queues
from dlqconsole.api.index import ApiRoot

urlpatterns = [
    path("v1/", ApiRoot.as_view(), name="api-root"),
    path("v1/openapi.json", SpectacularJSONAPIView.as_view(), name="api-schema"),
    # The docs page is a page: signed out, it goes to the login and back.
    path("v1/docs/", login_required(SpectacularSwaggerSplitView.as_view(url_name="api-schema")), name="api-docs"),
    path("v1/", include(queues.urlpatterns)),
    path("v1/", include(deadletters.urlpatterns)),
    path("v1/", include(patterns.urlpatterns)),
    path("v1/", include(operations.urlpatterns)),
    path("v1/", include(alerts.urlpatterns)),
    path("v1/", include(audit.urlpatterns)),
    re_path(r"^.*$", login_not_required(csrf_exempt(errors.not_found))),
]
