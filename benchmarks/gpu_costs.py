"""The Draft Law's cost constants on the declared platform, measured with torch alone.

The paper declares one H200 with a 32B target and a 4B same-family drafter in bf16. vLLM cannot be
installed on the device machine, so this script builds decoder layers of those shapes (Qwen3-32B:
hidden 5120, 64 layers, 64 query / 8 KV heads of 128, MLP 25600, vocabulary 151936; Qwen3-4B:
hidden 2560, 36 layers, 32 / 8 heads of 128, MLP 9728) with random weights and times what a serving
step does: a decode pass of b rows over a KV cache of `--ctx` tokens each, and a verify pass of the
same rows with gamma + 1 query tokens each. It measures, at each batch size b:

    c_T    seconds of the target's decode pass (b rows, one token each)
    delta  (verify pass with gamma + 1 tokens per row - c_T) / (gamma c_T): the cost of one extra
           verified token per row, in units of the pass (the law's delta, as throughput counts it)
    d      (the drafter's decode pass, b rows) / c_T: one drafted token per row, in the same units

`--layers K` instantiates K distinct layers per model and runs them cyclically to the full depth
(K GB of weights apart for the 32B, far past any cache), so memory stays at a few GB; the LM head is
timed once per pass. Then the law's predictions for the platform (tau, saving, speedup at gamma,
the best gamma, w_S* approx and exact) at the given kappa and rho, written as JSON and as a
Markdown section for docs/law.md.

    python benchmarks/gpu_costs.py --device cuda --out gpu_costs.json --markdown gpu_costs.md
    python benchmarks/gpu_costs.py --tiny          # CPU, tiny shapes: what the tests run
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from agentspec_sdk import law  # noqa: E402


@dataclass(frozen=True)
class Shape:
    name: str
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    mlp: int
    vocab: int


TARGET = Shape("Qwen3-32B (shapes)", 5120, 64, 64, 8, 128, 25600, 151936)
DRAFTER = Shape("Qwen3-4B (shapes)", 2560, 36, 32, 8, 128, 9728, 151936)
TINY_TARGET = Shape("tiny target", 128, 4, 4, 2, 32, 256, 1000)
TINY_DRAFTER = Shape("tiny drafter", 64, 2, 2, 1, 32, 128, 1000)


class Layer:
    """One decoder layer (RMSNorm, GQA attention over a KV cache, SwiGLU MLP) with random weights."""

    def __init__(self, s: Shape, batch: int, ctx: int, device: str, dtype: torch.dtype, gen: torch.Generator):
        def w(*shape):  # generated on the device itself: GBs of weights in seconds on a GPU
            return torch.randn(*shape, generator=gen, device=device, dtype=dtype) * 0.02

        self.s = s
        self.qkv = w((s.heads + 2 * s.kv_heads) * s.head_dim, s.hidden)
        self.o = w(s.hidden, s.heads * s.head_dim)
        self.gate_up = w(2 * s.mlp, s.hidden)
        self.down = w(s.hidden, s.mlp)
        self.k_cache = w(batch, s.kv_heads, ctx, s.head_dim)
        self.v_cache = w(batch, s.kv_heads, ctx, s.head_dim)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        s = self.s
        b, q, _ = x.shape
        h = F.rms_norm(x, (s.hidden,))
        qkv = h @ self.qkv.T
        qh, kh, vh = qkv.split([s.heads * s.head_dim, s.kv_heads * s.head_dim, s.kv_heads * s.head_dim],
                               dim=-1)
        qh = qh.view(b, q, s.heads, s.head_dim).transpose(1, 2)
        kh = torch.cat([self.k_cache, kh.view(b, q, s.kv_heads, s.head_dim).transpose(1, 2)], dim=2)
        vh = torch.cat([self.v_cache, vh.view(b, q, s.kv_heads, s.head_dim).transpose(1, 2)], dim=2)
        group = s.heads // s.kv_heads
        kh, vh = kh.repeat_interleave(group, dim=1), vh.repeat_interleave(group, dim=1)
        ctx = kh.shape[2]
        # query i (of q new tokens) sees the cache and new tokens 0..i
        mask = torch.ones(q, ctx, dtype=torch.bool, device=x.device).tril(ctx - q)
        att = F.scaled_dot_product_attention(qh, kh, vh, attn_mask=mask)
        x = x + att.transpose(1, 2).reshape(b, q, -1) @ self.o.T
        h = F.rms_norm(x, (s.hidden,))
        g, u = (h @ self.gate_up.T).chunk(2, dim=-1)
        return x + (F.silu(g) * u) @ self.down.T


class Model:
    def __init__(self, s: Shape, batch: int, ctx: int, distinct: int, device: str, dtype: torch.dtype,
                 seed: int):
        gen = torch.Generator(device=device).manual_seed(seed)
        self.s = s
        self.layers = [Layer(s, batch, ctx, device, dtype, gen) for _ in range(min(distinct, s.layers))]
        self.head = torch.randn(s.vocab, s.hidden, generator=gen, device=device, dtype=dtype) * 0.02
        self.device, self.dtype = device, dtype

    @torch.inference_mode()
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for i in range(self.s.layers):
            x = self.layers[i % len(self.layers)](x)
        return F.rms_norm(x, (self.s.hidden,)) @ self.head.T


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def time_pass(model: Model, batch: int, q: int, reps: int, warmup: int = 3) -> float:
    """Median seconds of one forward pass of `batch` rows with `q` new tokens each."""
    x = torch.randn(batch, q, model.s.hidden, device=model.device).to(model.dtype)
    times = []
    for i in range(warmup + reps):
        _sync(model.device)
        t0 = time.perf_counter()
        model.forward(x)
        _sync(model.device)
        if i >= warmup:
            times.append(time.perf_counter() - t0)
    return statistics.median(times)


def measure(target: Shape, drafter: Shape, *, batches, gamma: int, ctx: int, distinct: int, device: str,
            dtype: torch.dtype, reps: int, seed: int = 0) -> list[dict]:
    out = []
    for b in batches:
        tgt = Model(target, b, ctx, distinct, device, dtype, seed)
        c_t = time_pass(tgt, b, 1, reps)
        verify = time_pass(tgt, b, gamma + 1, reps)
        del tgt
        dft = Model(drafter, b, ctx, distinct, device, dtype, seed + 1)
        draft = time_pass(dft, b, 1, reps)
        del dft
        if device.startswith("cuda"):
            torch.cuda.empty_cache()
        out.append({"batch": b, "gamma": gamma, "ctx": ctx, "c_t_s": c_t, "verify_s": verify,
                    "draft_s": draft, "delta": max((verify - c_t) / (gamma * c_t), 0.0), "d": draft / c_t})
    return out


def predictions(costs: list[dict], kappa: float, rho: dict, w: dict, gamma_max: int = 16) -> list[dict]:
    """The law at each measured (b, delta, d): tau, saving and speedup at gamma, the best gamma, w_S*."""
    mix = law.ClassMix(w, rho)
    out = []
    for c in costs:
        params = law.LawParams(kappa, c["delta"], c["d"])
        rep = law.evaluate(params, mix, c["gamma"], gamma_max).to_dict()
        best = law.best_gamma(params, mix, gamma_max)
        out.append({"batch": c["batch"], "gamma": c["gamma"], "delta": c["delta"], "d": c["d"],
                    "tau": rep["tau"], "saving": rep["saving"], "speedup": rep["speedup"],
                    "gamma_opt": best.gamma,
                    "speedup_at_gamma_opt": best.speedup, "w_s_star_approx": rep["w_s_star_approx"],
                    "w_s_star_approx_reason": rep["w_s_star_approx_reason"],
                    "w_s_star_exact": rep["w_s_star_exact"],
                    "w_s_star_exact_reason": rep["w_s_star_exact_reason"]})
    return out


def markdown(result: dict) -> str:
    lines = [f"Measured with `benchmarks/gpu_costs.py` on {result['device_name']} ({result['dtype']}, random "
             f"weights of {result['target']['name']} / {result['drafter']['name']}, {result['ctx']} context "
             f"tokens per row, γ = {result['gamma']}); law at κ = {result['kappa']}, ρ = {result['rho']}, "
             f"w = {result['w']}:",
             "", "| b | c_T ms | verify ms (γ+1 tokens) | drafter ms | δ | d | τ | s | speedup | best γ "
                 "| w_S* approx | w_S* exact |",
             "|" + "---|" * 12]
    for c, p in zip(result["costs"], result["predictions"], strict=True):
        approx = f"{p['w_s_star_approx']:.3f}" if p["w_s_star_approx"] is not None else "none"
        exact = f"{p['w_s_star_exact']:.3f}" if p["w_s_star_exact"] is not None else "none"
        lines.append(f"| {c['batch']} | {1000 * c['c_t_s']:.2f} | {1000 * c['verify_s']:.2f} "
                     f"| {1000 * c['draft_s']:.2f} | {c['delta']:.4f} | {c['d']:.3f} | {p['tau']:.2f} "
                     f"| {p['saving']:.3f} | {p['speedup']:.2f}× "
                     f"| {p['gamma_opt']} ({p['speedup_at_gamma_opt']:.2f}×) | {approx} | {exact} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--tiny", action="store_true", help="tiny shapes (CPU tests)")
    ap.add_argument("--batches", default="1,8")
    ap.add_argument("--gamma", type=int, default=8)
    ap.add_argument("--ctx", type=int, default=2048, help="KV-cache tokens per row")
    ap.add_argument("--layers", type=int, default=4, help="distinct layers instantiated per model")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--dtype", default=None, help="bfloat16 (default on GPU) or float32 (default on CPU)")
    ap.add_argument("--kappa", type=float, default=0.64, help="the bench's fitted kappa (docs/replay.md)")
    ap.add_argument("--rho", default="0.80,0.42,0.14", help="rho_S,rho_R,rho_F (the bench's, from entropies)")
    ap.add_argument("--w", default="0.7,0.3,0.0", help="w_S,w_R,w_F (arm D's token shares)")
    ap.add_argument("--out", type=Path, default=None, help="JSON file")
    ap.add_argument("--markdown", type=Path, default=None, help="Markdown section for docs/law.md")
    args = ap.parse_args(argv)
    dtype = getattr(torch, args.dtype) if args.dtype else (torch.bfloat16 if args.device.startswith("cuda")
                                                           else torch.float32)
    target, drafter = (TINY_TARGET, TINY_DRAFTER) if args.tiny else (TARGET, DRAFTER)
    rho = dict(zip("SRF", (float(x) for x in args.rho.split(",")), strict=True))
    w = dict(zip("SRF", (float(x) for x in args.w.split(",")), strict=True))
    batches = [int(x) for x in args.batches.split(",")]
    t0 = time.perf_counter()
    costs = measure(target, drafter, batches=batches, gamma=args.gamma, ctx=args.ctx, distinct=args.layers,
                    device=args.device, dtype=dtype, reps=args.reps)
    result = {"device": args.device,
              "device_name": torch.cuda.get_device_name() if args.device.startswith("cuda") else "CPU",
              "dtype": str(dtype).removeprefix("torch."), "target": asdict(target),
              "drafter": asdict(drafter), "gamma": args.gamma, "ctx": args.ctx,
              "distinct_layers": args.layers, "kappa": args.kappa,
              "rho": rho, "w": w, "costs": costs, "predictions": predictions(costs, args.kappa, rho, w),
              "seconds": time.perf_counter() - t0}
    if not all(math.isfinite(c["c_t_s"]) and c["c_t_s"] > 0 for c in costs):
        raise SystemExit("a pass time is not a positive number")
    text = json.dumps(result, indent=2)
    if args.out:
        args.out.write_text(text + "\n")
    if args.markdown:
        args.markdown.write_text(markdown(result))
    print(markdown(result))
    return result


if __name__ == "__main__":
    main()
