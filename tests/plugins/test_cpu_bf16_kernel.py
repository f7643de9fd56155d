"""deepinfer's bfloat16 linear kernel (plugins_builtin/cpu_bf16_linear.c) against a float64
product, in each build (AVX2; AVX512-BF16 where the CPU has it; AMX where it has that too), through
both ways in (its C++ operator, plugins_builtin/cpu_bf16_op.cpp, and Python's ctypes call), and its
build (torch.utils.cpp_extension): cached, said once, and a clear reason where it cannot be built."""
from __future__ import annotations

import logging
import os
import re
import shutil
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from deepinfer_builtin.devices import cpu, cpu_bf16, native_build

pytestmark = pytest.mark.skipif(not getattr(torch.cpu, "_is_avx2_supported", lambda: False)(),
                                reason="the kernel needs an x86-64 CPU with AVX2")


def _case(rows: int, n: int, k: int, bias: bool, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, k, generator=g).bfloat16()
    w = torch.randn(n, k, generator=g).bfloat16()
    b = torch.randn(n, generator=g).bfloat16() if bias else None
    return x, w, b


@pytest.fixture(params=["avx2", pytest.param("avx512_bf16", marks=pytest.mark.skipif(
    not cpu_bf16.avx512_bf16(), reason="this CPU has no AVX512-BF16")), pytest.param("amx_bf16", marks=pytest.mark.skipif(
        not (cpu_bf16.avx512_bf16() and cpu_bf16.amx_bf16()), reason="this CPU has no AMX-BF16"))])
def build(request, monkeypatch):
    """Each build of the kernel this CPU runs: the AVX2 one (everywhere), the AVX512-BF16 one, the
    AMX one."""
    monkeypatch.setattr(cpu_bf16, "avx512_bf16", lambda: request.param != "avx2")
    monkeypatch.setattr(cpu_bf16, "amx_bf16", lambda: request.param == "amx_bf16")
    cpu_bf16._library.cache_clear()
    if request.param == "amx_bf16" and cpu_bf16.kernel_kind() == "avx512_bf16":
        if hasattr(cpu_bf16._library()[0], "deepinfer_bf16_amx_init"):
            pytest.skip("Linux did not grant this process AMX's tiles (it does from 5.16 on)")
        pytest.skip(f"this compiler cannot build the AMX path: {cpu_bf16._build()[1]}")
    assert cpu_bf16.kernel_kind() == request.param
    assert cpu_bf16.use_amx() == (request.param == "amx_bf16")
    yield request.param
    monkeypatch.undo()
    cpu_bf16._library.cache_clear()


@pytest.fixture(params=["native", "python"])
def way(request):
    """Each way into the kernel: its C++ operator (where it builds here) and Python's ctypes call."""
    if request.param == "native" and cpu_bf16.native_unavailable_reason():
        pytest.skip(f"the C++ operator does not build here: {cpu_bf16.native_unavailable_reason()}")
    cpu_bf16.use_native(request.param == "native")
    yield request.param
    cpu_bf16.use_native(True)


@pytest.mark.parametrize("rows", [1, 2, 3, 4, 5, 6, 7, 13, 16, 17, 40, 70])
# a short column block and tail, K not a multiple of 8 (or 32), and K within one tail; AMX's tiles
# (K a multiple of 32) for 3 blocks of 16 weight rows, and for 4 blocks, 1 more and a tail of 12
@pytest.mark.parametrize("n, k", [(67, 37), (130, 64), (9, 5), (70, 100), (48, 32), (92, 96)])
@pytest.mark.parametrize("bias", [False, True])
def test_the_kernel_is_the_exact_product_rounded_once(build, rows, n, k, bias):
    x, w, b = _case(rows, n, k, bias, seed=rows)
    calls = cpu_bf16.amx_calls()
    out = cpu_bf16.bf16_linear(x, w, b)
    # the tiles take every weight of the AMX build whose K is a multiple of 32 (and 16 rows or more)
    assert cpu_bf16.amx_calls() - calls == (build == "amx_bf16" and k % 32 == 0 and n >= 16)
    assert out.shape == (rows, n) and out.dtype == torch.bfloat16
    exact = x.double() @ w.double().t() + (0 if b is None else b.double())
    # one bfloat16 rounding (2^-8 relative) of a float32 sum (error under K 2^-24 of the sum of |terms|)
    bound = exact.abs() * 2 ** -8 + k * 2 ** -24 * (x.double().abs() @ w.double().abs().t() + 1)
    assert ((out.double() - exact).abs() <= bound).all()


