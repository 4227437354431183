"""The image tower: a ViT (Dosovitskiy et al. 2021) pooled at the class token, as open_clip builds it.

Keys match open_clip's `VisionTransformer`: conv1.weight (no bias), class_embedding,
positional_embedding, ln_pre, transformer.resblocks.*, ln_post, proj. `pool` mean is open_clip's pool_type avg
(ln_post on every token, then the mean of the patches); `layer_scale` its ls_init_value. The image tower never pads,
so its attention is called with key_mask=None and is never causal.

Options timm has and open_clip lacks, as timm builds them: `registers` (Darcet et al. 2024, "Vision Transformers
Need Registers"): N learned tokens `reg_token` [1, N, C] after the class token, without a position (timm's reg_tokens:
[cls, registers, patches]; the class token keeps angle 0 under RoPE and so do they), kept by patch dropout, counted in
the tokens every attention mixes and left out of mean pooling; `pool` map: timm's AttentionPoolLatent (one learned
query attending over every token after ln_post, then its MLP; SigLIP's MAP head), its weights under attn_pool.*.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from models.attention import rope
from models.blocks import PLAIN, BlockOptions, Transformer

# open_clip's pool_type tok and avg (the class token, the mean of the patch tokens) and timm's map (attention pooling)
POOLS = ("cls", "mean", "map")


def patch_dropout(x: Tensor, prob: float) -> Tensor:
    """Keep a random (1 - prob) share of the patch tokens of each image, always the class token (Li et al. 2023, FLIP).

    x [B, 1 + N, C] -> [B, 1 + max(1, int(N (1 - prob))), C].
    """
    return keep_patches(x, kept_patches(x, prob))


def kept_patches(x: Tensor, prob: float) -> Tensor:
    """[B, keep] indices of the patches patch dropout keeps in each image of x [B, 1 + N, C]."""
    B, N = x.shape[0], x.shape[1] - 1
    return torch.rand(B, N, device=x.device).topk(max(1, int(N * (1 - prob))), dim=-1).indices


def keep_patches(x: Tensor, idx: Tensor) -> Tensor:
    """The class token and the patches idx [B, keep] of x [B, 1 + N, C]."""
    patches = x[:, 1:].gather(1, idx[..., None].expand(-1, -1, x.shape[-1]))
    return torch.cat([x[:, :1], patches], dim=1)


class VisionTransformer(nn.Module):
    """images [B, 3, H, W] -> embeddings [B, output_dim] (not normalised)."""

    def __init__(
        self,
        *,
        image_size: int,
        patch_size: int,
        width: int,
        heads: int,
        output_dim: int,
        attentions: list[str],
        options: list[dict],
        block: BlockOptions = PLAIN,
        patch_dropout: float = 0.0,
        pos_embed: str = "learnable",
        pool: str = "cls",
        registers: int = 0,
    ):
        super().__init__()
        rope.check("image", pos_embed, width // heads)
        if pool not in POOLS:
            raise ValueError(f"image tower: pool={pool!r} is not one of {', '.join(POOLS)}")
        self.pool = pool
        if image_size % patch_size:
            raise ValueError(
                f"image tower: image size {image_size} is not a multiple of patch size {patch_size}; change one of them"
            )
        if not 0.0 <= patch_dropout < 1.0:
            raise ValueError(f"image tower: patch_dropout={patch_dropout} must be in [0, 1)")
        self.image_size, self.patch_size = (image_size, image_size), (patch_size, patch_size)
        self.grid_size = (image_size // patch_size,) * 2
        self.output_dim, self.patch_dropout, self.pos_embed, self.head_dim = (
            output_dim,
            patch_dropout,
            pos_embed,
            width // heads,
        )
        scale = width**-0.5
        self.conv1 = nn.Conv2d(3, width, kernel_size=patch_size, stride=patch_size, bias=False)
        self.class_embedding = nn.Parameter(scale * torch.randn(width))
        if pos_embed == "learnable":  # with RoPE the positions turn q and k in every layer instead (no table)
            grid = self.grid_size[0] * self.grid_size[1]
            self.positional_embedding = nn.Parameter(scale * torch.randn(grid + 1, width))
        self.ln_pre = nn.LayerNorm(width)
        self.transformer = Transformer(width, heads, attentions, options, causal=False, block=block)
        self.ln_post = nn.LayerNorm(width)
        self.proj = nn.Parameter(scale * torch.randn(width, output_dim))
        if registers < 0:
            raise ValueError(f"image tower: registers={registers} must be >= 0")
        self.registers = registers
        if registers:
            self.reg_token = nn.Parameter(scale * torch.randn(1, registers, width))
        if pool == "map":
            from timm.layers import AttentionPoolLatent  # timm's MAP head (SigLIP); imported only where used

            self.attn_pool = AttentionPoolLatent(width, num_heads=heads, mlp_ratio=block.mlp_ratio)

    def tokens(self, image: Tensor) -> Tensor:
        """[B, 3, H, W] -> [B, 1 + (H/p)(W/p), C]: class token then patches, plus positions."""
        x = self.conv1(image).flatten(2).transpose(1, 2)  # [B, N, C]
        cls_token = self.class_embedding.to(x.dtype).expand(x.shape[0], 1, -1)
        x = torch.cat([cls_token, x], dim=1)
        return x if self.pos_embed == "rope" else x + self.positional_embedding.to(x.dtype)

    def rope_table(self, image: Tensor, idx: Tensor | None) -> tuple[Tensor, Tensor]:
        """RoPE's (cos, sin) for the class token, the registers (angle 0, as the class token) and the patches of
        `image`'s grid (only those in idx [B, keep], one table per image, when patch dropout kept some)."""
        grid = (image.shape[-2] // self.patch_size[0], image.shape[-1] // self.patch_size[1])
        rows, cols = rope.grid_positions(*grid, device=image.device)
        if idx is not None:
            rows, cols = rows[idx], cols[idx]
        return tuple(self.with_registers(t) for t in rope.image_table(rows, cols, self.head_dim))

    def with_registers(self, x: Tensor, tokens: Tensor | None = None) -> Tensor:
        """x [..., 1 + N, C] with the registers after its first token: `tokens` [..., R, C], by default copies of
        that first token's row (in a RoPE table: the class token's angle 0, cos 1 and sin 0)."""
        if not self.registers:
            return x
        if tokens is None:
            tokens = x[..., :1, :].expand(*x.shape[:-2], self.registers, x.shape[-1])
        return torch.cat([x[..., :1, :], tokens.to(x.dtype), x[..., 1:, :]], dim=-2)

    def forward(self, image: Tensor) -> Tensor:
        x = self.tokens(image)
        idx = kept_patches(x, self.patch_dropout) if self.training and self.patch_dropout > 0 else None
        if idx is not None:
            x = keep_patches(x, idx)
        x = self.with_registers(x, self.reg_token.expand(x.shape[0], -1, -1) if self.registers else None)
        x = self.transformer(self.ln_pre(x), rope=self.rope_table(image, idx) if self.pos_embed == "rope" else None)
        return self.pooled(x) @ self.proj

    def pooled(self, x: Tensor) -> Tensor:
        """[B, 1 + R + N, C] -> [B, C]: the class token, the mean of the patches, or timm's attention pooling."""
        if self.pool == "cls":
            return self.ln_post(x[:, 0])
        if self.pool == "mean":
            return self.ln_post(x[:, 1 + self.registers :]).mean(1)
        return self.attn_pool(self.ln_post(x))
