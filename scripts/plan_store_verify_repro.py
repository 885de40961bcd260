"""Runs `opfacade verify` for the ops named on the command line in one process, logging the
plan store's loads and the graph builds (DEBUG) to stdout; a segfault prints Python's stack
(run with -X faulthandler). For reproducing a crash on a warm plan store (forty-fifth session).

    OPFACADE_CACHE_DIR=DIR python3 -X faulthandler scripts/plan_store_verify_repro.py OP...
"""

from __future__ import annotations

import logging
import sys

from opfacade.verify import verify_all

logging.basicConfig(level=logging.WARNING, stream=sys.stdout, format="%(message)s")
logging.getLogger("opfacade").setLevel(logging.DEBUG)
for op in sys.argv[1:]:
    verify_all(op=op, runs=1)
print("finished", flush=True)
