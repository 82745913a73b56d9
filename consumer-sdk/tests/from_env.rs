//! `Consumer::connect_from_env` and the default name, as a run of `ladle sweep` sees them:
//! `LADLE_SOCKET` and `LADLE_RUN` in the environment.
//!
//! The environment is global to the process, so this test binary holds exactly one test,
//! which sets and removes the variables itself; the other test binaries never touch them
//! (the parsing of the values is unit-tested in `config.rs` without the environment).

#![allow(clippy::unwrap_used)] // tests fail loudly by design

mod support;

use ladle_consumer::prelude::*;
use ladle_consumer::{RUN_ENV, SOCKET_ENV};
use support::{Behaviour, TestProducer};

/// Sets (`Some`) or removes (`None`) an environment variable.
fn set_env(name: &str, value: Option<&std::ffi::OsStr>) {
    // SAFETY: this binary runs one test, on one thread; the only other threads (the test
    // producer's and its watchdog) never read or write the environment, so nothing reads it
    // while it changes.
    unsafe {
        match value {
            Some(value) => std::env::set_var(name, value),
            None => std::env::remove_var(name),
        }
    }
}

#[test]
fn a_run_joins_the_feed_named_by_ladle_socket_under_its_ladle_run_name() {
    assert_eq!((SOCKET_ENV, RUN_ENV), ("LADLE_SOCKET", "LADLE_RUN"));
    let config = || ConsumerConfig {
        batch_size: 7,
        ..ConsumerConfig::default()
    };

    // Not a run of a feed: unset, or set empty, is a typed error naming the variable.
    set_env(RUN_ENV, None);
    for socket in [None, Some("".as_ref())] {
        set_env(SOCKET_ENV, socket);
        let err = Consumer::connect_from_env(config()).unwrap_err();
        assert!(
            matches!(
                err,
                ConnectError::NoSocket {
                    variable: "LADLE_SOCKET"
                }
            ),
            "{err:?}"
        );
        assert!(err.to_string().contains("LADLE_SOCKET"), "{err}");
    }
    assert_eq!(
        ConsumerConfig::default().name,
        format!("consumer-{}", std::process::id())
    );

    // A run: the socket and the name come from the environment.
    const LEN: u64 = 50;
    let producer = TestProducer::start(Behaviour::serve(LEN, 3));
    set_env(SOCKET_ENV, Some(producer.socket().as_os_str()));
    set_env(RUN_ENV, Some("lr-0.1".as_ref()));
    let consumer = Consumer::connect_from_env(config()).unwrap();
    assert_eq!(consumer.socket(), producer.socket());
    assert_eq!(consumer.config().name, "lr-0.1");
    assert_eq!(consumer.dataset().len, LEN);
    let mut seen: Vec<u64> = Vec::new();
    for batch in consumer.epoch() {
        seen.extend_from_slice(batch.unwrap().indices());
    }
    seen.sort_unstable();
    assert_eq!(seen, (0..LEN).collect::<Vec<_>>());
}
