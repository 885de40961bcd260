"""cuBLASLt through nvmath-python's thin binding (nvmath.bindings.cublasLt): matmul epilogues."""
