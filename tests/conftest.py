import pytest


def _has_sm90_kernels() -> bool:
    try:
        import torch

        import flash_attn_dash
    except ImportError:
        return False
    return torch.cuda.is_available() and flash_attn_dash.kernels_available()


HAS_SM90 = _has_sm90_kernels()


def pytest_collection_modifyitems(config, items):
    skip = pytest.mark.skip(reason="needs an sm90 GPU and the compiled flash_attn_dash kernels")
    for item in items:
        if "gpu" in item.keywords and not HAS_SM90:
            item.add_marker(skip)
