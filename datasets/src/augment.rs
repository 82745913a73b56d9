//! Augmentation into a caller-provided buffer: RandomResizedCrop + horizontal flip for
//! training, resize + center crop for evaluation, with torchvision's semantics.
//!
//! The crop is resized with [`fast_image_resize`] (SIMD, antialiased bilinear convolution,
//! like torchvision's `antialias=True`), straight from the decoded image into the caller's
//! `size × size × 3` buffer: no intermediate crop copy and no allocation per sample in the
//! caller's code. The flip mirrors the output rows in place.
//!
//! Parameters come from [`SampleRng`] seeded with `(seed, epoch, index)`, so the same sample
//! in the same epoch is augmented identically on every run and every machine.
//!
//! The producer now runs [`crate::transforms`] pipelines; this module is the reference for
//! their two presets ([`Transforms::train`](crate::transforms::Transforms::train) and
//! [`Transforms::eval`](crate::transforms::Transforms::eval) are tested byte-identical to
//! [`Augment::train`] and [`Augment::eval`]) and is what the decode fuzz target and the
//! decode+augment benchmark exercise.

use fast_image_resize::images::{Image, ImageRef};
use fast_image_resize::{FilterType, PixelType, ResizeAlg, ResizeOptions, Resizer};
use serde::Serialize;

use crate::decode::RgbImage;
use crate::error::AugmentError;
use crate::rng::{SampleRng, Stream};

/// What to do to every decoded image. The output is always `size × size × 3` u8, HWC.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
#[non_exhaustive]
pub enum Augment {
    /// torchvision `RandomResizedCrop(size, scale, ratio)` + `RandomHorizontalFlip(p)`.
    Train {
        /// Output side in pixels.
        size: u32,
        /// Range of the crop's area as a fraction of the image's (torchvision: 0.08–1).
        scale: (f64, f64),
        /// Range of the crop's aspect ratio w/h (torchvision: 3/4–4/3).
        ratio: (f64, f64),
        /// Probability of a horizontal flip (torchvision: 0.5).
        flip_p: f64,
    },
    /// torchvision `Resize(resize)` (shorter side) + `CenterCrop(size)`.
    Eval {
        /// Output side in pixels.
        size: u32,
        /// The shorter side before the center crop (ImageNet convention: 256 for 224).
        resize: u32,
    },
}

impl Augment {
    /// Training augmentation with torchvision's defaults at output side `size`.
    pub fn train(size: u32) -> Self {
        Self::Train {
            size,
            scale: (0.08, 1.0),
            ratio: (3.0 / 4.0, 4.0 / 3.0),
            flip_p: 0.5,
        }
    }

    /// Evaluation transform at output side `size`, resizing the shorter side to
    /// `size × 256 / 224` first (the ImageNet convention).
    pub fn eval(size: u32) -> Self {
        Self::Eval {
            size,
            resize: ((u64::from(size) * 256).div_ceil(224)) as u32,
        }
    }

    /// Output side in pixels.
    pub fn size(&self) -> u32 {
        match *self {
            Self::Train { size, .. } | Self::Eval { size, .. } => size,
        }
    }

    /// Bytes one output sample occupies (`size × size × 3`).
    pub fn output_len(&self) -> usize {
        let s = self.size() as usize;
        s * s * 3
    }

    /// The crop (in source pixels) and flip this augmentation applies to an image of
    /// `width × height` for sample `index` of `epoch`.
    pub fn params(&self, width: u32, height: u32, seed: u64, epoch: u64, index: u64) -> Crop {
        match *self {
            Self::Train {
                scale,
                ratio,
                flip_p,
                ..
            } => {
                let mut rng = SampleRng::new(Stream::Augment, seed, epoch, index);
                let mut crop = random_resized_crop(&mut rng, width, height, scale, ratio);
                crop.flip = rng.next_f64() < flip_p;
                crop
            }
            Self::Eval { size, resize } => center_crop(width, height, size, resize),
        }
    }
}

/// A crop rectangle in source pixels (fractional for the eval transform), and a flip.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Crop {
    /// Left edge.
    pub left: f64,
    /// Top edge.
    pub top: f64,
    /// Width.
    pub width: f64,
    /// Height.
    pub height: f64,
    /// Mirror the output horizontally.
    pub flip: bool,
}

