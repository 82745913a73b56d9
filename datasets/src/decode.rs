//! JPEG and PNG decoding into a reused RGB u8 buffer.
//!
//! # Decoder choice, by measurement
//!
//! JPEG goes through [`zune_jpeg`] (pure Rust, SIMD). The alternative was libjpeg-turbo via
//! the `turbojpeg` crate built from source with cmake and nasm. The crate docs ([`crate`],
//! "Decoder choice") have the numbers: libjpeg-turbo is 15% faster on baseline files and 9%
//! slower on progressive ones, not worth a C toolchain, cmake and nasm on every user's and
//! CI's machine when the per-image budget is met without it.
//!
//! PNG goes through the [`png`] crate (the decoder `image` uses), expanded to 8-bit RGB.
//!
//! WebP, BMP, TIFF and PPM/PGM (the rest of torchvision's `IMG_EXTENSIONS`) go through the
//! [`image`] crate, built with only those formats, into the RGB of PIL's `convert("RGB")`:
//! grey copied to R, G, B, alpha dropped, 16-bit grey clipped to 255 (PIL's `I;16` → `RGB`),
//! 16-bit colour cut to its high byte; PNG follows the same rules. Lossy WebP may differ from libwebp's by a level or two
//! (chroma upsampling); a TIFF that `image` cannot read (palette, YCbCr) is a bad sample.
//! Their size is checked against [`MAX_SIDE`] from the header, before decoding.
//!
//! Grayscale, grey+alpha, RGBA, CMYK and YCCK inputs all come out as RGB; alpha is dropped.
//! JPEGs decode in zune-jpeg's strict mode: a truncated or corrupt entropy stream is an error,
//! as it is for PIL (torchvision's default loader), rather than an image padded with grey.
//! A decoder that panics on hostile input is caught and reported as
//! [`DecodeError::Panicked`], so bad input is always an error value.

use std::io::Cursor;
use std::panic::{AssertUnwindSafe, catch_unwind};

use zune_core::bytestream::ZCursor;
use zune_core::colorspace::ColorSpace;
use zune_core::options::DecoderOptions;
use zune_jpeg::JpegDecoder;

use crate::error::DecodeError;
use crate::limits::{SampleLimits, fit};

#[path = "decode_jpeg_crop.rs"]
mod jpeg_crop;
pub use jpeg_crop::Rows;
#[path = "decode_other.rs"]
mod other;

/// The largest width or height accepted, a guard against decompression bombs.
pub const MAX_SIDE: u32 = 16_384;

/// What a record's bytes are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ImageKind {
    /// A JPEG (starts with `FF D8 FF`).
    Jpeg,
    /// A PNG (starts with the 8-byte PNG signature).
    Png,
    /// A WebP (`RIFF`, a length, `WEBP`), lossy or lossless; decoded by the `image` crate.
    WebP,
    /// A Windows bitmap (starts with `BM`); decoded by the `image` crate.
    Bmp,
    /// A TIFF (`II*\0` or `MM\0*`); decoded by the `image` crate.
    Tiff,
    /// A Netpbm image, PBM/PGM/PPM/PAM (`P1` … `P7`); decoded by the `image` crate.
    Pnm,
}

impl ImageKind {
    /// Sniffs the format from the first bytes.
    pub fn sniff(bytes: &[u8]) -> Option<Self> {
        if bytes.starts_with(&[0xFF, 0xD8, 0xFF]) {
            Some(Self::Jpeg)
        } else if bytes.starts_with(b"\x89PNG\r\n\x1a\n") {
            Some(Self::Png)
        } else {
            other::sniff(bytes)
        }
    }
}

/// A decoded RGB u8 image, HWC, borrowed from the decoder's buffer.
#[derive(Debug, Clone, Copy)]
pub struct RgbImage<'a> {
    /// Width in pixels.
    pub width: u32,
    /// Height in pixels.
    pub height: u32,
    /// `height × width × 3` bytes, row-major, RGB.
    pub pixels: &'a [u8],
}

