//! Crop-aware JPEG decoding: decode only the rows a crop needs, from the top down to the
//! crop's last MCU row (plus one, for the upsampler), and stop there.
//!
//! zune-jpeg decodes a baseline JPEG one MCU row at a time, top to bottom, and has no call to
//! stop early or to decode a region. The frame header's height is what tells it when to stop,
//! so a copy of the file whose SOF height is cut to the rows needed decodes exactly those rows
//! and ignores the rest of the entropy-coded data. Every row above the cut comes out
//! bit-identical to a full decode, provided the cut keeps one more MCU row below the last row
//! wanted when chroma is subsampled vertically (the "fancy" upsampler reads the chroma row
//! below; at the image's edge it repeats the last one instead). The tests check the identity
//! for every subsampling.
//!
//! Only files whose rows can be cut that way take this path: sequential Huffman (SOF0/SOF1)
//! with one scan holding every component, 1 or 3 components. Progressive files, multi-scan
//! baseline files, CMYK/YCCK and arithmetic coding are decoded whole, as before. So are
//! images the crop reaches the bottom of.
//!
//! The bytes past the cut are not read, so a file truncated or corrupt only below the crop
//! decodes on this path where a full decode would fail (as with libjpeg-turbo's skip calls).
//!
//! What it does not do (see `benches/README.md`, "Crop-aware decode"): skip the rows above
//! the crop or the columns beside it. zune-jpeg has no hook for either; entropy decoding
//! must read those blocks anyway, and their IDCT and colour conversion could only be skipped
//! inside the decoder.

use std::panic::{AssertUnwindSafe, catch_unwind};

use super::{Decoder, ImageKind, RgbImage, check_size, decode_jpeg, panic_message};
use crate::error::DecodeError;
use crate::limits::fit;

/// What the frame header of a JPEG says, as far as cutting its rows is concerned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Frame {
    /// Width in pixels.
    pub width: u32,
    /// Height in pixels.
    pub height: u32,
    /// Byte offset of the SOF's 16-bit big-endian height field.
    pub(crate) height_at: usize,
    /// Pixel rows per MCU row (8 × the largest vertical sampling factor; 8 for one component).
    mcu_rows: u32,
    /// Whether chroma is subsampled vertically (its upsampler reads the next MCU row).
    vertical_subsampling: bool,
    /// Whether the file's rows can be cut (see the module docs).
    cuttable: bool,
}

/// Reads the markers from SOI to the first SOS. `None` when the header is not a well-formed
/// JPEG header (the full decoder then reports why).
pub(crate) fn frame(bytes: &[u8]) -> Option<Frame> {
    if !bytes.starts_with(&[0xFF, 0xD8]) {
        return None;
    }
    let mut at = 2;
    let mut frame: Option<Frame> = None;
    let mut components = 0u8;
    loop {
        // Markers may be preceded by fill bytes 0xFF.
        while *bytes.get(at)? == 0xFF && *bytes.get(at + 1)? == 0xFF {
            at += 1;
        }
        if *bytes.get(at)? != 0xFF {
            return None;
        }
        let marker = *bytes.get(at + 1)?;
        at += 2;
        if (0xD0..=0xD8).contains(&marker) || marker == 0x01 {
            continue; // standalone markers
        }
        let len = usize::from(u16::from_be_bytes([*bytes.get(at)?, *bytes.get(at + 1)?]));
        let segment = bytes.get(at + 2..at + len.max(2))?;
        match marker {
            // SOF0..SOF15, less DHT (C4), JPG (C8) and DAC (CC).
            0xC0..=0xCF if !matches!(marker, 0xC4 | 0xC8 | 0xCC) => {
                if frame.is_some() || segment.len() < 6 {
                    return None;
                }
                let height = u16::from_be_bytes([segment[1], segment[2]]);
                let width = u16::from_be_bytes([segment[3], segment[4]]);
                components = segment[5];
                let specs = segment.get(6..6 + 3 * usize::from(components))?;
                let (mut h_max, mut v_max, mut v_min) = (1u8, 1u8, u8::MAX);
                for spec in specs.chunks_exact(3) {
                    let (h, v) = (spec[1] >> 4, spec[1] & 15);
                    h_max = h_max.max(h);
                    v_max = v_max.max(v);
                    v_min = v_min.min(v);
                }
                let single = components == 1;
                frame = Some(Frame {
                    width: u32::from(width),
                    height: u32::from(height),
                    height_at: at + 3,
                    mcu_rows: if single { 8 } else { 8 * u32::from(v_max) },
                    vertical_subsampling: !single && v_min < v_max,
                    cuttable: matches!(marker, 0xC0 | 0xC1)
                        && matches!(components, 1 | 3)
                        && height > 0
                        && (1..=4).contains(&h_max)
                        && (1..=4).contains(&v_max),
                });
            }
            0xDA => {
                let mut f = frame?;
                // The first scan must hold every component, so that rows are complete as
                // they are decoded.
                f.cuttable &= segment.first() == Some(&components);
                return Some(f);
            }
            0xD9 => return None,
            _ => {}
        }
        at += len;
    }
}

