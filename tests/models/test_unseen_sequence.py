"""Sequence and audio models that are not in the zoo, as users bring them (plain torch,
random weights, the legacy exporter, dynamic axes): a Whisper-like audio encoder (Conv1d
stack + GELU + attention), a Conformer block (GLU, depthwise Conv1d, BatchNorm1d, SiLU,
attention), a GPT-style causal decoder (Range/Expand mask, masked attention, LogSoftmax),
a Conv-TasNet-style separator (PReLU, GroupNorm, dilated depthwise Conv1d, ConvTranspose1d)
and a CRNN/CTC head (conv + BiLSTM + Linear + LogSoftmax). Each: the CPU build matches
onnxruntime; int8 is close to fp32; the accelerator build is bit-exact with the all-CPU
int8 build on fsim and the cycle model, and its multiply-adds are on the accelerator but
for the reasons named. Slow (a few seconds per model): `make test-slow`."""

import numpy as np
import pytest

from celosia.benchmarks.zoo_int8 import cosine
from celosia.compiler.pipeline import quantize_model
from celosia.models.registry import relative_error
from celosia.runtime.accel import AccelModel
from celosia.runtime.cpu import CpuModel

pytestmark = pytest.mark.slow


def _attention(torch, nn, d, heads, causal=False):
    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
            self.qkv, self.o = nn.Linear(d, 3 * d), nn.Linear(d, d)
            self.f1, self.f2 = nn.Linear(d, 2 * d), nn.Linear(2 * d, d)

        def forward(self, x):
            b, t, _ = x.shape
            q, k, v = self.qkv(self.ln1(x)).reshape(b, t, 3, heads, d // heads) \
                .permute(2, 0, 3, 1, 4)
            s = q @ k.transpose(-1, -2) * (d // heads) ** -0.5
            if causal:
                pos = torch.arange(t)
                s = s.masked_fill(pos[None, :] > pos[:, None], float("-inf"))
            a = torch.softmax(s, -1) @ v
            x = x + self.o(a.transpose(1, 2).reshape(b, t, d))
            return x + self.f2(nn.functional.gelu(self.f1(self.ln2(x))))
    return Block()


def _whisper(torch, nn):
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.c1 = nn.Conv1d(16, 32, 3, padding=1)
            self.c2 = nn.Conv1d(32, 32, 3, stride=2, padding=1)
            self.block = _attention(torch, nn, 32, 2)

        def forward(self, mel):
            x = nn.functional.gelu(self.c2(nn.functional.gelu(self.c1(mel))))
            return self.block(x.transpose(1, 2))
    return M(), {"mel": (1, 16, 32)}, {}


def _conformer(torch, nn):
    class M(nn.Module):
        def __init__(self, d=32):
            super().__init__()
            self.inp = nn.Linear(20, d)
            self.att = _attention(torch, nn, d, 4)
            self.ln, self.pw1 = nn.LayerNorm(d), nn.Conv1d(d, 2 * d, 1)
            self.dw = nn.Conv1d(d, d, 7, padding=3, groups=d)
            self.bn, self.pw2 = nn.BatchNorm1d(d), nn.Conv1d(d, d, 1)
            self.out = nn.Linear(d, 12)

        def forward(self, feats):
            x = self.att(self.inp(feats))
            y = nn.functional.glu(self.pw1(self.ln(x).transpose(1, 2)), dim=1)
            y = self.pw2(nn.functional.silu(self.bn(self.dw(y))))
            return self.out(x + y.transpose(1, 2)).log_softmax(-1)
    return M(), {"feats": (1, 24, 20)}, {"feats": {0: "batch"}}


def _gpt(torch, nn):
    class M(nn.Module):
        def __init__(self, vocab=97, d=32):
            super().__init__()
            self.emb, self.pos = nn.Embedding(vocab, d), nn.Embedding(64, d)
            self.block, self.ln = _attention(torch, nn, d, 4, causal=True), nn.LayerNorm(d)
            self.head = nn.Linear(d, vocab)

        def forward(self, ids):
            x = self.emb(ids) + self.pos(torch.arange(ids.shape[1]))
            return self.head(self.ln(self.block(x))).log_softmax(-1)
    return M(), {"ids": (1, 12)}, {"ids": {0: "batch", 1: "sequence"}}


def _convtasnet(torch, nn):
    class Block(nn.Module):
        def __init__(self, c, dilation):
            super().__init__()
            self.a, self.p1, self.n1 = nn.Conv1d(c, 32, 1), nn.PReLU(), nn.GroupNorm(1, 32)
            self.dw = nn.Conv1d(32, 32, 3, dilation=dilation, padding=dilation, groups=32)
            self.p2, self.b = nn.PReLU(), nn.Conv1d(32, c, 1)

        def forward(self, x):
            return x + self.b(self.p2(self.dw(self.n1(self.p1(self.a(x))))))

    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.enc = nn.Conv1d(1, 16, 8, stride=4, bias=False)
            self.blocks = nn.Sequential(Block(16, 1), Block(16, 2))
            self.mask = nn.Conv1d(16, 16, 1)
            self.dec = nn.ConvTranspose1d(16, 1, 8, stride=4, bias=False)

        def forward(self, mix):
            e = torch.relu(self.enc(mix))
            return self.dec(e * torch.sigmoid(self.mask(self.blocks(e))))
    return M(), {"mix": (1, 1, 256)}, {}


def _crnn(torch, nn):
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.cnn = nn.Sequential(nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                                     nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(),
                                     nn.MaxPool2d((8, 1)))
            self.rnn, self.fc = nn.LSTM(32, 24, bidirectional=True), nn.Linear(48, 11)

        def forward(self, image):
            y, _ = self.rnn(self.cnn(image).squeeze(2).permute(2, 0, 1))
            return self.fc(y).log_softmax(-1)
    return M(), {"image": (1, 1, 16, 32)}, {}


# model -> what may stay on the CPU's multiply-adds (reasons; none for the others)
MODELS = {"whisper": (_whisper, ()), "conformer": (_conformer, ()), "gpt": (_gpt, ()),
          "convtasnet": (_convtasnet, ("dilations", "ConvTranspose")), "crnn": (_crnn, ())}


@pytest.mark.parametrize("name", list(MODELS))
def test_unseen_sequence_model(name):
    torch = pytest.importorskip("torch")
    import onnxruntime as ort
    from celosia.models.torch_export import export

    build, allowed = MODELS[name]
    torch.manual_seed(0)
    module, shapes, axes = build(torch, torch.nn)
    names = list(shapes)

    def feeds(seed):
        rng = np.random.default_rng(seed)
        return {k: (rng.integers(1, 97, s, dtype=np.int64) if k == "ids" else
                    rng.normal(size=s).astype(np.float32)) for k, s in shapes.items()}

    example = tuple(torch.from_numpy(v) for v in feeds(0).values())
    model = export(module.eval(), example, names, ["y"],
                   {**axes, "y": {0: "batch"}} if axes else None)
    session = ort.InferenceSession(model.SerializeToString(),
                                   providers=["CPUExecutionProvider"])
    test = feeds(100)
    want = session.run(None, test)[0]
    cpu = CpuModel.build(model, {k: v.shape for k, v in test.items()})
    assert relative_error(cpu.run(test)["y"], want) < 1e-4

    q = quantize_model(model, [feeds(s) for s in range(1, 7)],
                       input_shapes={k: v.shape for k, v in test.items()})
    built = AccelModel.build(q)
    int8 = built.cpu_build().run(test)["y"]
    assert cosine(int8, want) > 0.995, cosine(int8, want)
    for target in ("fsim", "cycle"):
        np.testing.assert_array_equal(built.run(test, target=target)["y"], int8)

    from celosia.benchmarks.zoo_accel import placement_record
    record = placement_record(built)
    left = record["accel_cpu_macs"]
    assert all(any(a in reason for a in allowed) for reason in left), left
    if not allowed:
        assert record["accel_mac_share"] == 1.0, left
