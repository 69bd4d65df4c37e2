"""Mixtures of datasets: the pure parts (weight schedules, per-step apportionment)."""
