"""Runnable examples of the documentation pages (docs/tasks.md)."""
