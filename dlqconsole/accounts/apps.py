from __future__ import annotations

from django.apps import AppConfig


class AccountsConfig(AppConfig):
    name = "dlqconsole.accounts"
    label = "accounts"
    verbose_name = "Accounts"

    def ready(self) -> None:
        # Imported here: Django imports this module while it loads the apps, before models may be imported.
        from django.contrib.auth.signals import user_logged_in, user_logged_out, user_login_failed

        from dlqconsole.accounts import signin

        # Sign-ins are audited and throttled for every login form (the console's and the admin's).
        user_login_failed.connect(signin.on_login_failed, dispatch_uid="dlqconsole.accounts.login_failed")
        user_logged_in.connect(signin.on_logged_in, dispatch_uid="dlqconsole.accounts.logged_in")
        user_logged_out.connect(signin.on_logged_out, dispatch_uid="dlqconsole.accounts.logged_out")
