//! The synthetic dataset generator: real files in all three formats with photo-like content.
//!
//! Every image is a rendered scene: a two-colour gradient at a random angle, a handful of
//! soft-edged ellipses and rectangles, sinusoidal texture and per-pixel noise, in a palette
//! tied to the class (so labels mean something). Content depends only on `(seed, index)`,
//! never on the number of threads. JPEG files are a mix of encodings so that every decoder
//! path is exercised: about 60% baseline 4:2:0, 15% progressive, 10% baseline 4:4:4, 5%
//! 4:2:2, 4% grayscale, 2% CMYK and 4% PNG. At the default 500×375, quality 90, a JPEG is
//! about 100 KB, like an ImageNet photo.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

use jpeg_encoder::{ColorType, Encoder, SamplingFactor};
use serde::Serialize;

use crate::dataset::Format;
use crate::error::GenerateError;
use crate::formats::cifar::CIFAR10_CLASSES;
use crate::rng::{SampleRng, Stream};

/// Names of the first ten synthetic classes (colours, as the palettes are).
const CLASS_NAMES: [&str; 10] = [
    "amber", "beryl", "cobalt", "denim", "emerald", "fuchsia", "gold", "heather", "indigo", "jade",
];

/// Samples per WebDataset shard by default.
pub const DEFAULT_SHARD_SAMPLES: u64 = 256;
/// Records per CIFAR batch file (as in the original dataset).
const CIFAR_BATCH_RECORDS: u64 = 10_000;

/// How to generate a synthetic dataset.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SynthConfig {
    /// Which format to write.
    pub format: Format,
    /// Number of samples.
    pub count: u64,
    /// Number of classes (labels `0..classes`).
    pub classes: u32,
    /// Image width (ImageFolder and WebDataset; CIFAR is always 32×32).
    pub width: u32,
    /// Image height.
    pub height: u32,
    /// JPEG quality, 1–100.
    pub quality: u8,
    /// Seed of all content.
    pub seed: u64,
    /// Samples per WebDataset shard.
    pub shard_samples: u64,
    /// Threads rendering and encoding in parallel.
    pub threads: usize,
}

impl Default for SynthConfig {
    fn default() -> Self {
        Self {
            format: Format::ImageFolder,
            count: 1000,
            classes: 10,
            width: 500,
            height: 375,
            quality: 90,
            seed: 0,
            shard_samples: DEFAULT_SHARD_SAMPLES,
            threads: std::thread::available_parallelism().map_or(1, |n| n.get()),
        }
    }
}

/// What [`generate`] wrote.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct GenerateSummary {
    /// Samples written.
    pub samples: u64,
    /// Files written (images, shards or batches, plus class-name files).
    pub files: u64,
    /// Bytes written.
    pub bytes: u64,
}

/// How a sample is encoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Encoding {
    /// Baseline JPEG, 4:2:0.
    Baseline420,
    /// Progressive JPEG, 4:2:0.
    Progressive420,
    /// Baseline JPEG, 4:4:4.
    Baseline444,
    /// Baseline JPEG, 4:2:2.
    Baseline422,
    /// Single-channel JPEG.
    Grayscale,
    /// Four-channel CMYK JPEG (Adobe marker).
    Cmyk,
    /// 8-bit RGB PNG.
    Png,
}

impl Encoding {
    /// The encoding of sample `index` under `seed`.
    pub fn of(seed: u64, index: u64) -> Self {
        let mut rng = SampleRng::new(Stream::Synth, seed, u64::MAX, index);
        match rng.below(100) {
            0..4 => Self::Png,
            4..8 => Self::Grayscale,
            8..10 => Self::Cmyk,
            10..25 => Self::Progressive420,
            25..35 => Self::Baseline444,
            35..40 => Self::Baseline422,
            _ => Self::Baseline420,
        }
    }

    /// File extension of this encoding.
    pub fn extension(self) -> &'static str {
        if self == Self::Png { "png" } else { "jpg" }
    }
}

/// The class names the generator uses for `classes` classes.
pub fn class_names(format: Format, classes: u32) -> Vec<String> {
    (0..classes as usize)
        .map(|c| match format {
            Format::Cifar10 if classes <= 10 => CIFAR10_CLASSES[c].to_owned(),
            _ if classes <= 10 => CLASS_NAMES[c].to_owned(),
            _ => format!("class_{c:03}"),
        })
        .collect()
}

