//! What one sample may cost a feed, checked before it is paid, and buffers that do not keep
//! what one huge sample made them grow to.
//!
//! A dataset folder is written by other people: a file named like an image may be a 2 GiB
//! sparse file (no disk used, 2 GiB read) or a 32 KB PNG that declares 16384×16384 pixels
//! (a gigabyte of RGB). [`SampleLimits`] bounds both before any byte or pixel is paid:
//!
//! - **Pixels**, read from the header for every format (JPEG, PNG, WebP, BMP, TIFF, PNM) and
//!   checked before decoding: [`DEFAULT_MAX_PIXELS`] is 178 956 970, the count at which PIL,
//!   torchvision's loader, refuses an image (`DecompressionBombError`, twice
//!   `Image.MAX_IMAGE_PIXELS`). ladle therefore serves every image a torchvision
//!   `ImageFolder` loads and refuses the ones it refuses. The largest photos people train on
//!   fit: a 102 MP medium-format camera, a 108 MP phone.
//! - **Bytes**, from the file's size (`fstat`) or the tar member's header, before reading:
//!   [`DEFAULT_MAX_FILE_BYTES`] is 512 MiB, what the pixel budget takes as uncompressed 8-bit
//!   RGB (178 956 970 × 3 bytes is 512 MiB less 2 bytes: PIL's limit was made so). A
//!   compressed image of an admitted size is far smaller; a bigger file is either an
//!   uncompressed 16-bit image above the budget's worth or not an image.
//!
//! Both are options (`ladle serve --max-pixels`, `--max-file-mib`; the same for `ladle
//! sweep` and `ladle dataset inspect`). A sample over either is a bad sample that names its
//! file and the limit, skipped and counted like any other.
//!
//! The reused buffers of a decode thread (the file's bytes, the decoder's output, the
//! augmenter's intermediates) grow to the largest sample seen and used to stay there for the
//! feed's life: one 1 GB sample left 1 GB per thread. `fit` gives such a buffer back when
//! the next sample needs a quarter of it or less, above a floor of [`KEEP_BYTES`] that any
//! ordinary photo stays under, so a steady dataset reuses its buffers and a lone giant's
//! memory returns to the system at the next sample.

use serde::Serialize;

use crate::error::{DecodeError, SampleError};

/// PIL's `DecompressionBombError` threshold: `2 × Image.MAX_IMAGE_PIXELS`, with
/// `MAX_IMAGE_PIXELS = 1024 × 1024 × 1024 // 4 // 3`.
pub const DEFAULT_MAX_PIXELS: u64 = 2 * (1024 * 1024 * 1024 / 4 / 3);

/// 512 MiB: the pixel budget's worth of 8-bit RGB.
pub const DEFAULT_MAX_FILE_BYTES: u64 = 512 << 20;

/// A reused buffer up to this size is kept whatever the next sample needs (32 MiB: the RGB of
/// an 11-megapixel photo; glibc serves larger blocks with `mmap`, so freeing one returns it).
pub const KEEP_BYTES: usize = 32 << 20;

/// What one sample may cost: see the [module docs](self).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct SampleLimits {
    /// The largest file (or tar member) read, in bytes.
    pub max_file_bytes: u64,
    /// The most pixels (width × height, from the header) decoded.
    pub max_pixels: u64,
}

impl Default for SampleLimits {
    fn default() -> Self {
        Self {
            max_file_bytes: DEFAULT_MAX_FILE_BYTES,
            max_pixels: DEFAULT_MAX_PIXELS,
        }
    }
}

impl SampleLimits {
    /// Refuses a file of `bytes` at `location` above [`Self::max_file_bytes`], before it is
    /// read.
    pub fn check_file(
        &self,
        location: impl FnOnce() -> String,
        bytes: u64,
    ) -> Result<(), SampleError> {
        if bytes > self.max_file_bytes {
            return Err(SampleError::FileTooLarge {
                location: location(),
                bytes,
                max: self.max_file_bytes,
            });
        }
        Ok(())
    }

    /// Refuses an image of `width × height` above [`Self::max_pixels`] (or a side of 0).
    pub fn check_pixels(&self, width: u64, height: u64) -> Result<(), DecodeError> {
        check_pixels(width, height, self.max_pixels)
    }
}

/// [`SampleLimits::check_pixels`] against a budget of `max` pixels.
pub(crate) fn check_pixels(width: u64, height: u64, max: u64) -> Result<(), DecodeError> {
    let pixels = width.saturating_mul(height);
    if pixels == 0 || pixels > max {
        return Err(DecodeError::TooManyPixels { width, height, max });
    }
    Ok(())
}

/// `buf` holding at least `len` bytes, grown if needed; a buffer that one earlier sample made
/// larger than [`KEEP_BYTES`] and four times `len` is dropped first, giving its memory back.
pub fn fit(buf: &mut Vec<u8>, len: usize) -> &mut [u8] {
    give_back(buf, len);
    if buf.len() < len {
        buf.resize(len, 0);
    }
    &mut buf[..len]
}

/// Drops `buf`'s memory if it is larger than [`KEEP_BYTES`] and four times `need`.
pub(crate) fn give_back<T>(buf: &mut Vec<T>, need: usize) {
    let bytes = buf.capacity().saturating_mul(size_of::<T>());
    let need_bytes = need.saturating_mul(size_of::<T>());
    if bytes > KEEP_BYTES.max(need_bytes.saturating_mul(4)) {
        *buf = Vec::new();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_budgets_are_pils_and_its_worth_of_rgb() {
        assert_eq!(DEFAULT_MAX_PIXELS, 178_956_970);
        assert_eq!(DEFAULT_MAX_FILE_BYTES - DEFAULT_MAX_PIXELS * 3, 2);
    }

    #[test]
    fn pixels_are_checked_at_the_budget_and_never_overflow() {
        let limits = SampleLimits::default();
        assert!(limits.check_pixels(13_377, 13_377).is_ok()); // 178 944 129
        assert!(limits.check_pixels(16_384, 16_384).is_err());
        assert!(limits.check_pixels(u64::MAX, u64::MAX).is_err());
        assert!(limits.check_pixels(0, 5).is_err());
        let tight = SampleLimits {
            max_pixels: 100,
            ..limits
        };
        assert!(tight.check_pixels(10, 10).is_ok());
        assert!(tight.check_pixels(10, 11).is_err());
    }

    #[test]
    fn a_buffer_grown_for_one_huge_sample_is_given_back_and_an_ordinary_one_is_kept() {
        let mut buf = Vec::new();
        fit(&mut buf, 1 << 20);
        let small = buf.as_ptr();
        fit(&mut buf, 1000);
        assert_eq!(buf.as_ptr(), small, "a small buffer is reused");
        fit(&mut buf, 200 << 20);
        assert!(buf.capacity() >= 200 << 20);
        let huge = buf.as_ptr();
        fit(&mut buf, 100 << 20);
        assert_eq!(buf.as_ptr(), huge, "half of it is still worth keeping");
        fit(&mut buf, 1 << 20);
        assert!(buf.capacity() < 2 << 20, "given back: {}", buf.capacity());
    }
}
