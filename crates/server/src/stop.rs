//! Stop strings over streamed text: text is released as soon as no stop string can begin in
//! it; a tail that could still grow into one is held back until it does or cannot.

pub struct StopMatcher {
    stops: Vec<String>,
    held: String,
}

impl StopMatcher {
    pub fn new(stops: Vec<String>) -> Self {
        StopMatcher {
            stops: stops.into_iter().filter(|s| !s.is_empty()).collect(),
            held: String::new(),
        }
    }

    /// Adds text; returns what can be released and, when a stop string appeared, its index
    /// (the text released is then everything before it, and the matcher is spent).
    pub fn push(&mut self, text: &str) -> (String, Option<usize>) {
        self.held.push_str(text);
        if self.stops.is_empty() {
            return (std::mem::take(&mut self.held), None);
        }
        // The earliest stop string wins; among those starting together, the first listed.
        let hit = self
            .stops
            .iter()
            .enumerate()
            .filter_map(|(i, s)| self.held.find(s.as_str()).map(|p| (p, i)))
            .min();
        if let Some((pos, i)) = hit {
            let out = self.held[..pos].to_string();
            self.held.clear();
            return (out, Some(i));
        }
        let keep = self.partial_suffix_len();
        let cut = self.held.len() - keep;
        let out = self.held[..cut].to_string();
        self.held.drain(..cut);
        (out, None)
    }

    /// Releases whatever is still held (the generation ended without a stop string).
    pub fn finish(&mut self) -> String {
        std::mem::take(&mut self.held)
    }

    /// Length in bytes of the longest suffix of `held` that is a proper prefix of a stop
    /// string, cut at a character boundary.
    fn partial_suffix_len(&self) -> usize {
        let h = self.held.as_str();
        let mut best = 0;
        for s in &self.stops {
            let max = s.len().saturating_sub(1).min(h.len());
            for k in (best + 1..=max).rev() {
                let start = h.len() - k;
                if h.is_char_boundary(start) && s.as_bytes().starts_with(&h.as_bytes()[start..]) {
                    best = k;
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

    fn run(stops: &[&str], pieces: &[&str]) -> (String, Option<usize>) {
        let mut m = StopMatcher::new(stops.iter().map(|s| s.to_string()).collect());
        let mut out = String::new();
        for p in pieces {
            let (t, hit) = m.push(p);
            out += &t;
            if hit.is_some() {
                return (out, hit);
            }
        }
        out += &m.finish();
        (out, None)
    }

    #[test]
    fn stop_split_across_pieces_is_caught_and_not_emitted() {
        assert_eq!(
            run(&["END"], &["hello E", "N", "D world"]),
            ("hello ".into(), Some(0))
        );
    }

    #[test]
    fn near_miss_is_released() {
        assert_eq!(
            run(&["END"], &["hello E", "N", "x"]),
            ("hello ENx".into(), None)
        );
        assert_eq!(run(&["END"], &["hello EN"]), ("hello EN".into(), None));
    }

    #[test]
    fn earliest_stop_wins() {
        assert_eq!(run(&["b", "a"], &["xxab"]), ("xx".into(), Some(1)));
    }

    #[test]
    fn held_text_is_released_as_soon_as_it_cannot_match() {
        let mut m = StopMatcher::new(vec!["\n\n".into()]);
        assert_eq!(m.push("a\n").0, "a");
        assert_eq!(m.push("b").0, "\nb");
    }

    #[test]
    fn multibyte_text_is_cut_on_char_boundaries() {
        assert_eq!(run(&["éx"], &["aé", "é", "x"]), ("aé".into(), Some(0)));
    }
}
