"""`deepinfer train-demo`: train the embedded demo model pair (see deepinfer/tools/train_demo.py)."""
from __future__ import annotations

import argparse


def add_train_parser(sub) -> None:
    p = sub.add_parser("train-demo", help="train the embedded demo model pair", add_help=False)
    p.add_argument("rest", nargs=argparse.REMAINDER)
    p.set_defaults(func=lambda args: _run(args.rest))


def _run(rest: list[str]) -> int:
    from deepinfer.tools.train_demo import main

    return main(rest)
