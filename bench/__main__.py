"""`python -m bench` from the repository root (see bench/__init__.py)."""

import sys

from bench.runner import main

sys.exit(main())