/// A reusable decoder: keeps its output buffer between images so that steady-state decoding
/// does not grow memory. One per thread.
#[derive(Debug)]
pub struct Decoder {
    rgb: Vec<u8>,
    /// PNG scratch (the PNG's own layout before conversion to RGB).
    png: Vec<u8>,
    /// A JPEG whose frame height was cut ([`Decoder::decode_rows`]).
    patched: Vec<u8>,
    /// The most pixels an image may declare ([`SampleLimits::max_pixels`]).
    max_pixels: u64,
}

impl Default for Decoder {
    fn default() -> Self {
        Self::with_limits(&SampleLimits::default())
    }
}

impl Decoder {
    /// A decoder with empty buffers and the default pixel budget; the buffers grow to the
    /// largest image seen and are given back when a later image needs far less
    /// ([`crate::limits`]).
    pub fn new() -> Self {
        Self::default()
    }

    /// A decoder refusing images above `limits.max_pixels` from their header.
    pub fn with_limits(limits: &SampleLimits) -> Self {
        Self {
            rgb: Vec::new(),
            png: Vec::new(),
            patched: Vec::new(),
            max_pixels: limits.max_pixels,
        }
    }

    /// Bytes held by the reused buffers.
    #[cfg(test)]
    pub(crate) fn buffer_bytes(&self) -> usize {
        self.rgb.capacity() + self.png.capacity() + self.patched.capacity()
    }

    /// Decodes a JPEG or PNG into RGB.
    pub fn decode(&mut self, bytes: &[u8]) -> Result<RgbImage<'_>, DecodeError> {
        let kind = ImageKind::sniff(bytes).ok_or_else(|| DecodeError::UnknownFormat {
            magic: bytes.iter().take(8).copied().collect(),
        })?;
        let max = self.max_pixels;
        let (width, height) = catch_unwind(AssertUnwindSafe(|| match kind {
            ImageKind::Jpeg => decode_jpeg(bytes, &mut self.rgb, max),
            ImageKind::Png => decode_png(bytes, &mut self.png, &mut self.rgb, max),
            other => self::other::decode(other, bytes, &mut self.png, &mut self.rgb, max),
        }))
        .map_err(|panic| DecodeError::Panicked(panic_message(&panic)))??;
        let len = width as usize * height as usize * 3;
        Ok(RgbImage {
            width,
            height,
            pixels: &self.rgb[..len],
        })
    }

    /// Converts a planar CHW record (CIFAR's layout) into interleaved RGB.
    pub fn from_planar(
        &mut self,
        planar: &[u8],
        width: u32,
        height: u32,
    ) -> Result<RgbImage<'_>, DecodeError> {
        let plane = width as usize * height as usize;
        if planar.len() != plane * 3 {
            return Err(DecodeError::RawSize {
                len: planar.len(),
                expected: plane * 3,
            });
        }
        let rgb = fit(&mut self.rgb, plane * 3);
        let (r, rest) = planar.split_at(plane);
        let (g, b) = rest.split_at(plane);
        for (((px, &r), &g), &b) in rgb.chunks_exact_mut(3).zip(r).zip(g).zip(b) {
            px.copy_from_slice(&[r, g, b]);
        }
        Ok(RgbImage {
            width,
            height,
            pixels: &self.rgb[..plane * 3],
        })
    }
}

/// Both checks on a header's size: each side within [`MAX_SIDE`], the count within the budget.
fn check_size(width: u32, height: u32, max_pixels: u64) -> Result<(), DecodeError> {
    let (width, height) = (u64::from(width), u64::from(height));
    check_side(width, height)?;
    crate::limits::check_pixels(width, height, max_pixels)
}

fn check_side(width: u64, height: u64) -> Result<(), DecodeError> {
    if width == 0 || height == 0 || width > u64::from(MAX_SIDE) || height > u64::from(MAX_SIDE) {
        return Err(DecodeError::TooLarge {
            width,
            height,
            max: MAX_SIDE,
        });
    }
    Ok(())
}

