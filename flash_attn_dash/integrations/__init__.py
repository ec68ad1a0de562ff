"""Integrations of flash_attn_dash with training stacks, each an optional module imported on its own (importing the
package imports none of them, nor their frameworks).

:mod:`.torch_flash`: flash_attn_dash as PyTorch's flash-attention implementation, so that
``torch.nn.functional.scaled_dot_product_attention`` (flash backend) and ``torch.nn.attention.varlen.varlen_attn``
run our kernels (``from flash_attn_dash.integrations import torch_flash; torch_flash.activate()``).
:mod:`.hf`: flash_attn_dash as a Hugging Face transformers ``attn_implementation`` (``pip install
'flash-attn-dash[hf]'``; ``name = hf.register(); model.set_attn_implementation(name)``).
"""
