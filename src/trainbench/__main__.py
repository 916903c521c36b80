"""``python -m trainbench <command>``: the entry point of the command line (``trainbench.cli``)."""

from __future__ import annotations

import sys

from trainbench.cli import build_parser, main  # noqa: F401  (build_parser: the parser, importable from here as before)

if __name__ == "__main__":
    sys.exit(main())