fn decode_jpeg(
    bytes: &[u8],
    rgb: &mut Vec<u8>,
    max_pixels: u64,
) -> Result<(u32, u32), DecodeError> {
    let options = DecoderOptions::default()
        .jpeg_set_out_colorspace(ColorSpace::RGB)
        .set_strict_mode(true)
        .set_max_width(MAX_SIDE as usize)
        .set_max_height(MAX_SIDE as usize);
    let mut decoder = JpegDecoder::new_with_options(ZCursor::new(bytes), options);
    decoder
        .decode_headers()
        .map_err(|e| DecodeError::Jpeg(e.to_string()))?;
    let info = decoder
        .info()
        .ok_or_else(|| DecodeError::Jpeg("no frame header".into()))?;
    let (width, height) = (u32::from(info.width), u32::from(info.height));
    check_size(width, height, max_pixels)?;
    let len = decoder
        .output_buffer_size()
        .ok_or_else(|| DecodeError::Jpeg("image size overflows".into()))?;
    if len != width as usize * height as usize * 3 {
        return Err(DecodeError::Jpeg(format!(
            "decoder would write {len} bytes, not RGB"
        )));
    }
    decoder
        .decode_into(fit(rgb, len))
        .map_err(|e| DecodeError::Jpeg(e.to_string()))?;
    Ok((width, height))
}

fn decode_png(
    bytes: &[u8],
    scratch: &mut Vec<u8>,
    rgb: &mut Vec<u8>,
    max_pixels: u64,
) -> Result<(u32, u32), DecodeError> {
    let png_err = |e: png::DecodingError| DecodeError::Png(e.to_string());
    // The decoder's own allocations: the budget's worth of 16-bit RGBA.
    let limits = png::Limits {
        bytes: usize::try_from(max_pixels.saturating_mul(8)).unwrap_or(usize::MAX),
    };
    let mut decoder = png::Decoder::new_with_limits(Cursor::new(bytes), limits);
    // 16-bit grey stays 16-bit, to be clipped as PIL's `I;16` → `RGB` clips; every other
    // kind is cut to 8 bits (the high byte), palettes and tRNS expanded.
    let grey16 = {
        let header = decoder.read_header_info().map_err(png_err)?;
        header.color_type == png::ColorType::Grayscale && header.bit_depth == png::BitDepth::Sixteen
    };
    decoder.set_transformations(if grey16 {
        png::Transformations::IDENTITY
    } else {
        png::Transformations::normalize_to_color8()
    });
    let mut reader = decoder.read_info().map_err(png_err)?;
    let (width, height) = {
        let info = reader.info();
        (info.width, info.height)
    };
    check_size(width, height, max_pixels)?;
    let size = reader
        .output_buffer_size()
        .ok_or_else(|| DecodeError::Png("image size overflows".into()))?;
    let frame = reader.next_frame(fit(scratch, size)).map_err(png_err)?;
    let pixels = width as usize * height as usize;
    let src = &scratch[..frame.buffer_size()];
    let dst = fit(rgb, pixels * 3);
    let channels = frame.color_type.samples() * if grey16 { 2 } else { 1 };
    if frame.line_size != width as usize * channels || src.len() < pixels * channels {
        return Err(DecodeError::Png(format!(
            "unexpected {:?} frame layout",
            frame.color_type
        )));
    }
    match frame.color_type {
        png::ColorType::Rgb => dst.copy_from_slice(&src[..pixels * 3]),
        png::ColorType::Rgba => {
            for (d, s) in dst.chunks_exact_mut(3).zip(src.chunks_exact(4)) {
                d.copy_from_slice(&s[..3]);
            }
        }
        png::ColorType::Grayscale if grey16 => {
            for (d, s) in dst.chunks_exact_mut(3).zip(src.chunks_exact(2)) {
                d.fill(u16::from_be_bytes([s[0], s[1]]).min(255) as u8);
            }
        }
        png::ColorType::Grayscale => {
            for (d, &s) in dst.chunks_exact_mut(3).zip(src) {
                d.fill(s);
            }
        }
        png::ColorType::GrayscaleAlpha => {
            for (d, s) in dst.chunks_exact_mut(3).zip(src.chunks_exact(2)) {
                d.fill(s[0]);
            }
        }
        other => {
            return Err(DecodeError::Png(format!(
                "unexpected colour type {other:?}"
            )));
        }
    }
    Ok((width, height))
}

