from __future__ import annotations

from django.urls import path

from dlqconsole.operations import breaker_views, shed_views, views

app_name = "operations"
urlpatterns = [
    path("", views.operations_list, name="list"),
    path("plan/", views.operation_plan, name="plan"),
    path("shed/", shed_views.shed_plan, name="shed"),
    path("breakers/close/", breaker_views.breaker_close, name="breaker-close"),
    path("retry-message/<int:pk>/", views.message_retry, name="retry-message"),
    path("<int:pk>/", views.operation_detail, name="detail"),
    path("<int:pk>/start/", views.operation_start, name="start"),
    path("<int:pk>/pause/", views.operation_pause, name="pause"),
    path("<int:pk>/resume/", views.operation_resume, name="resume"),
    path("<int:pk>/cancel/", views.operation_cancel, name="cancel"),
    path("<int:pk>/rate/", views.operation_rate, name="rate"),
    path("<int:pk>/purged.csv", views.operation_purged, name="purged"),
]
