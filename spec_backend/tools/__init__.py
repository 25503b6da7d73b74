"""Tooling around the engine: the ``generate`` / ``bench`` / ``demo`` commands, their prompt sets, and
tiny random models for tests and smoke runs. Nothing in the engine imports this package."""
