"""Transformer models in plain torch, exported as users export them: a BERT-style encoder
and a ViT.

Attention is written from Linear, matmul and softmax (torch's fused MultiheadAttention
fast path does not export with the legacy exporter), and the BERT modules carry Hugging
Face's parameter names, so a real checkpoint loads into them (models/real.py does that for
all-MiniLM-L6-v2). Both are exported with dynamic axes (batch; BERT also sequence), which
gives the Shape -> Gather -> Concat -> Reshape chains real exports have.
"""

from __future__ import annotations

import math

from .torch_export import cached, export

__all__ = ["bert", "vit", "Bert"]


def _nn():
    import torch
    return torch, torch.nn


def _attention(q, k, v, heads: int, mask=None):
    """Multi-head scaled dot-product attention of [batch, seq, hidden] tensors, the way
    Hugging Face's eager BERT writes it (view/transpose, matmul, softmax, matmul)."""
    torch, _ = _nn()
    b, s, hidden = q.size(0), q.size(1), q.size(2)
    d = hidden // heads

    def split(x):
        return x.view(b, -1, heads, d).transpose(1, 2)

    scores = torch.matmul(split(q), split(k).transpose(-1, -2)) / math.sqrt(d)
    if mask is not None:
        scores = scores + mask
    probs = torch.softmax(scores, dim=-1)
    return torch.matmul(probs, split(v)).transpose(1, 2).reshape(b, s, hidden)


def _bert_modules():
    torch, nn = _nn()

    class Dense(nn.Module):  # Hugging Face's "output" blocks: dense, dropout, residual LN
        def __init__(self, cin, cout, eps):
            super().__init__()
            self.dense, self.LayerNorm = nn.Linear(cin, cout), nn.LayerNorm(cout, eps=eps)

        def forward(self, x, residual):
            return self.LayerNorm(self.dense(x) + residual)

    class SelfAttention(nn.Module):
        def __init__(self, hidden, heads):
            super().__init__()
            self.heads = heads
            self.query, self.key, self.value = (nn.Linear(hidden, hidden) for _ in range(3))

        def forward(self, x, mask):
            return _attention(self.query(x), self.key(x), self.value(x), self.heads, mask)

    class Attention(nn.Module):
        def __init__(self, hidden, heads, eps):
            super().__init__()
            self.self, self.output = SelfAttention(hidden, heads), Dense(hidden, hidden, eps)

        def forward(self, x, mask):
            return self.output(self.self(x, mask), x)

    class Intermediate(nn.Module):
        def __init__(self, hidden, inter):
            super().__init__()
            self.dense = nn.Linear(hidden, inter)

        def forward(self, x):
            return nn.functional.gelu(self.dense(x))  # exact GELU (Erf), as BERT's "gelu"

    class Layer(nn.Module):
        def __init__(self, hidden, heads, inter, eps):
            super().__init__()
            self.attention = Attention(hidden, heads, eps)
            self.intermediate = Intermediate(hidden, inter)
            self.output = Dense(inter, hidden, eps)

        def forward(self, x, mask):
            h = self.attention(x, mask)
            return self.output(self.intermediate(h), h)

    class Embeddings(nn.Module):
        def __init__(self, vocab, hidden, max_positions, eps):
            super().__init__()
            self.word_embeddings = nn.Embedding(vocab, hidden)
            self.position_embeddings = nn.Embedding(max_positions, hidden)
            self.token_type_embeddings = nn.Embedding(2, hidden)
            self.LayerNorm = nn.LayerNorm(hidden, eps=eps)
            self.register_buffer("position_ids", torch.arange(max_positions)[None],
                                 persistent=False)

        def forward(self, input_ids):
            positions = self.position_ids[:, :input_ids.size(1)]
            token_types = torch.zeros_like(input_ids)
            return self.LayerNorm(self.word_embeddings(input_ids)
                                  + self.position_embeddings(positions)
                                  + self.token_type_embeddings(token_types))

    class Encoder(nn.Module):
        def __init__(self, layers, *args):
            super().__init__()
            self.layer = nn.ModuleList(Layer(*args) for _ in range(layers))

    class Pooler(nn.Module):
        def __init__(self, hidden):
            super().__init__()
            self.dense = nn.Linear(hidden, hidden)

        def forward(self, x):
            return torch.tanh(self.dense(x[:, 0]))

    return Embeddings, Encoder, Pooler


