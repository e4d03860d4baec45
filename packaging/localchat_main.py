"""The script PyInstaller freezes: runs the same `main` as `python -m app`.

PyInstaller needs a script file as its entry point; `app/__main__.py` uses package-relative
imports, so it cannot be that script itself.
"""

import sys

from app.__main__ import main

if __name__ == "__main__":
    sys.exit(main())
