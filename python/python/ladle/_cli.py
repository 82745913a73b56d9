"""The ``ladle`` command of the Python package: the same command line as the ``ladle`` binary
(``ladle serve``, ``ladle sweep``, ``ladle top``, ...), run inside the native module, so that one
``pip install`` brings it with no Rust toolchain. ``ladle serve module:factory`` (or
``python -m ladle serve module:factory``) serves a Python dataset."""

from __future__ import annotations

import os
import shutil
import sys


def main() -> None:
    """Entry point of the ``ladle`` console script; never returns."""
    from . import _native

    # The CLI runs itself again (a Slurm batch script, benchmark workers) through this
    # script, not the Python interpreter that hosts it; `ladle serve module:factory` hands
    # over to the Python producer in this interpreter, where the package (and most likely the
    # user's dataset) is importable. Both are told to this process only, not put in the
    # environment: what it starts must not inherit them.
    script = sys.argv[0] if sys.argv and os.path.isfile(sys.argv[0]) else shutil.which("ladle")
    exe = os.path.abspath(script) if script else None
    sys.exit(_native.cli_main(["ladle", *sys.argv[1:]], exe, sys.executable))