def Bert(layers=12, hidden=768, heads=12, intermediate=3072, vocab=30522, max_positions=512,
         eps=1e-12, pooling="cls"):
    """A BertModel with Hugging Face's parameter names. ``pooling``: "cls" returns
    (last_hidden_state, pooler_output); "mean" returns the L2-normalised mean of the
    unmasked tokens (sentence-transformers' Pooling + Normalize)."""
    torch, nn = _nn()
    Embeddings, Encoder, Pooler = _bert_modules()

    class BertModel(nn.Module):
        def __init__(self):
            super().__init__()
            self.embeddings = Embeddings(vocab, hidden, max_positions, eps)
            self.encoder = Encoder(layers, hidden, heads, intermediate, eps)
            self.pooler = Pooler(hidden)

        def forward(self, input_ids, attention_mask):
            mask = attention_mask[:, None, None, :].to(torch.float32)
            additive = (1.0 - mask) * -10000.0
            h = self.embeddings(input_ids)
            for layer in self.encoder.layer:
                h = layer(h, additive)
            if pooling == "cls":
                return h, self.pooler(h)
            weights = attention_mask[:, :, None].to(torch.float32)
            mean = (h * weights).sum(1) / weights.sum(1).clamp(min=1e-9)
            return nn.functional.normalize(mean, p=2.0, dim=1)

    return BertModel()


def bert_feeds(args: dict, rng):
    """Token ids drawn from the vocabulary and a padding mask: each row keeps a random
    number (at least half) of its tokens."""
    import numpy as np

    batch, seq = args.get("batch", 1), args["seq"]
    ids = rng.integers(1, args.get("vocab", 30522), size=(batch, seq), dtype=np.int64)
    mask = np.ones((batch, seq), np.int64)
    for row in range(batch):
        mask[row, rng.integers(seq // 2, seq + 1):] = 0
    return {"input_ids": ids, "attention_mask": mask}


def bert(layers=12, hidden=768, heads=12, intermediate=3072, vocab=30522, seq=128, batch=1,
         seed=0):
    """A BERT-style encoder (BERT-base by default) with random weights; inputs input_ids and
    attention_mask [batch, sequence] (both axes dynamic), outputs last_hidden_state and
    pooler_output."""
    args = dict(layers=layers, hidden=hidden, heads=heads, intermediate=intermediate,
                vocab=vocab, seq=seq, batch=batch, seed=seed)

    def make():
        import torch
        torch.manual_seed(seed)
        model = Bert(layers, hidden, heads, intermediate, vocab).eval()
        feeds = bert_feeds(args, __import__("numpy").random.default_rng(seed))
        example = tuple(torch.from_numpy(feeds[k]) for k in ("input_ids", "attention_mask"))
        axes = {0: "batch", 1: "sequence"}
        return export(model, example, ["input_ids", "attention_mask"],
                      ["last_hidden_state", "pooler_output"],
                      {"input_ids": axes, "attention_mask": axes,
                       "last_hidden_state": axes, "pooler_output": {0: "batch"}})

    return cached(bert, args, make)


def _vit_module(image_size, patch, dim, depth, heads, mlp, classes):
    torch, nn = _nn()

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.norm1, self.norm2 = nn.LayerNorm(dim, eps=1e-6), nn.LayerNorm(dim, eps=1e-6)
            self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
            self.fc1, self.fc2 = nn.Linear(dim, mlp), nn.Linear(mlp, dim)

        def forward(self, x):
            q, k, v = self.qkv(self.norm1(x)).chunk(3, dim=-1)
            x = x + self.proj(_attention(q, k, v, heads))
            return x + self.fc2(nn.functional.gelu(self.fc1(self.norm2(x))))

    class ViT(nn.Module):
        def __init__(self):
            super().__init__()
            self.patch_embed = nn.Conv2d(3, dim, patch, patch)
            tokens = (image_size // patch) ** 2 + 1
            self.cls_token = nn.Parameter(torch.randn(1, 1, dim) * 0.02)
            self.pos_embed = nn.Parameter(torch.randn(1, tokens, dim) * 0.02)
            self.blocks = nn.ModuleList(Block() for _ in range(depth))
            self.norm = nn.LayerNorm(dim, eps=1e-6)
            self.head = nn.Linear(dim, classes)

        def forward(self, image):
            x = self.patch_embed(image).flatten(2).transpose(1, 2)
            x = torch.cat([self.cls_token.expand(x.size(0), -1, -1), x], dim=1)
            x = x + self.pos_embed
            for block in self.blocks:
                x = block(x)
            return self.head(self.norm(x)[:, 0])

    return ViT()


def vit(image_size=224, patch=16, dim=768, depth=12, heads=12, mlp=3072, classes=1000,
        batch=1, seed=0):
    """A Vision Transformer (ViT-B/16 by default): patch embedding, class token, pre-norm
    blocks with exact GELU; input image [batch, 3, H, W] with a dynamic batch axis."""
    args = dict(image_size=image_size, patch=patch, dim=dim, depth=depth, heads=heads,
                mlp=mlp, classes=classes, batch=batch, seed=seed)

    def make():
        import torch
        torch.manual_seed(seed)
        model = _vit_module(image_size, patch, dim, depth, heads, mlp, classes).eval()
        example = (torch.randn(batch, 3, image_size, image_size),)
        return export(model, example, ["image"], ["logits"],
                      {"image": {0: "batch"}, "logits": {0: "batch"}})

    return cached(vit, args, make)

