"""Small strict readers of environment variables.

Every deploy-specific setting comes from the environment. A bad value raises ImproperlyConfigured at start-up
with the variable's name, rather than surfacing later as a confusing error deep inside a request.
"""

from __future__ import annotations

import ipaddress
import os
import re

from django.core.exceptions import ImproperlyConfigured

from dlqconsole.core.durations import parse_duration

TRUE_WORDS = {"1", "true", "yes", "on"}
FALSE_WORDS = {"0", "false", "no", "off", ""}


def env_str(name: str, default: str) -> str:
    return os.environ.get(name, default)


def env_bool(name: str, default: bool) -> bool:
    raw = os.environ.get(name)
    if raw is None:
        return default
    word = raw.strip().lower()
    if word in TRUE_WORDS:
        return True
    if word in FALSE_WORDS:
        return False
    raise ImproperlyConfigured(f"{name} must be one of {sorted(TRUE_WORDS | FALSE_WORDS)}, not {raw!r}")


def env_int(name: str, default: int, *, minimum: int | None = None, maximum: int | None = None) -> int:
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ImproperlyConfigured(f"{name} must be an integer, not {raw!r}") from None
    if minimum is not None and value < minimum:
        raise ImproperlyConfigured(f"{name} must be at least {minimum}, not {value}")
    if maximum is not None and value > maximum:
        raise ImproperlyConfigured(f"{name} must be at most {maximum}, not {value}")
    return value


def env_float(name: str, default: float, *, minimum: float | None = None, maximum: float | None = None) -> float:
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ImproperlyConfigured(f"{name} must be a number, not {raw!r}") from None
    if minimum is not None and value < minimum:
        raise ImproperlyConfigured(f"{name} must be at least {minimum}, not {value}")
    if maximum is not None and value > maximum:
        raise ImproperlyConfigured(f"{name} must be at most {maximum}, not {value}")
    return value


def env_duration(name: str, default: str, *, minimum: int | None = None) -> int:
    """Seconds in a duration written as people write them (`90s`, `5m`, `1h30m`; a bare number is seconds)."""
    raw = os.environ.get(name)
    text = default if raw is None or raw.strip() == "" else raw
    try:
        value = parse_duration(text)
    except ValueError as error:
        raise ImproperlyConfigured(f"{name}: {error}") from None
    if minimum is not None and value < minimum:
        raise ImproperlyConfigured(f"{name} must be at least {minimum} s, not {value} s")
    return value


def env_list(name: str, default: list[str]) -> list[str]:
    raw = os.environ.get(name)
    if raw is None:
        return list(default)
    return [item.strip() for item in raw.split(",") if item.strip()]


def env_mapping(name: str, *, name_pattern: str) -> dict[str, str]:
    """`name=value;name2=value2` (DLQ_BROKERS): names match `name_pattern` and are unique; values are not empty."""
    raw = os.environ.get(name, "").strip()
    found: dict[str, str] = {}
    for item in raw.split(";"):
        if not item.strip():
            continue
        key, sep, value = item.partition("=")
        key, value = key.strip(), value.strip()
        if not sep or not value:
            raise ImproperlyConfigured(f"{name}: {key[:40]!r} has no value (write name=value;name2=value2)")
        if not re.fullmatch(name_pattern, key):
            raise ImproperlyConfigured(f"{name}: {key[:40]!r} is not a valid name ({name_pattern})")
        if key in found:
            raise ImproperlyConfigured(f"{name} names {key!r} twice")
        found[key] = value
    return found


def env_networks(name: str, default: list[str]) -> list[str]:
    """A comma-separated list of networks (`10.0.0.0/8`, `fd00::/8`; a single address is its own /32 or /128)."""
    networks = env_list(name, default)
    for network in networks:
        try:
            ipaddress.ip_network(network, strict=False)
        except ValueError:
            raise ImproperlyConfigured(f"{name}: {network!r} is not a network (CIDR)") from None
    return networks
