//! Arbitrary bytes → `Decoder::decode`; a decoded image is then augmented with the training
//! transform at 32×32 and the eval transform at 16×16. Errors are fine; panics are bugs.
#![no_main]

use ladle_datasets::transforms::{Transformer, Transforms};
use ladle_datasets::decode::Decoder;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let mut decoder = Decoder::new();
    let Ok(image) = decoder.decode(data) else {
        return;
    };
    assert_eq!(
        image.pixels.len(),
        image.width as usize * image.height as usize * 3,
        "decoded buffer does not match {}x{} RGB",
        image.width,
        image.height
    );
    for (transforms, seed) in [(Transforms::train(32), 1), (Transforms::eval(16), 0)] {
        let mut out = vec![0u8; transforms.output_len()];
        let _ = Transformer::new(transforms).apply(image, seed, 0, data.len() as u64, &mut out);
    }
});
