"""deploy/prometheus/alerts.yml is valid, unit-tested with promtool, and, like the Grafana dashboard, only uses
metric names that /metrics exports."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from django.conf import settings
from django.test import Client
from prometheus_client.parser import text_string_to_metric_families

DEPLOY = Path(settings.BASE_DIR) / "deploy"
PROMTOOL = shutil.which("promtool")
needs_promtool = pytest.mark.skipif(
    PROMTOOL is None, reason="promtool is not installed (Debian package prometheus; scripts/system-packages)"
)
METRIC_NAME = re.compile(r"\b((?:dlq|django)_[a-z0-9_]+)\b")


def promtool(*args: str) -> subprocess.CompletedProcess[str]:
    assert PROMTOOL is not None
    return subprocess.run([PROMTOOL, *args], cwd=DEPLOY / "prometheus", capture_output=True, text=True, timeout=60)


@needs_promtool
def test_alert_rules_pass_promtool_check() -> None:
    result = promtool("check", "rules", "alerts.yml")

    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS: 13 rules found" in result.stdout


@needs_promtool
def test_alert_rules_fire_as_their_unit_tests_expect() -> None:
    result = promtool("test", "rules", "alerts_test.yml")

    assert result.returncode == 0, result.stdout + result.stderr


@needs_promtool
def test_example_prometheus_config_is_valid() -> None:
    result = promtool("check", "config", "prometheus.yml")

    assert result.returncode == 0, result.stdout + result.stderr


@pytest.fixture
def exported_names(client: Client, db: None) -> set[str]:
    """Every family and sample name /metrics exports (families without samples included)."""
    client.get("/healthz")
    names: set[str] = set()
    for family in text_string_to_metric_families(client.get("/metrics").content.decode()):
        names.add(family.name)
        names.update(sample.name for sample in family.samples)
        if family.type == "counter":
            names.add(family.name + "_total")
    return names


def referenced(text: str) -> set[str]:
    return set(METRIC_NAME.findall(text))


def test_alert_rules_use_exported_metrics(exported_names: set[str]) -> None:
    rules = (DEPLOY / "prometheus" / "alerts.yml").read_text()
    expressions = "\n".join(re.findall(r"expr: ([^\n]+(?:\n {10,}[^\n]+)*)", rules))

    used = referenced(expressions)

    assert used, "no metric found in the rules"
    assert used <= exported_names, used - exported_names


def test_grafana_dashboard_parses_and_uses_exported_metrics(exported_names: set[str]) -> None:
    dashboard = json.loads((DEPLOY / "grafana" / "dlqconsole.json").read_text())

    expressions = [target["expr"] for panel in dashboard["panels"] for target in panel.get("targets", [])]
    used = set().union(*(referenced(expression) for expression in expressions))

    assert dashboard["uid"] and dashboard["title"]
    assert len(expressions) >= 10
    assert used <= exported_names, used - exported_names
    panel_ids = [panel["id"] for panel in dashboard["panels"]]
    assert len(panel_ids) == len(set(panel_ids))
