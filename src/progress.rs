//! Progress on stderr through `indicatif`: bytes, rate and time left while a large checkpoint's
//! weights load, and tokens, rate and time left while a long prompt prefills. Both draw to
//! indicatif's stderr target, which draws nothing when stderr is not a terminal
//! (`ProgressDrawTarget::is_hidden`), so logs and pipes stay clean.

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

use crate::model::{LoadProgress, PrefillProgress};
use crate::pipeline::Progress;

/// Checkpoints smaller than this load in well under a second: no bar.
pub const LOAD_BAR_MIN_BYTES: u64 = 256 << 20;

/// `loading weights [####......] 2.41 GiB/77.00 GiB 1.20 GiB/s 1m 02s left`
const LOAD_TEMPLATE: &str = "{msg} [{bar:30}] {binary_bytes}/{binary_total_bytes} {binary_bytes_per_sec} {eta} left";
/// `prefill [####......] 12288/65536 tokens 3120.4/s 17s left`
const PREFILL_TEMPLATE: &str = "{msg} [{bar:30}] {pos}/{len} tokens {per_sec} {eta} left";

/// A bar of `total` units on stderr in one of the templates above (hidden when stderr is not a
/// terminal).
fn bar(total: u64, template: &str, msg: &'static str) -> ProgressBar {
    let style =
        ProgressStyle::with_template(template).unwrap_or_else(|_| ProgressStyle::default_bar()).progress_chars("#>.");
    ProgressBar::with_draw_target(Some(total), ProgressDrawTarget::stderr()).with_style(style).with_message(msg)
}

/// Feeds a generation's reports to two bars, each created at its first report, and only when
/// it will move: the load bar for a checkpoint of at least [`LOAD_BAR_MIN_BYTES`], finished
/// once every byte is read; the prefill bar for a prompt of more than one chunk (the prefill
/// reports once per chunk), cleared once every token is in, before the generated text streams
/// out. `FOVEA_PROGRESS=always` (a diagnostic switch) draws both for any size.
pub struct Bars {
    always: bool,
    load: Option<ProgressBar>,
    prefill: Option<ProgressBar>,
}

impl Bars {
    pub fn new() -> Self {
        Bars { always: std::env::var("FOVEA_PROGRESS").is_ok_and(|v| v == "always"), load: None, prefill: None }
    }

    /// Feed one report.
    pub fn update(&mut self, p: Progress) {
        match p {
            Progress::Load(p) => self.load(p),
            Progress::Prefill(p) => self.prefill(p),
        }
    }

    fn load(&mut self, p: LoadProgress) {
        if p.total_bytes < LOAD_BAR_MIN_BYTES && !self.always {
            return;
        }
        let bar = self.load.get_or_insert_with(|| bar(p.total_bytes, LOAD_TEMPLATE, "loading weights"));
        bar.set_position(p.done_bytes.min(p.total_bytes));
        if p.done_bytes >= p.total_bytes && !bar.is_finished() {
            bar.finish();
        }
    }

    fn prefill(&mut self, p: PrefillProgress) {
        if p.chunks < 2 && !self.always {
            return;
        }
        let total = p.total_tokens as u64;
        let bar = self.prefill.get_or_insert_with(|| bar(total, PREFILL_TEMPLATE, "prefill"));
        bar.set_position((p.done_tokens as u64).min(total));
        if p.done_tokens >= p.total_tokens && !bar.is_finished() {
            bar.finish_and_clear();
        }
    }
}

impl Default for Bars {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load(done: u64, total: u64) -> Progress {
        Progress::Load(LoadProgress { done_bytes: done, total_bytes: total })
    }
    fn prefill(done: usize, total: usize, chunks: usize) -> Progress {
        Progress::Prefill(PrefillProgress { done_tokens: done, total_tokens: total, chunks })
    }
    fn quiet() -> Bars {
        Bars { always: false, load: None, prefill: None }
    }

    #[test]
    fn the_load_bar_exists_only_for_large_checkpoints_and_follows_the_bytes_read() {
        let mut bars = quiet();
        let small = LOAD_BAR_MIN_BYTES - 1;
        bars.update(load(0, small));
        bars.update(load(small, small));
        assert!(bars.load.is_none(), "small checkpoints load silently");
        let total = LOAD_BAR_MIN_BYTES * 4;
        let mut bars = quiet();
        bars.update(load(0, total));
        bars.update(load(total / 2, total));
        let b = bars.load.clone().expect("a large checkpoint gets a bar");
        assert_eq!((b.position(), b.length()), (total / 2, Some(total)));
        assert!(!b.is_finished());
        bars.update(load(total + 9, total));
        assert_eq!(b.position(), total, "more bytes than the total show a full bar");
        assert!(b.is_finished(), "the bar ends once every byte is read");
        let mut forced = Bars { always: true, ..quiet() };
        forced.update(load(small, small));
        assert!(forced.load.is_some(), "FOVEA_PROGRESS=always draws any size");
    }

    #[test]
    fn the_prefill_bar_exists_only_for_prompts_of_several_chunks_and_follows_the_tokens() {
        let mut bars = quiet();
        bars.update(prefill(0, 300, 1));
        bars.update(prefill(300, 300, 1));
        assert!(bars.prefill.is_none(), "a one-chunk prompt prefills silently");
        let mut bars = quiet();
        bars.update(prefill(0, 1300, 3));
        bars.update(prefill(512, 1300, 3));
        let b = bars.prefill.clone().expect("a prompt of several chunks gets a bar");
        assert_eq!((b.position(), b.length()), (512, Some(1300)));
        assert!(!b.is_finished());
        bars.update(prefill(1300, 1300, 3));
        assert!(b.is_finished(), "the bar ends once every token is in");
        assert!(bars.load.is_none(), "the prefill does not start a load bar");
        let mut forced = Bars { always: true, ..quiet() };
        forced.update(prefill(0, 7, 1));
        assert!(forced.prefill.is_some(), "FOVEA_PROGRESS=always draws any prompt");
    }

    #[test]
    fn the_templates_parse() {
        // a template indicatif refuses would silently fall back to the default bar
        for t in [LOAD_TEMPLATE, PREFILL_TEMPLATE] {
            assert!(ProgressStyle::with_template(t).is_ok(), "{t}");
        }
    }

    #[test]
    fn bars_are_hidden_when_stderr_is_not_a_terminal() {
        // under the test harness stderr is captured or piped: not a terminal
        use std::io::IsTerminal;
        if !std::io::stderr().is_terminal() {
            assert!(bar(10, PREFILL_TEMPLATE, "prefill").is_hidden());
        }
    }
}
