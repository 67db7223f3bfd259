"""Whether an exchange routes a routing key anywhere, asked of RabbitMQ's management HTTP API when planning.

AMQP can tell that an exchange exists (a passive declare) but not whether anything is bound to it for a key: a
retry into an exchange whose binding was removed would only show up while running, as messages the broker
returns (mandatory) and the run marks failed. The management API lists an exchange's bindings, so the plan can
say beforehand which messages no queue would receive.

Only a sure "nowhere" is reported. Anything this module cannot judge (a headers exchange, whose routing depends
on each message's headers; a plugin's exchange type; a policy it cannot read) counts as routable, and the
publisher's mandatory flag still catches what slips through.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

import requests

from dlqconsole.brokers import registry
from dlqconsole.core.broker_urls import Api, api_from_urls
from dlqconsole.core.http import DeniedAddressError, HttpError, check_target, guarded_session

# Connect and read timeouts: a plan waits at most this long for an API that does not answer.
TIMEOUT = (2.0, 5.0)
BUILT_IN_TYPES = frozenset({"direct", "fanout", "topic", "headers"})
# How many exchange-to-exchange hops are followed before giving up (and counting the key as routable).
MAX_HOPS = 8


__all__ = ["Api", "RoutingUnknown", "api_from_settings", "api_from_urls", "routing_problems", "topic_matches"]


def api_from_settings() -> Api | None:
    """The default broker's management API."""
    return registry.api(registry.default_broker())


class RoutingUnknown(Exception):
    """The API could not be asked; the message says why (shown on the plan as "bindings not checked: ...")."""


def topic_matches(pattern: str, key: str) -> bool:
    """RabbitMQ's topic matching: words separated by dots, "*" one word, "#" zero or more words; an empty key
    or pattern has no words (RabbitMQ's split_topic_key)."""
    return _words_match(_words(pattern), _words(key))


def _words(text: str) -> tuple[str, ...]:
    return tuple(text.split(".")) if text else ()


@functools.lru_cache(maxsize=4096)
def _words_match(pattern: tuple[str, ...], words: tuple[str, ...]) -> bool:
    if not pattern:
        return not words
    head, rest = pattern[0], pattern[1:]
    if head == "#":
        return any(_words_match(rest, words[skip:]) for skip in range(len(words) + 1))
    if not words:
        return False
    return (head == "*" or head == words[0]) and _words_match(rest, words[1:])


