"""``python -m skillstate.bench.overhead``: the benchmark outside the skillstate CLI."""

from __future__ import annotations

import sys

from skillstate.bench.overhead.cli import main

if __name__ == "__main__":
    sys.exit(main())
