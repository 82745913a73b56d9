//! WebP, BMP, TIFF and Netpbm (PPM/PGM) decoding through the `image` crate: the rest of
//! torchvision's `IMG_EXTENSIONS`. JPEG and PNG, nearly every file of a real dataset, keep
//! their own decoders in the parent module.
//!
//! The output is what PIL's `Image.open(f).convert("RGB")` (torchvision's `pil_loader`) gives:
//!
//! | decoded as | RGB u8 out | PIL's path |
//! |---|---|---|
//! | 8-bit grey (and 1-bit, palette expanded) | grey copied to R, G and B | `L` → `RGB` |
//! | 8-bit grey + alpha, RGBA | alpha dropped, never composited | `LA`/`RGBA` → `RGB` |
//! | 16-bit grey | clipped to 0…255 (not scaled) | `I;16` → `RGB` clips (`I16_RGB`) |
//! | 16-bit grey + alpha, RGB, RGBA | the high byte of each sample | PIL unpacks `…;16B` to 8 bits |
//! | 32-bit float RGB(A) | `image`'s 0…1 scaled by 255, rounded | PIL has no such mode: refuses |
//!
//! Lossy WebP goes through `image-webp` rather than libwebp: its chroma upsampling may differ
//! from libwebp's by a level or two per channel; lossless WebP, BMP, TIFF and PPM/PGM are
//! exact. A TIFF `image` cannot read (palette colour, YCbCr, planar configuration 2) is a bad
//! sample here although PIL reads it.
//!
//! The width and height are checked against [`MAX_SIDE`] and the pixel budget
//! ([`crate::limits`]) from the header, before any pixel is decoded, and the decoder is given
//! the same bounds through [`image::Limits`].

use std::io::Cursor;

use image::{ColorType, ImageDecoder, ImageError, Limits};

use super::{ImageKind, MAX_SIDE, check_size};
use crate::error::DecodeError;
use crate::limits::fit;

/// The formats of this module, sniffed by content as PIL does (not by extension).
pub(super) fn sniff(bytes: &[u8]) -> Option<ImageKind> {
    match bytes {
        [
            b'R',
            b'I',
            b'F',
            b'F',
            _,
            _,
            _,
            _,
            b'W',
            b'E',
            b'B',
            b'P',
            ..,
        ] => Some(ImageKind::WebP),
        [b'B', b'M', ..] => Some(ImageKind::Bmp),
        // Classic TIFF and BigTIFF, either byte order.
        [b'I', b'I', 42 | 43, 0, ..] | [b'M', b'M', 0, 42 | 43, ..] => Some(ImageKind::Tiff),
        [b'P', b'1'..=b'7', next, ..] if next.is_ascii_whitespace() => Some(ImageKind::Pnm),
        _ => None,
    }
}

/// The short name of a format, for messages.
fn name(kind: ImageKind) -> &'static str {
    match kind {
        ImageKind::Jpeg => "JPEG",
        ImageKind::Png => "PNG",
        ImageKind::WebP => "WebP",
        ImageKind::Bmp => "BMP",
        ImageKind::Tiff => "TIFF",
        ImageKind::Pnm => "PPM/PGM",
    }
}

/// Decodes `bytes` (already sniffed as `kind`) into `rgb`, using `scratch` for the decoder's
/// own layout. Returns the width and height.
pub(super) fn decode(
    kind: ImageKind,
    bytes: &[u8],
    scratch: &mut Vec<u8>,
    rgb: &mut Vec<u8>,
    max_pixels: u64,
) -> Result<(u32, u32), DecodeError> {
    let bad = |e: ImageError| match e {
        ImageError::Limits(_) => DecodeError::Image {
            format: name(kind),
            reason: format!(
                "over ladle's limits ({MAX_SIDE} pixels a side, {max_pixels} in all): {e}"
            ),
        },
        e => DecodeError::Image {
            format: name(kind),
            reason: e.to_string(),
        },
    };
    let reader = Cursor::new(bytes);
    match kind {
        ImageKind::WebP => {
            let decoder = image::codecs::webp::WebPDecoder::new(reader).map_err(bad)?;
            decode_with(decoder, kind, scratch, rgb, max_pixels)
        }
        ImageKind::Bmp => {
            let decoder = image::codecs::bmp::BmpDecoder::new(reader).map_err(bad)?;
            decode_with(decoder, kind, scratch, rgb, max_pixels)
        }
        ImageKind::Tiff => {
            let decoder = image::codecs::tiff::TiffDecoder::new(reader).map_err(bad)?;
            decode_with(decoder, kind, scratch, rgb, max_pixels)
        }
        ImageKind::Pnm => {
            let decoder = image::codecs::pnm::PnmDecoder::new(reader).map_err(bad)?;
            decode_with(decoder, kind, scratch, rgb, max_pixels)
        }
        ImageKind::Jpeg | ImageKind::Png => Err(DecodeError::Image {
            format: name(kind),
            reason: "JPEG and PNG have their own decoders".into(),
        }),
    }
}

