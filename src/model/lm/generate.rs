//! Token generation on top of [`LmModel::prefill`] / [`LmModel::decode`]: greedy at temperature
//! 0, otherwise temperature → top-k → top-p sampling from a seeded ChaCha8 generator
//! (`rand_chacha` documents its output as value-stable across platforms and crate versions, so a
//! seed gives the same ids everywhere).

use rand_chacha::ChaCha8Rng;
use rand_chacha::rand_core::{RngCore, SeedableRng};

use std::time::{Duration, Instant};

use crate::backend::Backend;
use crate::error::{Error, Result};
use crate::model::PrefillProgress;

use super::{LmCache, LmInput, LmModel, Prefill};

/// How the next token is picked from a row of logits.
#[derive(Clone, Debug, PartialEq)]
pub struct Sampling {
    /// 0 = greedy (argmax; the lowest id wins a tie).
    pub temperature: f32,
    /// Keep the `k` most likely tokens (0 = no limit).
    pub top_k: usize,
    /// Keep the smallest set of most likely tokens whose probability reaches `p` (1 = no limit).
    pub top_p: f32,
    pub seed: u64,
}

impl Default for Sampling {
    fn default() -> Self {
        Sampling { temperature: 0.0, top_k: 0, top_p: 1.0, seed: 0 }
    }
}

impl Sampling {
    /// Reject settings that have no meaning (negative or NaN temperature, top-p outside (0, 1]).
    pub fn validate(&self) -> Result<()> {
        if !(self.temperature >= 0.0 && self.temperature.is_finite()) {
            return Err(Error::Invalid(format!("temperature {} must be a finite number >= 0", self.temperature)));
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return Err(Error::Invalid(format!("top-p {} must be in (0, 1]", self.top_p)));
        }
        Ok(())
    }
}

/// The sampler's random source: ChaCha8 seeded with `seed_from_u64`.
#[derive(Clone, Debug)]
pub struct Rng(ChaCha8Rng);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(ChaCha8Rng::seed_from_u64(seed))
    }
    /// Uniform in [0, 1) with 53 random bits (the top bits of one u64, so the conversion is ours
    /// and as stable as the generator).
    pub fn next_f64(&mut self) -> f64 {
        (self.0.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// Index of the largest logit (the lowest index on ties; NaN never wins).
pub fn argmax(logits: &[f32]) -> usize {
    logits.iter().enumerate().fold((0, f32::NEG_INFINITY), |m, (i, &x)| if x > m.1 { (i, x) } else { m }).0
}

/// Pick the next token from one row of logits.
pub fn pick(logits: &[f32], s: &Sampling, rng: &mut Rng) -> usize {
    if s.temperature == 0.0 || logits.len() <= 1 {
        return argmax(logits);
    }
    // candidates by descending logit (stable: lower id first among equals)
    let mut order: Vec<usize> = (0..logits.len()).filter(|&i| !logits[i].is_nan()).collect();
    if order.is_empty() {
        return 0;
    }
    order.sort_by(|&a, &b| logits[b].total_cmp(&logits[a]).then(a.cmp(&b)));
    if s.top_k > 0 {
        order.truncate(s.top_k);
    }
    let t = s.temperature as f64;
    let top = logits[order[0]] as f64;
    let mut probs: Vec<f64> = order.iter().map(|&i| ((logits[i] as f64 - top) / t).exp()).collect();
    let sum: f64 = probs.iter().sum();
    probs.iter_mut().for_each(|p| *p /= sum);
    if s.top_p < 1.0 {
        let mut acc = 0.0;
        let mut keep = probs.len();
        for (n, p) in probs.iter().enumerate() {
            acc += p;
            if acc >= s.top_p as f64 {
                keep = n + 1;
                break;
            }
        }
        probs.truncate(keep);
        order.truncate(keep);
    }
    let total: f64 = probs.iter().sum();
    let mut u = rng.next_f64() * total;
    for (n, p) in probs.iter().enumerate() {
        if u < *p {
            return order[n];
        }
        u -= p;
    }
    order[probs.len() - 1]
}

/// Why generation ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StopReason {
    MaxTokens,
    Eos,
}

/// What [`generate`] produced, and where its time went.
#[derive(Clone, Debug)]
pub struct Generation {
    pub ids: Vec<i32>,
    pub stop: StopReason,
    /// Wall time of the prefill (up to the first token's logits on the host).
    pub prefill: Duration,
    /// Wall time of the decode steps (`ids.len() − 1` of them).
    pub decode: Duration,
}

/// Prefill `input` (with merged `embeds` if given), then decode up to `max_tokens` tokens,
/// calling `on_token` with each as it is produced. An EOS id in `eos` is emitted, then stops.
/// `on_prefill` sees the prefill's progress chunk by chunk.
#[allow(clippy::too_many_arguments)]
pub fn generate<B: Backend>(
    model: &LmModel<B>,
    b: &B,
    input: &LmInput,
    embeds: Option<B::Tensor>,
    max_tokens: usize,
    eos: &[i32],
    sampling: &Sampling,
    on_prefill: &mut dyn FnMut(PrefillProgress),
    on_token: &mut dyn FnMut(i32) -> Result<()>,
) -> Result<Generation> {
    let mut g = Generator::new(model, b, input, embeds, max_tokens, eos, sampling)?;
    // the prefill's progress: before its first chunk, after each one (waiting for a GPU lane's
    // queued work when there are several, so the counts are finished tokens), and at its end
    let mut prefill = g.prefill_progress();
    if let Some(p) = prefill {
        on_prefill(p);
    }
    while let Some(step) = g.step(model, b)? {
        match step {
            Step::Chunk => {
                if let Some(p) = g.prefill_progress() {
                    b.sync()?;
                    on_prefill(p);
                }
            }
            Step::Token(tok) => {
                if let Some(p) = prefill.take() {
                    on_prefill(PrefillProgress { done_tokens: p.total_tokens, ..p });
                }
                on_token(tok)?;
            }
        }
    }
    g.finish()
}

/// What one [`Generator::step`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    /// A prefill chunk that is not the prompt's last.
    Chunk,
    /// The prompt's last chunk, or a decode step: the token it produced.
    Token(i32),
}

