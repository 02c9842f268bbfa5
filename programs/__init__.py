"""Simulation programs (absl flags)."""
