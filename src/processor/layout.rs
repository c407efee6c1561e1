//! The image token block ("N-layout"), vision.md §2.2: `build_image_block` of the reference
//! `image_processor.py` (checked against the vLLM 1:1 port, corpus id 59454824949, and
//! `adurham/exo`'s torch-free port), plus llama.cpp's `layout_idx` formulation for the tests.

use super::solver::COMPRESS_PAD_TO;
use super::{IMAGE, IMAGE_END, IMAGE_NEW_LINE, IMAGE_PAD, IMAGE_START, ImageBlock};

/// `len(types)` = lead pads + START + `rows*row_len` + pad_last + END (without building it).
pub fn block_len(n_llm_h: usize, n_llm_w: usize, start_pos: usize) -> usize {
    let (compress_pad, rows, row_len, pad_last) = dims(n_llm_h, n_llm_w, start_pos);
    compress_pad + 1 + rows * row_len + pad_last + 1
}

/// `(compress_pad, rows, row_len, pad_last)` of the reference.
fn dims(n_llm_h: usize, n_llm_w: usize, start_pos: usize) -> (usize, usize, usize, usize) {
    let compress_pad = COMPRESS_PAD_TO - 1 - start_pos % COMPRESS_PAD_TO;
    let rows = n_llm_h + n_llm_h % 2;
    let row_len = n_llm_w + 1;
    // Python: rows // 2 * row_len % 2 * 2, left to right.
    let pad_last = ((rows / 2) * row_len) % 2 * 2;
    (compress_pad, rows, row_len, pad_last)
}

