//! The Vision-Exp language-side behaviours (vision.md §5): the embedding merge (§5.1) and the
//! image-span attention visibility (§5.3). `bias_vl` routing (§5.2) lives in the MoE of
//! [`super::LmModel`] (image rows are the ids ≥ vocab).

use crate::backend::{Backend, DeviceTensor, HostTensor};
use crate::error::{Error, Result};

use super::LmModel;

/// Block token types (vision.md §2.3): sentinel id = vocab + type.
pub const IMAGE_START: i32 = 0;
pub const IMAGE_PAD: i32 = 1;
pub const IMAGE: i32 = 2;
pub const IMAGE_NEW_LINE: i32 = 3;
pub const IMAGE_END: i32 = 4;
/// `vision_max_n_token` of the released config (the §5.3 clamp).
pub const MAX_IMAGE_TOKENS: usize = 384;

/// Inclusive raw-key bounds `(lo, hi)` per query for a prefill from position 0 (vision.md §5.3,
/// R model.py `get_image_visible` + `get_window_topk_idxs_visible`): tokens from START through
/// END see the whole span both ways and their window reaches back to the span start; everything
/// else (text, lead PADs) keeps the causal window of `window` keys.
pub fn visible_bounds(ids: &[i32], vocab: usize, window: usize, max_image_tokens: usize) -> Vec<(usize, usize)> {
    let s = ids.len();
    let (start_id, end_id) = (vocab as i64 + IMAGE_START as i64, vocab as i64 + IMAGE_END as i64);
    // running START/END counts, last START at or before i, first END at or after i
    let mut left = vec![0usize; s];
    let mut right = vec![0usize; s];
    let (mut n_start, mut n_end, mut last_start) = (0usize, 0usize, 0usize);
    let mut valid = vec![false; s];
    for i in 0..s {
        let id = ids[i] as i64;
        if id == start_id {
            n_start += 1;
            last_start = i;
        }
        if id == end_id {
            n_end += 1;
        }
        valid[i] = n_start > n_end || id == end_id;
        if valid[i] {
            left[i] = (i - last_start).min(max_image_tokens - 1);
        }
    }
    let mut next_end = s;
    for i in (0..s).rev() {
        if ids[i] as i64 == end_id {
            next_end = i;
        }
        if valid[i] {
            right[i] = (next_end - i).min(max_image_tokens);
        }
    }
    let width = s.min(window + max_image_tokens);
    (0..s)
        .map(|i| {
            let left_add = left[i].saturating_sub(window - 1);
            let lo = i.saturating_sub(window - 1).saturating_sub(left_add);
            let hi = (i + right[i]).min(lo + width - 1).min(s - 1);
            (lo, hi)
        })
        .collect()
}

/// One image's block in a prompt, for [`LmModel::merge_images`].
pub struct ImageBlock<'a, B: Backend> {
    /// Position of the block's first token (its first lead PAD, or START).
    pub start: usize,
    /// The block's token types (vision.md §2.2), lead PADs included.
    pub types: &'a [i32],
    /// The aligner row feeding each IMAGE slot, in slot order.
    pub perm: &'a [usize],
    /// The image's aligner rows `[n_llm_h·n_llm_w, d]`, row-major.
    pub aligner: &'a B::Tensor,
}