/// Label of sample `index`: classes are balanced and interleaved.
fn label_of(index: u64, classes: u32) -> u32 {
    (index % u64::from(classes)) as u32
}

/// Renders sample `index`'s scene as RGB into `out` (resized to `width × height × 3`).
pub fn render(seed: u64, index: u64, classes: u32, width: u32, height: u32, out: &mut Vec<u8>) {
    let mut rng = SampleRng::new(Stream::Synth, seed, 0, index);
    let class = label_of(index, classes);
    let hue = f64::from(class) / f64::from(classes.max(1)) * 360.0;
    let colour = |spread: f64, rng: &mut SampleRng| {
        hsv(
            hue + rng.uniform(-spread, spread),
            rng.uniform(0.3, 1.0),
            rng.uniform(0.25, 1.0),
        )
    };
    let (c0, c1) = (colour(40.0, &mut rng), colour(180.0, &mut rng));
    let angle = rng.uniform(0.0, std::f64::consts::TAU);
    let (ax, ay) = (angle.cos(), angle.sin());
    let (w, h) = (f64::from(width), f64::from(height));
    let extent = ax.abs() * w + ay.abs() * h;

    struct Shape {
        cx: f64,
        cy: f64,
        rx: f64,
        ry: f64,
        ellipse: bool,
        rgb: [f64; 3],
        fx: f64,
        fy: f64,
    }
    let shapes: Vec<Shape> = (0..rng.inclusive(3, 8))
        .map(|_| Shape {
            cx: rng.uniform(0.0, w),
            cy: rng.uniform(0.0, h),
            rx: rng.uniform(0.05, 0.3) * w,
            ry: rng.uniform(0.05, 0.3) * h,
            ellipse: rng.below(2) == 0,
            rgb: colour(90.0, &mut rng),
            fx: rng.uniform(0.02, 0.4),
            fy: rng.uniform(0.02, 0.4),
        })
        .collect();
    let (tfx, tfy) = (rng.uniform(0.01, 0.15), rng.uniform(0.01, 0.15));
    let noise_amp = rng.uniform(36.0, 52.0);
    let mut noise = rng.next_u64() | 1;

    out.clear();
    out.reserve(width as usize * height as usize * 3);
    for y in 0..height {
        let yf = f64::from(y);
        for x in 0..width {
            let xf = f64::from(x);
            let t = ((xf * ax + yf * ay) / extent).rem_euclid(1.0);
            let mut px = [0.0; 3];
            for (k, p) in px.iter_mut().enumerate() {
                *p = c0[k] * (1.0 - t) + c1[k] * t;
            }
            let texture = 12.0 * (xf * tfx).sin() * (yf * tfy).cos();
            for s in &shapes {
                let (dx, dy) = ((xf - s.cx) / s.rx, (yf - s.cy) / s.ry);
                let d = if s.ellipse {
                    (dx * dx + dy * dy).sqrt()
                } else {
                    dx.abs().max(dy.abs())
                };
                // Soft edge over the last 5% of the radius.
                let alpha = ((1.0 - d) * 20.0).clamp(0.0, 1.0);
                if alpha > 0.0 {
                    let stripes = 18.0 * (xf * s.fx + yf * s.fy).sin();
                    for (k, p) in px.iter_mut().enumerate() {
                        *p = *p * (1.0 - alpha) + (s.rgb[k] + stripes) * alpha;
                    }
                }
            }
            // xorshift64: cheap per-pixel noise.
            noise ^= noise << 13;
            noise ^= noise >> 7;
            noise ^= noise << 17;
            for (k, p) in px.iter().enumerate() {
                let n = ((noise >> (k * 16)) & 0xFFFF) as f64 / 65535.0 - 0.5;
                out.push((p + texture + n * noise_amp).clamp(0.0, 255.0) as u8);
            }
        }
    }
}

/// HSV (hue in degrees) to RGB in 0–255.
fn hsv(hue: f64, s: f64, v: f64) -> [f64; 3] {
    let h = hue.rem_euclid(360.0) / 60.0;
    let c = v * s;
    let x = c * (1.0 - (h % 2.0 - 1.0).abs());
    let (r, g, b) = match h as u32 {
        0 => (c, x, 0.0),
        1 => (x, c, 0.0),
        2 => (0.0, c, x),
        3 => (0.0, x, c),
        4 => (x, 0.0, c),
        _ => (c, 0.0, x),
    };
    let m = v - c;
    [(r + m) * 255.0, (g + m) * 255.0, (b + m) * 255.0]
}

