"""deepinfer's bfloat16 linear kernel for x86 CPUs with AVX2 (``cpu_bf16_linear.c``), built with
its AVX512-BF16 path where the CPU has that, and its AMX path too where it has AMX-BF16 and Linux
grants the tiles (``kernel_kind``).

The source (C, which compiles as C++ too) is built at first use by
``torch.utils.cpp_extension.load`` (ninja and the machine's C++ compiler, ``$CXX`` else ``c++``)
into ``kernels/`` of a per-user cache (``native_build``: ``$DEEPINFER_CACHE_DIR``, else
``$XDG_CACHE_HOME/deepinfer`` or ``~/.cache/deepinfer``), named by a hash of the source and the
flags, and its function called with ctypes; a build says so once (``announce_build``: it takes
seconds). Built by gcc beside a torch that ships ``libgomp.so.1`` (its Linux wheels), it shares
torch's OpenMP runtime and threads (one soname, loaded once). Where it cannot be built (not x86-64
with AVX2, no compiler or ninja, no writable cache), ``unavailable_reason()`` says why and callers
keep torch's matmul.

Calls reach it through ``cpu_bf16_op.cpp``, a torch operator written in C++ that checks the
arguments and calls the kernel without Python (``native_op``), built beside it with the C++
compiler against this torch's headers. Where that cannot be built (a torch without its headers),
``native_unavailable_reason()`` says why and calls go through Python and ctypes: the same bits.
"""
from __future__ import annotations

import ctypes
import functools
import logging
import platform
from pathlib import Path

import torch
import torch.nn.functional as F

from deepinfer_builtin.devices import native_build

log = logging.getLogger("deepinfer")
SOURCE = Path(__file__).with_name("cpu_bf16_linear.c")
#: the kernel as a torch operator written in C++ (built beside it where torch's headers are at hand)
NATIVE_SOURCE = Path(__file__).with_name("cpu_bf16_op.cpp")
#: the kernel's compiler flags beside torch.utils.cpp_extension's own (-fPIC, -std=c++20, ...)
FLAGS = ["-O3", "-mavx2", "-mfma", "-fopenmp"]
#: and its link's: torch's OpenMP runtime (libgomp.so.1, where torch ships it)
LDFLAGS = ["-fopenmp"]
#: added where the CPU has AVX512-BF16: the kernel's VDPBF16PS path (cpu_bf16_linear.c)
AVX512_BF16_FLAGS = ["-mavx512f", "-mavx512bf16"]
#: added beside those where it has AMX-BF16 too: the kernel's tile path
AMX_FLAGS = ["-mamx-tile", "-mamx-bf16"]


def avx512_bf16() -> bool:
    """Whether this CPU has AVX512-BF16 (as torch reports it)."""
    return bool(getattr(torch.cpu, "_is_avx512_bf16_supported", lambda: False)())


@functools.cache
def amx_bf16() -> bool:
    """Whether this CPU has AMX's tiles and their bfloat16 product, as Linux lists its flags (torch
    does not say; elsewhere: no)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    flags = set(line.split(":", 1)[1].split())
                    return {"amx_tile", "amx_bf16"} <= flags
    except OSError:
        pass
    return False


def build_flags() -> list[str]:
    """The compiler flags for this CPU: the AVX2 build, plus AVX512-BF16's where it has that, plus
    AMX's where it has that too."""
    if not avx512_bf16():
        return FLAGS
    return FLAGS + AVX512_BF16_FLAGS + (AMX_FLAGS if amx_bf16() else [])


def _platform_reason() -> str | None:
    """Why the kernel cannot run on this machine, or None."""
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return f"the kernel is written for x86-64 (AVX2); this machine is {platform.machine()}"
    if not getattr(torch.cpu, "_is_avx2_supported", lambda: False)():
        return "this CPU has no AVX2"
    return None


def _build(flags: list[str] | None = None) -> tuple[ctypes.CDLL | None, str | None]:
    """The library built with ``flags`` (default: ``build_flags()``) and loaded, or why not."""
    flags = build_flags() if flags is None else flags
    if (why := _platform_reason()) is not None:
        return None, why
    target, why = native_build.load(SOURCE, _flags_kind(flags), flags, LDFLAGS)
    if target is None:
        return None, why
    try:
        lib = ctypes.CDLL(str(target))
    except OSError as e:
        return None, f"cannot load {target}: {e}"
    fn = lib.deepinfer_bf16_linear
    fn.argtypes = [ctypes.c_void_p, ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_long,
                   ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int, ctypes.c_int]
    fn.restype = ctypes.c_int
    if hasattr(lib, "deepinfer_bf16_amx_init"):  # (the AMX build)
        lib.deepinfer_bf16_amx_init.restype = lib.deepinfer_bf16_use_amx.restype = ctypes.c_int
        lib.deepinfer_bf16_use_amx.argtypes = [ctypes.c_int]
        lib.deepinfer_bf16_amx_calls.restype = ctypes.c_long
    return lib, None


