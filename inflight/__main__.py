"""`python -m inflight`: the `inflight` command."""

import sys

from inflight.cli import main

sys.exit(main())
