"""`python -m tpuflow` runs the command line."""

import sys

from tpuflow.cli import main

sys.exit(main())