impl<B: Backend> LmModel<B> {
    /// §5.1 merge: embed `ids` (sentinel ids give zero rows), then replace the rows of each
    /// image's block with `sentinels[types]`, its IMAGE slots taking its own `aligner[perm]` in
    /// order. The ids of a block must be its sentinel ids `vocab + type` (they decide the
    /// image-span visibility and the `bias_vl` routing) and blocks must not overlap. → `[T, d]`.
    pub fn merge_images(&self, b: &B, ids: &[i32], images: &[ImageBlock<'_, B>]) -> Result<B::Tensor> {
        let sentinels = self
            .sentinels
            .as_ref()
            .ok_or_else(|| Error::tensor("image_start", "checkpoint has no image sentinel rows"))?;
        let (t, vocab) = (ids.len(), self.cfg.vocab_size);
        // source rows: [h (T) | sentinels (5) | image 0's aligner rows | image 1's | ...]
        let mut idx: Vec<i32> = (0..t as i32).collect();
        let mut merged = vec![false; t];
        let mut first_row = t + 5;
        for (n, img) in images.iter().enumerate() {
            let (start, end) = (img.start, img.start + img.types.len());
            if end > t {
                return Err(Error::Invalid(format!("image {n}: block {start}..{end} exceeds the {t}-token prompt")));
            }
            let n_rows = img.aligner.rows();
            let n_slots = img.types.iter().filter(|&&ty| ty == IMAGE).count();
            if n_slots != img.perm.len() || img.perm.iter().any(|&p| p >= n_rows) {
                return Err(Error::Invalid(format!(
                    "image {n}: {n_slots} IMAGE slots, {} perm entries for {n_rows} aligner rows",
                    img.perm.len()
                )));
            }
            let mut next = img.perm.iter();
            for (k, &ty) in img.types.iter().enumerate() {
                let pos = start + k;
                if !(IMAGE_START..=IMAGE_END).contains(&ty) {
                    return Err(Error::Invalid(format!("image {n}: block type {ty} at slot {k} (expected 0..=4)")));
                }
                if ids[pos] as i64 != vocab as i64 + ty as i64 {
                    return Err(Error::Invalid(format!(
                        "image {n}: position {pos} holds id {}, not the block's sentinel id {} (vocab {vocab} + type {ty})",
                        ids[pos],
                        vocab as i64 + ty as i64
                    )));
                }
                if std::mem::replace(&mut merged[pos], true) {
                    return Err(Error::Invalid(format!("image {n}: its block overlaps another at position {pos}")));
                }
                idx[pos] = match ty {
                    IMAGE => (first_row + *next.next().expect("counted above")) as i32,
                    _ => (t + ty as usize) as i32,
                };
            }
            first_row += n_rows;
        }
        let h = self.embed(b, ids)?;
        let src = images.iter().try_fold(b.concat_rows(&h, sentinels)?, |src, img| b.concat_rows(&src, img.aligner))?;
        b.gather_rows(&src, &b.upload(&HostTensor::i32([t], idx)?)?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ds4_attention_bounds_case() {
        // antirez/ds4 check_attention_bounds: vocab 100, window 4, positions 10..19 =
        // [text, PAD, START, IMAGE×5, END, text] after 10 text tokens.
        let mut ids: Vec<i32> = (0..10).map(|i| 3 + i).collect();
        ids.extend([5, 101, 100, 102, 102, 102, 102, 102, 104, 7]);
        let b = visible_bounds(&ids, 100, 4, MAX_IMAGE_TOKENS);
        let want = [(7, 10), (8, 11), (9, 18), (10, 18), (11, 18), (12, 18), (12, 18), (12, 18), (12, 18), (16, 19)];
        assert_eq!(&b[10..], &want);
        for (i, &(lo, hi)) in b[..10].iter().enumerate() {
            assert_eq!((lo, hi), ((i + 1).saturating_sub(4), i));
        }
    }

    #[test]
    fn two_spans_see_only_themselves_both_ways() {
        // fixtures/gen/lm/test_vision_ext.py TWO_SPANS (the reference transcription gives the same):
        // window 4, vocab 100, [t, t, START, IMAGE, END, PAD, START, IMAGE, IMAGE, END, t]
        let ids = [1, 2, 100, 102, 104, 101, 100, 102, 102, 104, 3];
        let b = visible_bounds(&ids, 100, 4, MAX_IMAGE_TOKENS);
        let want = [(0, 0), (0, 1), (0, 4), (0, 4), (1, 4), (2, 5), (3, 9), (4, 9), (5, 9), (6, 9), (7, 10)];
        assert_eq!(b, want);
    }
}
