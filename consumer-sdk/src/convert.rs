//! u8 HWC images to normalised f32: the CPU reference of the fused conversion kernel.
//!
//! The producer hands out `[B, H, W, 3]` u8 images; training wants f32 `[B, 3, H, W]`
//! (or channels-last `[B, H, W, 3]`) with `(x / 255 − mean[c]) / std[c]` per channel. Both this
//! reference and the CUDA kernel of the `cuda` feature compute it as one fused multiply-add per
//! element, `fma(x, scale[c], shift[c])` with `scale = 1 / (255·std)` and `shift = −mean / std`
//! computed once (in f64, rounded to f32) by [`Normalize::scale_shift`]: the same f32 constants
//! and the same single rounding on both sides, so the kernel's output can be compared with this
//! one exactly.

/// The per-channel mean and standard deviation of the normalisation, on the 0–1 scale (as
/// torchvision's `Normalize` takes them after `ToTensor`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Normalize {
    /// Per-channel mean (R, G, B).
    pub mean: [f32; 3],
    /// Per-channel standard deviation (R, G, B); finite and non-zero.
    pub std: [f32; 3],
}

impl Normalize {
    /// ImageNet's statistics: mean `(0.485, 0.456, 0.406)`, std `(0.229, 0.224, 0.225)`.
    pub const IMAGENET: Self = Self {
        mean: [0.485, 0.456, 0.406],
        std: [0.229, 0.224, 0.225],
    };

    /// No normalisation: only the scaling of `0..=255` to `0..=1`.
    pub const UNIT: Self = Self {
        mean: [0.0; 3],
        std: [1.0; 3],
    };

    /// The per-channel `(scale, shift)` with `normalised = x · scale + shift` for a raw byte
    /// `x`: `scale = 1 / (255·std)`, `shift = −mean / std`.
    ///
    /// Fails with [`ConvertError::BadNormalize`] for a zero or non-finite std or a non-finite
    /// mean (outside input: never a panic, never NaNs in a batch).
    pub fn scale_shift(&self) -> Result<([f32; 3], [f32; 3]), ConvertError> {
        let mut scale = [0.0; 3];
        let mut shift = [0.0; 3];
        for channel in 0..3 {
            let (mean, std) = (self.mean[channel], self.std[channel]);
            if !mean.is_finite() || !std.is_finite() || std == 0.0 {
                return Err(ConvertError::BadNormalize { channel, mean, std });
            }
            scale[channel] = (1.0 / (255.0 * f64::from(std))) as f32;
            shift[channel] = (-f64::from(mean) / f64::from(std)) as f32;
        }
        Ok((scale, shift))
    }
}

impl Default for Normalize {
    /// [`Normalize::UNIT`].
    fn default() -> Self {
        Self::UNIT
    }
}

/// Memory order of the converted f32 images.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Layout {
    /// `[B, 3, H, W]`, contiguous: PyTorch's default.
    #[default]
    Nchw,
    /// `[B, H, W, 3]`, contiguous: PyTorch's `channels_last` memory format of an NCHW tensor.
    Nhwc,
}

/// Converting a batch failed: the arguments do not describe one batch.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum ConvertError {
    /// A standard deviation is zero or not finite, or a mean is not finite.
    #[error(
        "normalisation of channel {channel}: mean {mean} and std {std}; the std must be finite and non-zero, the mean finite"
    )]
    BadNormalize {
        /// The channel (0 = R, 1 = G, 2 = B).
        channel: usize,
        /// Its mean.
        mean: f32,
        /// Its standard deviation.
        std: f32,
    },
    /// The shape's last dimension is not 3 (the ring holds RGB images).
    #[error("images have {channels} channels; the conversion takes RGB (3)")]
    Channels {
        /// The shape's last dimension.
        channels: usize,
    },
    /// `B·H·W·3` does not fit in `usize`.
    #[error("shape {shape:?} is too large to address")]
    TooLarge {
        /// The shape given.
        shape: [usize; 4],
    },
    /// The input holds a different number of bytes than the shape says.
    #[error("images of shape {shape:?} are {expected} bytes, got {actual}")]
    InputLength {
        /// The shape given.
        shape: [usize; 4],
        /// `B·H·W·3`.
        expected: usize,
        /// The input's length.
        actual: usize,
    },
    /// The output holds fewer elements than the shape says.
    #[error("output for shape {shape:?} needs {expected} f32 elements, got {actual}")]
    OutputLength {
        /// The shape given.
        shape: [usize; 4],
        /// `B·H·W·3`.
        expected: usize,
        /// The output's length.
        actual: usize,
    },
}

/// `B·H·W·3` for a `[B, H, W, 3]` shape, checked.
pub(crate) fn elements(shape: [usize; 4]) -> Result<usize, ConvertError> {
    let [b, h, w, c] = shape;
    if c != 3 {
        return Err(ConvertError::Channels { channels: c });
    }
    b.checked_mul(h)
        .and_then(|n| n.checked_mul(w))
        .and_then(|n| n.checked_mul(3))
        .ok_or(ConvertError::TooLarge { shape })
}

