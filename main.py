"""vlaeval's entry point from a checkout: `python main.py job=<name> [overrides]`, the same as the
`vlaeval` command the install puts on the PATH (vlaeval/cli.py: main)."""

from __future__ import annotations

import sys
from pathlib import Path

if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from vlaeval.cli import main

    main()