def test_a_rows_result_depends_on_nothing_but_its_own_inputs(build):
    """Each output is one float32 dot product in a fixed order: the same bits whatever the other rows,
    their order, the rows that share a read of the weights or the threads (so a verification's rows
    equal one-token steps' in the linears)."""
    # (AMX: 64 rows in four blocks of 16 a weight tile, then 6 more; 192 weight rows in tiles, 8 not)
    x, w, b = _case(70, 200, 96, True)
    whole = cpu_bf16.bf16_linear(x, w, b)
    for i in range(70):
        assert torch.equal(cpu_bf16.bf16_linear(x[i:i + 1], w, b), whole[i:i + 1])
    for rows in (19, 33, 64):  # (two, three and four blocks of 16)
        assert torch.equal(cpu_bf16.bf16_linear(x[:rows], w, b), whole[:rows])
    perm = torch.randperm(70, generator=torch.Generator().manual_seed(1))
    assert torch.equal(cpu_bf16.bf16_linear(x[perm], w, b), whole[perm])
    for block in range(1, 7):  # however many rows share a read of the weights
        assert torch.equal(cpu_bf16.bf16_linear(x, w, b, row_block=block), whole)
    threads = torch.get_num_threads()
    try:
        for n in (1, 2, 3):  # 200 columns are 4 blocks of at most 64
            torch.set_num_threads(n)
            assert torch.equal(cpu_bf16.bf16_linear(x, w, b), whole)
    finally:
        torch.set_num_threads(threads)


@pytest.mark.skipif(not (cpu_bf16.avx512_bf16() and cpu_bf16.amx_bf16()), reason="this CPU has no AMX-BF16")
def test_amx_can_be_turned_off_and_on_and_both_paths_give_the_product(build):
    """``use_amx``: the AMX build runs VDPBF16PS with it off (within one rounding of the exact
    product either way: the two sum in other orders); other builds never take AMX."""
    x, w, b = _case(5, 80, 64, True)
    exact = x.double() @ w.double().t() + b.double()
    bound = exact.abs() * 2 ** -8 + 64 * 2 ** -24 * (x.double().abs() @ w.double().abs().t() + 1)
    try:
        for on in (False, True):
            assert cpu_bf16.use_amx(on) == (on and build == "amx_bf16") == cpu_bf16.use_amx()
            calls = cpu_bf16.amx_calls()
            assert ((cpu_bf16.bf16_linear(x, w, b).double() - exact).abs() <= bound).all()
            assert cpu_bf16.amx_calls() - calls == (on and build == "amx_bf16")
    finally:
        cpu_bf16.use_amx(True)


