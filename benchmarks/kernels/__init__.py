"""The Triton kernels and cuBLAS against the H200's limits (GPU); results in results/kernels/."""
