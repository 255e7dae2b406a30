"""Errors that reach users as one clear line.

Every check on user input (a model, a scale, a calibration file) raises
:class:`QnnxError` with a message that names *where* (node, file, input) and
*what* is wrong. The CLI prints ``str(err)`` and exits 1; anything else is a bug.
"""

from __future__ import annotations


class QnnxError(ValueError):
    """A problem with the user's input, explained in one line."""

    def __init__(self, message: str, *, where: str | None = None):
        self.where = where
        self.detail = message
        super().__init__(f"{where}: {message}" if where else message)

    def at(self, where: str) -> "QnnxError":
        """The same error, located more precisely (outermost location first)."""
        loc = f"{where}: {self.where}" if self.where else where
        return QnnxError(self.detail, where=loc)
