//! What a consumer still needs (protocol version 13): a consumer that reads only part of an
//! epoch (a resumed one, a group's rank) declares, for a window of the feed's positions, the
//! set of dataset indices it still wants, so that the producer decodes only what some
//! consumer needs and lets the rest pass as holes ([`FLAG_HOLE`](crate::layout::FLAG_HOLE)).
//! The set is a bitmap over the dataset's `N` indices; ImageNet's 1.28 million take 160 KB,
//! more than a frame, so a declaration travels as [`Needs`](super::ClientMessage::Needs)
//! frames of at most [`MAX_FRAME`] bytes ([`NeedsFrame::split`]), gathered by the producer
//! with bounds against a hostile consumer ([`NeedsReceiver`]).
//!
//! Outside every window it declared, a consumer needs every sample: a declaration that is late
//! or never comes costs decodes, never a sample.

use serde::{Deserialize, Serialize};

use super::MAX_FRAME;
use crate::error::ProtocolError;

/// Bitmap words per frame: 16 hex digits each, well inside [`MAX_FRAME`] with the rest of the
/// frame (tag, numbers).
pub const WORDS_PER_FRAME: usize = (MAX_FRAME - 256) / 16;

/// One frame of a declaration.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NeedsFrame {
    /// Which declaration this frame belongs to (a new one replaces a partial one).
    pub id: u64,
    /// The window of the feed's positions (sequence numbers) it covers, `from..to`.
    pub from: u64,
    /// End of the window (exclusive).
    pub to: u64,
    /// The dataset's length `N`: bits `0..N` of the bitmap are meaningful.
    pub len: u64,
    /// Index of this frame's first word in the bitmap.
    pub offset: u64,
    /// The bitmap's words from `offset`, each as 16 hex digits (bit `i` of word `w` is index
    /// `64·w + i`).
    pub words: String,
}

/// A whole declaration: in positions `from..to`, the consumer needs the indices whose bit is
/// set in `words`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Declared {
    /// First position of the window.
    pub from: u64,
    /// End of the window (exclusive).
    pub to: u64,
    /// The bitmap over `0..N`.
    pub words: Vec<u64>,
}

impl NeedsFrame {
    /// The frames of declaration `id`: in `from..to`, the indices set in `words` (a bitmap
    /// over `0..len`).
    pub fn split(id: u64, from: u64, to: u64, len: u64, words: &[u64]) -> Vec<NeedsFrame> {
        let chunks: Vec<&[u64]> = if words.is_empty() {
            vec![&[]]
        } else {
            words.chunks(WORDS_PER_FRAME).collect()
        };
        chunks
            .into_iter()
            .enumerate()
            .map(|(k, chunk)| NeedsFrame {
                id,
                from,
                to,
                len,
                offset: (k * WORDS_PER_FRAME) as u64,
                words: chunk.iter().map(|w| format!("{w:016x}")).collect(),
            })
            .collect()
    }
}

/// The end of an open window ([`NeedsFrame::to`]): a skimming consumer needs its set
/// wherever the feed passes it, from the window's start on (protocol version 16).
pub const OPEN: u64 = u64::MAX;

/// Gathers a consumer's declaration frames; holds at most one bitmap of the feed's length.
#[derive(Debug)]
pub struct NeedsReceiver {
    len: u64,
    partial: Option<(NeedsFrame, Vec<u64>)>,
}

impl NeedsReceiver {
    /// A receiver for a feed of `len` samples.
    pub fn new(len: u64) -> Self {
        Self { len, partial: None }
    }

