//! When a feed stops by itself ([`Lifetime`]): a while after its last consumer left, a while
//! after its start if nobody ever came, never while a driver holds it. The decision is pure
//! ([`Lifetime::expired`]); the feeder asks it whenever no consumer is attached, under the
//! members' lock, and the control server refuses a `Hello` once the feed has begun to stop
//! (`protocol::STOPPING`), so that a consumer is either admitted before the decision, which it
//! then prevents, or told to look for a new feed; never welcomed into one that is ending.

use std::path::PathBuf;
use std::time::Duration;

/// When a feed stops by itself; `Default`: never.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Lifetime {
    /// Stop once no consumer, handshake or holder has been there this long, after one came
    /// (`ladle serve --idle-timeout`, `--keep-alive`).
    pub idle: Option<Duration>,
    /// Stop this long after the start if no consumer or holder ever came (its starter died
    /// before joining: `ladle serve --orphan-timeout`).
    pub orphan: Option<Duration>,
    /// A file that keeps the feed while any process holds a shared `flock` on it (a driver's
    /// `ladle.feed(...)`); the kernel drops a dead holder's lock.
    pub hold: Option<PathBuf>,
}

impl Lifetime {
    /// Why the feed stops now, if it does: it has been quiet (no consumer, no handshake, no
    /// holder) for `quiet`, and someone `came` before (else it is an orphan).
    pub(crate) fn expired(&self, quiet: Duration, came: bool) -> Option<String> {
        let (limit, what) = if came {
            (
                self.idle?,
                "after its last consumer left (idle timeout, keep-alive)",
            )
        } else {
            (
                self.orphan?,
                "after its start, and no consumer ever came (orphan timeout)",
            )
        };
        (quiet >= limit).then(|| format!("stopping {:.1} s {what}", limit.as_secs_f64()))
    }

    /// Whether a driver holds the feed now.
    pub(crate) fn held(&self) -> bool {
        self.hold.as_deref().is_some_and(|path| {
            ladle_os::process::is_held_shared(path).unwrap_or_else(|e| {
                tracing::warn!(hold = %path.display(), "cannot look at the hold file: {e}");
                false
            })
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: Duration = Duration::from_secs(1);

    #[test]
    fn an_orphan_stops_after_its_timeout_and_a_fed_feed_after_its_idle_timeout() {
        let lifetime = Lifetime {
            idle: Some(2 * S),
            orphan: Some(5 * S),
            hold: None,
        };
        // Nobody ever came: the orphan timeout, from the start.
        assert_eq!(lifetime.expired(4 * S, false), None);
        assert!(lifetime.expired(5 * S, false).unwrap().contains("orphan"));
        // Someone came and left: the idle timeout, from when the last one left.
        assert_eq!(lifetime.expired(S, true), None);
        assert!(lifetime.expired(2 * S, true).unwrap().contains("idle"));
    }

    #[test]
    fn without_timeouts_a_feed_never_stops_by_itself() {
        let never = Lifetime::default();
        assert_eq!(never.expired(Duration::MAX, false), None);
        assert_eq!(never.expired(Duration::MAX, true), None);
        // `--keep-alive` alone keeps today's rule: nothing happens before a first consumer.
        let keep_alive = Lifetime {
            idle: Some(S),
            ..Lifetime::default()
        };
        assert_eq!(keep_alive.expired(Duration::MAX, false), None);
        assert!(keep_alive.expired(S, true).is_some());
    }

    #[test]
    fn a_hold_file_is_held_while_a_shared_lock_is_taken() {
        let dir = tempfile::tempdir().unwrap();
        let hold = dir.path().join("k.hold");
        let lifetime = Lifetime {
            hold: Some(hold.clone()),
            ..Lifetime::default()
        };
        assert!(!lifetime.held());
        let driver = ladle_os::process::hold_shared(&hold).unwrap();
        assert!(lifetime.held());
        drop(driver);
        assert!(!lifetime.held());
    }
}
