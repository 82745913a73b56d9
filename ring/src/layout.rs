//! Where everything lives in the ring's shared-memory file.
//!
//! ```text
//! memfd: [ header page | field 0: C×b₀ | field 1: C×b₁ | … | indices C×u64 | flags C×u64 ]
//! ```
//! One region per schema field (`bₖ` bytes per sample: an image feed has `image` `C×H×W×3`
//! and `label` `C×8`), then the dataset indices and the per-sample flags ([`FLAG_BAD`]). Each
//! region is page-aligned and mapped twice back to back, so a window of up to `C`
//! consecutive samples starting anywhere is one contiguous slice of every field. `C` is a
//! multiple of a granule that keeps every region a whole number of pages: a field of `b`
//! bytes per sample needs `C` to be a multiple of `4096 / gcd(b, 4096)`, so a one-byte field
//! asks for multiples of 4096 samples (prefer `i64` labels to `u8` ones).

use serde::{Deserialize, Serialize};

use crate::error::LayoutError;
use crate::schema::Schema;
use crate::sys::PAGE;

/// Channels per pixel of an image feed (RGB).
pub const CHANNELS: u32 = 3;

/// Bit 0 of a sample's flags word: the sample could not be made (read, decoded, or built by
/// the user's code) and its fields are zero (an `i64` `label` is −1).
pub const FLAG_BAD: u64 = 1;

/// Bit 1 of a sample's flags word: a *hole*. No attached consumer needed this position of the
/// feed's permutation when the producer reached it (protocol version 13), so it was not
/// decoded: only its dataset index and flags were written, its fields hold whatever the slot
/// held before. Always set with [`FLAG_BAD`], so that a hole delivered by mistake is counted
/// as a bad sample, never taken for a good one. Consumers skip holes.
pub const FLAG_HOLE: u64 = 2;

/// The shape of a ring, sent to every consumer in `Welcome`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RingLayout {
    /// Samples the ring holds (`C`).
    pub capacity: u64,
    /// What one sample is.
    pub schema: Schema,
}

fn gcd(a: u64, b: u64) -> u64 {
    if b == 0 { a } else { gcd(b, a % b) }
}

fn lcm(a: u64, b: u64) -> u64 {
    a / gcd(a, b) * b
}

impl RingLayout {
    /// The smallest capacity step that keeps every region of `schema` page-aligned.
    pub fn granule(schema: &Schema) -> u64 {
        let page = PAGE as u64;
        schema
            .fields()
            .iter()
            .map(|f| page / gcd((f.bytes() as u64).max(1), page))
            .fold(page / 8, lcm)
    }

    /// A layout of exactly `capacity` samples of `schema`.
    pub fn new(capacity: u64, schema: Schema) -> Result<Self, LayoutError> {
        let granule = Self::granule(&schema);
        if capacity == 0 || capacity % granule != 0 {
            return Err(LayoutError::Capacity { capacity, granule });
        }
        let layout = Self { capacity, schema };
        layout
            .file_len_checked()
            .ok_or(LayoutError::TooLarge { capacity })?;
        Ok(layout)
    }

    /// A layout of `capacity` images of `height × width × 3` with `i64` labels.
    pub fn image(capacity: u64, height: u32, width: u32) -> Result<Self, LayoutError> {
        Self::new(capacity, Self::image_schema(height, width)?)
    }

    fn image_schema(height: u32, width: u32) -> Result<Schema, LayoutError> {
        if height == 0 || width == 0 || height > 8192 || width > 8192 {
            return Err(LayoutError::ImageSize { height, width });
        }
        Ok(Schema::image(height, width)?)
    }

    /// The largest layout of `schema` whose file fits in `bytes` (at least one granule).
    pub fn for_budget(bytes: u64, schema: Schema) -> Result<Self, LayoutError> {
        let granule = Self::granule(&schema);
        let per_sample = schema.sample_bytes() as u64 + 16;
        let capacity = (bytes.saturating_sub(PAGE as u64) / per_sample) / granule * granule;
        Self::new(capacity.max(granule), schema)
    }