    /// Takes one frame; returns the declaration once its last frame came. A frame of another
    /// length, out of order, with a bad word or bits past the dataset's end is an error (the
    /// consumer broke the protocol).
    pub fn add(&mut self, frame: NeedsFrame) -> Result<Option<Declared>, ProtocolError> {
        let bad = |why: String| Err(ProtocolError::Malformed(format!("Needs: {why}")));
        if frame.len != self.len {
            return bad(format!(
                "a bitmap of {} indices for a feed of {}",
                frame.len, self.len
            ));
        }
        // `to == u64::MAX`: an open window, a skimmer's (protocol version 16), which needs
        // its set wherever the feed passes it from `from` on.
        if frame.to <= frame.from || (frame.to != OPEN && frame.to - frame.from > self.len) {
            return bad(format!(
                "window {}..{} is empty or longer than an epoch of {}",
                frame.from, frame.to, self.len
            ));
        }
        let total = usize::try_from(self.len.div_ceil(64))
            .map_err(|_| ProtocolError::Malformed("Needs: dataset too large".into()))?;
        let same = |p: &NeedsFrame| p.id == frame.id && p.from == frame.from && p.to == frame.to;
        let mut words = match self.partial.take() {
            Some((first, words)) if same(&first) => words,
            // A new declaration replaces a partial one; it must start at word 0.
            _ => Vec::with_capacity(total),
        };
        if frame.offset != words.len() as u64 {
            return bad(format!(
                "frame at word {} after {} words",
                frame.offset,
                words.len()
            ));
        }
        if frame.words.len() % 16 != 0 || words.len() + frame.words.len() / 16 > total {
            return bad(format!(
                "more words than the {total} of {} indices",
                self.len
            ));
        }
        for k in (0..frame.words.len()).step_by(16) {
            let word = frame
                .words
                .get(k..k + 16)
                .and_then(|hex| u64::from_str_radix(hex, 16).ok());
            match word {
                Some(word) => words.push(word),
                None => return bad("a word that is not 16 hex digits".into()),
            }
        }
        if words.len() < total {
            self.partial = Some((frame, words));
            return Ok(None);
        }
        let tail = self.len % 64;
        if tail != 0 && words.last().is_some_and(|w| w >> tail != 0) {
            return bad(format!("bits past the dataset's {} indices", self.len));
        }
        Ok(Some(Declared {
            from: frame.from,
            to: frame.to,
            words,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::ClientMessage;

    #[test]
    fn an_imagenet_set_travels_in_frames_under_the_limit_and_arrives_exact() {
        let n: u64 = 1_281_167;
        let mut words = vec![0u64; n.div_ceil(64) as usize];
        for i in (0..n).filter(|i| i % 7 == 3 || i % 1000 == 0) {
            words[(i / 64) as usize] |= 1 << (i % 64);
        }
        let frames = NeedsFrame::split(5, 100, 100 + n, n, &words);
        assert!(frames.len() > 1);
        let mut receiver = NeedsReceiver::new(n);
        let mut got = None;
        for frame in frames {
            let bytes = serde_json::to_vec(&ClientMessage::Needs(frame.clone())).unwrap();
            assert!(bytes.len() <= MAX_FRAME, "{} bytes", bytes.len());
            assert!(got.is_none(), "complete before its last frame");
            got = receiver.add(frame).unwrap();
        }
        let got = got.unwrap();
        assert_eq!((got.from, got.to), (100, 100 + n));
        assert_eq!(got.words, words);
    }

    #[test]
    fn a_receiver_refuses_frames_out_of_order_of_another_length_or_with_bits_past_the_end() {
        let n = 100u64;
        let words = [u64::MAX, (1 << 36) - 1];
        let frame = NeedsFrame::split(1, 0, n, n, &words).remove(0);
        assert!(NeedsReceiver::new(n).add(frame.clone()).unwrap().is_some());
        // Another length.
        assert!(NeedsReceiver::new(n + 1).add(frame.clone()).is_err());
        // Bits past index 99.
        let past = NeedsFrame::split(1, 0, n, n, &[u64::MAX, 1 << 36]).remove(0);
        assert!(NeedsReceiver::new(n).add(past).is_err());
        // A frame that does not start at word 0, a window longer than an epoch, garbage.
        let mut late = frame.clone();
        late.offset = 1;
        assert!(NeedsReceiver::new(n).add(late).is_err());
        let mut long = frame.clone();
        long.to = n + 1;
        assert!(NeedsReceiver::new(n).add(long).is_err());
        let mut garbage = frame.clone();
        garbage.words.replace_range(0..1, "z");
        assert!(NeedsReceiver::new(n).add(garbage).is_err());
        let mut extra = frame;
        extra.words.push_str("0000000000000000");
        assert!(NeedsReceiver::new(n).add(extra).is_err());
    }
}
