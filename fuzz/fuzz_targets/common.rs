//! Shared by the dataset-reader targets: a per-process scratch directory and the
//! read + label + decode + augment loop over an opened dataset.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use ladle_datasets::Dataset;
use ladle_datasets::transforms::Transforms;
use ladle_datasets::pipeline::SampleProcessor;

/// Samples looked at per input, so that one input cannot take unbounded time.
pub const MAX_SAMPLES: u64 = 64;

/// A directory of this process's own under the system temp dir (`$TMPDIR`; `run.sh` points
/// it at a directory it removes afterwards), created on first use.
pub fn scratch_dir(target: &str) -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let dir = std::env::temp_dir().join(format!(
            "ladle-fuzz-{target}-{}-{:x}",
            std::process::id(),
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos())
        ));
        std::fs::create_dir_all(&dir).expect("create the fuzz scratch directory");
        dir
    })
}

/// Reads, labels and processes (train augmentation at 32) up to [`MAX_SAMPLES`] samples of
/// `dataset`, also asking for one index past the end. Errors are fine; panics are bugs.
pub fn exercise(dataset: &dyn Dataset) {
    let _ = dataset.class_names();
    let _ = dataset.problems().iter().map(ToString::to_string).count();
    let augment = Transforms::train(32);
    let mut out = vec![0u8; augment.output_len()];
    let mut processor = SampleProcessor::new(augment, 0);
    let mut scratch = Vec::new();
    let len = dataset.len();
    for index in (0..len.min(MAX_SAMPLES)).chain([len]) {
        let _ = dataset.location(index);
        let _ = dataset.label(index);
        let _ = dataset.read(index, &mut scratch, &Default::default());
        if let Err(error) = processor.process(dataset, index, 0, &mut out) {
            let _ = error.to_string();
        }
    }
}