/// Encodes RGB pixels with `encoding` into `out`.
pub fn encode(
    rgb: &[u8],
    width: u32,
    height: u32,
    encoding: Encoding,
    quality: u8,
    out: &mut Vec<u8>,
) -> Result<(), String> {
    out.clear();
    let (w, h) = (
        u16::try_from(width).map_err(|_| "width above 65535")?,
        u16::try_from(height).map_err(|_| "height above 65535")?,
    );
    if encoding == Encoding::Png {
        let mut enc = png::Encoder::new(&mut *out, width, height);
        enc.set_color(png::ColorType::Rgb);
        enc.set_depth(png::BitDepth::Eight);
        let mut writer = enc.write_header().map_err(|e| e.to_string())?;
        return writer.write_image_data(rgb).map_err(|e| e.to_string());
    }
    let mut enc = Encoder::new(&mut *out, quality);
    let converted: Vec<u8>;
    let (data, color) = match encoding {
        Encoding::Grayscale => {
            converted = rgb
                .chunks_exact(3)
                .map(|p| {
                    ((77 * u32::from(p[0]) + 150 * u32::from(p[1]) + 29 * u32::from(p[2])) >> 8)
                        as u8
                })
                .collect();
            (&converted[..], ColorType::Luma)
        }
        Encoding::Cmyk => {
            converted = rgb
                .chunks_exact(3)
                .flat_map(|p| {
                    let k = 255 - p[0].max(p[1]).max(p[2]);
                    let scale = |c: u8| {
                        if k == 255 {
                            0
                        } else {
                            ((255 - c - k) as u32 * 255 / (255 - k) as u32) as u8
                        }
                    };
                    [scale(p[0]), scale(p[1]), scale(p[2]), k]
                })
                .collect();
            (&converted[..], ColorType::Cmyk)
        }
        _ => (rgb, ColorType::Rgb),
    };
    match encoding {
        Encoding::Progressive420 => enc.set_progressive(true),
        // CMYK files (from print workflows) are normally not subsampled.
        Encoding::Baseline444 | Encoding::Cmyk => enc.set_sampling_factor(SamplingFactor::R_4_4_4),
        Encoding::Baseline422 => enc.set_sampling_factor(SamplingFactor::R_4_2_2),
        _ => enc.set_sampling_factor(SamplingFactor::R_4_2_0),
    }
    enc.encode(data, w, h, color).map_err(|e| e.to_string())
}

/// Writes a synthetic dataset of `config.format` into `out` (created if missing), calling
/// `progress` with the number of samples finished since the last call.
pub fn generate(
    config: &SynthConfig,
    out: &Path,
    progress: &(dyn Fn(u64) + Sync),
) -> Result<GenerateSummary, GenerateError> {
    validate(config)?;
    let io = |path: &Path| {
        let path = path.to_owned();
        move |source| GenerateError::Io { path, source }
    };
    std::fs::create_dir_all(out).map_err(io(out))?;
    let names = class_names(config.format, config.classes);
    let mut summary = GenerateSummary {
        samples: config.count,
        ..Default::default()
    };
    // Units of work: one image, one shard or one batch file.
    let unit = match config.format {
        Format::WebDataset => config.shard_samples,
        Format::Cifar10 => CIFAR_BATCH_RECORDS,
        Format::Cifar100 => config.count, // one train.bin, as in the original
        _ => 1,
    };
    match config.format {
        Format::ImageFolder => {
            for name in &names {
                let dir = out.join(name);
                std::fs::create_dir_all(&dir).map_err(io(&dir))?;
            }
        }
        Format::WebDataset => {
            summary += write_names(&out.join("classes.txt"), &names)?;
        }
        Format::Cifar100 => summary += write_names(&out.join("fine_label_names.txt"), &names)?,
        _ => summary += write_names(&out.join("batches.meta.txt"), &names)?,
    }
    let units = config.count.div_ceil(unit);
    let next = AtomicU64::new(0);
    let written = std::thread::scope(|scope| {
        let workers: Vec<_> = (0..config.threads.max(1))
            .map(|_| {
                scope.spawn(|| {
                    let mut total = GenerateSummary::default();
                    let mut scratch = Scratch::default();
                    loop {
                        let u = next.fetch_add(1, Ordering::Relaxed);
                        if u >= units {
                            return Ok(total);
                        }
                        let range = u * unit..((u + 1) * unit).min(config.count);
                        total += write_unit(config, out, &names, u, range, &mut scratch, progress)?;
                    }
                })
            })
            .collect();
        workers
            .into_iter()
            .map(|w| w.join().unwrap_or_else(|_| Err(panicked())))
            .collect::<Vec<_>>()
    });
    for w in written {
        summary += w?;
    }
    summary.samples = config.count;
    Ok(summary)
}

