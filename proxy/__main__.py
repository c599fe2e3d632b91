"""`python -m proxy` is `context-proxy`."""

import sys

from proxy.cli import main

sys.exit(main())
