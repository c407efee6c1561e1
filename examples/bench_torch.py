"""PyTorch reference timings for README's benchmark table, the same shapes as fovea's
`bench_vision` and `bench_lm_layer` examples, random bf16 weights, CUDA events, median of runs.

  python examples/bench_torch.py vit --grid 42x74            # ViT grid of a 1920x1080 image
  python examples/bench_torch.py vit --grid 28x28 --compile  # 392x392, torch.compile
  python examples/bench_torch.py lm                          # one CSA layer: prefill 4096, decode at 4K
  python examples/bench_torch.py lm --small --device cpu     # smoke test of the script itself

vit: timm 1.0.31 `DeepseekVitEncoder` with its aligner (32 x 1024, 16 heads, SwiGLU 2816, patch 14,
merge 3, out 4096), input the resized image [1, 3, 14h, 14w] (the grid fovea's processor gives:
1920x1080 -> 42x74 = 3108 patches, 392x392 -> 28x28).
lm: transformers 5.24.0 `DeepseekV4Model`, one decoder layer of the released config (language.md
§1: hidden 4096, 64 heads x 512, q-LoRA 1024, o 8 x 1024, 256 experts top-6 of width 2048 + shared,
CSA ratio 4 with the 64 x 128 top-512 indexer, window 128, hc 4), vocab 1024, the library's default
attention and experts implementations (printed).
Pins: timm 1.0.31, transformers 5.24.0 (the versions the goldens use).
"""

import argparse
import statistics
import time

import torch


def timed(fn, iters, device):
    """Median milliseconds of `fn()` over `iters` runs after two warm-ups."""
    fn()
    fn()
    out = []
    for _ in range(iters):
        if device == "cuda":
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            fn()
            b.record()
            torch.cuda.synchronize()
            out.append(a.elapsed_time(b))
        else:
            t = time.perf_counter()
            fn()
            out.append((time.perf_counter() - t) * 1e3)
    return statistics.median(out)


def bench_vit(a):
    from timm.models.deepseek_vit import DeepseekVitEncoder

    h, w = (int(v) for v in a.grid.split("x"))
    dim, depth, heads, inter, out = (128, 2, 4, 256, 256) if a.small else (1024, 32, 16, 2816, 4096)
    with torch.device(a.device):
        m = DeepseekVitEncoder(patch_size=14, in_chans=3, out_features=out, global_pool="align", embed_dim=dim,
                               depth=depth, num_heads=heads, mlp_ratio=inter / dim, downsample_ratio=3,
                               rope_temperature=10000.0, norm_eps=1e-6)
    m = m.to(torch.bfloat16).eval()
    x = torch.randn(1, 3, 14 * h, 14 * w, device=a.device, dtype=torch.bfloat16)
    f = torch.compile(m) if a.compile else m
    t0 = time.perf_counter()
    with torch.inference_mode():
        f(x)
    first = time.perf_counter() - t0
    with torch.inference_mode():
        ms = timed(lambda: f(x), a.iters, a.device)
    n = h * w
    flops = 2 * n * 3 * 14 * 14 * dim + depth * (2 * n * dim * (3 * dim + dim + 3 * inter) + 4 * n * n * dim)
    m_tok = -(-h // 3) * -(-w // 3)
    flops += 2 * m_tok * (9 * dim * out + out * out)
    mode = "compiled" if a.compile else "eager"
    print(f"torch vit {mode}: grid {h}x{w} ({n} patches), {depth} x {dim}: median {ms:.2f} ms, "
          f"{flops / 1e12:.3f} TFLOP -> {flops / ms / 1e9:.1f} TFLOP/s (first call {first:.1f} s)")


def lm_config(a):
    from transformers import DeepseekV4Config

    if a.small:
        d, nh, hd, rope, ql, ol, og, e, inter, ih, ihd, topk, win = 256, 4, 64, 16, 64, 64, 2, 16, 128, 4, 32, 16, 32
    else:
        d, nh, hd, rope, ql, ol, og, e, inter, ih, ihd, topk, win = (4096, 64, 512, 64, 1024, 1024, 8, 256, 2048, 64,
                                                                     128, 512, 128)
    return DeepseekV4Config(
        vocab_size=1024, hidden_size=d, num_hidden_layers=1, num_attention_heads=nh, num_key_value_heads=1,
        head_dim=hd, qk_rope_head_dim=rope, q_lora_rank=ql, o_lora_rank=ol, o_groups=og, n_routed_experts=e,
        num_experts_per_tok=6, n_shared_experts=1, moe_intermediate_size=inter, num_hash_layers=0,
        scoring_func="sqrtsoftplus", routed_scaling_factor=1.5, swiglu_limit=10.0, sliding_window=win,
        layer_types=["compressed_sparse_attention"],
        compress_rates={"compressed_sparse_attention": 4, "heavily_compressed_attention": 128},
        compress_rope_theta=160000.0, rope_theta=10000.0,
        rope_scaling={"type": "yarn", "factor": 16.0, "original_max_position_embeddings": 65536,
                      "beta_fast": 32, "beta_slow": 1},
        max_position_embeddings=1048576, index_n_heads=ih, index_head_dim=ihd, index_topk=topk, hc_mult=4,
        hc_sinkhorn_iters=20, hc_eps=1e-6, rms_norm_eps=1e-6, num_nextn_predict_layers=0, tie_word_embeddings=False)


def bench_lm(a):
    from transformers import DeepseekV4Model, DynamicCache

    cfg = lm_config(a)
    torch.manual_seed(0)
    with torch.device(a.device):
        model = DeepseekV4Model(cfg).to(torch.bfloat16).eval()
    f = torch.compile(model) if a.compile else model
    t = a.tokens
    ids = (torch.arange(t, device=a.device) * 7919 % cfg.vocab_size)[None]
    with torch.inference_mode():
        t0 = time.perf_counter()
        f(input_ids=ids, use_cache=False)
        first = time.perf_counter() - t0
        pre = timed(lambda: f(input_ids=ids, use_cache=False), a.iters, a.device)
        cache = DynamicCache(config=cfg)
        f(input_ids=ids, cache=cache, use_cache=True)
        step = [0]

        def decode():
            step[0] += 1
            f(input_ids=ids[:, step[0] % t:step[0] % t + 1], cache=cache, use_cache=True)

        dec = timed(decode, a.decode_steps, a.device)
    mode = "compiled" if a.compile else "eager"
    print(f"torch lm layer {mode} (attention {cfg._attn_implementation}, experts "
          f"{getattr(cfg, '_experts_implementation', None)}): prefill {t} tokens median {pre:.2f} ms "
          f"({t / pre * 1e3:.0f} tok/s, first call {first:.1f} s); decode at context {t}: median {dec:.3f} ms")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("what", choices=["vit", "lm"])
    ap.add_argument("--grid", default="42x74", help="ViT patch grid HxW")
    ap.add_argument("--tokens", type=int, default=4096)
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--decode-steps", type=int, default=16)
    ap.add_argument("--compile", action="store_true")
    ap.add_argument("--small", action="store_true", help="reduced sizes (a smoke test of this script)")
    ap.add_argument("--device", default="cuda")
    a = ap.parse_args()
    if a.device == "cuda":
        print(f"torch {torch.__version__} on {torch.cuda.get_device_name()}")
    (bench_vit if a.what == "vit" else bench_lm)(a)


if __name__ == "__main__":
    main()
