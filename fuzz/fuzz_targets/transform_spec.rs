//! Arbitrary text → `Transforms::parse` (the `ladle serve --transform` spec); a spec that
//! parses must print a canonical form that parses back to it, and must transform a small
//! image without panicking. Errors are fine; panics are bugs.
#![no_main]

use ladle_datasets::decode::RgbImage;
use ladle_datasets::transforms::{Transformer, Transforms};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(spec) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(transforms) = Transforms::parse(spec) else {
        return;
    };
    let again = Transforms::parse(&transforms.to_string()).expect("canonical form parses");
    assert_eq!(again, transforms);
    if transforms.size() > 512 {
        return;
    }
    let pixels: Vec<u8> = (0..9 * 7 * 3).map(|i| (i * 37 % 251) as u8).collect();
    let image = RgbImage {
        width: 9,
        height: 7,
        pixels: &pixels,
    };
    let mut out = vec![0u8; transforms.output_len()];
    let _ = Transformer::new(transforms).apply(image, 1, 2, 3, &mut out);
});
