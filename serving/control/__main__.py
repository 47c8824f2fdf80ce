"""Entry point of `python -m serving.control` (see serving/control/cli.py)."""

import sys

from serving.control.cli import main

sys.exit(main())
