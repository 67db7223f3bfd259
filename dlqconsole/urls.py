from __future__ import annotations

from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.urls import include, path

from dlqconsole.dashboard import dashboard
from dlqconsole.views import favicon, healthz, metrics

urlpatterns = [
    path("", dashboard, name="dashboard"),
    path("", include("dlqconsole.deadletters.urls")),
    path("operations/", include("dlqconsole.operations.urls")),
    path("alerts/", include("dlqconsole.alerts.urls")),
    path("", include("dlqconsole.accounts.urls")),
    path("api/", include("dlqconsole.api.urls")),
    path("login/", auth_views.LoginView.as_view(), name="login"),
    path("logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("admin/", admin.site.urls),
    path("healthz", healthz, name="healthz"),
    path("favicon.ico", favicon, name="favicon"),
    path("metrics", metrics, name="prometheus-django-metrics"),
]

handler400 = "dlqconsole.views.bad_request"
handler500 = "dlqconsole.views.server_error"
