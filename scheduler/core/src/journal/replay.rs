//! Reading a journal back: each line a [`Record`], or a [`Damage`] the daemon works around
//! instead of guessing (the daemon's `Journal::replay` reads its file with [`parse`]).

use crate::job::JobId;

use super::Record;

/// One line of a journal as read back.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum Entry {
    /// A record that parses.
    Record(Record),
    /// A line (or the start of one) that does not.
    Damaged(Damage),
}

/// A journal line that does not parse: what can still be read of it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Damage {
    /// 1-based line number.
    pub line: usize,
    /// The record's kind (`submitted`, `finished`, …), when its start is readable.
    pub event: Option<String>,
    /// The job it was about, when its start is readable (every record names one job).
    pub id: Option<JobId>,
    /// Its length, bytes.
    pub bytes: usize,
    /// Its first bytes, lossily as text, for people.
    pub excerpt: String,
}

/// Longest excerpt of a damaged line kept for messages.
const EXCERPT: usize = 120;

impl Damage {
    /// What can be read of the damaged bytes `text` on line `line`: a record starts
    /// `{"event":"NAME","id":N` (serde writes the tag first and every record's job id next).
    pub(super) fn read(line: usize, text: &[u8]) -> Self {
        let (event, id) = read_head(text);
        let shown = &text[..text.len().min(EXCERPT)];
        Self {
            line,
            event,
            id,
            bytes: text.len(),
            excerpt: String::from_utf8_lossy(shown).into_owned(),
        }
    }

    /// What losing this record means, for a torn last line (a write the daemon died in,
    /// or one that failed, so nobody was told it had happened).
    pub fn what_was_lost(&self) -> String {
        let job = self
            .id
            .map_or_else(|| "an unknown job".to_owned(), |id| format!("job {id}"));
        match self.event.as_deref() {
            Some("submitted") => format!(
                "the submission of {job}: never acknowledged, so not queued (if its client \
                 saw no job id, submit it again)"
            ),
            Some("starting") => {
                format!(
                    "the start of an attempt of {job}: it never began, and is run from the queue"
                )
            }
            Some("started") => format!(
                "the process id of {job}'s attempt: it is read back from the attempt's claim file"
            ),
            Some("measured") => format!("a measurement of {job}'s peak: it is measured again"),
            Some("finished") => format!(
                "the end of {job}'s attempt: it is read again from the attempt's status file \
                 (no status: interrupted, not rerun)"
            ),
            Some("requeued") => {
                format!("the requeue of {job} after its attempt ended: it stays ended, not rerun")
            }
            Some("cancelled") => {
                format!("the cancel of {job}: never acknowledged, so it stays queued")
            }
            Some("released") => {
                format!("the release of {job}: never acknowledged, so it stays held")
            }
            Some(other) => format!("a `{other}` record of {job}"),
            None => format!(
                "{} bytes that do not say which record they began",
                self.bytes
            ),
        }
    }
}

/// The event name and job id at the start of a (possibly partial) record.
fn read_head(text: &[u8]) -> (Option<String>, Option<JobId>) {
    const HEAD: &[u8] = br#"{"event":""#;
    let Some(rest) = text.strip_prefix(HEAD) else {
        return (None, None);
    };
    let Some(end) = rest.iter().position(|&b| b == b'"') else {
        return (None, None);
    };
    let name = &rest[..end];
    if name.is_empty() || !name.iter().all(|b| b.is_ascii_lowercase() || *b == b'_') {
        return (None, None);
    }
    let event = String::from_utf8_lossy(name).into_owned();
    let id = rest[end + 1..]
        .strip_prefix(br#","id":"#)
        .and_then(|digits| {
            let n = digits.iter().take_while(|b| b.is_ascii_digit()).count();
            // A number cut off by the end of the bytes may be missing digits.
            (n > 0 && n < digits.len()).then(|| &digits[..n])
        })
        .and_then(|d| std::str::from_utf8(d).ok()?.parse().ok());
    (Some(event), id)
}

/// A journal's bytes, read back.
#[derive(Debug, Default)]
#[non_exhaustive]
pub struct Parsed {
    /// Every complete line, in order: records, and damaged lines in their place.
    pub entries: Vec<Entry>,
    /// Bytes up to the end of the last complete line.
    pub good_len: usize,
    /// A last line without its newline: a write that never finished.
    pub torn: Option<Damage>,
}

/// Reads every line of `bytes`. A complete line that does not parse is a [`Damage`]; when a
/// record that parses follows its damaged start on the same line (a fragment left by a
/// failed write, then the next record), that record is kept after the damage.
pub fn parse(bytes: &[u8]) -> Parsed {
    let mut parsed = Parsed::default();
    let mut start = 0usize;
    let mut line_no = 0usize;
    while start < bytes.len() {
        line_no += 1;
        let Some(end) = bytes[start..].iter().position(|&b| b == b'\n') else {
            parsed.torn = Some(Damage::read(line_no, &bytes[start..]));
            break;
        };
        let line = &bytes[start..start + end];
        start += end + 1;
        parsed.good_len = start;
        if line.iter().all(u8::is_ascii_whitespace) {
            continue;
        }
        match serde_json::from_slice::<Record>(line) {
            Ok(record) => parsed.entries.push(Entry::Record(record)),
            Err(_) => {
                let (damaged, salvaged) = salvage(line);
                parsed
                    .entries
                    .push(Entry::Damaged(Damage::read(line_no, damaged)));
                if let Some(record) = salvaged {
                    parsed.entries.push(Entry::Record(record));
                }
            }
        }
    }
    parsed
}

/// Splits a damaged line into its damaged start and a whole record after it, if one
/// follows.
fn salvage(line: &[u8]) -> (&[u8], Option<Record>) {
    const HEAD: &[u8] = br#"{"event":""#;
    for at in 1..line.len() {
        if line[at..].starts_with(HEAD)
            && let Ok(record) = serde_json::from_slice::<Record>(&line[at..])
        {
            return (&line[..at], Some(record));
        }
    }
    (line, None)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_start_of_a_torn_record_names_its_event_and_job() {
        let d = Damage::read(3, br#"{"event":"submitted","id":12,"spec":{"comm"#);
        assert_eq!(d.event.as_deref(), Some("submitted"));
        assert_eq!(d.id, Some(12));
        assert!(
            d.what_was_lost().contains("job 12"),
            "{}",
            d.what_was_lost()
        );
        // Digits cut off by the tear may be missing: not read as a (wrong) id.
        let cut = Damage::read(3, br#"{"event":"finished","id":12"#);
        assert_eq!((cut.event.as_deref(), cut.id), (Some("finished"), None));
        let garbage = Damage::read(1, b"\x00\xff{\"id\":4");
        assert_eq!((garbage.event, garbage.id), (None, None));
    }

    #[test]
    fn a_record_written_after_a_fragment_on_the_same_line_is_kept_after_the_damage() {
        let bytes = b"{\"event\":\"cancelled\",\"id\":1}\n{\"event\":\"submitted\",\"id\":7,\"sp{\"event\":\"cancelled\",\"id\":2}\n";
        let parsed = parse(bytes);
        assert!(parsed.torn.is_none());
        assert_eq!(parsed.good_len, bytes.len());
        assert_eq!(parsed.entries.len(), 3);
        assert!(matches!(&parsed.entries[1], Entry::Damaged(d) if d.line == 2 && d.id == Some(7)));
        assert_eq!(
            parsed.entries[2],
            Entry::Record(Record::Cancelled { id: 2 })
        );
    }
}
