//! The embedded synthetic dataset `ladle demo` and `ladle bench fanout` default to: generated
//! on first use into a cache directory, then reused.

use std::path::PathBuf;

use anyhow::Context;
use ladle_datasets::synth::SynthConfig;

use crate::dataset::generate;

/// Version of the embedded dataset's recipe: bump to regenerate caches.
const DEMO_DATASET_VERSION: u32 = 2;
/// Samples in the embedded dataset.
pub(crate) const DEMO_SAMPLES: u64 = 1000;

/// The cache directory for generated datasets.
pub(crate) fn cache_dir() -> PathBuf {
    let env = |k: &str| {
        std::env::var_os(k)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
    };
    env("LADLE_CACHE_DIR")
        .or_else(|| env("XDG_CACHE_HOME").map(|d| d.join("ladle")))
        .or_else(|| env("HOME").map(|d| d.join(".cache").join("ladle")))
        .unwrap_or_else(|| std::env::temp_dir().join("ladle-cache"))
}

/// The embedded default dataset (ImageFolder of `samples` 500x375 JPEGs), generated on first
/// use; a marker file written last tells a complete cache from an interrupted one.
pub(crate) fn embedded_dataset(cache: Option<PathBuf>, samples: u64) -> anyhow::Result<PathBuf> {
    let dir = cache.unwrap_or_else(cache_dir).join(format!(
        "demo-imagefolder-v{DEMO_DATASET_VERSION}-{samples}"
    ));
    let marker = dir.join(".ladle-complete");
    if marker.is_file() {
        return Ok(dir);
    }
    eprintln!(
        "generating the embedded dataset ({samples} images) in {} ...",
        dir.display()
    );
    if dir.exists() {
        std::fs::remove_dir_all(&dir)
            .with_context(|| format!("removing the incomplete cache {}", dir.display()))?;
    }
    let config = SynthConfig {
        count: samples,
        ..SynthConfig::default()
    };
    generate(&config, &dir)?;
    std::fs::write(&marker, b"").with_context(|| format!("writing {}", marker.display()))?;
    Ok(dir)
}
