"""`python -m loadtests.bench --help`."""

from __future__ import annotations

import sys

from loadtests.bench.cli import main

sys.exit(main())
