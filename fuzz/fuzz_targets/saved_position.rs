//! Arbitrary bytes as a saved consumer position → `SavedPosition::decode` and, as a consumer
//! of a 1 000-sample feed loads it, `SavedPosition::decode_for`; a position that decodes must
//! encode back to bytes that decode to the same position. Errors are fine; panics (and huge
//! allocations the bytes cannot justify) are bugs. `fuzz/run.sh` seeds it with real positions.
#![no_main]

use ladle_consumer::position::SavedPosition;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(position) = SavedPosition::decode_for(data, 1_000) {
        assert_eq!(position.delivered.len(), 1_000);
    }
    if let Ok(position) = SavedPosition::decode(data) {
        let again =
            SavedPosition::decode(&position.encode()).expect("a re-encoded position decodes");
        assert_eq!(again, position);
    }
});