pub(crate) fn panic_message(panic: &Box<dyn std::any::Any + Send>) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "unknown panic".to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gradient(width: u32, height: u32) -> Vec<u8> {
        let mut v = Vec::new();
        for y in 0..height {
            for x in 0..width {
                v.extend_from_slice(&[(x * 255 / width) as u8, (y * 255 / height) as u8, 128]);
            }
        }
        v
    }

    fn jpeg(rgb: &[u8], w: u16, h: u16, color: jpeg_encoder::ColorType) -> Vec<u8> {
        let mut out = Vec::new();
        jpeg_encoder::Encoder::new(&mut out, 95)
            .encode(rgb, w, h, color)
            .unwrap();
        out
    }

    #[test]
    fn jpeg_and_png_decode_to_rgb_close_to_the_source() {
        let src = gradient(64, 48);
        let mut d = Decoder::new();
        let img = d
            .decode(&jpeg(&src, 64, 48, jpeg_encoder::ColorType::Rgb))
            .unwrap();
        assert_eq!(
            (img.width, img.height, img.pixels.len()),
            (64, 48, 64 * 48 * 3)
        );
        let err: u64 = img
            .pixels
            .iter()
            .zip(&src)
            .map(|(&a, &b)| a.abs_diff(b) as u64)
            .sum();
        assert!(
            err / (src.len() as u64) < 4,
            "mean abs error {}",
            err / src.len() as u64
        );

        let mut png_bytes = Vec::new();
        {
            let mut enc = png::Encoder::new(&mut png_bytes, 64, 48);
            enc.set_color(png::ColorType::Rgb);
            enc.write_header().unwrap().write_image_data(&src).unwrap();
        }
        let img = d.decode(&png_bytes).unwrap();
        assert_eq!(img.pixels, &src[..]);
    }

    #[test]
    fn sixteen_bit_png_grey_clips_and_sixteen_bit_colour_keeps_the_high_byte_as_pil_does() {
        let png16 = |color: png::ColorType, samples: &[u16]| {
            let mut out = Vec::new();
            let mut enc = png::Encoder::new(&mut out, 2, 1);
            enc.set_color(color);
            enc.set_depth(png::BitDepth::Sixteen);
            let data: Vec<u8> = samples.iter().flat_map(|v| v.to_be_bytes()).collect();
            enc.write_header().unwrap().write_image_data(&data).unwrap();
            out
        };
        let mut d = Decoder::new();
        // PIL: mode I;16, `convert("RGB")` clips to 255 (not the high byte, which is 0x01).
        let img = d
            .decode(&png16(png::ColorType::Grayscale, &[200, 0x1234]))
            .unwrap();
        assert_eq!(img.pixels, &[200, 200, 200, 255, 255, 255]);
        // PIL unpacks 16-bit RGB and grey+alpha to their high bytes.
        let img = d
            .decode(&png16(
                png::ColorType::Rgb,
                &[0x1234, 0xabcd, 0x00ff, 1, 2, 3],
            ))
            .unwrap();
        assert_eq!(img.pixels, &[0x12, 0xab, 0x00, 0, 0, 0]);
        let img = d
            .decode(&png16(png::ColorType::GrayscaleAlpha, &[0x8000, 9, 200, 9]))
            .unwrap();
        assert_eq!(img.pixels, &[0x80, 0x80, 0x80, 0, 0, 0]);
    }

    #[test]
    fn grayscale_and_cmyk_jpegs_come_out_as_rgb() {
        let gray: Vec<u8> = (0..32 * 32).map(|i| (i % 32 * 8) as u8).collect();
        let mut d = Decoder::new();
        let img = d
            .decode(&jpeg(&gray, 32, 32, jpeg_encoder::ColorType::Luma))
            .unwrap();
        assert_eq!(img.pixels.len(), 32 * 32 * 3);
        assert!(img.pixels.chunks(3).all(|p| p[0] == p[1] && p[1] == p[2]));

        // Pure cyan in CMYK (C=255, M=Y=K=0) is (0, 255, 255) in RGB.
        let cmyk: Vec<u8> = [255u8, 0, 0, 0].repeat(16 * 16);
        let img = d
            .decode(&jpeg(&cmyk, 16, 16, jpeg_encoder::ColorType::Cmyk))
            .unwrap();
        let px = &img.pixels[(8 * 16 + 8) * 3..][..3];
        assert!(
            px[0] < 40 && px[1] > 215 && px[2] > 215,
            "cyan decoded as {px:?}"
        );
    }

    #[test]
    fn garbage_truncated_and_empty_inputs_are_errors_not_panics() {
        let mut d = Decoder::new();
        assert!(matches!(
            d.decode(b""),
            Err(DecodeError::UnknownFormat { .. })
        ));
        assert!(matches!(
            d.decode(b"GIF89a...."),
            Err(DecodeError::UnknownFormat { .. })
        ));
        let good = jpeg(&gradient(64, 48), 64, 48, jpeg_encoder::ColorType::Rgb);
        for cut in [3, 20, 200, good.len() / 2] {
            assert!(
                d.decode(&good[..cut]).is_err(),
                "a JPEG cut at {cut} decoded"
            );
        }
        assert!(d.decode(b"\x89PNG\r\n\x1a\n garbage").is_err());
    }

    #[test]
    fn planar_records_become_interleaved() {
        let planar: Vec<u8> = [vec![1u8; 4], vec![2u8; 4], vec![3u8; 4]].concat();
        let mut d = Decoder::new();
        let img = d.from_planar(&planar, 2, 2).unwrap();
        assert_eq!(img.pixels, &[1, 2, 3].repeat(4)[..]);
        assert!(d.from_planar(&planar[1..], 2, 2).is_err());
    }
}

