"""Launching a Triton kernel compiled (CUDA) or in the Triton interpreter (CPU).

Triton fixes its mode when ``triton.language`` is first imported: with ``TRITON_INTERPRET=1`` in
the environment at that moment, its own ``@jit`` helpers (``tl.zeros``, ``tl.max`` ...) become
interpreted functions, and kernels must then be interpreted too. ``@kernel`` therefore decorates
lazily, at the first launch, in whatever mode triton.language was imported in; so the order in
which modules are imported after that never matters, and a wrong setup fails with a clear error.

``counters`` hands out the zeroed int32 counters that kernels with a last-program hand-off share
(split-K GEMVs, the argmax, decode attention merging in pass 1); ``pdl_supported`` says whether
kernels can be launched with programmatic dependent launch here.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
import triton
from triton.runtime.jit import JITFunction


def triton_interpreted() -> bool:
    """True when triton.language was imported with TRITON_INTERPRET=1 (kernels run on the CPU)."""
    from triton.language import standard

    return not isinstance(standard.zeros, JITFunction)


class Kernel:
    """A kernel function launched as ``kernel[grid](*args, **constexprs)``, decorated at first use."""

    def __init__(self, fn: Callable[..., Any], do_not_specialize: Sequence[str] = ()) -> None:
        self.fn = fn
        self.do_not_specialize = tuple(do_not_specialize)
        self._jit: Any = None

    def _pick(self, args: Sequence[Any]) -> Any:
        if self._jit is None:
            if triton_interpreted():
                from triton.runtime.interpreter import InterpretedFunction

                self._jit = InterpretedFunction(self.fn)
            else:
                self._jit = triton.jit(self.fn, do_not_specialize=self.do_not_specialize)
        return self._jit

    def _device_error(self, args: Sequence[Any]) -> ValueError | None:
        """The usual mistake behind a failed compiled launch, a tensor not on the GPU, as a clear
        error (looked for only once a launch has failed: the scan costs the host on every launch)."""
        if not isinstance(self._jit, JITFunction):
            return None
        cpu = next((a for a in args if isinstance(a, torch.Tensor) and not a.is_cuda), None)
        if cpu is None:
            return None
        return ValueError(f"{self.fn.__name__} was given a tensor on {cpu.device}; compiled Triton kernels need "
                          "CUDA tensors. To run on the CPU, set TRITON_INTERPRET=1 in the environment before "
                          "triton is first imported")

    def __getitem__(self, grid: tuple[int, ...]) -> Callable[..., Any]:
        def launch(*args: Any, **kwargs: Any) -> Any:
            if kwargs.get("PDL"):  # a kernel that waits for its predecessor (gdc_wait) may launch early
                kwargs["launch_pdl"] = True
            try:
                return self._pick(args)[grid](*args, **kwargs)
            except Exception as exc:
                err = self._device_error(args)
                if err is not None:
                    raise err from exc
                raise

        return launch


def kernel(fn: Callable[..., Any] | None = None, *, do_not_specialize: Sequence[str] = ()):
    """Decorator: ``@kernel`` or ``@kernel(do_not_specialize=[...])`` in place of ``@triton.jit``.

    Kernels written this way must not call other ``@triton.jit`` functions of this package (a
    helper would be fixed to one mode at import); inline helpers instead. A launch with the
    constexpr ``PDL=True`` is made with programmatic dependent launch: such a kernel must call
    ``tl.extra.cuda.gdc_wait()`` before it reads or writes anything the previous kernel touches.
    """
    if fn is None:
        return lambda f: Kernel(f, do_not_specialize)
    return Kernel(fn, do_not_specialize)


def next_pow2(n: int) -> int:
    return triton.next_power_of_2(max(1, int(n)))


_COUNTERS: dict[tuple[torch.device, str], torch.Tensor] = {}
_OUTGROWN: list[torch.Tensor] = []


def counters(device: torch.device, n: int, user: str) -> torch.Tensor:
    """Zeroed int32 counters for a last-program hand-off, one set per ``user`` kernel and device;
    every launch leaves its counters zero again, so launches in one stream can share them (not
    launches on two streams at once). A set that a launch outgrows stays allocated: a captured
    graph may still use it."""
    have = _COUNTERS.get((device, user))
    if have is None or have.numel() < n:
        if have is not None:
            _OUTGROWN.append(have)
        have = torch.zeros(max(n, 4096), dtype=torch.int32, device=device)
        _COUNTERS[(device, user)] = have
    return have


_PDL: dict[torch.device, bool] = {}


def pdl_supported(device: torch.device) -> bool:
    """Programmatic dependent launch: compiled kernels on compute capability 9.0 or newer, with a
    Triton that has grid-dependency control (3.4 and later)."""
    import triton.language as tl

    if device not in _PDL:
        _PDL[device] = (device.type == "cuda" and not triton_interpreted()
                        and hasattr(getattr(tl.extra, "cuda", None), "gdc_wait")
                        and torch.cuda.get_device_capability(device)[0] >= 9)
    return _PDL[device]
