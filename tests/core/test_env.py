"""Settings read from the environment fail at start-up with the variable's name when a value is wrong."""

from __future__ import annotations

import pytest
from django.core.exceptions import ImproperlyConfigured

from dlqconsole.core.env import env_int, env_networks


def test_networks_are_read_as_a_comma_separated_list(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DLQ_TEST_NETWORKS", " 10.0.0.0/8, fd00::/8 ,192.168.1.1,")

    assert env_networks("DLQ_TEST_NETWORKS", []) == ["10.0.0.0/8", "fd00::/8", "192.168.1.1"]


def test_an_unset_network_list_is_its_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("DLQ_TEST_NETWORKS", raising=False)

    assert env_networks("DLQ_TEST_NETWORKS", ["127.0.0.0/8"]) == ["127.0.0.0/8"]


def test_a_value_that_is_not_a_network_names_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DLQ_TEST_NETWORKS", "10.0.0.0/8,proxy.internal")

    with pytest.raises(ImproperlyConfigured, match=r"DLQ_TEST_NETWORKS: 'proxy.internal' is not a network"):
        env_networks("DLQ_TEST_NETWORKS", [])


def test_an_integer_past_its_maximum_names_the_variable_and_the_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DLQ_BODY_PREVIEW_BYTES", "10485760")

    with pytest.raises(ImproperlyConfigured, match="DLQ_BODY_PREVIEW_BYTES must be at most 131072, not 10485760"):
        env_int("DLQ_BODY_PREVIEW_BYTES", 65536, minimum=1024, maximum=131072)