def _flags_kind(flags: list[str]) -> str:
    """The build's kind that ``flags`` make (its library's name says it)."""
    return "amx_bf16" if AMX_FLAGS[0] in flags else "avx512_bf16" if AVX512_BF16_FLAGS[0] in flags else "avx2"


@functools.cache
def _library() -> tuple[ctypes.CDLL | None, str | None, str | None]:
    """(the library, why it is unavailable, its kind: "amx_bf16", "avx512_bf16" or "avx2"); the C++
    operator, where it builds here, is pointed at this library's kernel (``native_op``). Says once
    what it builds where its libraries are not in the cache yet (``announce_build``)."""
    global _native_op
    announce_build()
    lib, why, kind = _kernel_library()
    _native_op = None
    if lib is not None:
        native, native_why = _native_library()
        if native is None:
            log.warning("cpu: the bfloat16 kernel's C++ operator could not be built (%s); its calls go through "
                        "Python and ctypes (about 3 us more a call eagerly, 8 from compiled code here)", native_why)
        else:
            native.deepinfer_native_point_at(ctypes.cast(lib.deepinfer_bf16_linear, ctypes.c_void_p),
                                             _row_block_for(kind))
            _native_op = torch.ops.deepinfer_native.bf16_linear.default
    return lib, why, kind


def _kernel_library() -> tuple[ctypes.CDLL | None, str | None, str | None]:
    if avx512_bf16():
        if amx_bf16():
            lib, why = _build()
            # (Linux grants the tiles from 5.16 on; the same build runs VDPBF16PS where it does not)
            if lib is not None:
                if lib.deepinfer_bf16_amx_init() == 0:
                    return lib, None, "amx_bf16"
                log.info("cpu: Linux did not grant AMX's tiles (it does from 5.16 on): the bfloat16 kernel "
                         "takes VDPBF16PS")
                return lib, None, "avx512_bf16"
            log.warning("cpu: the bfloat16 kernel's AMX build failed (%s); it takes VDPBF16PS", why)
        lib, why = _build(FLAGS + AVX512_BF16_FLAGS)  # (or where the compiler lacks -mamx-bf16)
        if lib is not None:
            return lib, None, "avx512_bf16"
    lib, why = _build(FLAGS)  # (or where the compiler lacks -mavx512bf16, say)
    return lib, why, None if lib is None else "avx2"


#: the C++ operator (``cpu_bf16_op.cpp``), pointed at the loaded kernel; None where it did not build
_native_op = None
#: whether calls take it (``use_native``)
_native_on = True
#: the operator's library by path, once loaded (a process loads one build of it)
_NATIVE_LOADED: dict[str, ctypes.CDLL] = {}


def announce_build() -> None:
    """Say once a process what is compiled, where the kernel's library (the build for this CPU) or
    its C++ operator's is not in the cache yet: the first use takes seconds more for it."""
    if _platform_reason() is not None:
        return
    native = None if _NATIVE_LOADED else _native_path()  # (a process loads one build of the operator)
    cold = [source.name for source, path in ((SOURCE, _kernel_path(build_flags())), (NATIVE_SOURCE, native))
            if path is not None and not path.exists()]
    if cold:
        native_build.announce(f"cpu: compiling deepinfer's bfloat16 CPU kernel ({' and '.join(cold)}) into "
                              f"{native_build.cache_dir() / 'kernels'}: this first use takes seconds more, "
                              "later ones load it from there")


def _kernel_path(flags: list[str]) -> Path:
    """Where the kernel built with ``flags`` is cached."""
    return native_build.library(SOURCE, _flags_kind(flags), flags, LDFLAGS)


def _native_flags() -> list[str]:
    """The C++ operator's compiler flags beside torch.utils.cpp_extension's own (its headers and C++
    ABI): torch's C++ standard."""
    return ["-O2", f"-std={cxx_standard()}", "-w"]


def _torch_header() -> Path:
    """The header that a torch with its C++ headers has (its wheels do)."""
    return Path(torch.__file__).parent / "include" / "torch" / "library.h"


def _native_path() -> Path | None:
    """Where the C++ operator built against this torch is cached (None for a torch without its headers)."""
    if not _torch_header().exists():
        return None
    return native_build.library(NATIVE_SOURCE, "torch", _native_flags(), [], key_extra=native_build.torch_key())


