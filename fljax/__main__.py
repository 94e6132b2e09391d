"""``python -m fljax``: the CLI."""

import sys

from fljax.runner.cli import main

sys.exit(main())
