"""``python -m fedhf`` runs the ``fedhf`` command (fedhf.cli)."""

import sys

from .cli import main

sys.exit(main())