/// Builds types/perm/rows of one image block. Grid position `t` (pairs of rows interleaved
/// column by column) maps to grid cell `order[t]` = `(2g + rem%2, rem/2)` with
/// `g = t / (2*row_len)`, `rem = t % (2*row_len)`: the reference's
/// `arange(rows*row_len).view(rows//2, 2, row_len).transpose(1, 2).reshape(-1)`.
pub fn build_image_block(n_llm_h: usize, n_llm_w: usize, start_pos: usize) -> ImageBlock {
    let (compress_pad, rows, row_len, pad_last) = dims(n_llm_h, n_llm_w, start_pos);
    let n_img = n_llm_h * n_llm_w;
    let len = compress_pad + 1 + rows * row_len + pad_last + 1;
    let mut types = Vec::with_capacity(len);
    let mut perm = Vec::with_capacity(n_img);
    types.extend(std::iter::repeat_n(IMAGE_PAD, compress_pad));
    types.push(IMAGE_START);
    for t in 0..rows * row_len {
        let (g, rem) = (t / (2 * row_len), t % (2 * row_len));
        let (r, c) = (2 * g + rem % 2, rem / 2);
        // grid_types = ([IMAGE]*w + [NEWLINE]) * h + [PAD]*(row_len*pad_h)
        if r >= n_llm_h {
            types.push(IMAGE_PAD);
        } else if c == n_llm_w {
            types.push(IMAGE_NEW_LINE);
        } else {
            types.push(IMAGE);
            perm.push((r * n_llm_w + c) as u32);
        }
    }
    types.extend(std::iter::repeat_n(IMAGE_PAD, pad_last));
    types.push(IMAGE_END);
    debug_assert_eq!(types.len(), len);
    // rows: IMAGE slot k -> perm[k]; a sentinel of type t -> n_img + t.
    let mut k = 0;
    let rows_idx = types
        .iter()
        .map(|&t| {
            if t == IMAGE {
                k += 1;
                perm[k - 1]
            } else {
                (n_img + t as usize) as u32
            }
        })
        .collect();
    ImageBlock { types, perm, rows: rows_idx }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: u8 = IMAGE_START;
    const P: u8 = IMAGE_PAD;
    const I: u8 = IMAGE;
    const NL: u8 = IMAGE_NEW_LINE;
    const E: u8 = IMAGE_END;

    /// A literal transcription of the reference: grid_types, order via the view/transpose,
    /// image_idx, perm = image_idx[order] filtered.
    fn reference(h: usize, w: usize, sp: usize) -> (Vec<u8>, Vec<u32>) {
        let compress_pad = 3 - sp % 4;
        let pad_h = h % 2;
        let rows = h + pad_h;
        let row_len = w + 1;
        let pad_last = rows / 2 * row_len % 2 * 2;
        let mut grid_types = Vec::new();
        for _ in 0..h {
            grid_types.extend(std::iter::repeat_n(I, w));
            grid_types.push(NL);
        }
        grid_types.extend(std::iter::repeat_n(P, row_len * pad_h));
        // view(rows/2, 2, row_len).transpose(1, 2): element [a][c][b] = a*2*row_len + b*row_len + c
        let mut order = Vec::new();
        for a in 0..rows / 2 {
            for c in 0..row_len {
                for b in 0..2 {
                    order.push(a * 2 * row_len + b * row_len + c);
                }
            }
        }
        let mut image_idx = vec![-1i64; rows * row_len];
        for r in 0..h {
            for c in 0..w {
                image_idx[r * row_len + c] = (r * w + c) as i64;
            }
        }
        let perm: Vec<u32> = order.iter().map(|&o| image_idx[o]).filter(|&v| v >= 0).map(|v| v as u32).collect();
        let mut types = vec![P; compress_pad];
        types.push(S);
        types.extend(order.iter().map(|&o| grid_types[o]));
        types.extend(std::iter::repeat_n(P, pad_last));
        types.push(E);
        (types, perm)
    }

    /// llama.cpp's `layout_idx` (L-clip set_input): row of [aligner ; start, end, newline, pad].
    fn llama_layout_idx(h: usize, w: usize) -> Vec<usize> {
        let rows = h + h % 2;
        let row_len = w + 1;
        let n_grid = h * w;
        (0..rows * row_len)
            .map(|t| {
                let g = t / (2 * row_len);
                let rem = t % (2 * row_len);
                let (c, r) = (rem / 2, 2 * g + rem % 2);
                if r >= h {
                    n_grid + 3
                } else if c == w {
                    n_grid + 2
                } else {
                    r * w + c
                }
            })
            .collect()
    }

    #[test]
    fn spec_examples() {
        let b = build_image_block(3, 2, 0);
        assert_eq!(b.types, vec![P, P, P, S, I, I, I, I, NL, NL, I, P, I, P, NL, P, E]);
        assert_eq!(b.perm, vec![0, 2, 1, 3, 4, 5]);
        let b = build_image_block(2, 2, 0);
        assert_eq!(b.types, vec![P, P, P, S, I, I, I, I, NL, NL, P, P, E]);
        assert_eq!(b.perm, vec![0, 2, 1, 3]);
        assert_eq!(b.rows, vec![5, 5, 5, 4, 0, 2, 1, 3, 7, 7, 5, 5, 8]);
    }

    #[test]
    fn brute_force_against_reference_and_llama() {
        for h in 1..=24 {
            for w in 1..=40 {
                let lidx = llama_layout_idx(h, w);
                for sp in 0..9 {
                    let b = build_image_block(h, w, sp);
                    let (types, perm) = reference(h, w, sp);
                    assert_eq!(b.types, types, "h={h} w={w} sp={sp}");
                    assert_eq!(b.perm, perm, "h={h} w={w} sp={sp}");
                    assert_eq!(b.types.len(), block_len(h, w, sp));
                    assert_eq!(b.rows.len(), b.types.len());
                    // START at a position ≡ 3 (mod 4) relative to start_pos.
                    let s = b.types.iter().position(|&t| t == S).unwrap();
                    assert_eq!((sp + s) % 4, 3);
                    let (_, rows, row_len, pad_last) = dims(h, w, sp);
                    assert_eq!((rows * row_len + pad_last) % 4, 0);
                    assert_eq!(b.types.len(), (3 - sp % 4) + 1 + rows * row_len + pad_last + 1);
                    // The grid part agrees with llama.cpp's layout_idx (its sentinel order
                    // is start, end, newline, pad; ours is start, pad, pad, newline, end).
                    let n = h * w;
                    let ours: Vec<usize> = b.rows[s + 1..s + 1 + rows * row_len]
                        .iter()
                        .map(|&r| r as usize)
                        .map(|r| match r.checked_sub(n) {
                            None => r,
                            Some(1) => n + 3,
                            Some(3) => n + 2,
                            Some(t) => panic!("unexpected sentinel type {t} inside the grid"),
                        })
                        .collect();
                    assert_eq!(ours, lidx, "h={h} w={w}");
                    // rows: IMAGE -> perm, others -> n + type.
                    let mut k = 0;
                    for (i, &t) in b.types.iter().enumerate() {
                        if t == I {
                            assert_eq!(b.rows[i], b.perm[k]);
                            k += 1;
                        } else {
                            assert_eq!(b.rows[i] as usize, n + t as usize);
                        }
                    }
                    assert_eq!(k, n);
                    let mut sorted = b.perm.clone();
                    sorted.sort();
                    assert_eq!(sorted, (0..n as u32).collect::<Vec<_>>());
                }
            }
        }
    }
}
