"""``python -m fljax``: the CLI."""

import sys

from fljax.cli import main

sys.exit(main())
