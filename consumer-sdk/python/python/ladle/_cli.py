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

    # The CLI runs itself again (a Slurm batch script, benchmark workers): point it at this
    # script, not at the Python interpreter that hosts it.
    script = sys.argv[0] if sys.argv and os.path.isfile(sys.argv[0]) else shutil.which("ladle")
    if script and "LADLE_EXE" not in os.environ:
        os.environ["LADLE_EXE"] = os.path.abspath(script)
    # `ladle serve module:factory` hands over to the Python producer: in this interpreter,
    # where the package (and most likely the user's dataset) is importable.
    os.environ.setdefault("LADLE_PYTHON", sys.executable)
    sys.exit(_native.cli_main(["ladle", *sys.argv[1:]]))
