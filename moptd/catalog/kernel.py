"""Kernel-log and driver-stack signals (filled in by the kernel/driver collectors)."""

from moptd.catalog import SignalSpec

SIGNALS: list[SignalSpec] = []
