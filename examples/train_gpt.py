"""Train a small character-level GPT twice from one seed: with tinyflash's attention and with PyTorch's SDPA.

    python examples/train_gpt.py                       # on a CUDA GPU: 600 steps each, bfloat16
    python examples/train_gpt.py --csv figures/data/gpt_training_h200.csv
    python -m tinyflash.plots --only gpt_training      # the figure of the two loss curves, from that CSV

The models start from the same weights and see the same batches. Step by step, in turn, one step of
the model whose attention is ``tinyflash.torch.attention`` (the tensor-core forward and backward), one
of the model whose attention is SDPA's flash backend, and one of a second SDPA model (to see how far
SDPA is from itself); the rest of the models is the same PyTorch code. Their losses may part only by rounding: the two attentions round differently (both are exact
up to it), and training carries the difference on. The run passes when both curves, each averaged
over a window of SMOOTH steps, stay within TOLERANCE of each other at every step, and the held-out
losses, measured every EVAL_EVERY steps on the same batches, too; or, where the two SDPA runs part by
more, within twice their gap (``tinyflash.bench.training_run`` says why).
It prints the tokens per second of both, from CUDA events around each step (the host's launches
included where the GPU waits for them).

The text is generated here (:func:`corpus`): sentences from a small grammar with agreement between
subject and verb, so that a model has something to learn and the data need no download and carry no
copyright. Compare runs in bfloat16 (the default), or in float16 with loss scaling: without it, float16
gradients underflow in both implementations and the comparison measures that.
"""

from __future__ import annotations

import argparse
import math
import sys
import time

import numpy as np

from tinyflash.bench.training_run import REPEAT, SMOOTH, TOLERANCE, compare

EVAL_EVERY = 50  # steps between held-out losses

NOUNS = ("fox", "dog", "cat", "bird", "horse", "child", "farmer", "river", "storm", "teacher")
PLURALS = {"child": "children", "fox": "foxes"}
ADJECTIVES = ("quick", "lazy", "red", "old", "small", "quiet", "bright", "tired", "clever", "wild")
VERBS = (("jumps over", "jump over"), ("sees", "see"), ("follows", "follow"), ("waits for", "wait for"),
         ("runs past", "run past"), ("finds", "find"), ("hears", "hear"), ("watches", "watch"))
NUMBERS = ("two", "three", "four", "five", "six", "seven")


def noun_phrase(rng) -> tuple[str, bool]:
    """'the quick fox' or 'three old dogs', and whether it is plural."""
    noun, adjective = NOUNS[rng.integers(len(NOUNS))], ADJECTIVES[rng.integers(len(ADJECTIVES))]
    if rng.random() < 0.5:
        return f"the {adjective} {noun}", False
    plural = PLURALS.get(noun, noun + "s")
    return f"{NUMBERS[rng.integers(len(NUMBERS))]} {adjective} {plural}", True


def corpus(n_chars: int, seed: int = 0) -> str:
    """At least ``n_chars`` characters of sentences: a subject, a verb that agrees with it, an object."""
    rng = np.random.default_rng(seed)
    parts, size = [], 0
    while size < n_chars:
        subject, plural = noun_phrase(rng)
        obj, _ = noun_phrase(rng)
        verb = VERBS[rng.integers(len(VERBS))][1 if plural else 0]
        sentence = f"{subject} {verb} {obj}.\n" if rng.random() < 0.8 else f"{subject} {verb} {obj}, and "
        parts.append(sentence)
        size += len(sentence)
    return "".join(parts)


