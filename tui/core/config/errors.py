"""Errors a user can cause or meet. Each carries its exit code and a one-line message."""

from __future__ import annotations

EXIT_PASS = 0
EXIT_FAIL = 1
EXIT_BAD_INPUT = 2
EXIT_SERVER = 3
EXIT_INCONCLUSIVE = 4
EXIT_LOG = 5                 # the event log could not be written (full disk, removed, not writable)
EXIT_INTERNAL = 6            # hitproof's own machinery failed (a bug): the run is not judged
EXIT_INTERRUPTED = 130


class HitproofError(Exception):
    """A problem the user should read as one line, never as a traceback."""

    exit_code = EXIT_BAD_INPUT

    def __init__(self, message: str):
        super().__init__(" ".join(str(message).split()))


class BadInput(HitproofError):
    exit_code = EXIT_BAD_INPUT


class ServerProblem(HitproofError):
    """The server is unreachable, died, answered with an HTTP error or a broken stream."""

    exit_code = EXIT_SERVER


class InternalError(HitproofError):
    """A part of hitproof failed where a finding could be lost (the relay of a server's output, the
    app's soak worker): the run stops and is not judged; the line says what failed."""

    exit_code = EXIT_INTERNAL


class LogWriteError(HitproofError):
    """The event log could not be written: the run stops at the first failed write."""

    exit_code = EXIT_LOG