/// Where a [`Generator`] stands.
enum Phase<B: Backend> {
    /// Chunks of the prompt still to run.
    Prefill(Prefill<B>),
    /// The cache after the prompt and every token but `last`, the token to feed next.
    Decode {
        cache: LmCache<B>,
        last: i32,
    },
    Done(StopReason),
}

/// One sequence's generation as a state machine: each [`Generator::step`] is one prefill chunk
/// or one decode step, so a caller can check for cancellation between steps and interleave
/// several sequences (each with its own cache). [`generate`] runs one to the end.
pub struct Generator<B: Backend> {
    phase: Phase<B>,
    rng: Rng,
    sampling: Sampling,
    max_tokens: usize,
    eos: Vec<i32>,
    ids: Vec<i32>,
    prefill: Duration,
    decode: Duration,
}

impl<B: Backend> Generator<B> {
    /// A generation of at most `max_tokens` tokens after `input` (with merged `embeds` if
    /// given); nothing runs until the first [`Generator::step`].
    pub fn new(
        model: &LmModel<B>,
        b: &B,
        input: &LmInput,
        embeds: Option<B::Tensor>,
        max_tokens: usize,
        eos: &[i32],
        sampling: &Sampling,
    ) -> Result<Self> {
        sampling.validate()?;
        let phase = if max_tokens == 0 {
            Phase::Done(StopReason::MaxTokens)
        } else {
            Phase::Prefill(model.start_prefill(b, input, embeds, b.prefill_chunk())?)
        };
        Ok(Generator {
            phase,
            rng: Rng::new(sampling.seed),
            sampling: sampling.clone(),
            max_tokens,
            eos: eos.to_vec(),
            ids: Vec::with_capacity(max_tokens),
            prefill: Duration::ZERO,
            decode: Duration::ZERO,
        })
    }

    /// Where the prompt's prefill stands while it runs; `None` once it has finished (or when
    /// nothing is to be generated).
    pub fn prefill_progress(&self) -> Option<PrefillProgress> {
        match &self.phase {
            Phase::Prefill(p) => Some(p.progress()),
            _ => None,
        }
    }

    /// Run one prefill chunk or one decode step; `None` once generation has stopped (EOS,
    /// emitted as the last token, or `max_tokens`).
    pub fn step(&mut self, model: &LmModel<B>, b: &B) -> Result<Option<Step>> {
        let t = Instant::now();
        let (logits, cache) = match std::mem::replace(&mut self.phase, Phase::Done(StopReason::MaxTokens)) {
            Phase::Done(stop) => {
                self.phase = Phase::Done(stop);
                return Ok(None);
            }
            Phase::Prefill(mut p) => {
                let hidden = model
                    .prefill_step(b, &mut p, None)?
                    .ok_or_else(|| Error::Invalid("prefill of an empty prompt".into()))?;
                if !p.is_done() {
                    self.phase = Phase::Prefill(p);
                    self.prefill += t.elapsed();
                    return Ok(Some(Step::Chunk));
                }
                let logits = b.download(&model.last_logits(b, &hidden)?)?.into_f32("logits")?;
                self.prefill += t.elapsed();
                (logits, p.cache)
            }
            Phase::Decode { mut cache, last } => {
                let logits = b.download(&model.decode(b, &mut cache, last)?)?.into_f32("logits")?;
                self.decode += t.elapsed();
                (logits, cache)
            }
        };
        Ok(Some(self.take_token(&logits, cache)))
    }

