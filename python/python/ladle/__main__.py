"""``python -m ladle serve module:factory --socket S``: serve a Python dataset from the shell.

``module:factory`` names a module on the path and a callable in it that returns the dataset
(or the dataset object itself), e.g. ``mytrain.data:make_train_set``. ``ladle serve
module:factory`` (the ``ladle`` command, binary or console script) comes here; the options are
``ladle serve``'s where they mean the same (``--threads`` is the worker processes).
"""

from __future__ import annotations

import argparse
import importlib
import sys


def _load(spec: str):
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise SystemExit(f"ladle: expected module:factory, not {spec!r}")
    sys.path.insert(0, "")
    try:
        module = importlib.import_module(module_name)
    except ImportError as error:
        raise SystemExit(f"ladle: cannot import {module_name}: {error}") from None
    try:
        target = getattr(module, attr)
    except AttributeError:
        raise SystemExit(f"ladle: {module_name} has no {attr}") from None
    # A class or a factory function is called; a dataset object (which has __getitem__) is
    # used as it is.
    if isinstance(target, type) or (callable(target) and not hasattr(target, "__getitem__")):
        return target()
    return target


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m ladle",
        description="Serve a Python dataset (any object with __len__ and __getitem__ returning "
        "a dict of arrays) as a ladle feed: consumers read it zero-copy, each with its own batch size.",
    )
    from . import _native

    parser.add_argument(
        "--version",
        action="version",
        version=f"ladle {_native.VERSION} (commit {_native.COMMIT}, features: {_native.FEATURES})",
        help="the version, git commit and enabled features this package was built from",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="serve module:factory's dataset until Ctrl-C or SIGTERM")
    serve.add_argument("dataset", metavar="module:factory", help="callable returning the dataset, or the dataset")
    serve.add_argument("--socket", required=True, help="the feed's Unix socket (consumers join it)")
    serve.add_argument("--threads", "--workers", dest="workers", type=int, default=None,
                       help="worker processes (default: the cores)")
    serve.add_argument("--ring-mib", type=int, default=256, help="shared memory for the ring (default 256)")
    serve.add_argument("--seed", type=int, default=0, help="seed of the permutations and of each sample's randomness")
    serve.add_argument("--on-error", choices=["skip", "raise"], default="skip",
                       help="a sample that raises: deliver it as bad and count it (skip), or stop (raise)")
    serve.add_argument("--fail-on-bad-sample", dest="on_error", action="store_const", const="raise",
                       help="the same as --on-error raise (the name `ladle serve` uses)")
    serve.add_argument("--stall-timeout", type=float, default=10.0, metavar="S",
                       help="seconds a consumer may hold the feed back before it goes on without it "
                            "(default 10)")
    serve.add_argument("--keep-alive", type=float, default=None, metavar="S",
                       help="stop once the last consumer has been gone S seconds")
    serve.add_argument("--timeout", type=float, default=None, metavar="S",
                       help="a worker taking over S seconds on one sample is killed and replaced, "
                            "the sample made again by another (default: no limit)")
    args = parser.parse_args(argv)
    from ._producer import serve as serve_feed

    dataset = _load(args.dataset)
    serve_feed(
        dataset,
        args.socket,
        workers=args.workers,
        ring_mib=args.ring_mib,
        seed=args.seed,
        on_error=args.on_error,
        stall_timeout=args.stall_timeout,
        keep_alive=args.keep_alive,
        timeout=args.timeout,
        name=args.dataset,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