impl Frame {
    /// The rows to decode so that rows `0..rows` come out exactly as in a full decode:
    /// `rows` rounded up to whole MCU rows, plus one MCU row when chroma is subsampled
    /// vertically; `None` when that is the whole image or the file cannot be cut.
    pub(crate) fn cut_for(&self, rows: u32) -> Option<u32> {
        if !self.cuttable || rows == 0 {
            return None;
        }
        let mut cut = rows.div_ceil(self.mcu_rows).saturating_mul(self.mcu_rows);
        if self.vertical_subsampling {
            cut = cut.saturating_add(self.mcu_rows);
        }
        (cut < self.height).then_some(cut)
    }
}

/// A decoded image that may hold only the top rows of the file's image.
#[derive(Debug, Clone, Copy)]
pub struct Rows<'a> {
    /// The decoded rows: the full width, `image.height` rows from the top.
    pub image: RgbImage<'a>,
    /// The height of the whole image, as the file declares it.
    pub full_height: u32,
}

impl Decoder {
    /// Decodes only the top rows of an image that a caller needs, or the whole of it.
    ///
    /// `rows_needed(width, height)` is told the image's size (read from the header alone)
    /// and returns how many rows from the top it will read, or `None` for all. A JPEG whose
    /// rows can be cut (see the module docs) is decoded down to those rows, rounded up to
    /// whole MCU rows (one more when chroma is subsampled vertically): bit-identical to the
    /// same rows of [`Decoder::decode`]. Anything else is decoded whole.
    pub fn decode_rows(
        &mut self,
        bytes: &[u8],
        rows_needed: impl FnOnce(u32, u32) -> Option<u32>,
    ) -> Result<Rows<'_>, DecodeError> {
        let cut = match ImageKind::sniff(bytes) {
            Some(ImageKind::Jpeg) => frame(bytes).and_then(|f| {
                // One over a limit is decoded "whole" below, which refuses it.
                check_size(f.width, f.height, self.max_pixels).ok()?;
                let rows = rows_needed(f.width, f.height)?;
                f.cut_for(rows).map(|cut| (f, cut))
            }),
            _ => None,
        };
        let Some((frame, cut)) = cut else {
            let image = self.decode(bytes)?;
            return Ok(Rows {
                full_height: image.height,
                image,
            });
        };
        fit(&mut self.patched, bytes.len()).copy_from_slice(bytes);
        let cut16 = u16::try_from(cut).map_err(|_| DecodeError::Jpeg("cut too tall".into()))?;
        self.patched[frame.height_at..frame.height_at + 2].copy_from_slice(&cut16.to_be_bytes());
        let Self {
            rgb,
            patched,
            max_pixels,
            ..
        } = self;
        let patched = &patched[..bytes.len()];
        let (width, height) =
            catch_unwind(AssertUnwindSafe(|| decode_jpeg(patched, rgb, *max_pixels)))
                .map_err(|panic| DecodeError::Panicked(panic_message(&panic)))??;
        if (width, height) != (frame.width, cut) {
            return Err(DecodeError::Jpeg(format!(
                "decoded {width}x{height}, not the {}x{cut} asked for",
                frame.width
            )));
        }
        let len = width as usize * height as usize * 3;
        Ok(Rows {
            image: RgbImage {
                width,
                height,
                pixels: &self.rgb[..len],
            },
            full_height: frame.height,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A photo-like image: smooth gradients plus high-frequency texture, so that every
    /// MCU has AC coefficients and a chroma error would show.
    fn texture(width: u32, height: u32) -> Vec<u8> {
        let mut v = Vec::with_capacity((width * height * 3) as usize);
        for y in 0..height {
            for x in 0..width {
                let n = (x.wrapping_mul(2_654_435_761) ^ y.wrapping_mul(40_503)) >> 7;
                v.extend_from_slice(&[
                    (x * 255 / width) as u8 ^ (n as u8 & 31),
                    (y * 255 / height) as u8,
                    ((x + y) * 3) as u8 ^ (n >> 8) as u8 & 63,
                ]);
            }
        }
        v
    }

    fn encode(width: u16, height: u16, sampling: jpeg_encoder::SamplingFactor) -> Vec<u8> {
        let mut out = Vec::new();
        let mut enc = jpeg_encoder::Encoder::new(&mut out, 90);
        enc.set_sampling_factor(sampling);
        enc.encode(
            &texture(u32::from(width), u32::from(height)),
            width,
            height,
            jpeg_encoder::ColorType::Rgb,
        )
        .unwrap();
        out
    }

    #[test]
    fn the_rows_decoded_are_bit_identical_to_the_same_rows_of_a_full_decode() {
        use jpeg_encoder::SamplingFactor as S;
        for sampling in [S::R_4_2_0, S::R_4_2_2, S::R_4_4_4, S::R_4_4_0, S::R_4_1_1] {
            for (w, h) in [(500u16, 375u16), (97, 61), (64, 48)] {
                let bytes = encode(w, h, sampling);
                let mut d = Decoder::new();
                let full = d.decode(&bytes).unwrap().pixels.to_vec();
                let row = usize::from(w) * 3;
                let mut cut_some = false;
                for rows in [
                    1,
                    7,
                    8,
                    9,
                    15,
                    16,
                    17,
                    31,
                    33,
                    u32::from(h) / 2,
                    u32::from(h) - 1,
                ] {
                    let part = d.decode_rows(&bytes, |_, _| Some(rows)).unwrap();
                    assert_eq!(part.full_height, u32::from(h));
                    assert_eq!(part.image.width, u32::from(w));
                    assert!(part.image.height >= rows.min(u32::from(h)));
                    cut_some |= part.image.height < u32::from(h);
                    // Rows 0..rows are promised; the extra MCU row below them is not.
                    let n = rows.min(u32::from(h)) as usize * row;
                    assert!(
                        part.image.pixels[..n] == full[..n],
                        "{sampling:?} {w}x{h}: rows 0..{rows} differ from the full decode"
                    );
                }
                // (jpeg-encoder writes 4:1:1 as one scan per component: decoded whole.)
                assert!(
                    cut_some || sampling == S::R_4_1_1,
                    "{sampling:?} {w}x{h}: nothing was cut"
                );
            }
        }
    }

    #[test]
    fn grayscale_jpegs_are_cut_too_and_progressive_and_cmyk_ones_are_decoded_whole() {
        let mut d = Decoder::new();
        let gray: Vec<u8> = (0..200 * 120).map(|i| (i * 7 % 251) as u8).collect();
        let mut bytes = Vec::new();
        jpeg_encoder::Encoder::new(&mut bytes, 90)
            .encode(&gray, 200, 120, jpeg_encoder::ColorType::Luma)
            .unwrap();
        let full = d.decode(&bytes).unwrap().pixels.to_vec();
        let part = d.decode_rows(&bytes, |_, _| Some(20)).unwrap();
        assert_eq!(part.image.height, 24);
        assert_eq!(part.image.pixels, &full[..24 * 200 * 3]);

        let mut progressive = Vec::new();
        let mut enc = jpeg_encoder::Encoder::new(&mut progressive, 90);
        enc.set_progressive(true);
        enc.encode(&texture(96, 64), 96, 64, jpeg_encoder::ColorType::Rgb)
            .unwrap();
        let part = d.decode_rows(&progressive, |_, _| Some(8)).unwrap();
        assert_eq!((part.image.height, part.full_height), (64, 64));

        let cmyk: Vec<u8> = [255u8, 0, 0, 0].repeat(64 * 64);
        let mut bytes = Vec::new();
        jpeg_encoder::Encoder::new(&mut bytes, 90)
            .encode(&cmyk, 64, 64, jpeg_encoder::ColorType::Cmyk)
            .unwrap();
        let part = d.decode_rows(&bytes, |_, _| Some(8)).unwrap();
        assert_eq!(part.image.height, 64);
    }

    #[test]
    fn the_caller_is_told_the_size_from_the_header_and_may_ask_for_everything() {
        let bytes = encode(120, 90, jpeg_encoder::SamplingFactor::R_4_2_0);
        let mut d = Decoder::new();
        let mut seen = None;
        let part = d
            .decode_rows(&bytes, |w, h| {
                seen = Some((w, h));
                None
            })
            .unwrap();
        assert_eq!(seen, Some((120, 90)));
        assert_eq!((part.image.height, part.full_height), (90, 90));
        // Rows past the bottom decode the whole image.
        let part = d.decode_rows(&bytes, |_, h| Some(h + 100)).unwrap();
        assert_eq!(part.image.height, 90);
    }

    #[test]
    fn corrupt_and_truncated_jpegs_are_errors_on_the_cut_path_too() {
        let bytes = encode(128, 96, jpeg_encoder::SamplingFactor::R_4_2_0);
        let mut d = Decoder::new();
        let header_end = frame(&bytes).map(|f| f.height_at + 20).unwrap();
        for cut in [3, 20, header_end, header_end + 40] {
            assert!(
                d.decode_rows(&bytes[..cut], |_, _| Some(8)).is_err(),
                "a JPEG cut at {cut} decoded"
            );
        }
        // Every single-byte corruption of the header: an error or an image, never a panic.
        for i in 0..header_end.min(bytes.len()) {
            let mut bad = bytes.clone();
            bad[i] ^= 0x5A;
            let _ = d.decode_rows(&bad, |_, _| Some(8));
        }
        assert!(frame(b"\xFF\xD8\xFF").is_none());
        assert!(frame(b"\xFF\xD8\xFF\xC0\x00\x02").is_none());
    }
}
