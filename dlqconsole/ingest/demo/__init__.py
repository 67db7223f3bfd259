"""The demo: a faulty shop service and a Celery app that dead-letter realistic failures through RabbitMQ."""
