"""``python -m gateway`` is the same as the ``hoard`` command."""

import sys

from gateway.app.cli import main

sys.exit(main())
