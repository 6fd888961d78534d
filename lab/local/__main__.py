"""``python -m lab.local DIR [LOCK_FD]``: the supervisor of the stack planned in DIR (``tokenfleet
up`` starts it; ``lab.local.supervisor``)."""

from __future__ import annotations

import sys

from lab.local.supervisor import main

sys.exit(main(sys.argv[1:]))
