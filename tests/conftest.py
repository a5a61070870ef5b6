"""Shared test setup: subprocesses never see the repository on ``sys.path``.

``python -c`` and ``python -m`` put the working directory first on ``sys.path``;
``PYTHONSAFEPATH`` (Python 3.11+) stops that, so a subprocess started from the
repository imports the installed prescreen, as the parent does.
"""

from __future__ import annotations

import os

os.environ.setdefault("PYTHONSAFEPATH", "1")
