//! The progress bar drawn on stderr while a large checkpoint's weights load.

use std::io::Write;

use crate::model::LoadProgress;

/// Checkpoints smaller than this load in well under a second: no bar.
pub const LOAD_BAR_MIN_BYTES: u64 = 256 << 20;

/// Width of the bar in characters.
const BAR_WIDTH: usize = 30;

/// One line of the bar: `loading weights [#########.....................]  31%  2.4/7.7 GB`.
pub fn render(p: LoadProgress) -> String {
    let frac = if p.total_bytes == 0 { 1.0 } else { p.done_bytes.min(p.total_bytes) as f64 / p.total_bytes as f64 };
    let filled = (frac * BAR_WIDTH as f64).floor() as usize;
    // GB for real checkpoints, MB below one GB (the shipped model, FOVEA_PROGRESS=always)
    let (scale, unit) = if p.total_bytes >= 1_000_000_000 { (1e9, "GB") } else { (1e6, "MB") };
    format!(
        "loading weights [{}{}] {:>3}% {:.1}/{:.1} {unit}",
        "#".repeat(filled),
        ".".repeat(BAR_WIDTH - filled),
        (frac * 100.0).floor() as u32,
        p.done_bytes.min(p.total_bytes) as f64 / scale,
        p.total_bytes as f64 / scale
    )
}

/// Draws [`render`] on stderr, redrawn in place (`\r`) when the percentage changes, ended with a
/// newline when the load is done. Silent for checkpoints under [`LOAD_BAR_MIN_BYTES`] unless
/// `FOVEA_PROGRESS=always` (a diagnostic switch: the bar on any checkpoint).
pub struct LoadBar {
    always: bool,
    last_percent: Option<u32>,
}

impl LoadBar {
    pub fn new() -> Self {
        LoadBar { always: std::env::var("FOVEA_PROGRESS").is_ok_and(|v| v == "always"), last_percent: None }
    }

    /// Feed one report from the loader.
    pub fn update(&mut self, p: LoadProgress) {
        if let Some(frame) = self.frame(p) {
            let mut err = std::io::stderr().lock();
            // a closed stderr must not stop the load
            let _ = write!(err, "{frame}").and_then(|_| err.flush());
        }
    }

    /// What to write for one report: nothing under the size gate or when the percentage has not
    /// changed; else the bar after `\r`, with a newline once the load is done.
    fn frame(&mut self, p: LoadProgress) -> Option<String> {
        if p.total_bytes < LOAD_BAR_MIN_BYTES && !self.always {
            return None;
        }
        let percent =
            if p.total_bytes == 0 { 100 } else { (p.done_bytes.min(p.total_bytes) * 100 / p.total_bytes) as u32 };
        if self.last_percent == Some(percent) {
            return None;
        }
        self.last_percent = Some(percent);
        let end = if p.done_bytes >= p.total_bytes { "\n" } else { "" };
        Some(format!("\r{}{end}", render(p)))
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
    fn the_bar_fills_with_the_bytes_read() {
        assert_eq!(render(p(0, 77_000_000_000)), format!("loading weights [{}]   0% 0.0/77.0 GB", ".".repeat(30)));
        assert_eq!(
            render(p(38_500_000_000, 77_000_000_000)),
            format!("loading weights [{}{}]  50% 38.5/77.0 GB", "#".repeat(15), ".".repeat(15))
        );
        assert_eq!(
            render(p(77_000_000_000, 77_000_000_000)),
            format!("loading weights [{}] 100% 77.0/77.0 GB", "#".repeat(30))
        );
    }

    #[test]
    fn more_bytes_than_the_total_or_an_empty_checkpoint_show_a_full_bar() {
        assert_eq!(render(p(9, 4)), render(p(4, 4)));
        assert!(render(p(0, 0)).contains("100%"));
    }

    #[test]
    fn the_bar_draws_for_large_checkpoints_once_per_percent_and_ends_the_line() {
        let mut bar = LoadBar { always: false, last_percent: None };
        let small = LOAD_BAR_MIN_BYTES - 1;
        assert_eq!(bar.frame(p(0, small)), None, "small checkpoints load silently");
        let total = LOAD_BAR_MIN_BYTES * 4;
        assert!(bar.frame(p(0, total)).is_some_and(|f| f.starts_with('\r') && !f.ends_with('\n')));
        assert_eq!(bar.frame(p(1, total)), None, "same percentage: no redraw");
        assert!(bar.frame(p(total, total)).is_some_and(|f| f.ends_with("100% 1.1/1.1 GB\n")));
        let mut forced = LoadBar { always: true, last_percent: None };
        assert!(forced.frame(p(small, small)).is_some(), "FOVEA_PROGRESS=always draws any size");
    }

    #[test]
    fn checkpoints_under_a_gigabyte_count_in_megabytes() {
        assert!(render(p(2_500_000, 4_990_000)).ends_with(" 50% 2.5/5.0 MB"), "{}", render(p(2_500_000, 4_990_000)));
    }
}
