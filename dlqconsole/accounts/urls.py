from __future__ import annotations

from django.urls import path

from dlqconsole.accounts import token_views, views

app_name = "accounts"

urlpatterns = [
    path("audit/", views.audit_log, name="audit"),
    path("account/tokens/", token_views.token_list, name="tokens"),
]
