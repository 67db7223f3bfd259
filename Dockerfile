# The console's image: gunicorn by default; docker-compose.yml runs every other process from it too. An exact
# Python release on Debian bookworm, so a rebuild gets the same interpreter.
FROM python:3.12.14-slim-bookworm
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 DLQ_VAR_DIR=/app/var
WORKDIR /app
COPY requirements.txt .
# Every package, transitive ones too, is pinned with its hashes (requirements.in, `make lock`); pip refuses the rest.
RUN pip install --no-cache-dir --require-hashes -r requirements.txt
# The processes run as a user of their own, not root; its home is var/, where gunicorn puts its control socket.
RUN useradd --system --uid 10001 --user-group --home-dir /app/var --no-create-home dlqconsole
COPY . .
# collectstatic signs nothing, so it runs without SECRET_KEY (dlqconsole/checks.py). The static files stay root's;
# the user writes only var/ (SQLite, the consumer's heartbeat) and var/exports (a volume, which takes this owner).
RUN python manage.py collectstatic --no-input -v0 \
    && mkdir -p var/exports \
    && chown dlqconsole:dlqconsole var var/exports
# Numeric, so that an orchestrator's "run as non-root" check can see it is not root.
USER 10001:10001
EXPOSE 8000
CMD ["gunicorn", "dlqconsole.wsgi", "--bind", "0.0.0.0:8000", "--workers", "2", "--threads", "4"]
