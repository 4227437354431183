"""Few-shot linear probes on frozen image features, by closed-form ridge regression (as big_vision's few-shot
evaluator: whitened features, a constant bias feature, one-hot targets in {-1, +1}, a fixed L2 penalty).

`accuracies(features, labels, shots=(1, 5, 10, 25), draws=5)` draws, per class, k images for the probe and keeps the
class's other images for testing; the k-shot accuracy is the mean over `draws` draws. A k that leaves some class with
no test image (a class with k or fewer images) is left out of the result. The features are those the zero-shot
evaluation already computes (eval/zeroshot.py), so the probe costs no extra forward pass.
"""

from __future__ import annotations

import torch
from torch import Tensor

SHOTS = (1, 5, 10, 25)
BIAS = 100.0  # the constant feature that carries the bias: large, so the penalty barely touches the bias
L2 = 2.0**10  # the ridge penalty on whitened features


def ridge_accuracy(
    train_x: Tensor, train_y: Tensor, test_x: Tensor, test_y: Tensor, num_classes: int, l2: float
) -> float:
    """Top-1 accuracy on (test_x, test_y) of the ridge regression fitted to (train_x, train_y), float64."""
    mean, std = train_x.mean(0, keepdim=True), train_x.std(0, unbiased=False, keepdim=True) + 1e-5

    def design(x: Tensor) -> Tensor:
        x = (x - mean) / std
        return torch.cat([x, torch.full((len(x), 1), BIAS, dtype=x.dtype)], 1)

    x, targets = design(train_x), 2.0 * torch.nn.functional.one_hot(train_y, num_classes).to(train_x.dtype) - 1.0
    n, d = x.shape
    if n >= d:  # (X^T X + l2 I)^-1 X^T Y
        weights = torch.linalg.solve(x.T @ x + l2 * torch.eye(d, dtype=x.dtype), x.T @ targets)
    else:  # X^T (X X^T + l2 I)^-1 Y: the same, solved in the smaller dimension
        weights = x.T @ torch.linalg.solve(x @ x.T + l2 * torch.eye(n, dtype=x.dtype), targets)
    return (design(test_x) @ weights).argmax(1).eq(test_y).double().mean().item()


def draw(labels: Tensor, k: int, generator: torch.Generator) -> tuple[Tensor, Tensor]:
    """(probe indices, test indices): k random images of every class with images, the rest for testing."""
    probe, test = [], []
    for c in labels.unique():
        members = (labels == c).nonzero().flatten()
        order = members[torch.randperm(len(members), generator=generator)]
        probe.append(order[:k])
        test.append(order[k:])
    return torch.cat(probe), torch.cat(test)


def accuracies(
    features: Tensor, labels: Tensor, shots=SHOTS, draws: int = 5, seed: int = 0, l2: float = L2
) -> dict[int, float]:
    """{k: mean k-shot accuracy over `draws` draws} for every k in `shots` that leaves each class a test image."""
    features, labels = features.double().cpu(), labels.long().cpu()
    num_classes = int(labels.max()) + 1 if len(labels) else 0
    smallest = int(torch.bincount(labels)[labels.unique()].min()) if len(labels) else 0
    out = {}
    for k in shots:
        if k >= smallest:
            continue
        generator = torch.Generator().manual_seed(seed * 1000 + k)
        results = []
        for _ in range(draws):
            probe, test = draw(labels, k, generator)
            results.append(
                ridge_accuracy(features[probe], labels[probe], features[test], labels[test], num_classes, l2)
            )
        out[k] = sum(results) / len(results)
    return out
