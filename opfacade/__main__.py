"""`python -m opfacade` is the `opfacade` command."""

import sys

from .cli import main

sys.exit(main())
