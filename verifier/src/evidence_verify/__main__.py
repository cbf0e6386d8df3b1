"""``python -m evidence_verify``: the same as the ``evidence-verify`` command."""

import sys

from .cli import main

sys.exit(main())
