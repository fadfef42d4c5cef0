"""``python -m clipcache.flows.cli``: the ``clipcache`` command."""

import sys

from clipcache.flows.cli import console

if __name__ == "__main__":
    sys.exit(console())