@dataclass
class RoutingChecker:
    """Asks the API once per exchange and answers `problem(exchange, routing_key)` for each destination."""

    api: Api
    session: requests.Session = field(default_factory=guarded_session)
    _exchanges: dict[str, dict[str, Any] | None] = field(default_factory=dict)
    _bindings: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    _policies: list[dict[str, Any]] | None = None

    def _get(self, path: str) -> Any:
        try:
            check_target(self.api.base)
            response = self.session.get(
                self.api.base + path, auth=self.api.auth, timeout=TIMEOUT, allow_redirects=False
            )
        except HttpError as error:
            raise RoutingUnknown(f"the management API at {self.api} is not asked: {error}") from error
        except DeniedAddressError as error:
            raise RoutingUnknown(f"the management API at {self.api} is not asked: {error.message}") from error
        except requests.RequestException as error:
            raise RoutingUnknown(f"the management API at {self.api} did not answer ({type(error).__name__})") from error
        if response.status_code == 404:
            return None
        if response.status_code in (401, 403):
            raise RoutingUnknown(f"the management API at {self.api} refused the login ({response.status_code})")
        if response.status_code != 200:
            raise RoutingUnknown(f"the management API at {self.api} answered {response.status_code}")
        try:
            return response.json()
        except ValueError as error:
            raise RoutingUnknown(f"the management API at {self.api} did not answer JSON") from error

    def _vhost_path(self, *parts: str) -> str:
        return "/".join(quote(part, safe="") for part in parts)

    def exchange(self, name: str) -> dict[str, Any] | None:
        if name not in self._exchanges:
            found = self._get("api/exchanges/" + self._vhost_path(self.api.vhost, name))
            self._exchanges[name] = found if isinstance(found, dict) else None
        return self._exchanges[name]

    def bindings(self, name: str) -> list[dict[str, Any]]:
        if name not in self._bindings:
            found = self._get("api/exchanges/" + self._vhost_path(self.api.vhost, name) + "/bindings/source")
            self._bindings[name] = [row for row in found or [] if isinstance(row, dict)]
        return self._bindings[name]

    def _policy_alternate(self, info: dict[str, Any]) -> str | None:
        """The alternate exchange the exchange's policy gives it ("" none); None when the policy cannot be read
        (reading policies takes the policymaker tag)."""
        policy = info.get("policy")
        if not policy:
            return ""
        if self._policies is None:
            try:
                found = self._get("api/policies/" + self._vhost_path(self.api.vhost))
            except RoutingUnknown:
                found = None  # asked once: every exchange with a policy then counts as routing
            self._policies = [row for row in found or [] if isinstance(row, dict)]
        for row in self._policies:
            if row.get("name") == policy:
                definition = row.get("definition")
                return str(definition.get("alternate-exchange") or "") if isinstance(definition, dict) else ""
        return None

    def problem(self, exchange: str, routing_key: str) -> str:
        """Why no queue would receive a message published to `exchange` with `routing_key` ("" when one would,
        or when that cannot be told)."""
        info = self.exchange(exchange)
        if info is None:
            return f"exchange {exchange!r} does not exist"
        if info.get("internal"):
            return f"exchange {exchange!r} is internal: only other exchanges can publish to it"
        if self._routes(exchange, routing_key, seen=set()):
            return ""
        return f"exchange {exchange!r} routes key {routing_key!r} to no queue (no matching binding)"

    def _routes(self, exchange: str, routing_key: str, *, seen: set[str]) -> bool:
        """True when the key reaches a queue through `exchange`, or when that cannot be told."""
        if exchange in seen:
            return False  # a loop of exchange bindings delivers nothing more
        if len(seen) >= MAX_HOPS:
            return True
        seen.add(exchange)
        info = self.exchange(exchange)
        if info is None:
            return False
        kind = str(info.get("type") or "")
        if kind not in BUILT_IN_TYPES:
            return True
        for binding in self.bindings(exchange):
            if not self._binding_matches(kind, binding, routing_key):
                continue
            if binding.get("destination_type") != "exchange":
                return True
            if self._routes(str(binding.get("destination") or ""), routing_key, seen=seen):
                return True
        arguments = info.get("arguments") or {}
        alternate = str(arguments.get("alternate-exchange") or "") if isinstance(arguments, dict) else ""
        if not alternate:  # an alternate exchange in the arguments wins over a policy's
            from_policy = self._policy_alternate(info)
            if from_policy is None:
                return True
            alternate = from_policy
        return bool(alternate) and self._routes(alternate, routing_key, seen=seen)

    @staticmethod
    def _binding_matches(kind: str, binding: dict[str, Any], routing_key: str) -> bool:
        if kind == "direct":
            return str(binding.get("routing_key", "")) == routing_key
        if kind == "topic":
            return topic_matches(str(binding.get("routing_key", "")), routing_key)
        # fanout routes to every binding; a headers binding may match some messages' headers: counted as routing.
        return True


def routing_problems(destinations: Iterable[tuple[str, str]], *, api: Api) -> dict[tuple[str, str], str]:
    """Why each (exchange, routing key) reaches no queue ("" when it does or cannot be told). Raises
    RoutingUnknown when the API cannot be asked at all."""
    checker = RoutingChecker(api=api)
    try:
        return {(exchange, key): checker.problem(exchange, key) for exchange, key in destinations}
    finally:
        checker.session.close()
