from __future__ import annotations

import os

from django.core.wsgi import get_wsgi_application

from dlqconsole.checks import refuse_to_start_without_secret_key

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "dlqconsole.settings")
# gunicorn imports this module, and runserver too (WSGI_APPLICATION): neither serves sessions signed with a public key.
refuse_to_start_without_secret_key("the web server")
application = get_wsgi_application()
