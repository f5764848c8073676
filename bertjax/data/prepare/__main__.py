"""``python -m bertjax.data.prepare``: bertjax.data.prepare.main, errors in one line.

The command line lives in a package's ``__main__`` so that running it never imports its own
module twice: bertjax.data imports bertjax.data.prepare before runpy would run it as __main__.
"""

import sys

from bertjax.data.prepare import main

if __name__ == "__main__":
    try:
        main()
    except (ValueError, FileNotFoundError) as err:
        sys.exit(f"error: {err}")
