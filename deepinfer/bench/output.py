"""What every `deepinfer bench` subcommand shares in its output: `--json FILE` and progress lines."""
from __future__ import annotations

import json
import sys
import time
from typing import Any


def add_json_arg(b) -> None:
    b.add_argument("--json", dest="json_out", default=None, metavar="FILE",
                   help="also write the results to FILE as JSON ({command, date, args, results})")


def write_json(args, results: list[dict[str, Any]]) -> None:
    """``results`` (one object a row of the printed table) to ``args.json_out``, if given."""
    if not getattr(args, "json_out", None):
        return
    settings = {k: v for k, v in vars(args).items() if k not in ("func", "json_out") and _plain(v)}
    with open(args.json_out, "w") as f:
        json.dump({"command": args.bench_command, "date": time.strftime("%Y-%m-%d"), "args": settings,
                   "results": results}, f, indent=2)


def _plain(value: Any) -> bool:
    return value is None or isinstance(value, str | int | float | bool | list | dict)


def progress(message: str) -> None:
    """One line on stderr as soon as it is known (tables go to stdout, at the end)."""
    print(f"[bench] {message}", file=sys.stderr, flush=True)
