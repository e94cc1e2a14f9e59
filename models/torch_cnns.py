"""Convolutional networks in plain torch (no torchvision: it does not install beside the CPU
wheel), exported with the legacy exporter as users export them:

- ``convnext``: ConvNeXt-T (depthwise 7x7, channels-last LayerNorm, GELU, layer scale; the
  downsampling LayerNorm written out per channel, as the reference code does).
- ``yolo``: a YOLOv8n-style detector (Conv-BN-SiLU, C2f blocks with Split and Concat,
  SPPF, nearest Upsample + Concat feature pyramid, DFL box decoding with anchors).
- ``unet``: a U-Net segmentation / text-detection network (ConvTranspose up-sampling in
  the deep half, bilinear Resize in the shallow half, as DBNet-style OCR detectors do).
- ``mobilenet_v3``: torchvision's MobileNetV3-Large (hardswish, squeeze-excitation with
  hardsigmoid).
- ``efficientnet``: EfficientNet-B0 (SiLU, squeeze-excitation with sigmoid).

Each takes a width (and where it matters depth) multiplier and an image size, so the tests
build small versions of the same architecture. BatchNorm statistics are those of random
inputs (torch_export.calibrate_batchnorm) so activations keep an order-one scale.
"""

from __future__ import annotations

import math

from .torch_export import cached, calibrate_batchnorm, export

__all__ = ["convnext", "yolo", "unet", "mobilenet_v3", "efficientnet"]


