"""Whole engines under the Triton interpreter, each in a child process (Triton fixes its mode when
it is first imported, so TRITON_INTERPRET=1 must be set before the child imports it).

The child runs with two changes to the interpreter that alter its speed only (an engine generation
of the 2-layer hybrid test model took 101 s instead of 289 s on the 2-core CI machine):

- integer-overflow checks off: the interpreter evaluates a device assert around every integer add
  and multiply, which compiled kernels do only in debug mode (the kernel tests in tests/kernels keep
  the checks: they run in the pytest process, without these changes);
- a nested ``@triton.jit`` call no longer patches ``triton.language`` again when the launch has
  patched it already (the stock interpreter re-patches on every nested call, walking the modules'
  members with ``inspect.getmembers`` each time).

With a Triton whose interpreter lacks what the changes touch, the child runs unchanged.
"""
from __future__ import annotations

import dataclasses
import inspect
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

#: how long a child may take before it is taken for hung (some take close to 10 minutes on a loaded
#: 2-core machine without the changes above)
TIMEOUT = 1200


def run_interpreted(argv: list[str], timeout: float = TIMEOUT, reference_attention: bool = False
                    ) -> subprocess.CompletedProcess:
    """Run ``python -m MODULE ARGS...`` or ``python -c CODE ARGS...`` (``argv`` without the
    interpreter) in the Triton interpreter, from the repository root; its output is captured.
    ``reference_attention``: the triton backend's attention kernels are their torch references
    there (tests/reference_kernels.py), for tests of the engine around them."""
    mode, target, *args = argv
    if mode == "-m":
        body = f"import runpy\nrunpy.run_module({target!r}, run_name='__main__', alter_sys=True)\n"
    elif mode == "-c":
        body = target
    else:
        raise ValueError(f"argv must start with -m MODULE or -c CODE, not {mode!r}")
    code = "from tests.interpreter import quicken\nquicken()\n"
    if reference_attention:
        code += "from tests.reference_kernels import use_reference_attention\nuse_reference_attention()\n"
    code += body
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-c", code, *args], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=timeout, check=False)


def quicken() -> None:
    """Apply the two speed changes described above to this process's Triton interpreter."""
    try:
        import triton.language as tl
        from triton.runtime import interpreter
        options, function, patch = (interpreter.InterpreterOptions, interpreter.InterpretedFunction,
                                    interpreter._patch_lang)
        builder, error, is_builtin = interpreter.interpreter_builder, interpreter.InterpreterError, tl.core.is_builtin
    except (ImportError, AttributeError):
        return
    if "sanitize_overflow" in {f.name for f in dataclasses.fields(options)}:
        builder.options = dataclasses.replace(builder.options, sanitize_overflow=False)
    langs: dict = {}  # per jit function: the language modules its globals hold (what patching covers)

    def call(self, *args, **kwargs):
        mods = langs.get(self.fn)
        if mods is None:
            mods = langs[self.fn] = [m for m in self.fn.__globals__.values()
                                     if inspect.ismodule(m) and m in (tl, tl.core)]
        if any(is_builtin(m.full) for m in mods):  # not patched for this launch yet
            patch(self.fn)
        fn = self.rewrite()
        try:
            return fn(*args, **kwargs)
        except Exception as e:
            raise error(repr(e)) from e

    function.__call__ = call