def build(args, attention, vocab: int, device):
    """The GPT: token and position embeddings, ``args.layers`` pre-norm blocks of causal self-attention
    (``attention(q, k, v)`` on (batch, heads, T, head dim)) and an MLP, a final norm and the logits."""
    import torch
    from torch import nn

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.norm1, self.norm2 = nn.LayerNorm(args.width), nn.LayerNorm(args.width)
            self.qkv, self.proj = nn.Linear(args.width, 3 * args.width), nn.Linear(args.width, args.width)
            self.mlp = nn.Sequential(nn.Linear(args.width, 4 * args.width), nn.GELU(),
                                     nn.Linear(4 * args.width, args.width))

        def forward(self, x):
            b, t, c = x.shape
            q, k, v = self.qkv(self.norm1(x)).view(b, t, 3, args.heads, c // args.heads).permute(2, 0, 3, 1, 4)
            y = attention(q, k, v).transpose(1, 2).reshape(b, t, c)
            x = x + self.proj(y)
            return x + self.mlp(self.norm2(x))

    class GPT(nn.Module):
        def __init__(self):
            super().__init__()
            self.tokens, self.positions = nn.Embedding(vocab, args.width), nn.Embedding(args.context, args.width)
            self.blocks = nn.ModuleList(Block() for _ in range(args.layers))
            self.norm, self.head = nn.LayerNorm(args.width), nn.Linear(args.width, vocab)

        def forward(self, idx):
            x = self.tokens(idx) + self.positions(torch.arange(idx.shape[1], device=idx.device))
            for block in self.blocks:
                x = block(x)
            return self.head(self.norm(x))

    return GPT().to(device)


def attentions(dtype):
    """name -> attention(q, k, v), causal: tinyflash, SDPA, and SDPA again (its spread against itself)."""
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    import tinyflash.torch as tft

    def sdpa(q, k, v):
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            return F.scaled_dot_product_attention(q, k, v, is_causal=True)

    return {"tinyflash": lambda q, k, v: tft.attention(q, k, v, causal=True), "sdpa_flash": sdpa, REPEAT: sdpa}


def train(args) -> list[dict]:
    """Both models, step by step in turn; one row per (implementation, step)."""
    import torch
    import torch.nn.functional as F

    device, dtype = torch.device("cuda"), getattr(torch, args.dtype)
    text = corpus(args.chars, args.seed)
    chars = sorted(set(text))
    data = torch.tensor([chars.index(c) for c in text], dtype=torch.long)
    split = int(0.9 * len(data))
    train_data, held_out = data[:split].to(device), data[split:].to(device)
    batches = torch.Generator().manual_seed(args.seed)  # the batches: the same for both models

    def batch(source, gen):
        start = torch.randint(len(source) - args.context - 1, (args.batch,), generator=gen).to(device)
        rows = start[:, None] + torch.arange(args.context + 1, device=device)
        return source[rows[:, :-1]], source[rows[:, 1:]]

    eval_batches = [batch(held_out, torch.Generator().manual_seed(args.seed + 1 + i)) for i in range(4)]
    models, optimizers = {}, {}
    for name, attention in attentions(dtype).items():
        torch.manual_seed(args.seed)  # the same initial weights
        models[name] = build(args, attention, len(chars), device)
        optimizers[name] = torch.optim.AdamW(models[name].parameters(), lr=args.lr, weight_decay=0.1)
    scaler = {name: torch.amp.GradScaler(enabled=args.dtype == "float16") for name in models}
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    rows = []
    for step in range(args.steps):
        lr = args.lr * min(1.0, (step + 1) / 50) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * step / args.steps)))
        x, y = batch(train_data, batches)
        for name, model in models.items():
            for group in optimizers[name].param_groups:
                group["lr"] = lr
            start.record()
            with torch.autocast("cuda", dtype=dtype):
                loss = F.cross_entropy(model(x).float().view(-1, len(chars)), y.view(-1))
            optimizers[name].zero_grad(set_to_none=True)
            scaler[name].scale(loss).backward()
            scaler[name].step(optimizers[name])
            scaler[name].update()
            stop.record()
            stop.synchronize()
            row = {"impl": name, "step": step, "loss": loss.item(), "step_ms": start.elapsed_time(stop)}
            if step % EVAL_EVERY == 0 or step == args.steps - 1:
                with torch.no_grad(), torch.autocast("cuda", dtype=dtype):
                    row["eval_loss"] = float(np.mean([F.cross_entropy(model(ex).float().view(-1, len(chars)),
                                                                      ey.view(-1)).item() for ex, ey in eval_batches]))
            rows.append(row)
        if step % EVAL_EVERY == 0 or step == args.steps - 1:
            now = {r["impl"]: r for r in rows[-len(models):]}
            print(f"step {step:5d}  " + "  ".join(f"{n}: loss {r['loss']:.4f} held-out {r['eval_loss']:.4f}"
                                                  for n, r in now.items()), flush=True)
    return rows


FIELDS = ["device", "date", "numpy", "numba_cuda", "cupy", "torch", "commit", "impl", "dtype", "layers", "width",
          "heads", "context", "batch", "step", "loss", "eval_loss", "step_ms"]


def write_csv(path, rows: list[dict], args) -> None:
    import torch

    from tinyflash.bench.record import CsvWriter, environment

    env = environment(torch.cuda.get_device_name())
    writer = CsvWriter(path, FIELDS)
    for r in rows:
        writer.write({**{k: v for k, v in env.items() if k in FIELDS}, "dtype": args.dtype, "layers": args.layers,
                      "width": args.width, "heads": args.heads, "context": args.context, "batch": args.batch, **r})
    writer.close()


def parse(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--width", type=int, default=256, help="model width (heads × head dim)")
    parser.add_argument("--heads", type=int, default=4, help="attention heads (head dim = width / heads)")
    parser.add_argument("--context", type=int, default=256, help="characters per sequence")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--dtype", choices=("bfloat16", "float16"), default="bfloat16")
    parser.add_argument("--chars", type=int, default=2_000_000, help="characters of generated text")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--csv", default=None, help="write every step of both runs here")
    return parser.parse_args(argv)


def main(argv=None) -> int:
    args = parse(argv)
    import torch

    if not torch.cuda.is_available():
        print("this example trains on a CUDA GPU (tinyflash's kernels); none is available", file=sys.stderr)
        return 2
    print(f"seed {args.seed}; {args.layers} layers, width {args.width}, {args.heads} heads of "
          f"{args.width // args.heads}, context {args.context}, batch {args.batch}, {args.dtype}", flush=True)
    began = time.perf_counter()
    rows = train(args)
    result = compare(rows, args.batch * args.context)
    if args.csv:
        write_csv(args.csv, rows, args)
    for name, speed in result["tokens_per_s"].items():
        print(f"{name:10s}  final loss (last {SMOOTH} steps) {result['final_loss'][name]:.4f}   "
              f"{speed:,.0f} tokens/s")
    ok = result["within"]
    if "sdpa_self_train_gap" in result:
        print(f"SDPA against itself (a second run from the same seed): training loss {result['sdpa_self_train_gap']:.4f}, "
              f"held-out {result['sdpa_self_eval_gap']:.4f}")
    print(f"largest gap: training loss (smoothed over {SMOOTH} steps) {result['max_train_gap']:.4f}, held-out "
          f"{result['max_eval_gap']:.4f} (allowed {result['allowed_train_gap']:.4f} and {result['allowed_eval_gap']:.4f}: "
          f"{TOLERANCE} or twice SDPA's own gap; worst at step {result['worst_step']}): "
          f"{'within' if ok else 'BEYOND'}; "
          f"{time.perf_counter() - began:.0f} s", flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
