"""Integrations of flash_attn_dash with other frameworks' attention entry points.

:mod:`.torch_flash`: flash_attn_dash as PyTorch's flash-attention implementation, so that
``torch.nn.functional.scaled_dot_product_attention`` (flash backend) and ``torch.nn.attention.varlen.varlen_attn``
run our kernels (``from flash_attn_dash.integrations import torch_flash; torch_flash.activate()``).
"""