/// Converts `[B, H, W, 3]` u8 `images` (`shape`, as [`crate::BatchOf::shape`] gives it) to f32
/// in `out` (exactly `B·H·W·3` elements used), `(x / 255 − mean[c]) / std[c]` per channel, in
/// `layout` order. The CPU reference of the `cuda` feature's kernel: same constants, one fused
/// multiply-add per element, bit-identical results.
///
/// Fails, without writing, when the lengths do not match the shape, the shape is not RGB, or
/// the normalisation is invalid.
pub fn convert_cpu(
    images: &[u8],
    shape: [usize; 4],
    normalize: &Normalize,
    layout: Layout,
    out: &mut [f32],
) -> Result<(), ConvertError> {
    let expected = elements(shape)?;
    if images.len() != expected {
        return Err(ConvertError::InputLength {
            shape,
            expected,
            actual: images.len(),
        });
    }
    if out.len() < expected {
        return Err(ConvertError::OutputLength {
            shape,
            expected,
            actual: out.len(),
        });
    }
    let (scale, shift) = normalize.scale_shift()?;
    let out = &mut out[..expected];
    let fma = |x: u8, c: usize| f32::from(x).mul_add(scale[c], shift[c]);
    match layout {
        Layout::Nhwc => {
            for (i, (&x, y)) in images.iter().zip(out.iter_mut()).enumerate() {
                *y = fma(x, i % 3);
            }
        }
        Layout::Nchw => {
            let plane = shape[1] * shape[2];
            if plane == 0 {
                return Ok(());
            }
            for (src, dst) in images
                .chunks_exact(plane * 3)
                .zip(out.chunks_exact_mut(plane * 3))
            {
                let (r, gb) = dst.split_at_mut(plane);
                let (g, b) = gb.split_at_mut(plane);
                for (p, px) in src.chunks_exact(3).enumerate() {
                    r[p] = fma(px[0], 0);
                    g[p] = fma(px[1], 1);
                    b[p] = fma(px[2], 2);
                }
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// mean 0.5, std 0.25: x ↦ (x/255 − 0.5) / 0.25 = x/63.75 − 2.
    const HALF_QUARTER: Normalize = Normalize {
        mean: [0.5; 3],
        std: [0.25; 3],
    };

    fn close(a: &[f32], b: &[f32]) -> bool {
        a.len() == b.len() && a.iter().zip(b).all(|(x, y)| (x - y).abs() <= 1e-6)
    }

    #[test]
    fn two_pixels_convert_to_hand_computed_values_in_both_layouts() {
        // one image of 1x2 pixels: (0, 51, 255) and (255, 102, 0)
        let images = [0, 51, 255, 255, 102, 0];
        let shape = [1, 1, 2, 3];
        let mut out = [f32::NAN; 6];
        convert_cpu(&images, shape, &HALF_QUARTER, Layout::Nhwc, &mut out).unwrap();
        assert!(close(&out, &[-2.0, -1.2, 2.0, 2.0, -0.4, -2.0]), "{out:?}");
        convert_cpu(&images, shape, &HALF_QUARTER, Layout::Nchw, &mut out).unwrap();
        // planes R = [0, 255], G = [51, 102], B = [255, 0]
        assert!(close(&out, &[-2.0, 2.0, -1.2, -0.4, 2.0, -2.0]), "{out:?}");
    }

    #[test]
    fn imagenet_normalisation_matches_the_formula_per_channel() {
        let images = [10, 128, 250];
        let mut out = [0.0; 3];
        convert_cpu(
            &images,
            [1, 1, 1, 3],
            &Normalize::IMAGENET,
            Layout::Nchw,
            &mut out,
        )
        .unwrap();
        for c in 0..3 {
            let want = (f64::from(images[c]) / 255.0 - f64::from(Normalize::IMAGENET.mean[c]))
                / f64::from(Normalize::IMAGENET.std[c]);
            assert!(
                (f64::from(out[c]) - want).abs() < 1e-5,
                "{c}: {out:?} vs {want}"
            );
        }
    }

    #[test]
    fn nchw_puts_each_image_in_its_own_three_planes() {
        // two 1x1 images
        let images = [1, 2, 3, 4, 5, 6];
        let mut out = [0.0; 6];
        let identity = Normalize {
            mean: [0.0; 3],
            std: [1.0 / 255.0; 3],
        };
        convert_cpu(&images, [2, 1, 1, 3], &identity, Layout::Nchw, &mut out).unwrap();
        assert!(close(&out, &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]), "{out:?}");
    }

    #[test]
    fn a_zero_std_or_nan_mean_is_an_error_not_nans() {
        let mut out = [0.0; 3];
        let zero_std = Normalize {
            mean: [0.0; 3],
            std: [1.0, 0.0, 1.0],
        };
        assert!(matches!(
            convert_cpu(&[0; 3], [1, 1, 1, 3], &zero_std, Layout::Nchw, &mut out),
            Err(ConvertError::BadNormalize { channel: 1, .. })
        ));
        let nan_mean = Normalize {
            mean: [0.0, 0.0, f32::NAN],
            std: [1.0; 3],
        };
        assert!(matches!(
            nan_mean.scale_shift(),
            Err(ConvertError::BadNormalize { channel: 2, .. })
        ));
    }

    #[test]
    fn mismatched_lengths_and_shapes_are_errors_and_write_nothing() {
        let mut out = [7.0; 6];
        let norm = Normalize::UNIT;
        assert_eq!(
            convert_cpu(&[0; 5], [1, 1, 2, 3], &norm, Layout::Nchw, &mut out),
            Err(ConvertError::InputLength {
                shape: [1, 1, 2, 3],
                expected: 6,
                actual: 5
            })
        );
        assert!(matches!(
            convert_cpu(&[0; 6], [1, 1, 2, 3], &norm, Layout::Nchw, &mut out[..5]),
            Err(ConvertError::OutputLength {
                expected: 6,
                actual: 5,
                ..
            })
        ));
        assert!(matches!(
            convert_cpu(&[0; 8], [1, 1, 2, 4], &norm, Layout::Nchw, &mut out),
            Err(ConvertError::Channels { channels: 4 })
        ));
        assert!(matches!(
            convert_cpu(&[], [usize::MAX, 2, 1, 3], &norm, Layout::Nchw, &mut out),
            Err(ConvertError::TooLarge { .. })
        ));
        assert_eq!(out, [7.0; 6]);
    }
}