/// torchvision's `RandomResizedCrop.get_params`, draw for draw: ten tries at a random area and
/// log-uniform aspect ratio, then a fallback center crop clamped to the ratio range.
pub(crate) fn random_resized_crop(
    rng: &mut SampleRng,
    width: u32,
    height: u32,
    scale: (f64, f64),
    ratio: (f64, f64),
) -> Crop {
    let (w_f, h_f) = (f64::from(width), f64::from(height));
    let area = w_f * h_f;
    let (log_lo, log_hi) = (ratio.0.ln(), ratio.1.ln());
    for _ in 0..10 {
        let target_area = area * rng.uniform(scale.0, scale.1);
        let aspect = rng.uniform(log_lo, log_hi).exp();
        let w = (target_area * aspect).sqrt().round();
        let h = (target_area / aspect).sqrt().round();
        if w > 0.0 && h > 0.0 && w <= w_f && h <= h_f {
            let top = rng.inclusive(0, (h_f - h) as u64) as f64;
            let left = rng.inclusive(0, (w_f - w) as u64) as f64;
            return Crop {
                left,
                top,
                width: w,
                height: h,
                flip: false,
            };
        }
    }
    let in_ratio = w_f / h_f;
    let (w, h) = if in_ratio < ratio.0.min(ratio.1) {
        (w_f, (w_f / ratio.0.min(ratio.1)).round())
    } else if in_ratio > ratio.0.max(ratio.1) {
        ((h_f * ratio.0.max(ratio.1)).round(), h_f)
    } else {
        (w_f, h_f)
    };
    let top = ((h_f - h) / 2.0).floor();
    let left = ((w_f - w) / 2.0).floor();
    Crop {
        left,
        top,
        width: w,
        height: h,
        flip: false,
    }
}

/// `Resize(resize)` then `CenterCrop(size)`, expressed as one crop of the source so that a
/// single resize produces the output.
fn center_crop(width: u32, height: u32, size: u32, resize: u32) -> Crop {
    let (w_f, h_f) = (f64::from(width), f64::from(height));
    let scale = f64::from(resize) / w_f.min(h_f);
    let side = (f64::from(size) / scale).min(w_f).min(h_f);
    Crop {
        left: (w_f - side) / 2.0,
        top: (h_f - side) / 2.0,
        width: side,
        height: side,
        flip: false,
    }
}

/// Applies an [`Augment`] with a reused SIMD resizer. One per thread.
pub struct Augmenter {
    augment: Augment,
    resizer: Resizer,
}

impl std::fmt::Debug for Augmenter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Augmenter")
            .field("augment", &self.augment)
            .finish_non_exhaustive()
    }
}

impl Augmenter {
    /// An augmenter for `augment`.
    pub fn new(augment: Augment) -> Self {
        Self {
            augment,
            resizer: Resizer::new(),
        }
    }

    /// The augmentation this applies.
    pub fn augment(&self) -> &Augment {
        &self.augment
    }

    /// Augments `image` (sample `index` of `epoch`) into `out`, which must hold exactly
    /// [`Augment::output_len`] bytes. Returns the crop that was applied.
    pub fn apply(
        &mut self,
        image: RgbImage<'_>,
        seed: u64,
        epoch: u64,
        index: u64,
        out: &mut [u8],
    ) -> Result<Crop, AugmentError> {
        let size = self.augment.size();
        let expected = self.augment.output_len();
        if out.len() != expected {
            return Err(AugmentError::OutputSize {
                len: out.len(),
                expected,
            });
        }
        if image.width == 0 || image.height == 0 || size == 0 {
            return Err(AugmentError::Degenerate {
                width: image.width,
                height: image.height,
                size,
            });
        }
        let crop = self
            .augment
            .params(image.width, image.height, seed, epoch, index);
        let resize_err = |e: &dyn std::fmt::Display| AugmentError::Resize(e.to_string());
        let src = ImageRef::new(image.width, image.height, image.pixels, PixelType::U8x3)
            .map_err(|e| resize_err(&e))?;
        let mut dst =
            Image::from_slice_u8(size, size, out, PixelType::U8x3).map_err(|e| resize_err(&e))?;
        let options = ResizeOptions::new()
            .resize_alg(ResizeAlg::Convolution(FilterType::Bilinear))
            .crop(crop.left, crop.top, crop.width, crop.height);
        self.resizer
            .resize(&src, &mut dst, &options)
            .map_err(|e| resize_err(&e))?;
        if crop.flip {
            flip_rows(out, size as usize);
        }
        Ok(crop)
    }
}

