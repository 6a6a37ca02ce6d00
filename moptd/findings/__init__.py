"""Findings history: every finding transition and kernel/NVML event, kept across restarts."""
