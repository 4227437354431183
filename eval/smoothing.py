"""Over-smoothing: how much of the tokens' differences each image-tower attention layer keeps.

Gerami et al. 2026 say the normalised linear form (sim = 1 + q^.k^ over its sum) converges much more slowly or fails
at long sequences because it over-smooths: its weights lie within a factor of about 2 of each other however the
queries and keys align, so at N tokens every output is close to the mean of the values. This module measures that
per layer on real images: with v the layer's values and o its mixed output (before the output projection), both
[B, N, C] over every token of the image tower,

    spread(x) = mean_i |x_i - mean_j x_j|^2 / mean_i |x_i|^2     (the share of the tokens' energy they do not share)
    kept = spread(o) / spread(v)

kept = 1 for a layer that passes each token its own value, 0 for one that gives every token the same output (the
uniform average); scale-free, so Eq. 7's unnormalised sum and the normalised forms compare on one axis. Averaged over
the images of a batch. `kept_per_layer` runs it on any CLIP of this project (trained or at initialisation).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from eval.datasets import ImageFolderSet

FIGURE = "smoothing.png"


def spread(x: Tensor) -> Tensor:
    """[B, N, C] -> [B]: the part of the tokens' mean squared norm that is not their mean."""
    centred = x - x.mean(dim=1, keepdim=True)
    return centred.pow(2).sum(-1).mean(1) / x.pow(2).sum(-1).mean(1).clamp_min(1e-30)


def values_of(attention: nn.Module, x: Tensor) -> Tensor:
    """The layer's values v [B, N, C] from its input (the in-projection's last third)."""
    dim = attention.dim
    bias = None if attention.in_proj_bias is None else attention.in_proj_bias[2 * dim :]
    return F.linear(x, attention.in_proj_weight[2 * dim :], bias)


@torch.no_grad()
def kept_per_layer(model: nn.Module, images: Tensor) -> list[float]:
    """The kept share of token spread (module docstring) of each image-tower layer, first layer first."""
    blocks = model.visual.transformer.resblocks
    seen: dict[int, dict[str, Tensor]] = {i: {} for i in range(len(blocks))}
    hooks = []
    for i, block in enumerate(blocks):
        attention = block.attn

        def take_values(module, args, i=i, attention=attention):
            seen[i]["v"] = values_of(attention, args[0]).float()

        def take_output(module, args, i=i):
            seen[i]["o"] = args[0].float()

        hooks.append(attention.register_forward_pre_hook(take_values))
        hooks.append(attention.out_proj.register_forward_pre_hook(take_output))
    try:
        model.encode_image(images)
    finally:
        for hook in hooks:
            hook.remove()
    return [float((spread(s["o"]) / spread(s["v"]).clamp_min(1e-30)).mean()) for s in seen.values()]


def sample_images(folder: Path, transform, count: int) -> Tensor:
    """`count` images of an ImageFolder tree spread over its classes (every k-th), transformed, as one batch."""
    dataset = ImageFolderSet(folder, transform)
    step = max(1, len(dataset) // count)
    return torch.stack([dataset[i][0] for i in range(0, len(dataset), step)][:count])


def kept_of_run(run_dir: Path, images: Path, count: int = 64) -> list[float]:
    """kept_per_layer of a run's newest checkpoint on `count` images of an ImageFolder tree, in fp32 on the CPU."""
    from eval.checkpoint import load_ours  # the model loaders: only where a run is measured

    loaded = load_ours(Path(run_dir), "cpu")
    return kept_per_layer(loaded.model.float(), sample_images(images, loaded.transform, count))


def curve_of(run_dir: Path) -> list[list]:
    """[[samples seen, [kept of layer 1, ...]], ...] from the evaluations a run logged with eval.smoothing."""
    lines = (Path(run_dir) / "metrics.jsonl").read_text().splitlines()
    records = [r for r in map(json.loads, lines) if "smoothing/layer1" in r]
    return [[r["samples_seen"], [r[f"smoothing/layer{i}"] for i in range(1, 1 + count_layers(r))]] for r in records]


def count_layers(record: dict) -> int:
    return sum(1 for k in record if k.startswith("smoothing/layer"))


def figure(runs: list[dict], path: Path) -> None:
    """The mean over layers of the kept share against samples seen, per attention (colour) and size (panel)."""
    # imported here: a training process imports this module for kept_per_layer, and plotting's imports cost it ~1.5 s
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from eval.scaling_plot import plain_ticks

    sizes = list(dict.fromkeys(r["size"] for r in runs if r.get("kept_curve")))
    attentions = list(dict.fromkeys(r["attention"] for r in runs))
    fig, axes = plt.subplots(1, len(sizes), figsize=(4.6 * len(sizes), 3.6), dpi=110, squeeze=False)
    for ax, size in zip(axes[0], sizes):
        for r in (r for r in runs if r["size"] == size and r.get("kept_curve")):
            x, y = [s for s, _ in r["kept_curve"]], [sum(k) / len(k) for _, k in r["kept_curve"]]
            colour = plt.get_cmap("tab10")(attentions.index(r["attention"]) % 10)
            ax.plot(x, y, marker=".", ms=3, color=colour, label=r["attention"])
        ax.set(xscale="log", xlabel="samples seen", ylabel="kept share of token spread (mean over layers)", title=size)
        ax.grid(True, which="both", alpha=0.3)
        plain_ticks(ax)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def section(runs: list[dict]) -> list[str]:
    """The report's section on over-smoothing, from the runs' `kept` and `kept_curve` (none where not measured)."""
    measured = [r for r in runs if r.get("kept")]
    if not measured:
        return []
    rows = ["| size | attention | image tokens | kept share of token spread, layer 1 ... last | mean |"]
    rows.append("|---|---|---|---|---|")
    for r in sorted(measured, key=lambda r: (r.get("image_tokens") or 0, r["size"], r["attention"])):
        layers, mean = " / ".join(f"{k:.3f}" for k in r["kept"]), sum(r["kept"]) / len(r["kept"])
        rows.append(f"| {r['size']} | {r['attention']} | {r.get('image_tokens')} | {layers} | {mean:.3f} |")
    curves = (
        [f"![kept share of token spread during training]({FIGURE})\n"] if any(r.get("kept_curve") for r in runs) else []
    )
    return [
        "## Over-smoothing (the mechanism of claim (b))\n",
        "\n".join(rows) + "\n",
        "Per image-tower layer of each full-budget run's final weights, on the zero-shot images: spread(o) / "
        "spread(v), the share of the tokens' differences in the values v that the attention's output o keeps, "
        "where spread(x) = mean_i |x_i - mean_j x_j|^2 / mean_i |x_i|^2 (eval/smoothing.py). 1: each token keeps "
        "its own value; 0: every token gets the same output (the uniform average). The paper's mechanism predicts "
        "that the normalised form keeps less, and less at more tokens. The figure: the same at every evaluation "
        "during training (eval.smoothing), the mean over layers.\n",
        *curves,
    ]
