"""The benchmarks' own tests, apart from the product suite (which never imports benchmarks/):

    .venv/bin/python -m pytest benchmarks/tests

The scripts in benchmarks/ import one another by module name (`_common`), as they do when
run as scripts, so their folder goes on the path here.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