    /// Pick the next token from `logits` `[vocab]` and move to the phase it leads to.
    fn take_token(&mut self, logits: &[f32], cache: LmCache<B>) -> Step {
        let tok = pick(logits, &self.sampling, &mut self.rng) as i32;
        self.ids.push(tok);
        self.phase = if self.eos.contains(&tok) {
            Phase::Done(StopReason::Eos)
        } else if self.ids.len() >= self.max_tokens {
            Phase::Done(StopReason::MaxTokens)
        } else {
            Phase::Decode { cache, last: tok }
        };
        Step::Token(tok)
    }

    /// One step of each generator, as [`Generator::step`] takes it, except that the decode steps
    /// of all generators that are decoding run as one forward ([`LmModel::decode_batch`]); prefill
    /// chunks run one after another. Result i is generator i's; when the batched forward fails,
    /// every generator in it fails with the error's message (one failure fails the whole batch;
    /// each stops, as after a failed step).
    pub fn step_batch(gens: &mut [&mut Generator<B>], model: &LmModel<B>, b: &B) -> Vec<Result<Option<Step>>> {
        let mut results: Vec<Option<Result<Option<Step>>>> = gens.iter().map(|_| None).collect();
        let mut decoding = Vec::new();
        for (i, g) in gens.iter_mut().enumerate() {
            match std::mem::replace(&mut g.phase, Phase::Done(StopReason::MaxTokens)) {
                Phase::Decode { cache, last } => decoding.push((i, cache, last)),
                other => {
                    g.phase = other;
                    results[i] = Some(g.step(model, b));
                }
            }
        }
        if !decoding.is_empty() {
            let t = Instant::now();
            let ids: Vec<i32> = decoding.iter().map(|(_, _, last)| *last).collect();
            let mut caches: Vec<&mut LmCache<B>> = decoding.iter_mut().map(|(_, cache, _)| cache).collect();
            let logits = model
                .decode_batch(b, &mut caches, &ids)
                .and_then(|l| b.download(&l))
                .and_then(|l| l.into_f32("logits"));
            let vocab = model.config().vocab_size;
            match logits {
                Ok(logits) => {
                    // every sequence in the batch waited for the whole step
                    let step = t.elapsed();
                    for (row, (i, cache, _)) in decoding.into_iter().enumerate() {
                        let g = &mut gens[i];
                        g.decode += step;
                        results[i] = Some(Ok(Some(g.take_token(&logits[row * vocab..(row + 1) * vocab], cache))));
                    }
                }
                Err(e) => {
                    let msg = format!("a decode step of {} sequences: {e}", ids.len());
                    for (i, _, _) in decoding {
                        results[i] = Some(Err(Error::Invalid(msg.clone())));
                    }
                }
            }
        }
        results.into_iter().map(|r| r.expect("every generator took a step")).collect()
    }

    /// Why generation stopped, once it has.
    pub fn stopped(&self) -> Option<StopReason> {
        match self.phase {
            Phase::Done(stop) => Some(stop),
            _ => None,
        }
    }

    /// The tokens produced so far.
    pub fn ids(&self) -> &[i32] {
        &self.ids
    }

    /// Wall time of the prefill chunks and of the decode steps so far.
    pub fn times(&self) -> (Duration, Duration) {
        (self.prefill, self.decode)
    }

    /// The result of a generation that has stopped; an error if it is still running.
    pub fn finish(self) -> Result<Generation> {
        match self.phase {
            Phase::Done(stop) => Ok(Generation { ids: self.ids, stop, prefill: self.prefill, decode: self.decode }),
            _ => Err(Error::Invalid("generation has not stopped yet".into())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn greedy_sampling_topk1_and_seeds() {
        let logits = [0.1f32, 2.0, 1.9, -1.0];
        let mut rng = Rng::new(7);
        assert_eq!(pick(&logits, &Sampling::default(), &mut rng), 1);
        let k1 = Sampling { temperature: 5.0, top_k: 1, ..Sampling::default() };
        assert!((0..50).all(|_| pick(&logits, &k1, &mut rng) == 1));
        let hot = Sampling { temperature: 100.0, seed: 3, ..Sampling::default() };
        let draw = |seed| {
            let mut r = Rng::new(seed);
            (0..64).map(|_| pick(&logits, &hot, &mut r)).collect::<Vec<_>>()
        };
        assert_eq!(draw(3), draw(3));
        assert_ne!(draw(3), draw(4));
        assert!((0..4).all(|i| draw(3).contains(&i)), "a hot distribution visits every token");
        // top-p small enough keeps only the best token
        let p = Sampling { temperature: 1.0, top_p: 0.01, ..Sampling::default() };
        assert!((0..50).all(|_| pick(&logits, &p, &mut rng) == 1));
    }
}
