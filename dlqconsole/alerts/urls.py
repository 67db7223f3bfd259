from __future__ import annotations

from django.urls import path

from dlqconsole.alerts import views

app_name = "alerts"
urlpatterns = [
    path("", views.alert_list, name="list"),
    path("bulk/", views.alert_bulk, name="bulk"),
    path("<int:pk>/", views.alert_detail, name="detail"),
    path("<int:pk>/acknowledge/", views.alert_acknowledge, name="acknowledge"),
    path("<int:pk>/silence/", views.alert_silence, name="silence"),
    path("queues/", views.queue_list, name="queues"),
    path("rules/", views.rule_list, name="rules"),
    path("rules/new/", views.rule_edit, name="rule-new"),
    path("rules/<int:pk>/", views.rule_edit, name="rule"),
    path("rules/<int:pk>/silence/", views.rule_silence, name="rule-silence"),
    path("rules/<int:pk>/delete/", views.rule_delete, name="rule-delete"),
    path("channels/", views.channel_list, name="channels"),
    path("channels/new/", views.channel_edit, name="channel-new"),
    path("channels/<int:pk>/", views.channel_detail, name="channel"),
    path("channels/<int:pk>/edit/", views.channel_edit, name="channel-edit"),
    path("channels/<int:pk>/test/", views.channel_test, name="channel-test"),
    path("channels/<int:pk>/send-open/", views.channel_send_open, name="channel-send-open"),
    path("channels/<int:pk>/rotate-secret/", views.channel_rotate_secret, name="channel-rotate-secret"),
    path("channels/<int:pk>/enable/", views.channel_enable, name="channel-enable"),
    path("channels/<int:pk>/delete/", views.channel_delete, name="channel-delete"),
    path("notifications/<int:pk>/", views.notification_status, name="notification"),
]
