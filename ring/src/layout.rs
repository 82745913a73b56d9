//! Where everything lives in the ring's shared-memory file.
//!
//! ```text
//! memfd: [ header page | images C×H×W×3 | labels C×i64 | indices C×u64 ]
//! ```
//! Each of the three sample regions is page-aligned and mapped twice back to back, so a
//! window of up to `C` consecutive samples starting anywhere is one contiguous slice.
//! `C` is a multiple of a granule that keeps every region a whole number of pages.

use serde::{Deserialize, Serialize};

use crate::error::LayoutError;
use crate::sys::PAGE;

/// Channels per pixel (RGB).
pub const CHANNELS: u32 = 3;

/// The shape of a ring, sent to every consumer in `Welcome`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct RingLayout {
    /// Samples the ring holds (`C`).
    pub capacity: u64,
    /// Image height in pixels.
    pub height: u32,
    /// Image width in pixels.
    pub width: u32,
}

fn gcd(a: u64, b: u64) -> u64 {
    if b == 0 { a } else { gcd(b, a % b) }
}

impl RingLayout {
    /// The smallest capacity step that keeps every region page-aligned for these images.
    pub fn granule(height: u32, width: u32) -> u64 {
        let sample = u64::from(height) * u64::from(width) * u64::from(CHANNELS);
        let page = PAGE as u64;
        let for_images = page / gcd(sample.max(1), page);
        let for_words = page / 8;
        for_images * for_words / gcd(for_images, for_words)
    }

    /// A layout of exactly `capacity` samples of `height × width × 3`.
    pub fn new(capacity: u64, height: u32, width: u32) -> Result<Self, LayoutError> {
        let granule = Self::granule(height, width);
        if height == 0 || width == 0 || height > 8192 || width > 8192 {
            return Err(LayoutError::ImageSize { height, width });
        }
        if capacity == 0 || capacity % granule != 0 {
            return Err(LayoutError::Capacity { capacity, granule });
        }
        let layout = Self {
            capacity,
            height,
            width,
        };
        layout
            .file_len_checked()
            .ok_or(LayoutError::TooLarge { capacity })?;
        Ok(layout)
    }

    /// The largest layout whose file fits in `bytes` (at least one granule).
    pub fn for_budget(bytes: u64, height: u32, width: u32) -> Result<Self, LayoutError> {
        let granule = Self::granule(height, width);
        let per_sample = u64::from(height) * u64::from(width) * u64::from(CHANNELS) + 16;
        let capacity = (bytes.saturating_sub(PAGE as u64) / per_sample.max(1)) / granule * granule;
        Self::new(capacity.max(granule), height, width)
    }

    /// Bytes of one image.
    pub fn sample_bytes(&self) -> usize {
        self.height as usize * self.width as usize * CHANNELS as usize
    }

    /// The largest batch a consumer may ask for (`C / 2`), so that the producer can always
    /// fill the next batch while a consumer holds one.
    pub fn max_batch(&self) -> u64 {
        self.capacity / 2
    }

    /// Bytes of the header region.
    pub fn header_len(&self) -> usize {
        PAGE
    }

    /// Offset and length of the images region.
    pub fn images(&self) -> (u64, usize) {
        (PAGE as u64, self.capacity as usize * self.sample_bytes())
    }

    /// Offset and length of the labels region.
    pub fn labels(&self) -> (u64, usize) {
        let (off, len) = self.images();
        (off + len as u64, self.capacity as usize * 8)
    }

    /// Offset and length of the dataset-indices region.
    pub fn indices(&self) -> (u64, usize) {
        let (off, len) = self.labels();
        (off + len as u64, self.capacity as usize * 8)
    }

    fn file_len_checked(&self) -> Option<u64> {
        let images = self.capacity.checked_mul(self.sample_bytes() as u64)?;
        let words = self.capacity.checked_mul(16)?;
        (PAGE as u64)
            .checked_add(images)?
            .checked_add(words)
            .filter(|&n| n <= 1 << 40)
    }

    /// Bytes of the whole file.
    pub fn file_len(&self) -> u64 {
        self.file_len_checked().unwrap_or(u64::MAX)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn regions_are_page_aligned_for_common_and_odd_image_sizes() {
        for (h, w) in [(224, 224), (32, 32), (299, 299), (7, 13), (1, 1)] {
            let layout = RingLayout::for_budget(64 << 20, h, w).unwrap();
            for (off, len) in [layout.images(), layout.labels(), layout.indices()] {
                assert_eq!(off % PAGE as u64, 0, "{h}x{w}");
                assert_eq!(len % PAGE, 0, "{h}x{w}");
            }
            assert!(layout.file_len() <= (64 << 20).max(layout.file_len()));
        }
    }

    #[test]
    fn a_budget_of_256_mib_holds_over_a_thousand_224px_samples() {
        let layout = RingLayout::for_budget(256 << 20, 224, 224).unwrap();
        assert!(layout.capacity >= 1024, "{layout:?}");
        assert!(layout.file_len() <= 256 << 20);
        assert_eq!(layout.max_batch(), layout.capacity / 2);
    }

    #[test]
    fn capacities_off_the_granule_and_empty_images_are_rejected() {
        assert!(matches!(
            RingLayout::new(100, 224, 224),
            Err(LayoutError::Capacity { .. })
        ));
        assert!(matches!(
            RingLayout::new(512, 0, 224),
            Err(LayoutError::ImageSize { .. })
        ));
    }
}
