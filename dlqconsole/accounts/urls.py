from __future__ import annotations

from django.urls import path

from dlqconsole.accounts import views

app_name = "accounts"

urlpatterns = [
    path("", views.audit_log, name="audit"),
]
