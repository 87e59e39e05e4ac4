//! Turning sampled token bytes into text deltas: UTF-8 reassembly and stop strings.
//!
//! A token can end in the middle of a multi-byte character, and a stop string
//! can straddle several tokens. `TextStream` holds back exactly the bytes that
//! might still turn into a character or a stop match, so a client never sees a
//! broken character or the first half of a stop string.

/// Incremental text assembly for one sequence.
#[derive(Debug, Default)]
pub struct TextStream {
    /// Bytes of an incomplete UTF-8 character at the end of the last piece.
    partial: Vec<u8>,
    /// Decoded text not yet released because it may be the start of a stop string.
    held: String,
    stops: Vec<String>,
}

/// What pushing one token's bytes produced.
#[derive(Debug, PartialEq, Eq)]
pub enum Pushed {
    /// Text safe to emit now (possibly empty).
    Text(String),
    /// A stop string matched: emit this text (the part before the stop) and end.
    Stopped(String),
}

impl TextStream {
    /// Empty stop strings are ignored: they would match before any output.
    pub fn new(stops: &[String]) -> Self {
        TextStream {
            partial: Vec::new(),
            held: String::new(),
            stops: stops.iter().filter(|s| !s.is_empty()).cloned().collect(),
        }
    }

    /// Adds the bytes of one token piece.
    pub fn push(&mut self, bytes: &[u8]) -> Pushed {
        self.partial.extend_from_slice(bytes);
        let valid_up_to = match std::str::from_utf8(&self.partial) {
            Ok(text) => text.len(),
            Err(err) => match err.error_len() {
                // An incomplete character at the end: keep it for the next piece.
                None => err.valid_up_to(),
                // Bytes that can never become valid UTF-8: replace them so one
                // bad token cannot stall the stream forever.
                Some(_) => {
                    let lossy = String::from_utf8_lossy(&self.partial).into_owned();
                    self.partial.clear();
                    return self.release(&lossy);
                }
            },
        };
        let rest = self.partial.split_off(valid_up_to);
        let complete = std::mem::replace(&mut self.partial, rest);
        // `valid_up_to` marks a UTF-8 boundary, so this conversion cannot fail.
        let text = String::from_utf8_lossy(&complete).into_owned();
        self.release(&text)
    }

    /// Ends the stream: everything held back is released.
    pub fn finish(&mut self) -> String {
        let mut out = std::mem::take(&mut self.held);
        if !self.partial.is_empty() {
            out.push_str(&String::from_utf8_lossy(&self.partial));
            self.partial.clear();
        }
        out
    }

    fn release(&mut self, text: &str) -> Pushed {
        self.held.push_str(text);
        if let Some(at) = self.earliest_stop() {
            self.held.truncate(at);
            return Pushed::Stopped(std::mem::take(&mut self.held));
        }
        let keep = self.longest_stop_prefix_suffix();
        let emit_len = self.held.len() - keep;
        let tail = self.held.split_off(emit_len);
        Pushed::Text(std::mem::replace(&mut self.held, tail))
    }

    fn earliest_stop(&self) -> Option<usize> {
        self.stops.iter().filter_map(|stop| self.held.find(stop.as_str())).min()
    }

    /// Length of the longest suffix of `held` that is a proper prefix of a stop
    /// string, measured on a character boundary.
    fn longest_stop_prefix_suffix(&self) -> usize {
        let mut best = 0;
        for stop in &self.stops {
            let max = stop.len().saturating_sub(1).min(self.held.len());
            for len in (best + 1..=max).rev() {
                let start = self.held.len() - len;
                if self.held.is_char_boundary(start) && stop.starts_with(&self.held[start..]) {
                    best = len;
                    break;
                }
            }
        }
        best
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;

    /// Feeds pieces and returns (emitted text, whether a stop matched).
    fn run(stops: &[&str], pieces: &[&[u8]]) -> (String, bool) {
        let stops: Vec<String> = stops.iter().map(|s| s.to_string()).collect();
        let mut stream = TextStream::new(&stops);
        let mut out = String::new();
        for piece in pieces {
            match stream.push(piece) {
                Pushed::Text(text) => out.push_str(&text),
                Pushed::Stopped(text) => {
                    out.push_str(&text);
                    return (out, true);
                }
            }
        }
        out.push_str(&stream.finish());
        (out, false)
    }

    /// (stop strings, pieces) -> (emitted text, whether a stop matched)
    type Case<'a> = (&'a [&'a str], Vec<&'a [u8]>, (&'a str, bool));

    #[test]
    fn text_stream_cases() {
        let euro = "€".as_bytes();
        let cases: Vec<Case> = vec![
            (&[], vec![b"Hello", b" world"], ("Hello world", false)),
            // A character split over three tokens comes out whole.
            (&[], vec![&euro[..1], &euro[1..2], &euro[2..]], ("€", false)),
            // A stop string across tokens is cut and not leaked.
            (&["STOP"], vec![b"abc ST", b"OP def"], ("abc ", true)),
            // A held-back prefix that turns out not to be a stop is released.
            (&["STOP"], vec![b"abc ST", b"ART"], ("abc START", false)),
            // Held text is released at the end of the stream.
            (&["STOP"], vec![b"abc ST"], ("abc ST", false)),
            // The earliest of several stops wins.
            (&["b", "a"], vec![b"xxab"], ("xx", true)),
            // A stop made of a multi-byte character split across pieces.
            (&["€"], vec![b"5 ", &euro[..2], &euro[2..]], ("5 ", true)),
            // Invalid bytes become replacement characters instead of stalling.
            (&[], vec![b"a\xff", b"b"], ("a\u{fffd}b", false)),
            // Empty stop strings are ignored.
            (&[""], vec![b"ok"], ("ok", false)),
        ];
        for (stops, pieces, (text, stopped)) in cases {
            assert_eq!(run(stops, &pieces), (text.to_string(), stopped), "stops {stops:?}");
        }
    }

    #[test]
    fn stop_prefix_is_held_not_emitted() {
        let mut stream = TextStream::new(&["</s>".to_string()]);
        assert_eq!(stream.push(b"hi </"), Pushed::Text("hi ".to_string()));
        assert_eq!(stream.push(b"s>"), Pushed::Stopped(String::new()));
    }
}
