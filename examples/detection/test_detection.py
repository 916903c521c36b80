"""An object detector: torchvision's Faster R-CNN (region proposals, RoIAlign, box head) on a small backbone of one's
own, random weights, tiny images. Its targets are a list of dicts (boxes, labels), one per image, and in training it
returns a dict of losses, which the loss function sums."""

import functools

import pytest
import torch
from torch import nn
from torchvision.models.detection import FasterRCNN
from torchvision.models.detection.anchor_utils import AnchorGenerator
from torchvision.models.detection.faster_rcnn import FastRCNNPredictor, TwoMLPHead
from torchvision.ops import MultiScaleRoIAlign

from trainbench import TrainingSpec

SIZE, CLASSES, BOXES = 64, 3, 2  # 64x64 images, 2 classes and the background, 2 objects an image


def detector():
    """Three stride-2 conv stages (64 channels at 1/8 scale), then torchvision's RPN and RoI heads, sized down."""
    backbone = nn.Sequential(*(nn.Sequential(nn.Conv2d(i, o, 3, 2, 1, bias=False), nn.BatchNorm2d(o), nn.ReLU())
                               for i, o in ((3, 16), (16, 32), (32, 64))))
    backbone.out_channels = 64
    anchors = AnchorGenerator(sizes=((16, 32, 64),), aspect_ratios=((0.5, 1.0, 2.0),))
    return FasterRCNN(backbone, min_size=SIZE, max_size=SIZE, rpn_anchor_generator=anchors, rpn_pre_nms_top_n_train=200,
                      rpn_post_nms_top_n_train=50, box_batch_size_per_image=32,
                      box_roi_pool=MultiScaleRoIAlign(["0"], 7, 2), box_head=TwoMLPHead(64 * 7 * 7, 128),
                      box_predictor=FastRCNNPredictor(128, CLASSES))


def scenes(n, gen):
    """``n`` images with their targets: ``BOXES`` boxes each (x1 < x2, y1 < y2, in pixels) and their labels (0 is the
    background)."""
    images = torch.rand(n, 3, SIZE, SIZE, generator=gen, device=gen.device)
    corners = torch.rand(n, BOXES, 2, 2, generator=gen, device=gen.device).sort(dim=2).values * (SIZE - 8)
    boxes = torch.cat([corners[:, :, 0], corners[:, :, 1] + 8], dim=2)
    labels = torch.randint(1, CLASSES, (n, BOXES), generator=gen, device=gen.device)
    return images, [{"boxes": b, "labels": c} for b, c in zip(boxes, labels)]


SPEC = TrainingSpec(
    name="fasterrcnn", model=detector, batch_size=2, batches=scenes, checkpoint_blocks=["backbone"],
    loss_fn=lambda model, batch: sum(model(list(batch[0]), batch[1]).values()),
    optimizer=functools.partial(torch.optim.SGD, lr=0.01, momentum=0.9),
)


@pytest.mark.parametrize("recipe", ["baseline", "set_to_none", "checkpointing"])
def test_fasterrcnn(train_bench, recipe):
    train_bench(recipe, SPEC)
