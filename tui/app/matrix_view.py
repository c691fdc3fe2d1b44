"""`hitproof matrix` in the app: the app built by the one factory (app.build_app) over a MatrixSource.

The top of tui/app: it builds the app, so nothing in tui/app imports it. The table on screen is
matrix_table.py; the app's matrix behaviour (rows, the running profile, replaying a finished row)
is matrix_mode.py.
"""

from __future__ import annotations

from typing import Any

from ..core.config.errors import EXIT_INTERRUPTED
from ..matrix import pending_row, run_matrix
from .app import build_app
from .sources import MatrixSource


def matrix_app(scenario, profiles, out, *, argv: list[str], **options):
    """The app over tui.matrix.run_matrix (the CLI's `hitproof matrix` without --headless, and the
    tests): built by the one factory over a MatrixSource. Returns (app, source)."""

    async def start(*, hooks, on_row):
        return await run_matrix(scenario, profiles, out, hooks=hooks, on_row=on_row, argv=argv)

    source = MatrixSource(start, [pending_row(p, scenario) for p in profiles], out=str(out))
    return build_app(source, **options), source


def run_matrix_app(scenario, profiles, out, *, argv: list[str]) -> tuple[int, list[dict[str, Any]]]:
    """`hitproof matrix` without --headless. Returns the exit code (0 when the matrix ran, 130 when
    the user quit before it ended) and the rows."""
    app, source = matrix_app(scenario, profiles, out, argv=argv)
    app.run()
    return (app.return_code if app.return_code is not None else EXIT_INTERRUPTED), source.rows
