from __future__ import annotations

from django.urls import path

from dlqconsole.deadletters import views

app_name = "deadletters"
urlpatterns = [
    path("", views.dashboard, name="dashboard"),
]
