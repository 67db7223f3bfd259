"""Benchmarks (run by `make bench`, not part of the test suite)."""

from __future__ import annotations
