"""``python -m quickdraft.cli``: the same as the ``quickdraft`` command."""

import sys

from quickdraft.cli import main

sys.exit(main())
