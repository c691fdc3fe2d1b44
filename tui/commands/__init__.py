"""Commands that are one module each: `add_parser(sub)` declares the subcommand, `run(args)` runs it
(returning the exit code; a HitproofError becomes one line and its exit code in tui/cli.py)."""