def test_each_output_is_rounded_to_bfloat16_once_to_nearest_even():
    """With K = 1 an output is x w + b in float32, rounded once: torch's own rounding of that sum,
    bit for bit, overflow to infinity, infinities and NaN included."""
    g = torch.Generator().manual_seed(3)
    x = torch.randn(7, 1, generator=g) * torch.tensor([1, 1e-3, 1e3, 1e19, 1e-30, 1, 1]).unsqueeze(1)
    x[5, 0], x[6, 0] = float("inf"), float("nan")
    x = x.bfloat16()
    w = (torch.randn(300, 1, generator=g) * torch.logspace(-20, 20, 300).unsqueeze(1)).bfloat16()
    b = torch.randn(300, generator=g).bfloat16()
    want = (x.float() @ w.float().t() + b.float()).bfloat16()
    # (and K = 32, the rest zeros: the same sums, through AMX's tiles where the kernel has them)
    wide_x, wide_w = torch.zeros(7, 32, dtype=torch.bfloat16), torch.zeros(300, 32, dtype=torch.bfloat16)
    wide_x[:, :1], wide_w[:, :1] = x, w
    for got in (cpu_bf16.bf16_linear(x, w, b), cpu_bf16.bf16_linear(wide_x, wide_w, b)):
        assert torch.equal(got.isnan(), want.isnan())
        assert torch.equal(got.nan_to_num(), want.nan_to_num())
        assert got.isinf().any() and got.isnan().any()  # the cases above were reached


def test_shapes_strides_and_nan_are_handled_as_f_linear_does(way):
    x, w, _ = _case(6, 40, 24, False)
    x3 = x.reshape(2, 3, 24)
    assert torch.equal(cpu_bf16.bf16_linear(x3, w), cpu_bf16.bf16_linear(x, w).reshape(2, 3, 40))
    xt = x.t().contiguous().t()  # the same values, column-major
    assert not xt.is_contiguous() and torch.equal(cpu_bf16.bf16_linear(xt, w), cpu_bf16.bf16_linear(x, w))
    assert cpu_bf16.bf16_linear(x[:0], w).shape == (0, 40)
    torch.testing.assert_close(cpu_bf16.bf16_linear(x3, w).float(), F.linear(x3, w).float(), rtol=2 ** -7,
                               atol=1e-2)
    wt = w.t().contiguous().t()  # a column-major weight
    assert not wt.is_contiguous() and torch.equal(cpu_bf16.bf16_linear(x, wt), cpu_bf16.bf16_linear(x, w))
    b = torch.randn(40).bfloat16()
    assert torch.equal(cpu_bf16.bf16_linear(x[:, :0], w[:, :0], b), F.linear(x[:, :0], w[:, :0], b))  # K = 0
    for x, w, _ in (_case(6, 40, 24, False), _case(6, 48, 64, False)):  # (K = 64: AMX's tiles, where it has them)
        bad = x.clone()
        bad[2, 5] = float("nan")
        out, clean = cpu_bf16.bf16_linear(bad, w), cpu_bf16.bf16_linear(x, w)
        assert out[2].isnan().all() and torch.equal(out[[0, 1, 3, 4, 5]], clean[[0, 1, 3, 4, 5]])


def test_wrong_dtypes_and_shapes_are_refused_with_what_is_valid(way):
    x, w, b = _case(2, 8, 16, True)
    with pytest.raises(ValueError, match="bfloat16 CPU tensors, got torch.float32"):
        cpu_bf16.bf16_linear(x.float(), w, b)
    with pytest.raises(ValueError, match=r"do not match: weight must be \[N, 16\]"):
        cpu_bf16.bf16_linear(x, w[:, :8], b)
    with pytest.raises(ValueError, match=r"bias \(4,\) do not match"):
        cpu_bf16.bf16_linear(x, w, b[:4])
    for block in (7, -1):
        with pytest.raises(ValueError, match=f"row_block must be 1-6 \\(0: the default\\), got {block}"):
            cpu_bf16.bf16_linear(x, w, b, row_block=block)


