// deepinfer's bfloat16 CPU kernel (cpu_bf16_linear.c) as a torch operator written in C++:
// torch.ops.deepinfer_native.bf16_linear(x, weight, bias=None, row_block=0).
//
// The operator that cpu_bf16.py declares in Python runs its kernel through Python and ctypes: from
// compiled code (inductor's C++ wrapper) each call goes back into the interpreter, and from eager
// code each call runs the Python checks. This one checks its arguments and calls the kernel in C++.
// It is built at first use against the torch that runs it (cpu_bf16.py: its headers, its C++ ABI)
// and is handed the kernel's entry point by cpu_bf16.py (deepinfer_native_point_at), so the two
// libraries are built and cached independently and always run the same kernel build. Its results
// are the kernel's bits.
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/linear.h>
#include <torch/library.h>

#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

namespace {

// deepinfer_bf16_linear(x, R, K, w, N, bias, out, threads, row_block): 0, or nonzero without memory
using kernel_fn = int (*)(const void *, long, long, const void *, long, const void *, void *, int, int);

std::atomic<kernel_fn> kernel{nullptr};
std::atomic<int> default_block{6};
std::atomic<long> calls{0};

// a shape as Python prints a tuple: (2, 16), (8,)
std::string shape(const at::Tensor &t) {
  std::string s = "(";
  for (int64_t i = 0; i < t.dim(); ++i) s += (i ? ", " : "") + std::to_string(t.size(i));
  return s + (t.dim() == 1 ? ",)" : ")");
}

std::string dtype_on_device(const at::Tensor &t) {
  return "torch." + std::string(c10::getDtypeNames(t.scalar_type()).first) + " on " + t.device().str();
}

bool bf16_cpu(const at::Tensor &t) { return t.scalar_type() == at::kBFloat16 && t.device().is_cpu(); }

at::Tensor bf16_linear(const at::Tensor &x, const at::Tensor &weight, const std::optional<at::Tensor> &bias_in,
                       int64_t row_block) {
  kernel_fn fn = kernel.load();
  TORCH_CHECK(fn != nullptr, "deepinfer_native.bf16_linear: no kernel (cpu_bf16.py points it at one when it loads)");
  const bool has_bias = bias_in.has_value() && bias_in->defined();
  if (!bf16_cpu(x) || !bf16_cpu(weight) || (has_bias && !bf16_cpu(*bias_in))) {
    std::string got = dtype_on_device(x) + ", " + dtype_on_device(weight);
    if (has_bias) got += ", " + dtype_on_device(*bias_in);
    TORCH_CHECK_VALUE(false, "bf16_linear takes bfloat16 CPU tensors, got ", got);
  }
  // (messages are whole strings: on torch 2.11's GPU host a build with -std=c++17 crashed where
  // c10's message macros formatted a number, and formatted strings did not)
  TORCH_CHECK_VALUE(x.dim() >= 1, "bf16_linear: x must have at least one dimension, got a scalar");
  const int64_t k = x.size(-1), n = weight.dim() ? weight.size(0) : 0;
  if (weight.dim() != 2 || weight.size(1) != k || (has_bias && (bias_in->dim() != 1 || bias_in->size(0) != n))) {
    const std::string message = "bf16_linear: x " + shape(x) + ", weight " + shape(weight) + " and bias " +
                                (has_bias ? shape(*bias_in) : std::string("None")) +
                                " do not match: weight must be [N, " + std::to_string(k) + "] and bias [N]";
    TORCH_CHECK_VALUE(false, message);
  }
  if (row_block < 0 || row_block > 6) {
    const std::string message = "bf16_linear: row_block must be 1-6 (0: the default), got " + std::to_string(row_block);
    TORCH_CHECK_VALUE(false, message);
  }
  if (k == 0) return at::linear(x, weight, bias_in);  // nothing to multiply: the bias, or zeros
  const at::Tensor flat = x.reshape({-1, k}).contiguous();
  const at::Tensor w = weight.contiguous();
  at::Tensor bias;
  if (has_bias) bias = bias_in->contiguous();
  std::vector<int64_t> out_shape(x.sizes().begin(), x.sizes().end());
  out_shape.back() = n;
  at::Tensor out = at::empty(out_shape, x.options());
  const int64_t rows = flat.size(0);
  if (rows && n) {
    const int block = row_block ? static_cast<int>(row_block) : default_block.load();
    if (fn(flat.const_data_ptr(), rows, k, w.const_data_ptr(), n, has_bias ? bias.const_data_ptr() : nullptr,
           out.mutable_data_ptr(), at::get_num_threads(), block) != 0) {
      const std::string message = "bf16_linear: no memory for a copy of x (" + std::to_string(rows) + " x " +
                                  std::to_string(k) + ": float32, or AMX's layout)";
      TORCH_CHECK_WITH(OutOfMemoryError, false, message);
    }
  }
  calls.fetch_add(1, std::memory_order_relaxed);
  return out;
}

}  // namespace

extern "C" {
// the kernel's entry point (deepinfer_bf16_linear of the loaded build) and the rows of x that share
// one read of the weights when a call does not say (cpu_bf16.default_row_block)
void deepinfer_native_point_at(void *fn, int row_block) {
  default_block.store(row_block);
  kernel.store(reinterpret_cast<kernel_fn>(fn));
}

// calls that reached the kernel through this operator in this process
long deepinfer_native_calls(void) { return calls.load(); }
}

TORCH_LIBRARY(deepinfer_native, m) {
  m.def("bf16_linear(Tensor x, Tensor weight, Tensor? bias=None, int row_block=0) -> Tensor");
}

// (for every backend: a tensor elsewhere than on the CPU gets the checks' ValueError, not the
// dispatcher's NotImplementedError; the Meta kernel, registered from Python, takes meta tensors)
TORCH_LIBRARY_IMPL(deepinfer_native, CompositeExplicitAutograd, m) { m.impl("bf16_linear", &bf16_linear); }
