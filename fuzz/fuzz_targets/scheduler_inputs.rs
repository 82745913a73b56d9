//! Arbitrary bytes through the scheduler's parsers of outside input: the first byte picks
//! one, the rest is its input. 0: a socket request frame (`protocol::read_frame`); 1: a
//! trace CSV (`sim::trace::parse`); 2: a journal file (`Journal::open`), then one append.
//! Errors are fine; panics are bugs.
#![no_main]

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use ladle_scheduler::journal::{Journal, Record};
use ladle_scheduler::protocol::{self, Request};
use ladle_scheduler::sim::trace;
use libfuzzer_sys::fuzz_target;

fn scratch() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let dir = std::env::temp_dir().join(format!("ladle-fuzz-scheduler-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("create the fuzz scratch directory");
        dir
    })
}

fuzz_target!(|data: &[u8]| {
    let Some((&which, input)) = data.split_first() else {
        return;
    };
    match which % 3 {
        0 => {
            let _ = protocol::read_frame::<Request>(input, Path::new("fuzz"));
        }
        1 => {
            let _ = trace::parse(&String::from_utf8_lossy(input));
        }
        _ => {
            let path = scratch().join("journal.jsonl");
            std::fs::write(&path, input).expect("write the journal");
            if let Ok((mut journal, _records)) = Journal::open(&path) {
                let _ = journal.append(&Record::Cancelled { id: 1 });
            }
        }
    }
});
