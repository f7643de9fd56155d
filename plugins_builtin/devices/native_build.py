"""Building deepinfer's native code at first use: a source compiled into a shared library in a
per-user cache (``$DEEPINFER_CACHE_DIR``, else ``$XDG_CACHE_HOME/deepinfer`` or
``~/.cache/deepinfer``), under ``kernels/``, named by a hash of what makes the build, and the
cache's builds of other versions deleted once unused for a week (``cpu_bf16.py``: the CPU's
bfloat16 kernel and its C++ operator).
"""
from __future__ import annotations

import hashlib
import os
import shlex
import shutil
import subprocess
import tempfile
import time
from pathlib import Path


def cache_dir() -> Path:
    if os.environ.get("DEEPINFER_CACHE_DIR"):
        return Path(os.environ["DEEPINFER_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "deepinfer"


def cached_build(source: Path, compiler_var: str, default_compiler: str, flags: list[str],
                  libs: list[str], key_extra: str = "") -> tuple[Path | None, str | None]:
    """``source`` built into the cache as ``kernels/<its stem>-<key>.so`` (``compiler flags -o .so
    source libs``, the compiler from ``$compiler_var``, else ``default_compiler``), unless a build of
    the same key is there; the key hashes the source, the flags, the libraries, the compiler's
    ``--version`` output and ``key_extra``. The library's path, or why it could not be built."""
    name = os.environ.get(compiler_var) or default_compiler
    compiler = shlex.split(name)  # CC="ccache gcc" is one compiler
    kind = "C++" if source.suffix == ".cpp" else "C"
    if not compiler or shutil.which(compiler[0]) is None:
        return None, f"no {kind} compiler: {name!r} is not on PATH (set {compiler_var} to one)"
    try:
        version = subprocess.run([*compiler, "--version"], capture_output=True, text=True, timeout=60,
                                 check=False).stdout
        text = source.read_text()
    except (OSError, subprocess.SubprocessError) as e:
        return None, f"cannot run the {kind} compiler {compiler[0]!r} on {source.name}: {e}"
    key = hashlib.sha256("\0".join([text, *flags, *libs, version, key_extra]).encode()).hexdigest()[:16]
    target = cache_dir() / "kernels" / f"{source.stem}-{key}.so"
    if not target.exists():
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(suffix=".so", dir=target.parent)
            os.close(fd)
        except OSError as e:
            return None, f"cannot write the kernel cache {target.parent} (set DEEPINFER_CACHE_DIR): {e}"
        try:
            done = subprocess.run([*compiler, *flags, "-o", tmp, str(source), *libs], capture_output=True, text=True,
                                  timeout=300, check=False)
            if done.returncode != 0:
                return None, f"{compiler[0]} could not build {source.name}: {done.stderr.strip()[-500:]}"
            umask = os.umask(0)
            os.umask(umask)
            os.chmod(tmp, 0o755 & ~umask)  # mkstemp's 0600 would keep a shared cache's other users out
            os.replace(tmp, target)  # atomic: another process building the same key loses nothing
            _remove_stale_builds(target)
        except (OSError, subprocess.SubprocessError) as e:
            return None, f"{compiler[0]} could not build {source.name}: {e}"
        finally:
            if os.path.exists(tmp):
                os.remove(tmp)
    try:
        os.utime(target)  # in use: not stale to another version's build (_remove_stale_builds)
    except OSError:
        pass  # (a cache shared read-only)
    return target, None


#: a build of another source, flags or compiler unused this long is deleted when one is built
STALE_SECONDS = 7 * 24 * 3600


def _remove_stale_builds(keep: Path) -> None:
    """Delete the cache's libraries of other sources, flags or compilers (an earlier deepinfer's)
    that no process has loaded for ``STALE_SECONDS`` (loading one marks it), so that the cache does
    not grow with every change while checkouts of several versions can share it."""
    now = time.time()
    for old in keep.parent.glob(keep.name.rsplit("-", 1)[0] + "-*.so"):
        try:
            if old != keep and now - old.stat().st_mtime > STALE_SECONDS:
                old.unlink()
        except OSError:
            pass  # (another process removed it first, or the cache is read-only to us)