def test_the_cpp_operator_gives_the_python_calls_bits_and_counts_its_calls(build):
    """The C++ operator calls the kernel of the build loaded now (each build in turn), with the same
    arguments as Python's ctypes call: the same bits, row blocks and threads included."""
    if cpu_bf16.native_unavailable_reason():
        pytest.skip(f"the C++ operator does not build here: {cpu_bf16.native_unavailable_reason()}")
    for rows, n, k, bias in ((1, 67, 37, True), (6, 130, 64, False), (17, 48, 32, True), (40, 92, 96, True)):
        x, w, b = _case(rows, n, k, bias, seed=rows)
        x3 = x.reshape(1, rows, k)
        calls = cpu_bf16.native_calls()
        try:
            assert cpu_bf16.use_native(False) is False
            slow = [cpu_bf16.bf16_linear(x, w, b), cpu_bf16.bf16_linear(x3, w, b), cpu_bf16.bf16_linear(x, w, b, row_block=2)]
            assert cpu_bf16.native_calls() == calls  # (none through the operator)
            assert cpu_bf16.use_native(True) is True
            fast = [cpu_bf16.bf16_linear(x, w, b), cpu_bf16.bf16_linear(x3, w, b), cpu_bf16.bf16_linear(x, w, b, row_block=2)]
        finally:
            cpu_bf16.use_native(True)
        assert cpu_bf16.native_calls() - calls == 3
        for got, want in zip(fast, slow):
            assert got.shape == want.shape and torch.equal(got, want)
    # the operator itself, as compiled code calls it
    x, w, b = _case(5, 40, 24, True)
    assert torch.equal(cpu_bf16.native_op()(x, w, b), cpu_bf16.bf16_linear(x, w, b))
    with pytest.raises(ValueError, match="row_block must be 1-6"):
        cpu_bf16.native_op()(x, w, b, 7)


def test_the_operator_under_torch_compile_gives_the_kernels_bits():
    x, w, b = _case(3, 50, 32, True)
    op = torch.compile(lambda a: torch.ops.deepinfer.cpu_bf16_linear(a, w, b).float().softmax(-1),
                       backend="aot_eager", fullgraph=True)
    assert torch.equal(op(x), cpu_bf16.bf16_linear(x, w, b).float().softmax(-1))
    # the device's linear calls it under torch.compile for the rows the kernel takes
    linear = torch.compile(lambda a: cpu.bf16_linear(a, w, b, kernel_rows=4, from_rows=4), backend="aot_eager",
                           fullgraph=True)
    calls = cpu_bf16.native_calls()
    assert torch.equal(linear(x), cpu_bf16.bf16_linear(x, w, b))
    # (the C++ operator, where it builds: once in the compiled code, once above)
    assert cpu_bf16.native_calls() - calls == (2 if cpu_bf16.native_unavailable_reason() is None else 0)
    assert torch.equal(cpu.bf16_linear(x, w, b, kernel_rows=2, from_rows=sys.maxsize), F.linear(x, w, b))


