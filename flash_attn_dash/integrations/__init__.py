"""Integrations of flash_attn_dash with training stacks, each an optional module imported on its own (importing the
package imports none of them, nor their frameworks): :mod:`.hf` registers flash_attn_dash as a Hugging Face
transformers ``attn_implementation`` (``pip install 'flash-attn-dash[hf]'``); :mod:`.torch_flash` registers it with
PyTorch's flash-attention hooks where the installed torch offers them.
"""
