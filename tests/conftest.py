import os

# Triton kernels run through the interpreter on CPU; it must be set before they are imported.
if not os.environ.get("CUDA_VISIBLE_DEVICES_FORCE_GPU"):
    try:
        import torch

        if not torch.cuda.is_available():
            os.environ.setdefault("TRITON_INTERPRET", "1")
    except ImportError:
        pass

import pytest  # noqa: E402

try:  # tiny test models: one thread beats two fighting over a 2-core machine
    import torch as _torch

    _torch.set_num_threads(1)
except ImportError:
    pass


def pytest_collection_modifyitems(config, items):
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
