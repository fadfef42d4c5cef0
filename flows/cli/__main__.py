"""``python -m clipcache.flows.cli``: the ``clipcache`` command."""

import sys

from clipcache.flows.cli.app import main

if __name__ == "__main__":
    sys.exit(main())
