"""``python -m clipcache``: the ``clipcache`` command."""

import sys

from clipcache.flows.cli import main

if __name__ == "__main__":
    sys.exit(main())