@functools.cache
def _native_library() -> tuple[ctypes.CDLL | None, str | None]:
    """``cpu_bf16_op.cpp`` built against this torch (its headers, libraries and C++ ABI) and loaded,
    its operator registered; or why not (a torch without its headers, no C++ compiler)."""
    path = _native_path()
    if path is None:
        return None, f"this torch has no C++ headers ({_torch_header()} is missing)"
    lib = _NATIVE_LOADED.get(str(path))
    if lib is None:
        if hasattr(torch.ops.deepinfer_native, "bf16_linear"):  # (registering it again would end the process)
            return None, "another build of the operator is loaded in this process already"
        target, why = native_build.load(NATIVE_SOURCE, "torch", _native_flags(), [], key_extra=native_build.torch_key())
        if target is None:
            return None, why
        try:
            lib = _NATIVE_LOADED[str(path)] = ctypes.CDLL(str(target))
        except OSError as e:
            return None, f"cannot load {target}: {e}"
    lib.deepinfer_native_point_at.argtypes = [ctypes.c_void_p, ctypes.c_int]
    lib.deepinfer_native_point_at.restype = None
    lib.deepinfer_native_calls.restype = ctypes.c_long
    if not torch._C._dispatch_has_kernel_for_dispatch_key("deepinfer_native::bf16_linear", "Meta"):
        meta = torch.library.Library("deepinfer_native", "IMPL")  # (shapes, for torch.compile's tracing)
        meta.impl("bf16_linear", _linear_meta, "Meta")
        _LIBRARIES.append(meta)
    return lib, None


def _linear_meta(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
                 row_block: int = 0) -> torch.Tensor:
    """Either operator's output without its values (the Meta implementation: shapes for
    torch.compile's tracing)."""
    return x.new_empty((*x.shape[:-1], weight.shape[0]))


def _active_native():
    """The C++ operator where it is loaded and ``use_native`` is on, else None."""
    return _native_op if _native_on else None


def cxx_standard() -> str:
    """The C++ standard torch's headers are built with: C++20 from torch 2.11 on (built as C++17
    against 2.11 on the GPU host, the operator crashed the process where an error message held a
    number, session 51), C++17 before."""
    major, minor = (int(part) for part in torch.__version__.split(".")[:2])
    return "c++20" if (major, minor) >= (2, 11) else "c++17"


def native_op():
    """``torch.ops.deepinfer_native.bf16_linear`` (x, weight, bias=None, row_block=0): the kernel
    called from C++, for eager and compiled code alike, where it was built and ``use_native`` is on;
    else None (then ``torch.ops.deepinfer.cpu_bf16_linear`` runs it through Python). Its results
    are the kernel's bits, either way."""
    _library()
    return _active_native()


def compiled_op():
    """The operator that compiled code calls for the kernel: the C++ one where ``_library`` has
    loaded it and ``use_native`` is on, else ``torch.ops.deepinfer.cpu_bf16_linear`` (reads of this
    module's globals only, which torch.compile traces and guards on)."""
    op = _active_native()
    return torch.ops.deepinfer.cpu_bf16_linear if op is None else op


def use_native(on: bool | None = None) -> bool:
    """Whether calls take the C++ operator (``native_op``); ``on`` switches that for the whole
    process (tests and benchmarks compare the two ways in)."""
    global _native_on
    if on is not None:
        _native_on = bool(on)
    return native_op() is not None


def native_unavailable_reason() -> str | None:
    """None when the C++ operator is built and loaded here, else why not."""
    if _library()[0] is None:
        return "the kernel itself is unavailable: " + str(_library()[1])
    return _native_library()[1]


def native_calls() -> int:
    """How many calls of the kernel came through the C++ operator in this process."""
    lib = _native_library()[0] if _library()[0] is not None else None
    return int(lib.deepinfer_native_calls()) if lib is not None else 0


def kernel_kind() -> str | None:
    """Which build runs here: "amx_bf16" (AMX's tiles, where Linux granted them), "avx512_bf16"
    (VDPBF16PS), "avx2" (widened to float32), or None when the kernel is unavailable
    (``unavailable_reason``)."""
    return _library()[2]


def amx_calls() -> int:
    """How many calls of the kernel have taken AMX's tiles in this process (0 without them)."""
    lib = _library()[0]
    return int(lib.deepinfer_bf16_amx_calls()) if hasattr(lib, "deepinfer_bf16_amx_calls") else 0


def use_amx(on: bool | None = None) -> bool:
    """Whether the kernel takes AMX's tiles (the "amx_bf16" build); ``on`` turns them off or back on
    for the whole process (tests and benchmarks compare the paths: their results may differ in
    the last bit, by the order of the sums). Never on for other builds."""
    lib, _, kind = _library()
    if kind != "amx_bf16":
        return False
    return bool(lib.deepinfer_bf16_use_amx(-1 if on is None else int(on)))


