"""How the command line reports an exception: user input in one line, plugin code named, exit codes.

Exit codes (docs/cli.md): 0 done; 1 a failure while running (an error raised inside a plugin's
code, an engine that could not start, an error inside deepinfer); 2 a mistake in the command's
input (arguments, config, model directory, plugin selection); 130 interrupted.
"""
from __future__ import annotations

import os
import sys
import traceback

EXIT_OK, EXIT_FAILURE, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130
DEBUG_ENV = "DEEPINFER_DEBUG"
#: the kinds of exception deepinfer raises for bad input (its own checks subclass ValueError)
USER_INPUT = (ValueError, TypeError, FileNotFoundError)


def debug_enabled(flag: bool = False) -> bool:
    return flag or os.environ.get(DEBUG_ENV, "").strip().lower() in ("1", "true", "yes", "on")


def _deepinfer_input_error(exc: BaseException) -> bool:
    """An error class deepinfer defines for bad input (raised by its checks, even when a plugin called
    them), or a pydantic validation error (options, parameters)."""
    from pydantic import ValidationError

    own = isinstance(exc, ValueError) and type(exc).__module__.split(".")[0] == "deepinfer"
    return own or isinstance(exc, ValidationError)


def report(exc: BaseException, prog: str = "deepinfer", debug: bool = False) -> int:
    """Print ``exc`` for a person and return the exit code. With ``debug`` the traceback comes first."""
    from deepinfer.plugins.origin import plugin_origin

    if debug_enabled(debug):
        traceback.print_exception(type(exc), exc, exc.__traceback__, file=sys.stderr)
    hint = "" if debug_enabled(debug) else f" (run with --debug or {DEBUG_ENV}=1 for the traceback)"
    origin = plugin_origin(exc)
    if origin is not None:
        if _deepinfer_input_error(exc) or (origin.builtin and isinstance(exc, USER_INPUT)):
            print(f"{prog}: error: {origin}: {exc}", file=sys.stderr)
            return EXIT_USAGE
        print(f"{prog}: error in {origin}: {type(exc).__name__}: {exc}{hint}", file=sys.stderr)
        return EXIT_FAILURE
    if isinstance(exc, USER_INPUT):
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    print(f"{prog}: internal error: {type(exc).__name__}: {exc}{hint}", file=sys.stderr)
    return EXIT_FAILURE
