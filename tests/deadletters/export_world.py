"""Shared by the export tests: export places are counted in Redis, which outlives a test."""

from __future__ import annotations

from dlqconsole.core.leases import LocalLeases, RedisLeases, get_leases


def clear_export_leases() -> None:
    """No export holds a place: the pools of every user and of the running exports are emptied."""
    leases = get_leases()
    if isinstance(leases, RedisLeases):
        keys = list(leases.client.scan_iter(match=f"{leases.prefix}exports:*"))
        if keys:
            leases.client.delete(*keys)
    elif isinstance(leases, LocalLeases):
        leases.pools.clear()
