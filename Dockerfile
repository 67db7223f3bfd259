FROM python:3.12-slim
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 DLQ_VAR_DIR=/app/var
WORKDIR /app
COPY requirements.txt .
RUN pip install --no-cache-dir -r requirements.txt
COPY . .
RUN python manage.py collectstatic --no-input -v0
EXPOSE 8000
CMD ["gunicorn", "dlqconsole.wsgi", "--bind", "0.0.0.0:8000", "--workers", "2", "--threads", "4"]
