"""User-facing errors. Each carries an exit code; the CLI prints the message, never a traceback."""

from __future__ import annotations

EXIT_OK = 0
EXIT_CHECK_FAILED = 1
EXIT_USAGE = 2


class RlctlError(Exception):
    """An error meant for the user: what is wrong, where, and how to fix it."""

    exit_code = EXIT_USAGE

    def __init__(self, message: str, *, hint: str | None = None):
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        return self.message if not self.hint else f"{self.message}\n  fix: {self.hint}"


class RecipeError(RlctlError):
    """A recipe file that cannot be used: unreadable, malformed, or not matching the schema."""


class Unreachable(RlctlError):
    """A place to run (a host, a cluster) did not answer: an executor's error, so that the experiment queue holds
    its variants back instead of failing them."""

    exit_code = EXIT_CHECK_FAILED


class CheckFailed(RlctlError):
    exit_code = EXIT_CHECK_FAILED


class PatchError(RlctlError):
    """A patch set that cannot be applied, reverted or read."""
