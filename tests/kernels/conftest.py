"""Kernel tests run on the GPU when there is one, else in Triton's CPU interpreter.

TRITON_INTERPRET must be set before any kernel module is imported (triton.jit reads it at
decoration time), hence here, at conftest import, and only without CUDA so GPU runs compile
real kernels."""

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
