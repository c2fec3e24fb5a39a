"""Errors a user can cause, reported as one line naming the file and the field."""

from __future__ import annotations


class HetsimError(Exception):
    """Base class of errors that the CLI reports without a traceback (exit 2)."""


class ConfigError(HetsimError):
    """Bad input in a user-written file (config, profile, model, plan, sweep).

    Args:
        file: the file (or a pseudo-source such as ``<demo>``).
        field: dotted field path inside it, '' when the whole file is at fault.
        message: what is wrong, in one line.
    """

    def __init__(self, file: str, field: str, message: str) -> None:
        self.file = str(file)
        self.field = field
        self.message = message
        super().__init__(self.line())

    def line(self) -> str:
        where = f"{self.file}: {self.field}" if self.field else self.file
        return f"{where}: {self.message}"

