"""pytest setup: the tests' helpers (helpers.py) and the examples are importable."""

import os
import sys

here = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [here, os.path.join(here, "..", "examples")]
