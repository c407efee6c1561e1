//! Progress on stderr through `indicatif`: bytes, rate and time left while a large checkpoint's
//! weights load, and a bar for long prefills. Both draw to indicatif's stderr target, which
//! draws nothing when stderr is not a terminal (`ProgressDrawTarget::is_hidden`), so logs and
//! pipes stay clean.

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

use crate::model::LoadProgress;

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

/// A bar for a prefill of `tokens` prompt tokens: the caller advances it with
/// [`ProgressBar::inc`] per chunk and ends it with [`ProgressBar::finish_and_clear`].
pub fn prefill_bar(tokens: u64) -> ProgressBar {
    bar(tokens, PREFILL_TEMPLATE, "prefill")
}

/// Feeds the loader's reports to a byte bar, created at the first report of a checkpoint of at
/// least [`LOAD_BAR_MIN_BYTES`] (any size with `FOVEA_PROGRESS=always`, a diagnostic switch),
/// and finished once every byte is read.
pub struct LoadBar {
    always: bool,
    bar: Option<ProgressBar>,
}

impl LoadBar {
    pub fn new() -> Self {
        LoadBar { always: std::env::var("FOVEA_PROGRESS").is_ok_and(|v| v == "always"), bar: None }
    }

    /// Feed one report from the loader.
    pub fn update(&mut self, p: LoadProgress) {
        if p.total_bytes < LOAD_BAR_MIN_BYTES && !self.always {
            return;
        }
        let bar = self.bar.get_or_insert_with(|| bar(p.total_bytes, LOAD_TEMPLATE, "loading weights"));
        bar.set_position(p.done_bytes.min(p.total_bytes));
        if p.done_bytes >= p.total_bytes && !bar.is_finished() {
            bar.finish();
        }
    }
}

impl Default for LoadBar {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(done: u64, total: u64) -> LoadProgress {
        LoadProgress { done_bytes: done, total_bytes: total }
    }

    #[test]
    fn the_bar_exists_only_for_large_checkpoints_and_follows_the_bytes_read() {
        let mut bar = LoadBar { always: false, bar: None };
        let small = LOAD_BAR_MIN_BYTES - 1;
        bar.update(p(0, small));
        bar.update(p(small, small));
        assert!(bar.bar.is_none(), "small checkpoints load silently");
        let total = LOAD_BAR_MIN_BYTES * 4;
        let mut bar = LoadBar { always: false, bar: None };
        bar.update(p(0, total));
        bar.update(p(total / 2, total));
        let b = bar.bar.clone().expect("a large checkpoint gets a bar");
        assert_eq!((b.position(), b.length()), (total / 2, Some(total)));
        assert!(!b.is_finished());
        bar.update(p(total + 9, total));
        assert_eq!(b.position(), total, "more bytes than the total show a full bar");
        assert!(b.is_finished(), "the bar ends once every byte is read");
        let mut forced = LoadBar { always: true, bar: None };
        forced.update(p(small, small));
        assert!(forced.bar.is_some(), "FOVEA_PROGRESS=always draws any size");
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
            assert!(prefill_bar(10).is_hidden());
        }
    }
}
