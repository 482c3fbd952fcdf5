"""Fixtures of the tests over every registered task (tests/task_instances.py): a family edits nothing here."""

from tests.task_instances import task_ctx, task_encoder  # noqa: F401
