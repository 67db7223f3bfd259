from __future__ import annotations

from django.urls import path

from dlqconsole.alerts import views

app_name = "alerts"
urlpatterns = [
    path("", views.alerts_list, name="list"),
]
