"""pytest configuration shared by tests/ and the doctests of src/posenc.

The Triton kernel module has no doctests and is left to tests/test_rope_triton.py, which
imports it first, after choosing Triton's interpreter where there is no GPU (a kernel
decorated before ``TRITON_INTERPRET=1`` is set would not run on CPU tensors), and which
skips where triton is not installed.
"""

collect_ignore = [
    "src/posenc/torch/kernels/rope_triton.py",
    "src/posenc/torch/kernels/rope_triton_ops.py",  # imports the kernel module
]
