//! Arbitrary bytes → a feed's schema, as text (`Schema::from_str`, what `ladle.serve` sends)
//! and as the JSON ring layout a producer's `Welcome` carries (what a consumer must survive
//! from a hostile or broken producer). A schema that parses must print a text form that
//! parses back to it; a layout that is accepted must keep every region inside its file.
//! Errors are fine; panics are bugs.
#![no_main]

use ladle_ring::{RingLayout, Schema};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(text) = std::str::from_utf8(data)
        && let Ok(schema) = text.parse::<Schema>()
    {
        let again: Schema = schema.to_string().parse().expect("the text form parses");
        assert_eq!(again, schema);
        let _ = RingLayout::for_budget(1 << 20, schema);
    }
    if let Ok(sent) = serde_json::from_slice::<RingLayout>(data)
        && let Ok(layout) = RingLayout::new(sent.capacity, sent.schema)
    {
        let end = layout.regions().iter().map(|&(off, len)| off + len as u64).max();
        assert_eq!(end, Some(layout.file_len()));
    }
});