/// Files that declare more pixels than they hold, in every format, for the tests of the
/// pixel budget ([`crate::limits`]).
#[cfg(test)]
pub(crate) mod bombs {
    use super::ImageKind;

    /// A 1-bit grey PNG of `width × height` zeros: valid, a few KB for hundreds of megapixels.
    pub(crate) fn png(width: u32, height: u32) -> Vec<u8> {
        let mut out = Vec::new();
        let mut encoder = png::Encoder::new(&mut out, width, height);
        encoder.set_color(png::ColorType::Grayscale);
        encoder.set_depth(png::BitDepth::One);
        encoder.set_compression(png::Compression::Fast);
        let mut writer = encoder.write_header().unwrap();
        let mut stream = writer.stream_writer().unwrap();
        let row = vec![0u8; (width as usize).div_ceil(8)];
        for _ in 0..height {
            std::io::Write::write_all(&mut stream, &row).unwrap();
        }
        stream.finish().unwrap();
        writer.finish().unwrap();
        out
    }

    /// A file whose header says `width × height` and whose data is a few bytes: the decoder
    /// must refuse it from the header, before it allocates for the pixels.
    pub(crate) fn header(kind: ImageKind, width: u32, height: u32) -> Vec<u8> {
        let le32 = |v: u32| v.to_le_bytes();
        match kind {
            ImageKind::Jpeg => {
                let mut bytes = Vec::new();
                jpeg_encoder::Encoder::new(&mut bytes, 90)
                    .encode(&[0; 16 * 16 * 3], 16, 16, jpeg_encoder::ColorType::Rgb)
                    .unwrap();
                let at = super::jpeg_crop::frame(&bytes).unwrap().height_at;
                bytes[at..at + 2].copy_from_slice(&(height as u16).to_be_bytes());
                bytes[at + 2..at + 4].copy_from_slice(&(width as u16).to_be_bytes());
                bytes
            }
            ImageKind::Png => png(width, height),
            ImageKind::Bmp => {
                let mut b = b"BM".to_vec();
                b.extend(le32(54 + 16));
                b.extend([0; 4]);
                b.extend(le32(54));
                b.extend(le32(40));
                b.extend(le32(width));
                b.extend(le32(height));
                b.extend([1, 0, 24, 0]);
                b.extend([0; 24]);
                b.extend([0; 16]);
                b
            }
            ImageKind::Pnm => {
                let mut b = format!("P5\n{width} {height}\n255\n").into_bytes();
                b.extend([0; 16]);
                b
            }
            ImageKind::WebP => {
                // Lossless (VP8L): 14 bits each of width − 1 and height − 1.
                let dims = (width - 1) | (height - 1) << 14;
                let mut chunk = vec![0x2f];
                chunk.extend(le32(dims));
                chunk.extend([0; 11]);
                let mut b = b"RIFF".to_vec();
                b.extend(le32(4 + 8 + chunk.len() as u32));
                b.extend(b"WEBPVP8L");
                b.extend(le32(chunk.len() as u32));
                b.extend(chunk);
                b
            }
            ImageKind::Tiff => {
                // Grey, 8 bits, one uncompressed strip that the file does not hold.
                let entries: [(u16, u16, u32); 9] = [
                    (256, 4, width),
                    (257, 4, height),
                    (258, 3, 8),
                    (259, 3, 1),
                    (262, 3, 1),
                    (273, 4, 8 + 2 + 9 * 12 + 4),
                    (277, 3, 1),
                    (278, 4, height),
                    (279, 4, width.saturating_mul(height)),
                ];
                let mut b = b"II*\0".to_vec();
                b.extend(le32(8));
                b.extend((entries.len() as u16).to_le_bytes());
                for (tag, kind, value) in entries {
                    b.extend(tag.to_le_bytes());
                    b.extend(kind.to_le_bytes());
                    b.extend(le32(1));
                    b.extend(le32(value));
                }
                b.extend(le32(0));
                b.extend([0; 16]);
                b
            }
        }
    }
}

