"""Device plugins: the CPU, NVIDIA Hopper and Blackwell, Huawei Ascend."""
