"""``python -m node.cli``: the ``cancel-bus`` command."""

import sys

from . import main

sys.exit(main())
