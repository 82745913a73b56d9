//! `ladle dataset inspect`: open a dataset, decode every sample once, name the bad files.

use std::ops::ControlFlow;
use std::path::PathBuf;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use serde::Serialize;

use crate::dataset::{Dataset, Format, LeftOut};
use crate::error::PipelineError;
use crate::limits::SampleLimits;
use crate::pipeline::{SampleProcessor, for_each_parallel};
use crate::transforms::Transforms;

/// One sample that could not be used, and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct BadSample {
    /// The file, `shard.tar:member` or `batch.bin#record`.
    pub location: String,
    /// The error, as text.
    pub error: String,
}

/// What [`inspect`] found.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct InspectReport {
    /// The detected format.
    pub format: Format,
    /// The dataset's path (in JSON as [`crate::names`] text: a path that is not UTF-8 keeps
    /// its bytes as `\xNN`).
    #[serde(serialize_with = "crate::names::serialize_path")]
    pub path: PathBuf,
    /// Samples in the index (bad samples found while indexing are not counted).
    pub samples: u64,
    /// Number of classes.
    pub classes: usize,
    /// Class names.
    pub class_names: Vec<String>,
    /// Samples that decoded.
    pub decoded: u64,
    /// Bytes of RGB pixels decoded.
    pub decoded_bytes: u64,
    /// Smallest decoded width × height (by pixel count).
    pub min_size: Option<(u32, u32)>,
    /// Largest decoded width × height.
    pub max_size: Option<(u32, u32)>,
    /// Locations of bad samples, sorted.
    pub bad_files: Vec<String>,
    /// Bad samples with their errors, sorted by location.
    pub errors: Vec<BadSample>,
    /// Files that are not samples for their extension (as torchvision leaves them out),
    /// counted by extension, sorted by it.
    pub left_out: Vec<LeftOut>,
    /// What is worth a look but is no error (a hidden class folder, a class without images);
    /// see [`Dataset::warnings`].
    pub warnings: Vec<String>,
    /// The limits each sample was checked against.
    pub limits: SampleLimits,
}

/// Decodes every sample of `dataset` once on `threads` threads under `limits` (a file or
/// image above them is a bad sample, as it would be in a feed), calling `progress` with the
/// number of samples finished since the last call.
pub fn inspect(
    dataset: &dyn Dataset,
    threads: usize,
    limits: SampleLimits,
    progress: &(dyn Fn(u64) + Sync),
) -> Result<InspectReport, PipelineError> {
    let decoded = AtomicU64::new(0);
    let bytes = AtomicU64::new(0);
    let sizes = Mutex::new((None::<(u32, u32)>, None::<(u32, u32)>));
    let errors = Mutex::new(
        dataset
            .problems()
            .iter()
            .map(|e| BadSample {
                location: e.location().unwrap_or_default().to_owned(),
                error: e.to_string(),
            })
            .collect::<Vec<_>>(),
    );
    for_each_parallel(
        0..dataset.len(),
        threads,
        || SampleProcessor::with_limits(Transforms::eval(1), 0, limits),
        |processor, index| {
            let outcome = dataset
                .label(index)
                .and_then(|_| processor.decode(dataset, index));
            match outcome {
                Ok(image) => {
                    decoded.fetch_add(1, Ordering::Relaxed);
                    bytes.fetch_add(image.pixels.len() as u64, Ordering::Relaxed);
                    let mut s = sizes.lock().unwrap_or_else(|p| p.into_inner());
                    let px = |(w, h): (u32, u32)| u64::from(w) * u64::from(h);
                    let this = (image.width, image.height);
                    if s.0.is_none_or(|m| px(this) < px(m)) {
                        s.0 = Some(this);
                    }
                    if s.1.is_none_or(|m| px(this) > px(m)) {
                        s.1 = Some(this);
                    }
                }
                Err(error) => {
                    errors
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .push(BadSample {
                            location: dataset.location(index),
                            error: error.to_string(),
                        });
                }
            }
            progress(1);
            ControlFlow::Continue(())
        },
    )?;
    let mut errors = errors.into_inner().unwrap_or_else(|p| p.into_inner());
    errors.sort_by(|a, b| a.location.cmp(&b.location));
    let (min_size, max_size) = sizes.into_inner().unwrap_or_else(|p| p.into_inner());
    Ok(InspectReport {
        format: dataset.format(),
        path: dataset.root().to_owned(),
        samples: dataset.len(),
        classes: dataset.class_names().len(),
        class_names: dataset.class_names().to_vec(),
        decoded: decoded.into_inner(),
        decoded_bytes: bytes.into_inner(),
        min_size,
        max_size,
        bad_files: errors.iter().map(|e| e.location.clone()).collect(),
        errors,
        left_out: dataset.left_out().to_vec(),
        warnings: dataset.warnings().to_vec(),
        limits,
    })
}