@pytest.fixture
def fresh_build(monkeypatch, tmp_path):
    """The kernel built afresh into an empty cache, in a process that has said nothing about it yet
    (and the process's own library restored after)."""
    monkeypatch.setenv("DEEPINFER_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(native_build, "_ANNOUNCED", set(), raising=False)
    cpu_bf16._library.cache_clear()
    yield tmp_path
    monkeypatch.undo()
    cpu_bf16._library.cache_clear()


@pytest.mark.slow
def test_the_build_is_cached_by_source_and_flags(fresh_build):
    """Built once into its own directory of the cache, named by what makes it; loaded after without
    a build; other flags (or another source) build beside it, not over it."""
    assert cpu_bf16.unavailable_reason() is None
    built = list((fresh_build / "kernels").glob("cpu_bf16_linear_*/cpu_bf16_linear_*.so"))
    assert built == [cpu_bf16._kernel_path(cpu_bf16.build_flags())]
    assert built[0].parent.name == built[0].stem and built[0].stem.startswith(f"cpu_bf16_linear_{cpu_bf16.kernel_kind()}_")
    inode, mtime = built[0].stat().st_ino, built[0].stat().st_mtime
    cpu_bf16._library.cache_clear()  # another process: loads the cached library, builds nothing
    assert cpu_bf16.unavailable_reason() is None
    assert built[0].stat().st_ino == inode and built[0].stat().st_mtime == mtime
    assert list((fresh_build / "kernels").glob("cpu_bf16_linear_*/*.so")) == built
    other = cpu_bf16._kernel_path(cpu_bf16.FLAGS + ["-DDEEPINFER_TEST"])
    assert other != built[0] and other.parent.parent == built[0].parent.parent
    lib, why = cpu_bf16._build(cpu_bf16.FLAGS + ["-DDEEPINFER_TEST"])
    assert why is None and lib is not None and other.exists() and built[0].stat().st_ino == inode


def _build_messages(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if "compiling deepinfer's bfloat16 CPU kernel" in r.getMessage()]


@pytest.mark.slow
def test_a_build_says_what_it_compiles_once_and_a_cached_one_says_nothing(fresh_build, caplog):
    """First use with an empty cache compiles for seconds: one message says what and where (at INFO
    on the deepinfer logger, where logging is set up); a process that finds it cached says nothing."""
    with caplog.at_level(logging.INFO, logger="deepinfer"):
        assert cpu_bf16.unavailable_reason() is None
        cpu_bf16.kernel_kind()
        cpu_bf16.bf16_linear(*_case(2, 8, 16, True))
        cpu.CPUDevice(cpu.CPUOptions(), None).linear_op(torch.bfloat16)
    messages = _build_messages(caplog)
    assert len(messages) == 1, messages
    assert "cpu_bf16_linear.c" in messages[0] and str(fresh_build / "kernels") in messages[0]
    caplog.clear()
    native_build._ANNOUNCED.clear()
    cpu_bf16._library.cache_clear()  # another process, the cache warm
    with caplog.at_level(logging.INFO, logger="deepinfer"):
        assert cpu_bf16.unavailable_reason() is None
        cpu.CPUDevice(cpu.CPUOptions(), None).linear_op(torch.bfloat16)
    assert _build_messages(caplog) == []


def test_without_logging_set_up_the_message_is_one_line_on_stderr(monkeypatch, capsys):
    monkeypatch.setattr(native_build.log, "propagate", False)  # (no handler on deepinfer's logger or above)
    monkeypatch.setattr(native_build.log, "handlers", [])
    monkeypatch.setattr(native_build, "_ANNOUNCED", set())
    for _ in range(3):
        native_build.announce("cpu: compiling something")
    assert capsys.readouterr().err == "deepinfer: cpu: compiling something\n"


def test_ninja_is_found_in_its_package_where_path_lacks_it(monkeypatch, tmp_path):
    """torch.utils.cpp_extension runs ``ninja`` from PATH; a virtual environment's own (the ninja
    package, a dependency) is on PATH only where it is activated, so the build looks there too; and
    without any, the kernel is unavailable with a reason that says how to get it."""
    ninja = pytest.importorskip("ninja")
    monkeypatch.setenv("DEEPINFER_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("PATH", str(tmp_path))  # (nothing on it)
    with native_build._ninja_on_path():
        assert Path(shutil.which("ninja")).parent == Path(ninja.BIN_DIR)
    assert os.environ["PATH"] == str(tmp_path)
    (tmp_path / "c++").symlink_to(shutil.which("c++") or "/bin/true")
    monkeypatch.setitem(sys.modules, "ninja", None)  # (the package missing too)
    target, why = native_build.load(cpu_bf16.SOURCE, "avx2", cpu_bf16.FLAGS, cpu_bf16.LDFLAGS)
    assert target is None and why == "ninja is not on PATH (torch.utils.cpp_extension builds with it: pip install ninja)"


@pytest.mark.parametrize("compiler, reason", [("/nonexistent/c++", "no C++ compiler: '/nonexistent/c++' is not on PATH"),
                                              ("false", "false could not build cpu_bf16_linear.c")])
def test_without_a_working_compiler_the_device_says_why_and_keeps_torchs_matmul(
        fresh_build, monkeypatch, caplog, compiler, reason):
    monkeypatch.setenv("CXX", compiler)
    monkeypatch.setattr(cpu, "slow_bf16_matmul", lambda: True)
    monkeypatch.setattr(cpu, "native_bf16_matmul", lambda: False)  # (an AVX2 CPU without AVX-512)
    assert reason in cpu_bf16.unavailable_reason()
    x, w, _ = _case(2, 8, 16, False)
    with pytest.raises(RuntimeError, match=re.escape("unavailable: " + reason)):
        cpu_bf16.bf16_linear(x, w)
    cpu._warn_once.cache_clear()
    device = cpu.CPUDevice(cpu.CPUOptions(), None)
    with caplog.at_level(logging.WARNING, logger="deepinfer"):
        op = device.linear_op(torch.bfloat16)
    assert reason in caplog.text and "float32 from 4 rows" in caplog.text
    assert op.keywords == {"kernel_rows": 0, "from_rows": 4}
    assert torch.equal(op(x, w), F.linear(x, w))  # 2 rows: torch's own
    assert torch.equal(op(x[:0], w), F.linear(x[:0], w))  # no rows: not the kernel either
    assert cpu.CPUDevice(cpu.CPUOptions(bf16_float32_rows=0), None).linear_op(torch.bfloat16) is None
    assert device.draft_dtype(torch.bfloat16) == torch.float32  # a float32 draft, as without the kernel


def test_without_torchs_headers_the_kernel_is_called_through_python(monkeypatch, caplog, tmp_path):
    """Where the C++ operator cannot be built (a torch without its C++ headers), the kernel's calls
    go through Python and the log says why."""
    monkeypatch.setattr(cpu_bf16, "_torch_header", lambda: tmp_path / "torch" / "library.h")
    target, why = cpu_bf16._native_library.__wrapped__()
    assert target is None and why == f"this torch has no C++ headers ({tmp_path / 'torch' / 'library.h'} is missing)"
    monkeypatch.setattr(cpu_bf16, "_native_library", lambda: (None, why))
    cpu_bf16._library.cache_clear()
    try:
        with caplog.at_level(logging.WARNING, logger="deepinfer"):
            assert cpu_bf16.unavailable_reason() is None  # the kernel itself
        assert why in caplog.text and "calls go through Python" in caplog.text
        assert cpu_bf16.native_unavailable_reason() == why and cpu_bf16.native_op() is None
        assert cpu_bf16.compiled_op() is torch.ops.deepinfer.cpu_bf16_linear and not cpu_bf16.use_native()
        x, w, b = _case(3, 40, 24, True)
        exact = x.double() @ w.double().t() + b.double()
        bound = exact.abs() * 2 ** -8 + 24 * 2 ** -24 * (x.double().abs() @ w.double().abs().t() + 1)
        assert ((cpu_bf16.bf16_linear(x, w, b).double() - exact).abs() <= bound).all()
    finally:
        monkeypatch.undo()
        cpu_bf16._library.cache_clear()


def test_the_cpp_operator_is_loaded_once_a_process(monkeypatch, tmp_path):
    """Asked again, the operator's library is the one loaded; another build of it (here: another
    cache's) is refused with a reason, and not built, rather than registered twice, which would end
    the process."""
    if cpu_bf16.native_unavailable_reason():
        pytest.skip(f"the C++ operator does not build here: {cpu_bf16.native_unavailable_reason()}")
    loaded = cpu_bf16._native_library()[0]
    path = next(Path(p) for p, lib in cpu_bf16._NATIVE_LOADED.items() if lib is loaded)
    monkeypatch.setenv("DEEPINFER_CACHE_DIR", str(path.parent.parent.parent))  # (the cache it was loaded from)
    assert cpu_bf16._native_library.__wrapped__() == (loaded, None)
    monkeypatch.setenv("DEEPINFER_CACHE_DIR", str(tmp_path))
    lib, why = cpu_bf16._native_library.__wrapped__()
    assert lib is None and why == "another build of the operator is loaded in this process already"
    assert not (tmp_path / "kernels").exists()
