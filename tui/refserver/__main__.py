import argparse
import sys

from .cli import configure, main

parser = argparse.ArgumentParser(prog="python -m tui.refserver",
                                 description="hitproof's reference fault server (OpenAI-compatible)")
configure(parser)
sys.exit(main(parser.parse_args()))
