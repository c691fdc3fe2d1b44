"""Commands that are one module each: `add_parser(sub)` declares the subcommand (and sets `func`),
`run(args)` runs it and returns the exit code; a HitproofError becomes one line and its exit code in
tui/cli.py. A new command is a module here and one name in COMMANDS (the order of `hitproof --help`)."""

COMMANDS = ("run", "matrix", "replay", "report", "repro", "refserver", "size", "setup")
