"""deepinfer's native code built at first use by ``torch.utils.cpp_extension.load`` (ninja and the
C++ compiler, ``$CXX`` else ``c++``) into a per-user cache (``$DEEPINFER_CACHE_DIR``, else
``$XDG_CACHE_HOME/deepinfer`` or ``~/.cache/deepinfer``): a build directory under ``kernels/`` for
each library, named by a hash of what makes it (``library``), so that it is compiled once and
loaded after (``cpu_bf16.py``: the CPU's bfloat16 kernel and its C++ operator).
"""
from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import shlex
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import torch

log = logging.getLogger("deepinfer")


def cache_dir() -> Path:
    if os.environ.get("DEEPINFER_CACHE_DIR"):
        return Path(os.environ["DEEPINFER_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "deepinfer"


def library(source: Path, kind: str, cflags: list[str], ldflags: list[str], key_extra: str = "") -> Path:
    """Where ``load`` builds ``source`` with these flags: ``kernels/<name>/<name>.so`` in the cache,
    ``<name>`` being ``<source stem>_<kind>_<key>``, the key a hash of the source, the flags,
    ``key_extra`` and the cache's place. A changed source or flag builds anew beside the old build
    rather than over it (checkouts of several versions may share the cache); the place keeps
    torch's in-process record of a name's builds to one directory (elsewhere it would rename it)."""
    root = cache_dir() / "kernels"
    text = "\0".join([source.read_text(), *cflags, *ldflags, key_extra, str(root.resolve())])
    name = f"{source.stem}_{kind}_{hashlib.sha256(text.encode()).hexdigest()[:16]}"
    return root / name / f"{name}.so"


def load(source: Path, kind: str, cflags: list[str], ldflags: list[str],
         key_extra: str = "") -> tuple[Path | None, str | None]:
    """``source`` built by ``torch.utils.cpp_extension.load`` with the C++ compiler (``$CXX``, else
    ``c++``) and these flags beside its own, at ``library(...)`` unless built there already, and
    loaded (``torch.ops.load_library``: a C++ source's operators are registered); the library's
    path, or why it could not be built or loaded."""
    compiler = os.environ.get("CXX") or "c++"
    parts = shlex.split(compiler)  # CXX="ccache g++" is one compiler
    if not parts or shutil.which(parts[0]) is None:
        return None, f"no C++ compiler: {compiler!r} is not on PATH (set CXX to one)"
    target = library(source, kind, cflags, ldflags, key_extra)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        return None, f"cannot write the kernel cache {target.parent.parent} (set DEEPINFER_CACHE_DIR): {e}"
    from torch.utils import cpp_extension  # (imports setuptools: only where something is built or loaded)

    with _ninja_on_path():
        if not cpp_extension.is_ninja_available():
            return None, "ninja is not on PATH (torch.utils.cpp_extension builds with it: pip install ninja)"
        try:
            # (copies: load appends torch's own flags to the lists it is given)
            path = cpp_extension.load(target.stem, [str(source)], extra_cflags=list(cflags),
                                      extra_ldflags=list(ldflags), build_directory=str(target.parent),
                                      is_python_module=False, verbose=False)
        except (OSError, RuntimeError, ValueError, subprocess.SubprocessError) as e:
            # (RuntimeError: the compiler's output; CalledProcessError: a compiler that does not run)
            return None, f"{parts[0]} could not build {source.name}: {str(e).strip()[-500:]}"
    return Path(path), None


@contextlib.contextmanager
def _ninja_on_path() -> Iterator[None]:
    """PATH with the ``ninja`` package's binary (a deepinfer dependency) where no other ninja is on
    it: a virtual environment's ``bin`` is on PATH only where it is activated."""
    path = os.environ.get("PATH")
    if shutil.which("ninja") is None:
        try:
            import ninja
            os.environ["PATH"] = os.pathsep.join(filter(None, [ninja.BIN_DIR, path]))
        except (ImportError, AttributeError):
            pass
    try:
        yield
    finally:
        if path is None:
            os.environ.pop("PATH", None)
        else:
            os.environ["PATH"] = path


#: what ``announce`` has said in this process
_ANNOUNCED: set[str] = set()


def announce(message: str) -> None:
    """Say ``message`` once a process: on the ``deepinfer`` logger at INFO where logging has been set
    up (a handler on it or above), else as one line on stderr (a build takes seconds that would
    otherwise pass without a word)."""
    if message in _ANNOUNCED:
        return
    _ANNOUNCED.add(message)
    if log.hasHandlers():
        log.info(message)
    else:
        print(f"deepinfer: {message}", file=sys.stderr, flush=True)


def torch_key() -> str:
    """What a library built against torch's headers depends on: this torch's version and place."""
    return f"{torch.__version__} {Path(torch.__file__).parent}"