    /// [`RingLayout::for_budget`] for an image feed.
    pub fn image_for_budget(bytes: u64, height: u32, width: u32) -> Result<Self, LayoutError> {
        Self::for_budget(bytes, Self::image_schema(height, width)?)
    }

    /// Bytes of one sample's fields (without its index and flags).
    pub fn sample_bytes(&self) -> usize {
        self.schema.sample_bytes()
    }

    /// `(height, width)` of an image feed's images (see [`Schema::image_size`]).
    pub fn image_size(&self) -> Option<(u32, u32)> {
        self.schema.image_size()
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

    /// Offset and length of every region, in file order: the fields, the indices, the flags.
    pub fn regions(&self) -> Vec<(u64, usize)> {
        let cap = self.capacity as usize;
        let mut off = PAGE as u64;
        let sizes = self.schema.fields().iter().map(|f| f.bytes()).chain([8, 8]);
        sizes
            .map(|bytes| {
                let region = (off, cap * bytes);
                off += (cap * bytes) as u64;
                region
            })
            .collect()
    }

    /// Offset and length of field `k`'s region.
    pub fn field(&self, k: usize) -> (u64, usize) {
        self.regions()[k]
    }

    /// Offset and length of the dataset-indices region.
    pub fn indices(&self) -> (u64, usize) {
        self.regions()[self.schema.fields().len()]
    }

    /// Offset and length of the flags region.
    pub fn flags(&self) -> (u64, usize) {
        self.regions()[self.schema.fields().len() + 1]
    }

    fn file_len_checked(&self) -> Option<u64> {
        let per_sample = self.sample_bytes() as u64 + 16;
        let samples = self.capacity.checked_mul(per_sample)?;
        (PAGE as u64).checked_add(samples).filter(|&n| n <= 1 << 40)
    }

    /// Bytes of the whole file.
    pub fn file_len(&self) -> u64 {
        self.file_len_checked().unwrap_or(u64::MAX)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schema::{DType, Field};

    #[test]
    fn regions_are_page_aligned_for_common_and_odd_sample_shapes() {
        let schemas = [(224, 224), (32, 32), (299, 299), (7, 13), (1, 1)]
            .map(|(h, w)| Schema::image(h, w).unwrap())
            .into_iter()
            .chain(
                [
                    "wave: f32[16000], label: i64",
                    "x: u8[7], y: f16[3, 5], z: bool",
                ]
                .map(|s| s.parse::<Schema>().unwrap()),
            );
        for schema in schemas {
            let layout = RingLayout::for_budget(64 << 20, schema.clone()).unwrap();
            let regions = layout.regions();
            assert_eq!(regions.len(), schema.fields().len() + 2);
            for (off, len) in regions {
                assert_eq!(off % PAGE as u64, 0, "{schema}");
                assert_eq!(len % PAGE, 0, "{schema}");
            }
            let (last, len) = layout.flags();
            assert_eq!(last + len as u64, layout.file_len(), "{schema}");
        }
    }

    #[test]
    fn a_budget_of_256_mib_holds_over_a_thousand_224px_samples() {
        let layout = RingLayout::image_for_budget(256 << 20, 224, 224).unwrap();
        assert!(layout.capacity >= 1024, "{layout:?}");
        assert!(layout.file_len() <= 256 << 20);
        assert_eq!(layout.max_batch(), layout.capacity / 2);
        assert_eq!(layout.image_size(), Some((224, 224)));
    }

    #[test]
    fn a_one_byte_field_asks_for_whole_pages_of_samples() {
        let schema = Schema::new(vec![Field::new("flag", DType::Bool, [])]).unwrap();
        assert_eq!(RingLayout::granule(&schema), 4096);
        let schema: Schema = "wave: f32[16000], label: i64".parse().unwrap();
        assert_eq!(RingLayout::granule(&schema), 512);
    }

    #[test]
    fn capacities_off_the_granule_and_empty_images_are_rejected() {
        assert!(matches!(
            RingLayout::image(100, 224, 224),
            Err(LayoutError::Capacity { .. })
        ));
        assert!(matches!(
            RingLayout::image(512, 0, 224),
            Err(LayoutError::ImageSize { .. })
        ));
    }
}
