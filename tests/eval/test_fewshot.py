"""Few-shot ridge probes (eval/fewshot.py): the closed form in both of its dimensions, separable classes found,
random labels at chance, shots that leave a class no test image left out, draws averaged and seeded."""

import torch

from eval.fewshot import BIAS, accuracies, ridge_accuracy


def clusters(classes: int, per_class: int, dim: int, spread: float, seed: int = 0):
    generator = torch.Generator().manual_seed(seed)
    centres = torch.randn(classes, dim, generator=generator)
    labels = torch.arange(classes).repeat_interleave(per_class)
    return centres[labels] + spread * torch.randn(len(labels), dim, generator=generator), labels


def primal_predictions(train_x, train_y, test_x, classes, l2):
    """(X^T X + l2 I)^-1 X^T Y written out, whatever the sizes."""
    mean, std = train_x.mean(0, keepdim=True), train_x.std(0, unbiased=False, keepdim=True) + 1e-5
    design = lambda x: torch.cat([(x - mean) / std, torch.full((len(x), 1), BIAS, dtype=x.dtype)], 1)  # noqa: E731
    x = design(train_x)
    targets = 2.0 * torch.nn.functional.one_hot(train_y, classes).double() - 1
    weights = torch.linalg.solve(x.T @ x + l2 * torch.eye(x.shape[1], dtype=x.dtype), x.T @ targets)
    return (design(test_x) @ weights).argmax(1)


def test_the_small_side_solve_equals_the_primal_ridge():
    x, y = clusters(4, 3, dim=40, spread=1.0)  # 12 points in 40 dimensions: the dual branch
    test_x, test_y = clusters(4, 10, dim=40, spread=1.0, seed=1)
    x, test_x = x.double(), test_x.double()
    expected = primal_predictions(x, y, test_x, 4, 8.0).eq(test_y).double().mean().item()
    assert ridge_accuracy(x, y, test_x, test_y, 4, 8.0) == expected


def test_separable_classes_are_found_and_random_labels_are_at_chance():
    x, y = clusters(10, 30, dim=16, spread=0.05)
    assert accuracies(x, y, shots=(1, 5), draws=3) == {1: 1.0, 5: 1.0}
    shuffled = y[torch.randperm(len(y), generator=torch.Generator().manual_seed(0))]
    assert accuracies(torch.randn(300, 16), shuffled, shots=(10,), draws=3)[10] < 0.25  # chance: 0.1


def test_shots_that_leave_a_class_without_a_test_image_are_left_out_and_draws_are_seeded():
    x, y = clusters(5, 6, dim=8, spread=1.5)
    result = accuracies(x, y, shots=(1, 5, 6, 10), draws=4)
    assert sorted(result) == [1, 5]
    assert result == accuracies(x, y, shots=(1, 5), draws=4)  # the same draws again
    assert 0 < result[1] < result[5] < 1