/// Mirrors every row of a `side × side` RGB image in place.
fn flip_rows(pixels: &mut [u8], side: usize) {
    for row in pixels.chunks_exact_mut(side * 3) {
        let (mut i, mut j) = (0, side - 1);
        while i < j {
            let (a, b) = row.split_at_mut(j * 3);
            a[i * 3..i * 3 + 3].swap_with_slice(&mut b[..3]);
            i += 1;
            j -= 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn random_resized_crops_stay_inside_the_image_and_follow_the_ranges() {
        let aug = Augment::train(224);
        let mut flips = 0;
        for index in 0..2000 {
            let c = aug.params(500, 375, 1, 0, index);
            assert!(c.left >= 0.0 && c.top >= 0.0);
            assert!(
                c.left + c.width <= 500.0 && c.top + c.height <= 375.0,
                "{c:?}"
            );
            let area = c.width * c.height / (500.0 * 375.0);
            assert!((0.07..=1.0).contains(&area), "area {area}");
            let ratio = c.width / c.height;
            assert!(
                (0.74..=1.35).contains(&ratio) || c.width == 500.0,
                "ratio {ratio}"
            );
            flips += usize::from(c.flip);
        }
        assert!((800..1200).contains(&flips), "{flips} flips in 2000");
    }

    #[test]
    fn the_same_seed_epoch_and_index_give_the_same_crop() {
        let aug = Augment::train(224);
        assert_eq!(aug.params(500, 375, 3, 1, 9), aug.params(500, 375, 3, 1, 9));
        assert_ne!(aug.params(500, 375, 3, 1, 9), aug.params(500, 375, 3, 2, 9));
    }

    #[test]
    fn eval_takes_the_centered_square_of_the_resized_image() {
        let c = Augment::eval(224).params(500, 375, 0, 0, 0);
        // shorter side 375 -> 256, so 224 output pixels cover 375 * 224 / 256 source pixels.
        let side = 375.0 * 224.0 / 256.0;
        assert!((c.width - side).abs() < 1e-9 && (c.height - side).abs() < 1e-9);
        assert!((c.left - (500.0 - side) / 2.0).abs() < 1e-9);
        assert!(!c.flip);
    }

    #[test]
    fn augmenting_writes_the_whole_buffer_and_flip_mirrors_it() {
        let (w, h) = (64u32, 48u32);
        let pixels: Vec<u8> = (0..w * h)
            .flat_map(|i| [(i % w * 4) as u8, (i / w * 5) as u8, 77])
            .collect();
        let image = RgbImage {
            width: w,
            height: h,
            pixels: &pixels,
        };
        let full = Augment::Train {
            size: 16,
            scale: (1.0, 1.0),
            ratio: (4.0 / 3.0, 4.0 / 3.0),
            flip_p: 0.0,
        };
        let mirrored = Augment::Train {
            size: 16,
            scale: (1.0, 1.0),
            ratio: (4.0 / 3.0, 4.0 / 3.0),
            flip_p: 1.0,
        };
        let mut a = vec![0u8; 16 * 16 * 3];
        let mut b = vec![0u8; 16 * 16 * 3];
        Augmenter::new(full).apply(image, 0, 0, 0, &mut a).unwrap();
        Augmenter::new(mirrored)
            .apply(image, 0, 0, 0, &mut b)
            .unwrap();
        // The left column of the unflipped output is dark red; the right is bright red.
        assert!(a[0] < 20 && a[15 * 3] > 200, "{} {}", a[0], a[45]);
        for (ra, rb) in a.chunks(48).zip(b.chunks(48)) {
            let reversed: Vec<u8> = ra.chunks(3).rev().flatten().copied().collect();
            assert_eq!(rb, &reversed[..]);
        }
        let mut small = vec![0u8; 10];
        assert!(matches!(
            Augmenter::new(full).apply(image, 0, 0, 0, &mut small),
            Err(AugmentError::OutputSize { .. })
        ));
    }
}
