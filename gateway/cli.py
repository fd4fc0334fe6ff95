"""`python -m gateway.cli` still starts `edgerun` while work begun before the move to cli/ lands.

Temporary (issue 17, phase 1): the command line lives in the top-level `cli` package; new code
spawns `python -m cli` and imports `cli.main`. Delete this file once nothing names it.
"""

import sys

from cli.main import main

__all__ = ["main"]

if __name__ == "__main__":
    sys.exit(main())
