"""Write the manual's reference pages from the code, or check that they match it.

    python docs/gen_reference.py            # rewrite docs/reference/{scenario,cli,json-report,log-schema}.md
    python docs/gen_reference.py --check    # exit 1 naming each page that is stale (CI, tests/docs)

The pages come from what the program itself reads: each phase's `Settings` and the scenario's shared
sections, the argparse parsers `hitproof --help` prints, the code that builds `report --format json`,
and the event dataclasses of the log. Run it after adding a scenario key, a flag, a JSON key or an event
field, and commit the pages with the change."""

from __future__ import annotations

import os
import sys
from pathlib import Path

DOCS = Path(__file__).resolve().parent
ROOT = DOCS.parent
for path in (str(ROOT), str(DOCS)):
    if path not in sys.path:
        sys.path.insert(0, path)

os.environ["COLUMNS"] = "100"        # argparse wraps usage lines to the terminal: the pages must not vary

from reference_gen import cli_page, json_page, log_page, scenario_page  # noqa: E402

PAGES = {
    "reference/scenario.md": scenario_page.page,
    "reference/cli.md": cli_page.page,
    "reference/json-report.md": json_page.page,
    "reference/log-schema.md": log_page.page,
}


def rendered() -> dict[Path, str]:
    return {DOCS / name: build() for name, build in PAGES.items()}


def stale() -> list[str]:
    """The pages whose file differs from what the code makes now."""
    return [str(path.relative_to(ROOT)) for path, text in rendered().items()
            if not path.exists() or path.read_text() != text]


def main(argv: list[str]) -> int:
    if "--check" in argv:
        pages = stale()
        for page in pages:
            print(f"{page} is stale: run `python docs/gen_reference.py` and commit it", file=sys.stderr)
        return 1 if pages else 0
    for path, text in rendered().items():
        path.parent.mkdir(parents=True, exist_ok=True)
        if not path.exists() or path.read_text() != text:
            path.write_text(text)
            print(f"wrote {path.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
