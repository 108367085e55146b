"""Train a small image classifier from any loader of ``(uint8 images, labels)`` batches: in a
notebook, or in every process of a ``torchrun`` job (``scripts/train.py``).

    model = SmallCNN(num_classes=10).to(device)
    for epoch in range(epochs):
        loss = train_epoch(model, train_loader, optimizer, device)
        accuracy = evaluate(model, test_loader, device)

The GPU is used when ``system.pick_device()`` finds one, never required.
"""

import itertools

import torch
import torch.nn.functional as F
from torch import nn


class SmallCNN(nn.Module):
    """Four 3×3 convolutions with BatchNorm, each halving the image (rounding up, so any size of
    image works), then global average pooling and a linear layer.

    Takes ``uint8`` images (N, 3, H, W) as they come from the loader and scales them to 0..1 itself;
    BatchNorm then keeps every layer's inputs well scaled, which is what lets it learn in a few
    epochs.
    """

    def __init__(self, num_classes=10, width=16):
        super().__init__()
        channels = [3, width, 2 * width, 4 * width, 4 * width]
        self.features = nn.Sequential(
            *(
                layer
                for c_in, c_out in itertools.pairwise(channels)
                for layer in (
                    nn.Conv2d(c_in, c_out, 3, padding=1, bias=False),
                    nn.BatchNorm2d(c_out),
                    nn.ReLU(inplace=True),
                    nn.MaxPool2d(2, ceil_mode=True),  # an odd or tiny side still halves
                )
            )
        )
        self.classify = nn.Linear(channels[-1], num_classes)

    def forward(self, images):
        x = images.float() / 255 if images.dtype == torch.uint8 else images
        return self.classify(self.features(x).mean(dim=(2, 3)))


def train_epoch(model, batches, optimizer, device, steps=None):
    """One pass over ``batches`` (at most ``steps`` of them); returns ``(mean loss, samples
    seen)``."""
    model.train()
    total_loss, seen = 0.0, 0
    for batch in itertools.islice(batches, steps):
        total_loss += train_step(model, batch, optimizer, device) * len(batch[1])
        seen += len(batch[1])
    return total_loss / max(seen, 1), seen


def train_step(model, batch, optimizer, device):
    """One optimisation step on ``batch`` (images, labels); returns its loss."""
    images, labels = (tensor.to(device, non_blocking=True) for tensor in batch)
    loss = F.cross_entropy(model(images), labels)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
    return loss.item()


@torch.no_grad()
def evaluate(model, batches, device):
    """The fraction of samples in ``batches`` whose highest-scoring class is the label;
    ``ValueError`` when ``batches`` holds no sample, since an accuracy of nothing means nothing."""
    model.eval()
    correct = seen = 0
    for images, labels in batches:
        predictions = model(images.to(device)).argmax(dim=1).cpu()
        correct += int((predictions == labels).sum())
        seen += len(labels)
    if seen == 0:
        raise ValueError(
            "evaluate() got no samples: the test loader is empty (no test shards, or all skipped?)"
        )
    return correct / seen


def common_steps(samples, batch_size):
    """How many batches every rank can run this epoch: the fewest ``samples // batch_size`` over all
    ranks.

    Outside a distributed job that is just this process's count. Ranks that stop after the same
    number of steps make the same number of gradient all-reduces, so none waits forever for a
    partner that has finished.
    """
    steps = torch.tensor(samples // batch_size)
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        # NCCL reduces only tensors on this rank's GPU
        if torch.distributed.get_backend() == "nccl":
            steps = steps.to(torch.device("cuda", torch.cuda.current_device()))
        torch.distributed.all_reduce(steps, op=torch.distributed.ReduceOp.MIN)
    return int(steps)
