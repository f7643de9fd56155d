"""The `kv-store` cache policy: prefix-cache's blocks kept beyond device memory, in host memory and
in a directory on any POSIX mount, across restarts."""
