"""``python -m gateway`` is the same as the ``hoard`` command."""

import sys

from gateway.cli import main

sys.exit(main())
