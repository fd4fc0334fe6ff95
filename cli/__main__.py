"""`python -m cli` is `edgerun`."""

import sys

from cli.main import main

sys.exit(main())
