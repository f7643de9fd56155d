"""Huawei Ascend NPU plugins (device and attention) over torch-npu, imported lazily.

``device``: the `ascend` device (SoC and CANN checks, memory, streams, NPU graphs); ``attention``:
the `ascend` attention backend; ``ops``: the lazy torch_npu import, the kernels' documented limits
and the documentation each call follows; ``probe``: the torch-npu facts, run in a child process;
``layers``: RMSNorm and rotary embedding through the fused ops.
"""
