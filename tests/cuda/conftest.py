"""The GPU tests: compiled Triton kernels, CUDA graphs and the quantized default model on a
real GPU. They skip without one. Run them apart from the CPU suite, with Triton compiling
(the CPU suite runs Triton in its interpreter, chosen once per process):

    PAGEDLLM_TEST_CUDA=1 pytest tests/cuda
"""

from __future__ import annotations

import pytest
import torch


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark every test here `cuda`; skip them without a GPU or with Triton interpreting."""
    from pagedllm.platform.triton import triton_installed as triton_available
    from pagedllm.triton_kernels.runtime import interpreting

    reason = None
    if not torch.cuda.is_available():
        reason = "no CUDA GPU"
    elif not triton_available():
        reason = "triton is not installed"
    elif interpreting():
        reason = "Triton is interpreting in this session: run with PAGEDLLM_TEST_CUDA=1"
    for item in items:
        if "tests/cuda/" not in str(item.fspath).replace("\\", "/"):
            continue
        item.add_marker(pytest.mark.cuda)
        if reason is not None:
            item.add_marker(pytest.mark.skip(reason=reason))
