"""Build (or find) the kernels now: `python -m engines.builtin.runner.kernels` (the Makefile's install step)."""

import logging
import sys

from engines.builtin.runner.kernels import build_dir, load

logging.basicConfig(level=logging.INFO, format="%(message)s")
ok = load()
print(f"edgerun kernels: {'ready in ' + str(build_dir()) if ok else 'unavailable (torch ops will run instead)'}")
sys.exit(0)
