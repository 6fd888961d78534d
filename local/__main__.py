"""``python -m local DIR [LOCK_FD]``: the supervisor of the stack planned in DIR (``tokenfleet
up`` starts it; ``local.supervisor``)."""

from __future__ import annotations

import sys

from local.supervisor import main

sys.exit(main(sys.argv[1:]))
