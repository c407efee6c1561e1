//! FLOP models and the kernel-time table the benches share (each bench includes this file with
//! `#[path]`, so one count of the work stands behind every TFLOP/s figure they print).
#![allow(dead_code)] // each bench uses a part

use fovea::backend::KernelTime;
use fovea::config::{LmConfig, VisionConfig};

/// FLOPs of layer `l`'s prefill of `t` tokens from position 0: the matrix products (the hc
/// mixes, q/kv, grouped output, compressors, indexer, router, the routed and shared experts),
/// attention over each query's window and compressed entries (all of them for HCA, top-k for
/// CSA) and the indexer's scores over complete blocks. Elementwise work, norms and Sinkhorn
/// rounds are left out.
pub fn lm_layer_prefill_flops(c: &LmConfig, l: usize, t: usize) -> f64 {
    let f = |x: usize| x as f64;
    let (d, hc, nh, hd, ql) =
        (f(c.hidden_size), f(c.hc_mult), f(c.num_attention_heads), f(c.head_dim), f(c.q_lora_rank));
    let (ih, ihd) = (f(c.index_n_heads), f(c.index_head_dim));
    let experts = f(c.num_experts_per_tok + c.n_shared_experts);
    let mut per_token = 2.0 * 2.0 * hc * d * (2.0 + hc) * hc // the two hc mixes
        + 2.0 * d * ql + 2.0 * ql * nh * hd + 2.0 * d * hd // wq_a, wq_b, wkv
        + 2.0 * nh * hd * f(c.o_lora_rank) + 2.0 * f(c.o_groups * c.o_lora_rank) * d // wo_a, wo_b
        + 2.0 * d * f(c.n_routed_experts) // router
        + 2.0 * experts * 3.0 * d * f(c.moe_intermediate_size);
    let r = c.ratio(l);
    if r != 0 {
        per_token += 2.0 * 2.0 * d * if r == 4 { 2.0 * hd } else { hd }; // compressor kv + gate
    }
    if r == 4 {
        per_token += 2.0 * ql * ih * ihd + 2.0 * d * ih + 2.0 * 2.0 * d * 2.0 * ihd;
    }
    let mut total = per_token * f(t);
    for i in 0..t {
        let window = f((i + 1).min(c.sliding_window));
        let comp = match r {
            0 => 0.0,
            4 => f(((i + 1) / 4).min(c.index_topk)),
            _ => f((i + 1) / r),
        };
        total += 4.0 * nh * hd * (window + comp);
        if r == 4 {
            total += 2.0 * ih * ihd * f((i + 1) / 4);
        }
    }
    total
}

/// FLOPs of one ViT + aligner encode of `n` patches into `n_llm` image tokens: 2·n·in·out per
/// linear, 4·n²·dim per attention (scores + weighted sum).
pub fn vit_encode_flops(cfg: &VisionConfig, n: usize, n_llm: usize) -> f64 {
    let (d, i, h, nf) = (cfg.dim as f64, cfg.inter_dim as f64, cfg.hidden_size as f64, n as f64);
    let per_layer = 2.0 * nf * d * (3.0 * d + d + 2.0 * i + i) + 4.0 * nf * nf * d;
    2.0 * nf * cfg.patch_dim() as f64 * d
        + cfg.n_layers as f64 * per_layer
        + 2.0 * n_llm as f64 * (cfg.aligner_in_dim() as f64 * h + h * h)
}

/// The kernels' device times over `steps` units of work (`what`: "a step", "the prefill"), the
/// longest `top` then the rest, when the lane timed them.
pub fn print_kernel_times(kernels: Option<&[KernelTime]>, what: &str, steps: usize, top: usize) {
    let Some(kernels) = kernels else { return };
    let per = |s: f64| s * 1e3 / steps.max(1) as f64;
    let total: f64 = kernels.iter().map(|k| k.seconds).sum();
    println!("  device time {what}, by kernel (timestamps around each dispatch): {:.2} ms in all", per(total));
    for k in kernels.iter().take(top) {
        println!(
            "    {:<32} {:>8.3} ms  {:>6.1} dispatches",
            k.name,
            per(k.seconds),
            k.count as f64 / steps.max(1) as f64
        );
    }
    let rest: f64 = kernels.iter().skip(top).map(|k| k.seconds).sum();
    if kernels.len() > top {
        println!("    {} other kernels {:>17.3} ms", kernels.len() - top, per(rest));
    }
}