def _divisible(v: float, divisor: int = 8) -> int:
    """torchvision's _make_divisible: round channels to a multiple of 8, never below 90%."""
    new = max(divisor, int(v + divisor / 2) // divisor * divisor)
    return new + divisor if new < 0.9 * v else new


def _conv_bn(cin, cout, k=1, stride=1, groups=1, act=None):
    from torch import nn
    layers = [nn.Conv2d(cin, cout, k, stride, (k - 1) // 2, groups=groups, bias=False),
              nn.BatchNorm2d(cout)]
    return nn.Sequential(*layers, act) if act is not None else nn.Sequential(*layers)


def _export_image_model(module, batch, image_size, output_names, dynamic):
    import torch
    calibrate_batchnorm(module, lambda: (torch.randn(2, 3, image_size, image_size),), passes=3)
    example = (torch.randn(batch, 3, image_size, image_size),)
    axes = ({name: {0: "batch"} for name in ["image", *output_names]} if dynamic else None)
    return export(module, example, ["image"], output_names, axes)


# ---- ConvNeXt ---------------------------------------------------------------------------------


def _convnext_module(depths, dims, classes):
    import torch
    from torch import nn

    class LayerNorm2d(nn.Module):  # LayerNorm over channels of NCHW, written out
        def __init__(self, c, eps=1e-6):
            super().__init__()
            self.weight, self.bias, self.eps = nn.Parameter(torch.ones(c)), \
                nn.Parameter(torch.zeros(c)), eps

        def forward(self, x):
            u = x.mean(1, keepdim=True)
            s = (x - u).pow(2).mean(1, keepdim=True)
            x = (x - u) / torch.sqrt(s + self.eps)
            return self.weight[:, None, None] * x + self.bias[:, None, None]

    class Block(nn.Module):
        def __init__(self, dim):
            super().__init__()
            self.dwconv = nn.Conv2d(dim, dim, 7, padding=3, groups=dim)
            self.norm = nn.LayerNorm(dim, eps=1e-6)
            self.pwconv1, self.pwconv2 = nn.Linear(dim, 4 * dim), nn.Linear(4 * dim, dim)
            # Trained networks' layer scales are far from the 1e-6 they start at.
            self.gamma = nn.Parameter(torch.full((dim,), 0.5))

        def forward(self, x):
            y = self.norm(self.dwconv(x).permute(0, 2, 3, 1))
            y = self.gamma * self.pwconv2(nn.functional.gelu(self.pwconv1(y)))
            return x + y.permute(0, 3, 1, 2)

    class ConvNeXt(nn.Module):
        def __init__(self):
            super().__init__()
            self.downsample = nn.ModuleList([nn.Sequential(nn.Conv2d(3, dims[0], 4, 4),
                                                           LayerNorm2d(dims[0]))])
            for a, b in zip(dims, dims[1:]):
                self.downsample.append(nn.Sequential(LayerNorm2d(a), nn.Conv2d(a, b, 2, 2)))
            self.stages = nn.ModuleList(nn.Sequential(*(Block(d) for _ in range(n)))
                                        for n, d in zip(depths, dims))
            self.norm, self.head = nn.LayerNorm(dims[-1], eps=1e-6), nn.Linear(dims[-1], classes)

        def forward(self, x):
            for down, stage in zip(self.downsample, self.stages):
                x = stage(down(x))
            return self.head(self.norm(x.mean([-2, -1])))

    return ConvNeXt()


def convnext(depths=(3, 3, 9, 3), dims=(96, 192, 384, 768), image_size=224, classes=1000,
             batch=1, seed=0):
    """ConvNeXt (ConvNeXt-T by default); static shapes."""
    args = dict(depths=list(depths), dims=list(dims), image_size=image_size, classes=classes,
                batch=batch, seed=seed)

    def make():
        import torch
        torch.manual_seed(seed)
        module = _convnext_module(depths, dims, classes)
        return _export_image_model(module, batch, image_size, ["logits"], False)

    return cached(convnext, args, make)


# ---- YOLO -------------------------------------------------------------------------------------


def _yolo_modules():
    import torch
    from torch import nn

    def conv(cin, cout, k=1, s=1):
        return _conv_bn(cin, cout, k, s, act=nn.SiLU())

    class Bottleneck(nn.Module):
        def __init__(self, c):
            super().__init__()
            self.cv1, self.cv2 = conv(c, c, 3), conv(c, c, 3)

        def forward(self, x):
            return x + self.cv2(self.cv1(x))

    class C2f(nn.Module):
        def __init__(self, cin, cout, n, shortcut=True):
            super().__init__()
            self.c = cout // 2
            self.cv1, self.cv2 = conv(cin, 2 * self.c), conv((2 + n) * self.c, cout)
            self.m = nn.ModuleList(Bottleneck(self.c) if shortcut else
                                   nn.Sequential(conv(self.c, self.c, 3),
                                                 conv(self.c, self.c, 3)) for _ in range(n))

        def forward(self, x):
            y = list(self.cv1(x).chunk(2, 1))
            for m in self.m:
                y.append(m(y[-1]))
            return self.cv2(torch.cat(y, 1))

    class SPPF(nn.Module):
        def __init__(self, cin, cout):
            super().__init__()
            self.cv1, self.cv2 = conv(cin, cin // 2), conv(cin // 2 * 4, cout)
            self.m = nn.MaxPool2d(5, 1, 2)

        def forward(self, x):
            y = [self.cv1(x)]
            for _ in range(3):
                y.append(self.m(y[-1]))
            return self.cv2(torch.cat(y, 1))

    return conv, C2f, SPPF


def _yolo_module(width, classes, image_size):
    import torch
    from torch import nn

    conv, C2f, SPPF = _yolo_modules()
    c = [max(4, int(16 * width)) * 2 ** i for i in range(5)]  # yolov8n: 16 .. 256
    strides = (8, 16, 32)
    reg_max = 16

    class Detect(nn.Module):
        def __init__(self):
            super().__init__()
            cb, cc = max(16, c[2] // 4, 4 * reg_max), max(c[2], min(classes, 100))
            self.box = nn.ModuleList(nn.Sequential(conv(ch, cb, 3), conv(cb, cb, 3),
                                                   nn.Conv2d(cb, 4 * reg_max, 1))
                                     for ch in c[2:])
            self.cls = nn.ModuleList(nn.Sequential(conv(ch, cc, 3), conv(cc, cc, 3),
                                                   nn.Conv2d(cc, classes, 1)) for ch in c[2:])
            self.register_buffer("bins", torch.arange(reg_max, dtype=torch.float32))
            points, scale = [], []
            for s in strides:  # anchor points: the centre of every cell of every level
                n = image_size // s
                ys, xs = torch.meshgrid(torch.arange(n) + 0.5, torch.arange(n) + 0.5,
                                        indexing="ij")
                points.append(torch.stack([xs, ys], 0).reshape(2, -1))
                scale.append(torch.full((1, n * n), float(s)))
            self.register_buffer("anchors", torch.cat(points, 1))
            self.register_buffer("strides", torch.cat(scale, 1))

        def forward(self, feats):
            b = feats[0].size(0)
            box = torch.cat([m(f).view(b, 4 * reg_max, -1) for m, f in zip(self.box, feats)], 2)
            cls = torch.cat([m(f).view(b, classes, -1) for m, f in zip(self.cls, feats)], 2)
            # DFL: a distance per side as the expectation of a softmax over reg_max bins.
            dist = box.view(b, 4, reg_max, -1).softmax(2)
            dist = (dist * self.bins[None, None, :, None]).sum(2)
            lt, rb = dist.chunk(2, 1)
            x1y1, x2y2 = self.anchors - lt, self.anchors + rb
            xywh = torch.cat([(x1y1 + x2y2) / 2, x2y2 - x1y1], 1) * self.strides
            return torch.cat([xywh, cls.sigmoid()], 1)

    class YOLO(nn.Module):
        def __init__(self):
            super().__init__()
            self.stem = nn.Sequential(conv(3, c[0], 3, 2), conv(c[0], c[1], 3, 2),
                                      C2f(c[1], c[1], 1))
            self.p3 = nn.Sequential(conv(c[1], c[2], 3, 2), C2f(c[2], c[2], 2))
            self.p4 = nn.Sequential(conv(c[2], c[3], 3, 2), C2f(c[3], c[3], 2))
            self.p5 = nn.Sequential(conv(c[3], c[4], 3, 2), C2f(c[4], c[4], 1), SPPF(c[4], c[4]))
            self.up = nn.Upsample(scale_factor=2, mode="nearest")
            self.h4, self.h3 = C2f(c[4] + c[3], c[3], 1, False), C2f(c[3] + c[2], c[2], 1, False)
            self.d3, self.d4 = conv(c[2], c[2], 3, 2), conv(c[3], c[3], 3, 2)
            self.o4, self.o5 = C2f(c[2] + c[3], c[3], 1, False), C2f(c[3] + c[4], c[4], 1, False)
            self.detect = Detect()

        def forward(self, x):
            p3 = self.p3(self.stem(x))
            p4 = self.p4(p3)
            p5 = self.p5(p4)
            h4 = self.h4(torch.cat([self.up(p5), p4], 1))
            o3 = self.h3(torch.cat([self.up(h4), p3], 1))
            o4 = self.o4(torch.cat([self.d3(o3), h4], 1))
            o5 = self.o5(torch.cat([self.d4(o4), p5], 1))
            return self.detect([o3, o4, o5])

    return YOLO()


def yolo(width=1.0, image_size=640, classes=80, batch=1, seed=0):
    """A YOLOv8n-style detector (width 1.0 = YOLOv8n's channels); output [batch, 4 + classes,
    anchors]: boxes (centre, size in pixels) and class scores. Static shapes, as detector
    exports usually are. ``image_size``: a multiple of 32."""
    args = dict(width=width, image_size=image_size, classes=classes, batch=batch, seed=seed)

    def make():
        import torch
        torch.manual_seed(seed)
        module = _yolo_module(width, classes, image_size)
        return _export_image_model(module, batch, image_size, ["detections"], False)

    return cached(yolo, args, make)


# ---- U-Net ------------------------------------------------------------------------------------


def _unet_module(base, levels):
    import torch
    from torch import nn

    def double(cin, cout):
        return nn.Sequential(_conv_bn(cin, cout, 3, act=nn.ReLU()),
                             _conv_bn(cout, cout, 3, act=nn.ReLU()))

    class UNet(nn.Module):
        def __init__(self):
            super().__init__()
            ch = [base * 2 ** i for i in range(levels + 1)]
            self.inc = double(3, ch[0])
            self.down = nn.ModuleList(double(a, b) for a, b in zip(ch, ch[1:]))
            self.pool = nn.MaxPool2d(2)
            # Deep half: learned up-sampling (ConvTranspose); shallow half: bilinear Resize
            # then a 1x1 conv, as DBNet-style text detectors do.
            self.up = nn.ModuleList()
            for i in reversed(range(levels)):
                if i >= levels // 2:
                    self.up.append(nn.ConvTranspose2d(ch[i + 1], ch[i], 2, 2))
                else:
                    self.up.append(nn.Sequential(
                        nn.Upsample(scale_factor=2, mode="bilinear", align_corners=False),
                        nn.Conv2d(ch[i + 1], ch[i], 1)))
            self.dec = nn.ModuleList(double(2 * ch[i], ch[i]) for i in reversed(range(levels)))
            self.head = nn.Conv2d(ch[0], 1, 1)

        def forward(self, x):
            skips = [self.inc(x)]
            for down in self.down:
                skips.append(down(self.pool(skips[-1])))
            x = skips.pop()
            for up, dec in zip(self.up, self.dec):
                x = dec(torch.cat([up(x), skips.pop()], 1))
            return torch.sigmoid(self.head(x))

    return UNet()


def unet(base=32, levels=4, image_size=256, batch=1, seed=0):
    """A U-Net with a probability map as output [batch, 1, H, W]; dynamic batch axis.
    ``image_size``: a multiple of 2**levels."""
    args = dict(base=base, levels=levels, image_size=image_size, batch=batch, seed=seed)

    def make():
        import torch
        torch.manual_seed(seed)
        return _export_image_model(_unet_module(base, levels), batch, image_size,
                                   ["probability"], True)

    return cached(unet, args, make)


# ---- MobileNetV3 and EfficientNet -------------------------------------------------------------


def _squeeze_excite(c, squeeze, act, gate):
    from torch import nn

    class SqueezeExcite(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc1, self.fc2 = nn.Conv2d(c, squeeze, 1), nn.Conv2d(squeeze, c, 1)

        def forward(self, x):
            s = nn.functional.adaptive_avg_pool2d(x, 1)
            return x * gate(self.fc2(act(self.fc1(s))))

    return SqueezeExcite()


def _inverted_residual(cin, hidden, cout, k, stride, act, se):
    """MBConv: expand 1x1, depthwise kxk, optional squeeze-excitation, project 1x1."""
    from torch import nn

    layers = []
    if hidden != cin:
        layers.append(_conv_bn(cin, hidden, 1, act=act))
    layers.append(_conv_bn(hidden, hidden, k, stride, groups=hidden, act=act))
    if se is not None:
        layers.append(se)
    layers.append(_conv_bn(hidden, cout, 1))
    body = nn.Sequential(*layers)

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.block, self.residual = body, stride == 1 and cin == cout

        def forward(self, x):
            return x + self.block(x) if self.residual else self.block(x)

    return Block()


# torchvision's mobilenet_v3_large: kernel, expanded, out, SE, hardswish, stride
_V3_LARGE = [(3, 16, 16, 0, 0, 1), (3, 64, 24, 0, 0, 2), (3, 72, 24, 0, 0, 1),
             (5, 72, 40, 1, 0, 2), (5, 120, 40, 1, 0, 1), (5, 120, 40, 1, 0, 1),
             (3, 240, 80, 0, 1, 2), (3, 200, 80, 0, 1, 1), (3, 184, 80, 0, 1, 1),
             (3, 184, 80, 0, 1, 1), (3, 480, 112, 1, 1, 1), (3, 672, 112, 1, 1, 1),
             (5, 672, 160, 1, 1, 2), (5, 960, 160, 1, 1, 1), (5, 960, 160, 1, 1, 1)]


def _mobilenet_v3_module(width, classes):
    from torch import nn

    first = _divisible(16 * width)
    layers, cin = [_conv_bn(3, first, 3, 2, act=nn.Hardswish())], first
    for k, exp, out, se, hs, stride in _V3_LARGE:
        hidden, cout = _divisible(exp * width), _divisible(out * width)
        act = nn.Hardswish() if hs else nn.ReLU()
        block_se = (_squeeze_excite(hidden, _divisible(hidden // 4), nn.ReLU(), nn.Hardsigmoid())
                    if se else None)
        layers.append(_inverted_residual(cin, hidden, cout, k, stride, act, block_se))
        cin = cout
    last = 6 * cin
    layers.append(_conv_bn(cin, last, 1, act=nn.Hardswish()))
    return nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten(1),
                         nn.Linear(last, 1280), nn.Hardswish(), nn.Dropout(0.2),
                         nn.Linear(1280, classes))


def mobilenet_v3(width=1.0, image_size=224, classes=1000, batch=1, seed=0):
    """MobileNetV3-Large (5,483,032 parameters at width 1.0, 1000 classes); dynamic batch."""
    args = dict(width=width, image_size=image_size, classes=classes, batch=batch, seed=seed)

    def make():
        import torch
        torch.manual_seed(seed)
        return _export_image_model(_mobilenet_v3_module(width, classes), batch, image_size,
                                   ["logits"], True)

    return cached(mobilenet_v3, args, make)


# EfficientNet-B0: expansion, kernel, stride, in, out, repeats
_B0 = [(1, 3, 1, 32, 16, 1), (6, 3, 2, 16, 24, 2), (6, 5, 2, 24, 40, 2), (6, 3, 2, 40, 80, 3),
       (6, 5, 1, 80, 112, 3), (6, 5, 2, 112, 192, 4), (6, 3, 1, 192, 320, 1)]


def _efficientnet_module(width, depth, classes):
    from torch import nn

    stem = _divisible(32 * width)
    layers = [_conv_bn(3, stem, 3, 2, act=nn.SiLU())]
    cin = stem
    for expand, k, stride, _, out, repeats in _B0:
        cout = _divisible(out * width)
        for r in range(int(math.ceil(repeats * depth))):
            hidden = cin * expand
            se = _squeeze_excite(hidden, max(1, cin // 4), nn.SiLU(), nn.Sigmoid())
            layers.append(_inverted_residual(cin, hidden, cout, k, stride if r == 0 else 1,
                                             nn.SiLU(), se))
            cin = cout
    last = _divisible(1280 * width)
    layers.append(_conv_bn(cin, last, 1, act=nn.SiLU()))
    return nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten(1), nn.Dropout(0.2),
                         nn.Linear(last, classes))


def efficientnet(width=1.0, depth=1.0, image_size=224, classes=1000, batch=1, seed=0):
    """EfficientNet-B0 at width = depth = 1.0 (5,288,548 parameters at 1000 classes);
    static shapes."""
    args = dict(width=width, depth=depth, image_size=image_size, classes=classes, batch=batch,
                seed=seed)

    def make():
        import torch
        torch.manual_seed(seed)
        return _export_image_model(_efficientnet_module(width, depth, classes), batch,
                                   image_size, ["logits"], False)

    return cached(efficientnet, args, make)
