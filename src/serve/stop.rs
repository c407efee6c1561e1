//! `stop` sequences over streamed text: generation ends where one first appears, and neither it
//! nor anything after it reaches the client. Text that might be the start of a stop sequence is
//! held back until the next piece shows whether it is, so a stream never sends text that a
//! later piece would have cut.

/// Filters the pieces of one completion.
#[derive(Debug)]
pub struct StopFilter {
    stops: Vec<String>,
    /// Text received but not yet released: a suffix that is a proper prefix of a stop sequence.
    held: String,
}

impl StopFilter {
    /// `stops` must be non-empty strings (the request parser refuses empty ones).
    pub fn new(stops: Vec<String>) -> Self {
        StopFilter { stops, held: String::new() }
    }

    /// Take the next piece: the text now safe to send, and whether a stop sequence was found
    /// (the text is then everything before it, and the completion is over).
    pub fn push(&mut self, piece: &str) -> (String, bool) {
        self.held.push_str(piece);
        if let Some(at) = self.stops.iter().filter_map(|s| self.held.find(s.as_str())).min() {
            self.held.truncate(at);
            return (std::mem::take(&mut self.held), true);
        }
        // the longest tail of `held` that a stop sequence starts with (shorter than that sequence,
        // or it would have been found above); the text before it can go
        let keep = self
            .stops
            .iter()
            .flat_map(|s| (1..s.len()).filter(|&k| s.is_char_boundary(k)).map(move |k| &s[..k]))
            .filter(|prefix| self.held.ends_with(prefix))
            .map(str::len)
            .max()
            .unwrap_or(0);
        let rest = self.held.split_off(self.held.len() - keep);
        (std::mem::replace(&mut self.held, rest), false)
    }

    /// The text still held when the completion ends without a stop sequence.
    pub fn finish(self) -> String {
        self.held
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Feed `pieces`; the text sent and whether a stop sequence ended it.
    fn run(stops: &[&str], pieces: &[&str]) -> (String, bool) {
        let mut f = StopFilter::new(stops.iter().map(|s| s.to_string()).collect());
        let mut out = String::new();
        for p in pieces {
            let (text, stopped) = f.push(p);
            out += &text;
            if stopped {
                return (out, true);
            }
        }
        out += &f.finish();
        (out, false)
    }

    #[test]
    fn no_stop_passes_everything() {
        assert_eq!(run(&[], &["a ", "large", " circle"]), ("a large circle".into(), false));
        assert_eq!(run(&["zz"], &["a ", "large", " circle"]), ("a large circle".into(), false));
    }

    #[test]
    fn stops_inside_a_piece_and_across_pieces() {
        assert_eq!(run(&["circle"], &["a large circle and"]), ("a large ".into(), true));
        assert_eq!(run(&["circle"], &["a large ci", "rc", "le and more"]), ("a large ".into(), true));
        // the earliest of several sequences wins
        assert_eq!(run(&["and", "large"], &["a large circle and"]), ("a ".into(), true));
    }

    #[test]
    fn held_text_is_released_when_it_cannot_start_a_stop() {
        let mut f = StopFilter::new(vec!["circle".into()]);
        assert_eq!(f.push("a ci"), ("a ".into(), false));
        assert_eq!(f.push("ty"), ("city".into(), false));
        assert_eq!(f.push(" c"), (" ".into(), false));
        assert_eq!(f.finish(), "c");
    }

    #[test]
    fn multibyte_prefixes_split_on_char_boundaries() {
        assert_eq!(run(&["ée"], &["café", "e!"]), ("caf".into(), true));
        assert_eq!(run(&["éx"], &["café", "e!"]), ("cafée!".into(), false));
    }
}
