"""Entry point of `python -m atdp_io` (see atdp_io/cli.py)."""

import sys

from atdp_io.cli import main

sys.exit(main())
