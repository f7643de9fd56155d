"""The Huawei Ascend NPU device over torch-npu, imported lazily (its attention backend is
``deepinfer_builtin.attention.ascend``).

``device``: the `ascend` device (SoC and CANN checks, memory, streams, NPU graphs); ``ops``: the lazy
torch_npu import, the kernels' documented limits and the documentation each call follows; ``probe``: the torch-npu facts, run in a child process;
``layers``: RMSNorm and rotary embedding through the fused ops.
"""