fn panicked() -> GenerateError {
    GenerateError::InvalidOption("a generator thread panicked".into())
}

fn validate(config: &SynthConfig) -> Result<(), GenerateError> {
    let bad = |m: &str| Err(GenerateError::InvalidOption(m.to_owned()));
    if config.count == 0 {
        return bad("count must be at least 1");
    }
    if config.classes == 0 || config.classes > 256 {
        return bad("classes must be 1..=256");
    }
    if matches!(config.format, Format::Cifar10 | Format::Cifar100) && config.classes > 100 {
        return bad("CIFAR labels are one byte of at most 100 classes");
    }
    if !(8..=65535).contains(&config.width) || !(8..=65535).contains(&config.height) {
        return bad("width and height must be 8..=65535");
    }
    if !(1..=100).contains(&config.quality) {
        return bad("quality must be 1..=100");
    }
    if config.shard_samples == 0 {
        return bad("shard size must be at least 1");
    }
    Ok(())
}

impl std::ops::AddAssign for GenerateSummary {
    fn add_assign(&mut self, rhs: Self) {
        self.samples += rhs.samples;
        self.files += rhs.files;
        self.bytes += rhs.bytes;
    }
}

#[derive(Default)]
struct Scratch {
    rgb: Vec<u8>,
    encoded: Vec<u8>,
}

fn write_names(path: &Path, names: &[String]) -> Result<GenerateSummary, GenerateError> {
    let text = names.join("\n") + "\n";
    std::fs::write(path, &text).map_err(|source| GenerateError::Io {
        path: path.into(),
        source,
    })?;
    Ok(GenerateSummary {
        samples: 0,
        files: 1,
        bytes: text.len() as u64,
    })
}

