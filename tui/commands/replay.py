"""`hitproof replay LOG`: a recorded soak in the app (final state first, then play)."""

from __future__ import annotations

import argparse


def add_parser(sub) -> argparse.ArgumentParser:
    replay = sub.add_parser("replay", help="open a recorded soak log in the app (final state first, then play)")
    replay.add_argument("log", metavar="LOG", help="a recorded soak log (--record), plain or gzipped")
    replay.set_defaults(func=run)
    return replay


def run(args) -> int:
    return _replay(args)


def _replay(args) -> int:
    from ..app.app import build_app
    from ..app.replay import ReplaySource
    from ..core.log.compressed import plain

    app = build_app(ReplaySource(str(plain(args.log))))
    app.run()
    return 0
