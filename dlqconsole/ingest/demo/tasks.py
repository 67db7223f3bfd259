"""Demo Celery tasks. Each fails for realistic, data-driven reasons; the demo sends arguments that make some fail.

All run with late acks (see celery_app), so a failure leaves the message to RabbitMQ, which dead-letters it. They
are not shared tasks: importing this module must not add them to the console's own Celery app.
"""

from __future__ import annotations

import random
import time
from decimal import Decimal

from celery import Task
from celery.exceptions import Reject

from dlqconsole.ingest.demo.celery_app import app

SUPPORTED_CURRENCIES = {"EUR", "USD", "GBP", "CHF", "SEK"}
# Regions whose CRM endpoint is "down" in the demo: contacts there fail with connection resets.
UNREACHABLE_REGIONS = {"ap-south-1": ("crm-ap-south-1.internal", 8443), "sa-east-1": ("10.42.7.19", 443)}


@app.task(name="shop.invoices.generate_invoice", shared=False)
def generate_invoice(order_id: int, amount: str, currency: str) -> str:
    """Render an invoice; unsupported currencies and very large orders fail (the latter slowly)."""
    if currency not in SUPPORTED_CURRENCIES:
        raise ValueError(f"Unsupported currency {currency!r} for order {order_id}")
    if Decimal(amount) > Decimal("20000"):
        raise TimeoutError(f"PDF renderer timed out after {random.choice([15000, 30000, 45000])}ms (order {order_id})")
    time.sleep(0.01)
    return f"INV-{order_id}"


@app.task(name="shop.crm.sync_contact", bind=True, max_retries=2, shared=False)
def sync_contact(self: Task, contact_id: int, email: str, region: str) -> None:
    """Push a contact to the CRM; regions whose endpoint is down reset the connection, retried twice."""
    if region in UNREACHABLE_REGIONS:
        host, port = UNREACHABLE_REGIONS[region]
        error = ConnectionResetError(104, f"Connection reset by peer ({host}:{port})")
        # After max_retries the original exception is raised, the task fails, and its message is rejected.
        raise self.retry(exc=error, countdown=0.2)


@app.task(name="shop.mail.send_receipt", shared=False)
def send_receipt(order_id: int, email: str) -> None:
    """Send a receipt; an address that cannot be valid is rejected outright (no point in retrying)."""
    if "@" not in email:
        raise Reject(f"invalid e-mail address {email!r} for order {order_id}", requeue=False)