fn write_unit(
    config: &SynthConfig,
    out: &Path,
    names: &[String],
    unit: u64,
    range: std::ops::Range<u64>,
    s: &mut Scratch,
    progress: &(dyn Fn(u64) + Sync),
) -> Result<GenerateSummary, GenerateError> {
    let io = |path: &Path| {
        let path = path.to_owned();
        move |source| GenerateError::Io { path, source }
    };
    let encode_err = |path: &Path| {
        let path = path.to_owned();
        move |reason| GenerateError::Encode { path, reason }
    };
    let (w, h, seed) = (config.width, config.height, config.seed);
    match config.format {
        Format::ImageFolder => {
            let index = range.start;
            let encoding = Encoding::of(seed, index);
            let class = &names[label_of(index, config.classes) as usize];
            let path = out
                .join(class)
                .join(format!("{index:06}.{}", encoding.extension()));
            render(seed, index, config.classes, w, h, &mut s.rgb);
            encode(&s.rgb, w, h, encoding, config.quality, &mut s.encoded)
                .map_err(encode_err(&path))?;
            std::fs::write(&path, &s.encoded).map_err(io(&path))?;
            progress(1);
            Ok(GenerateSummary {
                samples: 0,
                files: 1,
                bytes: s.encoded.len() as u64,
            })
        }
        Format::WebDataset => {
            let path = out.join(format!("shard-{unit:06}.tar"));
            let file = File::create(&path).map_err(io(&path))?;
            let mut tar = tar::Builder::new(BufWriter::new(file));
            for index in range {
                let encoding = Encoding::of(seed, index);
                render(seed, index, config.classes, w, h, &mut s.rgb);
                encode(&s.rgb, w, h, encoding, config.quality, &mut s.encoded)
                    .map_err(encode_err(&path))?;
                let label = label_of(index, config.classes).to_string();
                let image_name = format!("{index:08}.{}", encoding.extension());
                for (name, data) in [
                    (image_name, &s.encoded[..]),
                    (format!("{index:08}.cls"), label.as_bytes()),
                ] {
                    let mut header = tar::Header::new_gnu();
                    header.set_size(data.len() as u64);
                    header.set_mode(0o644);
                    header.set_mtime(0);
                    header.set_cksum();
                    tar.append_data(&mut header, name, data)
                        .map_err(io(&path))?;
                }
                progress(1);
            }
            let mut writer = tar.into_inner().map_err(io(&path))?;
            writer.flush().map_err(io(&path))?;
            let bytes = std::fs::metadata(&path).map_err(io(&path))?.len();
            Ok(GenerateSummary {
                samples: 0,
                files: 1,
                bytes,
            })
        }
        Format::Cifar10 | Format::Cifar100 => {
            let side = crate::formats::cifar::SIDE;
            let path = if config.format == Format::Cifar100 {
                out.join("train.bin")
            } else {
                out.join(format!("data_batch_{}.bin", unit + 1))
            };
            let mut data = Vec::new();
            for index in range {
                render(seed, index, config.classes, side, side, &mut s.rgb);
                let label = label_of(index, config.classes) as u8;
                if config.format == Format::Cifar100 {
                    data.push(label / 5); // coarse label: 20 superclasses of 5
                }
                data.push(label);
                for channel in 0..3 {
                    data.extend(s.rgb.iter().skip(channel).step_by(3));
                }
                progress(1);
            }
            std::fs::write(&path, &data).map_err(io(&path))?;
            Ok(GenerateSummary {
                samples: 0,
                files: 1,
                bytes: data.len() as u64,
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decode::Decoder;

    #[test]
    fn every_encoding_round_trips_through_the_decoder_close_to_the_scene() {
        let (w, h) = (120, 90);
        let mut rgb = Vec::new();
        render(3, 5, 10, w, h, &mut rgb);
        assert_eq!(rgb.len(), (w * h * 3) as usize);
        let mut encoded = Vec::new();
        let mut decoder = Decoder::new();
        for encoding in [
            Encoding::Baseline420,
            Encoding::Progressive420,
            Encoding::Baseline444,
            Encoding::Baseline422,
            Encoding::Grayscale,
            Encoding::Cmyk,
            Encoding::Png,
        ] {
            encode(&rgb, w, h, encoding, 90, &mut encoded).unwrap();
            let img = decoder.decode(&encoded).unwrap();
            assert_eq!((img.width, img.height), (w, h), "{encoding:?}");
            // Mean absolute error against the scene; grayscale is compared to its luma.
            let err: u64 = if encoding == Encoding::Grayscale {
                img.pixels
                    .chunks(3)
                    .zip(rgb.chunks(3))
                    .map(|(d, s)| {
                        let luma =
                            (77 * u32::from(s[0]) + 150 * u32::from(s[1]) + 29 * u32::from(s[2]))
                                >> 8;
                        u64::from(d[0].abs_diff(luma as u8))
                    })
                    .sum::<u64>()
                    * 3
            } else {
                img.pixels
                    .iter()
                    .zip(&rgb)
                    .map(|(&a, &b)| u64::from(a.abs_diff(b)))
                    .sum()
            };
            let mean = err as f64 / rgb.len() as f64;
            let limit = if encoding == Encoding::Png { 0.0 } else { 12.0 };
            assert!(mean <= limit, "{encoding:?}: mean abs error {mean:.1}");
        }
    }

    #[test]
    fn scenes_are_not_flat_and_differ_between_samples() {
        let (mut a, mut b) = (Vec::new(), Vec::new());
        render(0, 1, 10, 64, 48, &mut a);
        render(0, 2, 10, 64, 48, &mut b);
        assert_ne!(a, b);
        let distinct: std::collections::HashSet<&[u8]> = a.chunks(3).collect();
        assert!(
            distinct.len() > 500,
            "only {} distinct colours",
            distinct.len()
        );
    }

    #[test]
    fn invalid_options_are_rejected_before_writing() {
        let dir = std::env::temp_dir().join(format!("ladle-synth-invalid-{}", std::process::id()));
        for config in [
            SynthConfig {
                count: 0,
                ..SynthConfig::default()
            },
            SynthConfig {
                classes: 0,
                ..SynthConfig::default()
            },
            SynthConfig {
                quality: 0,
                ..SynthConfig::default()
            },
            SynthConfig {
                width: 2,
                ..SynthConfig::default()
            },
        ] {
            assert!(matches!(
                generate(&config, &dir, &|_| {}),
                Err(GenerateError::InvalidOption(_))
            ));
        }
        assert!(!dir.exists());
    }
}