#[cfg(test)]
mod budget_tests {
    use super::bombs;
    use super::*;
    use crate::limits::{DEFAULT_MAX_PIXELS, SampleLimits};

    const KINDS: [ImageKind; 6] = [
        ImageKind::Jpeg,
        ImageKind::Png,
        ImageKind::WebP,
        ImageKind::Bmp,
        ImageKind::Tiff,
        ImageKind::Pnm,
    ];

    #[test]
    fn an_image_declaring_more_pixels_than_the_budget_is_refused_from_its_header_in_every_format() {
        // 16000 × 16000 is 256 megapixels, above the default budget, and within every
        // format's and MAX_SIDE's bounds on a side.
        for kind in KINDS {
            let bytes = bombs::header(kind, 16_000, 16_000);
            assert_eq!(ImageKind::sniff(&bytes), Some(kind));
            let err = Decoder::new().decode(&bytes).unwrap_err();
            assert!(
                matches!(
                    err,
                    DecodeError::TooManyPixels {
                        width: 16_000,
                        height: 16_000,
                        max: DEFAULT_MAX_PIXELS
                    }
                ),
                "{kind:?}: {err}"
            );
            // The crop-aware path checks the same budget.
            let err = Decoder::new()
                .decode_rows(&bytes, |_, _| Some(10))
                .unwrap_err();
            assert!(
                matches!(err, DecodeError::TooManyPixels { .. }),
                "{kind:?} by rows: {err}"
            );
        }
    }

    #[test]
    fn the_budget_is_the_callers_and_the_same_for_png_as_for_jpeg() {
        let tight = SampleLimits {
            max_pixels: 64 * 64 - 1,
            ..SampleLimits::default()
        };
        for kind in [ImageKind::Jpeg, ImageKind::Png] {
            let bytes = bombs::header(kind, 64, 64);
            let err = Decoder::with_limits(&tight).decode(&bytes).unwrap_err();
            assert!(
                matches!(err, DecodeError::TooManyPixels { max: 4095, .. }),
                "{kind:?}: {err}"
            );
            let fits = SampleLimits {
                max_pixels: 64 * 64,
                ..tight
            };
            if kind == ImageKind::Png {
                let mut decoder = Decoder::with_limits(&fits);
                let image = decoder.decode(&bytes).unwrap();
                assert_eq!((image.width, image.height), (64, 64));
            }
        }
    }
}
