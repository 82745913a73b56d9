//! Class names that do not fit a `Welcome` frame (protocol version 10): the producer splits
//! them into `ClassNames` frames sent before the `Welcome` ([`ClassNameFrames`]); the
//! consumer gathers them, bounded against a hostile producer, and puts them back into the
//! `Welcome` ([`ClassNamesReceiver`]).

use super::{MAX_FRAME, ServerMessage, Welcome};
use crate::error::ProtocolError;

/// The most bytes of class names a consumer takes (64 MiB: ImageNet-21k's 21 841 names are
/// about 0.5 MB; a producer that sends more is refused, not believed).
pub const MAX_CLASS_NAME_BYTES: usize = 64 << 20;

/// Room left in each frame for what surrounds the names (the message's tag and `total`).
const FRAME_OVERHEAD: usize = 64;

/// How a feed's class names travel to each consumer, decided once when the feed starts.
#[derive(Debug, Clone)]
pub struct ClassNameFrames {
    /// The `ClassNames` frames sent before every `Welcome`; empty when the names fit inside.
    pub frames: Vec<ServerMessage>,
    /// Whether the `Welcome` carries the names itself.
    pub inline: bool,
}

impl ClassNameFrames {
    /// Plans the frames for `template`, a `Welcome` of this feed (its per-consumer numbers
    /// at their widest, `u64::MAX`): the names inside it if the whole fits one frame, else in
    /// `ClassNames` frames of at most [`MAX_FRAME`] bytes each. Fails, naming what is too
    /// big, when the `Welcome` does not fit even without its names or one name alone does
    /// not fit a frame: then no consumer could ever join.
    pub fn plan(template: &Welcome) -> Result<Self, ProtocolError> {
        let size = |m: &ServerMessage| serde_json::to_vec(m).map_or(usize::MAX, |b| b.len());
        if size(&ServerMessage::Welcome(template.clone())) <= MAX_FRAME {
            return Ok(Self {
                frames: Vec::new(),
                inline: true,
            });
        }
        let mut bare = template.clone();
        let names = std::mem::take(&mut bare.dataset.class_names);
        let bare_len = size(&ServerMessage::Welcome(bare));
        if bare_len > MAX_FRAME {
            return Err(ProtocolError::Malformed(format!(
                "the feed's Welcome is {bare_len} bytes without its class names, above the \
                 {MAX_FRAME}-byte frame: shorten the dataset's path or the transform"
            )));
        }
        let total = names.len() as u64;
        let mut frames = Vec::new();
        let mut chunk: Vec<String> = Vec::new();
        let mut chunk_len = 0;
        for (i, name) in names.into_iter().enumerate() {
            // A name's JSON text (quotes, escapes) and its comma.
            let len = serde_json::to_vec(&name).map_or(usize::MAX, |b| b.len()) + 1;
            if len + FRAME_OVERHEAD > MAX_FRAME {
                return Err(ProtocolError::Malformed(format!(
                    "class name {i} is {len} bytes as JSON, above what one {MAX_FRAME}-byte \
                     frame holds"
                )));
            }
            if chunk_len + len + FRAME_OVERHEAD > MAX_FRAME {
                frames.push(ServerMessage::ClassNames {
                    total,
                    names: std::mem::take(&mut chunk),
                });
                chunk_len = 0;
            }
            chunk_len += len;
            chunk.push(name);
        }
        if !chunk.is_empty() {
            frames.push(ServerMessage::ClassNames {
                total,
                names: chunk,
            });
        }
        Ok(Self {
            frames,
            inline: false,
        })
    }
}

/// Gathers `ClassNames` frames before a `Welcome`, refusing a producer that sends more than
/// it announced, changes its total, or sends more than [`MAX_CLASS_NAME_BYTES`].
#[derive(Debug, Default)]
pub struct ClassNamesReceiver {
    total: Option<u64>,
    names: Vec<String>,
    bytes: usize,
}

impl ClassNamesReceiver {
    /// Takes one `ClassNames` frame's contents.
    pub fn add(&mut self, total: u64, names: Vec<String>) -> Result<(), ProtocolError> {
        if self.total.is_some_and(|t| t != total) {
            return Err(ProtocolError::Malformed(format!(
                "ClassNames said {total} names in all after saying {}",
                self.total.unwrap_or_default()
            )));
        }
        self.total = Some(total);
        self.bytes = names
            .iter()
            .fold(self.bytes, |n, name| n.saturating_add(name.len()));
        if self.bytes > MAX_CLASS_NAME_BYTES {
            return Err(ProtocolError::Malformed(format!(
                "more than {MAX_CLASS_NAME_BYTES} bytes of class names"
            )));
        }
        if self.names.len() as u64 + names.len() as u64 > total {
            return Err(ProtocolError::Malformed(format!(
                "more class names than the {total} announced"
            )));
        }
        self.names.extend(names);
        Ok(())
    }

