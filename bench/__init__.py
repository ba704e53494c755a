"""Measurements, each beside a reference measured in the same run (see bench/README.md)."""