fn decode_with(
    mut decoder: impl ImageDecoder,
    kind: ImageKind,
    scratch: &mut Vec<u8>,
    rgb: &mut Vec<u8>,
    max_pixels: u64,
) -> Result<(u32, u32), DecodeError> {
    let bad = |e: ImageError| DecodeError::Image {
        format: name(kind),
        reason: e.to_string(),
    };
    // The header's size, checked before a pixel is decoded.
    let (width, height) = decoder.dimensions();
    check_size(width, height, max_pixels)?;
    let color = decoder.color_type();
    let mut limits = Limits::default();
    limits.max_image_width = Some(MAX_SIDE);
    limits.max_image_height = Some(MAX_SIDE);
    // The largest output of an accepted size (16-bit RGBA) plus as much again for the
    // decoder's own buffers; the default 512 MiB would refuse large images JPEG accepts.
    limits.max_alloc = Some(max_pixels.saturating_mul(8 * 2));
    decoder.set_limits(limits).map_err(bad)?;
    let size = usize::try_from(decoder.total_bytes()).map_err(|_| DecodeError::TooLarge {
        width: u64::from(width),
        height: u64::from(height),
        max: MAX_SIDE,
    })?;
    decoder.read_image(fit(scratch, size)).map_err(bad)?;
    let pixels = width as usize * height as usize;
    to_rgb(color, &scratch[..size], fit(rgb, pixels * 3)).ok_or_else(|| DecodeError::Image {
        format: name(kind),
        reason: format!("unexpected {color:?} output of {size} bytes for {width}x{height}"),
    })?;
    Ok((width, height))
}

/// Converts the decoder's layout into RGB u8 as PIL's `convert("RGB")` does (see the module
/// docs); `None` when `src` is not `dst.len() / 3` pixels of `color`.
fn to_rgb(color: ColorType, src: &[u8], dst: &mut [u8]) -> Option<()> {
    let pixels = dst.len() / 3;
    if src.len() != pixels * usize::from(color.bytes_per_pixel()) {
        return None;
    }
    let out = dst.chunks_exact_mut(3);
    // 16-bit samples come in native byte order.
    let u16_at = |s: &[u8], i: usize| u16::from_ne_bytes([s[2 * i], s[2 * i + 1]]);
    let f32_at = |s: &[u8], i: usize| {
        f32::from_ne_bytes([s[4 * i], s[4 * i + 1], s[4 * i + 2], s[4 * i + 3]])
    };
    let high = |v: u16| (v >> 8) as u8;
    let unit = |v: f32| (v.clamp(0.0, 1.0) * 255.0).round() as u8;
    match color {
        ColorType::Rgb8 => dst.copy_from_slice(src),
        ColorType::Rgba8 => {
            for (d, s) in out.zip(src.chunks_exact(4)) {
                d.copy_from_slice(&s[..3]);
            }
        }
        ColorType::L8 => {
            for (d, &s) in out.zip(src) {
                d.fill(s);
            }
        }
        ColorType::La8 => {
            for (d, s) in out.zip(src.chunks_exact(2)) {
                d.fill(s[0]);
            }
        }
        ColorType::L16 => {
            for (d, s) in out.zip(src.chunks_exact(2)) {
                d.fill(u16_at(s, 0).min(255) as u8);
            }
        }
        ColorType::La16 => {
            for (d, s) in out.zip(src.chunks_exact(4)) {
                d.fill(high(u16_at(s, 0)));
            }
        }
        ColorType::Rgb16 | ColorType::Rgba16 => {
            let step = usize::from(color.bytes_per_pixel());
            for (d, s) in out.zip(src.chunks_exact(step)) {
                d.copy_from_slice(&[high(u16_at(s, 0)), high(u16_at(s, 1)), high(u16_at(s, 2))]);
            }
        }
        ColorType::Rgb32F | ColorType::Rgba32F => {
            let step = usize::from(color.bytes_per_pixel());
            for (d, s) in out.zip(src.chunks_exact(step)) {
                d.copy_from_slice(&[unit(f32_at(s, 0)), unit(f32_at(s, 1)), unit(f32_at(s, 2))]);
            }
        }
        _ => return None,
    }
    Some(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sixteen_bit_grey_clips_and_sixteen_bit_colour_keeps_the_high_byte_as_pil_does() {
        let grey: Vec<u8> = [7u16, 255, 256, 60_000]
            .iter()
            .flat_map(|v| v.to_ne_bytes())
            .collect();
        let mut dst = vec![0u8; 4 * 3];
        to_rgb(ColorType::L16, &grey, &mut dst).unwrap();
        assert_eq!(dst, [7, 7, 7, 255, 255, 255, 255, 255, 255, 255, 255, 255]);

        let rgb: Vec<u8> = [0x1234u16, 0xFF00, 0x00FF]
            .iter()
            .flat_map(|v| v.to_ne_bytes())
            .collect();
        let mut dst = vec![0u8; 3];
        to_rgb(ColorType::Rgb16, &rgb, &mut dst).unwrap();
        assert_eq!(dst, [0x12, 0xFF, 0x00]);
    }

    #[test]
    fn a_buffer_of_the_wrong_length_is_refused_not_indexed_past_its_end() {
        let mut dst = vec![0u8; 2 * 3];
        assert!(to_rgb(ColorType::Rgba8, &[0; 7], &mut dst).is_none());
        assert!(to_rgb(ColorType::L8, &[0; 2], &mut dst).is_some());
    }

    #[test]
    fn formats_are_sniffed_by_content() {
        assert_eq!(sniff(b"RIFF\0\0\0\0WEBPVP8 "), Some(ImageKind::WebP));
        assert_eq!(sniff(b"BM\0\0"), Some(ImageKind::Bmp));
        assert_eq!(sniff(b"II*\0\x08\0"), Some(ImageKind::Tiff));
        assert_eq!(sniff(b"MM\0*\0\0"), Some(ImageKind::Tiff));
        assert_eq!(sniff(b"P6\n2 2\n255\n"), Some(ImageKind::Pnm));
        assert_eq!(sniff(b"P5 2 2 255 "), Some(ImageKind::Pnm));
        assert_eq!(sniff(b"RIFF\0\0\0\0WAVE"), None);
        assert_eq!(sniff(b"P9\n"), None);
        assert_eq!(sniff(b"GIF89a"), None);
    }
}