    /// Puts the gathered names into `welcome`: all that were announced must have come, and a
    /// `Welcome` that follows `ClassNames` must carry none of its own.
    pub fn finish(self, welcome: &mut Welcome) -> Result<(), ProtocolError> {
        let Some(total) = self.total else {
            return Ok(());
        };
        if self.names.len() as u64 != total {
            return Err(ProtocolError::Malformed(format!(
                "{} of {total} class names came before the Welcome",
                self.names.len()
            )));
        }
        if !welcome.dataset.class_names.is_empty() {
            return Err(ProtocolError::Malformed(
                "a Welcome with class names of its own after ClassNames".into(),
            ));
        }
        welcome.dataset.class_names = self.names;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::{DatasetInfo, FeedIdentity};
    use crate::{RingLayout, Schema};

    fn welcome(names: Vec<String>) -> Welcome {
        Welcome {
            version: super::super::PROTOCOL_VERSION,
            consumer_id: u64::MAX,
            layout: RingLayout::for_budget(1 << 20, "x: u8[4]".parse::<Schema>().unwrap()).unwrap(),
            dataset: DatasetInfo {
                len: 100,
                class_names: names,
                source: "/data".into(),
            },
            start_seq: u64::MAX,
            identity: FeedIdentity {
                source: "/data".into(),
                len: 100,
                classes: String::new(),
                seed: 0,
                transform: String::new(),
                schema: String::new(),
                files: String::new(),
                sizes: String::new(),
            },
        }
    }

    #[test]
    fn few_names_ride_in_the_welcome_and_many_come_before_it_in_frames_that_fit() {
        let few = ClassNameFrames::plan(&welcome(vec!["cat".into(), "dog".into()])).unwrap();
        assert!(few.inline && few.frames.is_empty());
        // 25 000 names of up to 40 bytes, some that JSON escapes to six times their length.
        let names: Vec<String> = (0..25_000)
            .map(|i| match i % 3 {
                0 => format!("n{i:08}_{}", "x".repeat(30)),
                1 => format!("\u{1}\u{2}\"{i}"),
                _ => format!("クラス{i}"),
            })
            .collect();
        let many = ClassNameFrames::plan(&welcome(names.clone())).unwrap();
        assert!(!many.inline && many.frames.len() > 1);
        let mut receiver = ClassNamesReceiver::default();
        for frame in &many.frames {
            let body = serde_json::to_vec(frame).unwrap();
            assert!(body.len() <= MAX_FRAME, "{}", body.len());
            let ServerMessage::ClassNames { total, names } = frame.clone() else {
                panic!("{frame:?}");
            };
            receiver.add(total, names).unwrap();
        }
        let mut bare = welcome(Vec::new());
        receiver.finish(&mut bare).unwrap();
        assert_eq!(bare.dataset.class_names, names);
    }

    #[test]
    fn a_welcome_too_big_without_its_names_or_a_name_bigger_than_a_frame_is_refused() {
        let mut big = welcome(vec!["a".repeat(MAX_FRAME); 2]);
        let err = ClassNameFrames::plan(&big).unwrap_err().to_string();
        assert!(err.contains("class name 0"), "{err}");
        big.dataset.class_names = vec!["a".into(); 10_000];
        big.identity.transform = "t".repeat(MAX_FRAME);
        let err = ClassNameFrames::plan(&big).unwrap_err().to_string();
        assert!(err.contains("without its class names"), "{err}");
    }

    #[test]
    fn a_producer_sending_more_or_fewer_names_than_it_said_or_too_many_bytes_is_refused() {
        let mut r = ClassNamesReceiver::default();
        r.add(3, vec!["a".into(), "b".into()]).unwrap();
        assert!(r.add(4, vec!["c".into()]).is_err(), "a changed total");
        let mut r = ClassNamesReceiver::default();
        r.add(2, vec!["a".into(), "b".into()]).unwrap();
        assert!(r.add(2, vec!["c".into()]).is_err(), "more than announced");
        let mut r = ClassNamesReceiver::default();
        r.add(3, vec!["a".into()]).unwrap();
        assert!(
            r.finish(&mut welcome(Vec::new())).is_err(),
            "fewer than announced"
        );
        let mut r = ClassNamesReceiver::default();
        r.add(1, vec!["a".into()]).unwrap();
        assert!(
            r.finish(&mut welcome(vec!["b".into()])).is_err(),
            "names twice"
        );
        let mut r = ClassNamesReceiver::default();
        let huge = "a".repeat(MAX_FRAME);
        let err = (0..=MAX_CLASS_NAME_BYTES / MAX_FRAME)
            .map(|_| r.add(u64::MAX, vec![huge.clone()]))
            .find_map(Result::err);
        assert!(err.is_some(), "unbounded names");
        // Nothing came: the Welcome stands as it is.
        ClassNamesReceiver::default()
            .finish(&mut welcome(vec!["x".into()]))
            .unwrap();
    }
}
