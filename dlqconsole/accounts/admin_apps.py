"""django.contrib.admin's app, with the console's site: entered by role (see admin_site.py). Its own module: an
apps module is imported before the models are ready, and admin_site.py needs them."""

from __future__ import annotations

from django.contrib.admin.apps import AdminConfig


class ConsoleAdminConfig(AdminConfig):
    default_site = "dlqconsole.accounts.admin_site.ConsoleAdminSite"
