"""The text tower: a causal transformer pooled at the end-of-text token (Radford et al. 2021, CLIP).

open_clip keeps the text tower's modules at the top level of its CLIP (token_embedding,
positional_embedding, transformer, ln_final, text_projection), so `CLIP` extends `TextTower` rather
than holding it: the state-dict keys are then open_clip's exactly.

Padding: the tokenizer pads with id 0 to the right of the end-of-text token, and the end-of-text token
has the largest id of the vocabulary, so `argmax` of the ids finds it (open_clip's 'argmax' pooling).
Causal attention at a position <= EOT only sees positions <= EOT, none of them padding, so the pooled
feature never depends on padding and the attention is called with key_mask=None. For the same reason the padding
after the batch's longest caption can be left out: on the CPU the tower encodes only up to that caption's EOT
(`trim_padding`; the main job's captions fill 12 of 16 positions at most in a batch, a quarter less text work;
every causal attention gives the same prefix on a shorter sequence: tests/models/test_text_padding.py). Not on other
devices, where reading the length back would stall the host until the device caught up, nor in attention transfer,
whose loss reads every position (train/distill.py: keep_padding).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from models.attention import rope
from models.blocks import PLAIN, BlockOptions, Transformer


class TextTower(nn.Module):
    """token ids [B, L <= context_length] (int64) -> embeddings [B, output_dim] (not normalised)."""

    trim_padding = True  # on the CPU, leave out the positions after the batch's last EOT (the module docstring)

    def __init__(
        self,
        *,
        context_length: int,
        vocab_size: int,
        width: int,
        heads: int,
        output_dim: int,
        attentions: list[str],
        options: list[dict],
        block: BlockOptions = PLAIN,
        pos_embed: str = "learnable",
    ):
        super().__init__()
        rope.check("text", pos_embed, width // heads)
        self.context_length, self.vocab_size, self.text_pos_embed = context_length, vocab_size, pos_embed
        self.text_head_dim = width // heads
        self.token_embedding = nn.Embedding(vocab_size, width)
        if pos_embed == "learnable":  # with RoPE the positions turn q and k in every layer instead (no table)
            self.positional_embedding = nn.Parameter(torch.empty(context_length, width))
        self.transformer = Transformer(width, heads, attentions, options, causal=True, block=block)
        self.ln_final = nn.LayerNorm(width)
        self.text_projection = nn.Parameter(torch.empty(width, output_dim))
        self.init_text_parameters()

    def init_text_parameters(self) -> None:
        """open_clip's text init: small embeddings, residual projections scaled by depth (GPT-2 style)."""
        width, layers = self.transformer.width, self.transformer.layers
        nn.init.normal_(self.token_embedding.weight, std=0.02)
        if self.text_pos_embed == "learnable":
            nn.init.normal_(self.positional_embedding, std=0.01)
        proj_std = width**-0.5 * (2 * layers) ** -0.5
        for block in self.transformer.resblocks:
            nn.init.normal_(block.attn.in_proj_weight, std=width**-0.5)
            nn.init.normal_(block.attn.out_proj.weight, std=proj_std)
            nn.init.normal_(block.mlp.c_fc.weight, std=(2 * width) ** -0.5)
            nn.init.normal_(block.mlp.c_proj.weight, std=proj_std)
        nn.init.normal_(self.text_projection, std=width**-0.5)

    def check_length(self, length: int) -> None:
        if length > self.context_length:
            raise ValueError(
                f"text of {length} tokens exceeds the context length {self.context_length}; "
                "tokenize with models.tokenizer(name)"
            )

    def encode_text_features(self, text: Tensor) -> Tensor:
        """[B, L] ids -> [B, output_dim], pooled at each row's end-of-text token."""
        self.check_length(text.shape[1])
        eot = text.argmax(dim=-1)  # [B]
        if self.trim_padding and text.device.type == "cpu" and text.numel() and not torch.compiler.is_compiling():
            text = text[:, : int(eot.max()) + 1]
        length = text.shape[1]
        x = self.token_embedding(text)
        if self.text_pos_embed == "rope":
            x = self.transformer(x, key_mask=None, rope=rope.text_table(length, self.text_head_dim, x.device))
        else:
            x = self.transformer(x + self.positional_embedding[:length], key_mask=None)
        x = self.ln_final(x[torch.arange(x.shape[0], device=x.device), eot])  # [B, C]
        return x @ self.text_projection

    def encode_recurrent(self, text: Tensor) -> Tensor:
        """encode_text_features computed token by token: [B, L] ids -> [B, output_dim]. Each layer carries its
        attention's recurrent state of fixed size (no KV cache) through the tokens up to the last row's end-of-text
        token; one line naming the first layer whose attention has no recurrent step."""
        self.check_length(text.shape[1])
        eot = text.argmax(dim=-1)  # [B]
        length = int(eot.max()) + 1
        x = self.token_embedding(text[:, :length])
        table = None
        if self.text_pos_embed == "rope":
            table = rope.text_table(length, self.text_head_dim, x.device)
        else:
            x = x + self.positional_embedding[:length]
        try:
            states = self.transformer.init_state(x.shape[0], x.device, x.dtype)
        except ValueError as err:
            raise ValueError(f"text tower {err}") from None
        pooled = torch.zeros_like(x[:, 0])
        for t in range(length):
            position = None if table is None else (table[0][t : t + 1], table[1][t : t + 1])
            y, states = self.transformer.step(x[:, t], states, position)
            pooled = torch.where((eot == t)[:, None], y, pooled)
        return self.ln_final(pooled) @ self.text_projection
