"""Deterministic simulation support: history checkers and related tooling."""
