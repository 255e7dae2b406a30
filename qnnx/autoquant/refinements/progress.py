"""A progress line on stderr for the long steps after calibration (weight rounding, bias correction)."""

from __future__ import annotations

import sys
import time


class ProgressLine:
    """``{label}: {what}, {seconds}s``, rewritten in place on stderr; silent when not ``enabled``."""

    def __init__(self, label: str, enabled: bool):
        self.label, self.enabled, self.started = label, enabled, time.perf_counter()

    def __call__(self, what: str) -> None:
        if self.enabled:
            print(f"\r{self.label}: {what}, {time.perf_counter() - self.started:.1f}s", end="", file=sys.stderr,
                  flush=True)

    def end(self) -> None:
        if self.enabled:
            print(file=sys.stderr)