def unavailable_reason() -> str | None:
    """None when the kernel is built and loaded here, else why not."""
    return _library()[1]


_AVX512 = bool(getattr(torch.cpu, "_is_avx512_supported", lambda: False)())


def default_row_block() -> int:
    """The rows of x that share one read of the weights: 6 (the kernel's most), except for the AVX2
    build on a CPU with AVX-512, where blocks of 3 were faster from 5 rows on (cpu_bf16_linear.c).
    The results are the same bits either way."""
    return _row_block_for(kernel_kind())


def _row_block_for(kind: str | None) -> int:
    return 3 if _AVX512 and kind == "avx2" else 6


def bf16_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, *,
                row_block: int | None = None) -> torch.Tensor:
    """``F.linear(x, weight, bias)`` for bfloat16 CPU tensors through the kernel: each output in
    float32 over K, rounded to bfloat16 once. ``row_block`` (1-6): the rows of x that share one read
    of the weights; default ``default_row_block()``, this CPU's. Raises RuntimeError if the kernel is
    unavailable (``unavailable_reason``), ValueError if the arguments are not bfloat16 CPU tensors of
    matching shapes or ``row_block`` is out of range, and, without memory for the kernel's copy of
    x, MemoryError (torch.OutOfMemoryError through the C++ operator)."""
    lib, why, kind = _library()  # (first: it points the C++ operator at the kernel it loads)
    if lib is None:
        raise RuntimeError(f"deepinfer's bfloat16 CPU kernel is unavailable: {why}")
    op = _active_native()
    if op is not None:
        return op(x, weight, bias, row_block or 0)
    if row_block is not None and not 0 <= row_block <= 6:
        raise ValueError(f"bf16_linear: row_block must be 1-6 (0: the default), got {row_block}")
    k, n = x.shape[-1], weight.shape[0]
    bf16 = torch.bfloat16
    if (x.dtype != bf16 or weight.dtype != bf16 or not x.is_cpu or not weight.is_cpu
            or (bias is not None and (bias.dtype != bf16 or not bias.is_cpu))):
        tensors = (x, weight) if bias is None else (x, weight, bias)
        raise ValueError("bf16_linear takes bfloat16 CPU tensors, got "
                         + ", ".join(f"{t.dtype} on {t.device}" for t in tensors))
    if weight.dim() != 2 or weight.shape[1] != k or (bias is not None and bias.shape != (n,)):
        raise ValueError(f"bf16_linear: x {tuple(x.shape)}, weight {tuple(weight.shape)} and bias "
                         f"{None if bias is None else tuple(bias.shape)} do not match: weight must be "
                         f"[N, {k}] and bias [N]")
    if k == 0:  # nothing to multiply: the bias, or zeros
        return F.linear(x, weight, bias)
    flat = x.reshape(-1, k)
    if not flat.is_contiguous():
        flat = flat.contiguous()
    if not weight.is_contiguous():
        weight = weight.contiguous()
    if bias is not None and not bias.is_contiguous():
        bias = bias.contiguous()
    rows = flat.shape[0]
    out = torch.empty(rows, n, dtype=bf16)
    if rows and n and lib.deepinfer_bf16_linear(flat.data_ptr(), rows, k, weight.data_ptr(), n,
                                                None if bias is None else bias.data_ptr(), out.data_ptr(),
                                                torch.get_num_threads(), row_block or _row_block_for(kind)):
        raise MemoryError(f"bf16_linear: no memory for a copy of x ({rows} x {k}: float32, or AMX's layout)")
    return out if x.dim() == 2 else out.reshape(*x.shape[:-1], n)


def _define_operator() -> None:
    """``torch.ops.deepinfer.cpu_bf16_linear(x, weight, bias)``: ``bf16_linear`` as an operator, for
    code under torch.compile (which cannot trace a ctypes call) where the C++ operator is not built. Declared with torch.library's schema
    API, not custom_op, whose Python wrapper costs tens of microseconds a call (torch_attn.py).
    Defined once a process, however this module was imported."""
    try:
        torch.ops.deepinfer.cpu_bf16_linear  # noqa: B018
        return
    except (AttributeError, RuntimeError):
        pass
    lib = torch.library.Library("deepinfer", "FRAGMENT")
    lib.define("cpu_bf16_linear(Tensor x, Tensor weight, Tensor? bias) -> Tensor")
    lib.impl("cpu_bf16_linear", bf16_linear, "CPU")
    lib.impl("cpu_bf16_linear", _linear_meta, "Meta")
    _LIBRARIES.append(lib)  # a Library's definitions last as long as the object


_LIBRARIES: list = []
_define_operator()
