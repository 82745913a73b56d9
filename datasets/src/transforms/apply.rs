//! Running a [`Transforms`] pipeline on one decoded image, with reused buffers.

use fast_image_resize::images::{Image, ImageRef};
use fast_image_resize::{FilterType, PixelType, ResizeAlg, ResizeOptions, Resizer};

use super::{Drawn, PaddingMode, ResizeTo, Transform, Transforms, resized_dims};
use crate::decode::{RgbImage, Rows};
use crate::error::AugmentError;
use crate::rng::{SampleRng, Stream};

mod pixels;

pub(crate) use pixels::gray;
use pixels::{copy_padded, pixel_op, resample};

/// A crop rectangle in source pixels.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Crop {
    /// Left edge.
    pub left: f64,
    /// Top edge.
    pub top: f64,
    /// Width.
    pub width: f64,
    /// Height.
    pub height: f64,
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
    }
}

/// Most pixels an intermediate image may have (64 Mi, 192 MiB of RGB).
const MAX_PIXELS: u64 = 1 << 26;

/// Where the current image lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Loc {
    /// The caller's decoded image (read-only).
    Source,
    /// Scratch buffer 0 or 1.
    Buf0,
    Buf1,
    /// The caller's output buffer.
    Out,
}

/// One axis of a crop with padding: output coordinate `o` reads padded coordinate
/// `o + start` of an image padded by `pad2` (before) around an image padded by `pad1` around
/// the source.
#[derive(Debug, Clone, Copy)]
struct Axis {
    pad1: i64,
    n1: i64,
    pad2: i64,
    start: i64,
}

impl Axis {
    /// The source coordinate of output coordinate `o`, or `None` for the fill value.
    fn map(self, o: i64, n: u32, mode: PaddingMode) -> Option<usize> {
        let x1 = pad_map(o + self.start - self.pad2, self.n1, mode)?;
        pad_map(x1 - self.pad1, i64::from(n), mode).map(|x| x as usize)
    }
}

/// The coordinate `x` of an image of `n` pixels padded in `mode` (NumPy's `np.pad` modes).
fn pad_map(x: i64, n: i64, mode: PaddingMode) -> Option<i64> {
    if (0..n).contains(&x) {
        return Some(x);
    }
    match mode {
        PaddingMode::Constant => None,
        PaddingMode::Edge => Some(x.clamp(0, n - 1)),
        PaddingMode::Reflect if n == 1 => Some(0),
        PaddingMode::Reflect => {
            let period = 2 * (n - 1);
            let m = x.rem_euclid(period);
            Some(if m < n { m } else { period - m })
        }
        PaddingMode::Symmetric => {
            let period = 2 * n;
            let m = x.rem_euclid(period);
            Some(if m < n { m } else { period - 1 - m })
        }
    }
}

/// How a producing transform makes its output.
#[derive(Debug, Clone, Copy)]
enum Op {
    /// Crop a box, then resample the crop alone to the output size: pixels outside the box
    /// never contribute, as torchvision's `resized_crop` (crop, then resize).
    CropResample {
        left: u32,
        top: u32,
        width: u32,
        height: u32,
    },
    /// Resample a (fractional) source rectangle to the output size; the filter reads source
    /// pixels beyond the rectangle's edges, as resizing the whole image would.
    Resample {
        left: f64,
        top: f64,
        width: f64,
        height: f64,
    },
    /// Copy pixels, padding outside the source.
    Copy {
        x: Axis,
        y: Axis,
        mode: PaddingMode,
        fill: [u8; 3],
    },
}

/// Where [`Transformer::apply_traced`] collects what each transform drew; `None` when not
/// tracing.
pub(super) type Trace<'a> = Option<&'a mut Vec<Drawn>>;

/// Adds `drawn` to the trace, if there is one.
pub(super) fn record(trace: &mut Trace<'_>, drawn: impl FnOnce() -> Drawn) {
    if let Some(t) = trace {
        t.push(drawn());
    }
}

/// Python's `round` (half to even) of `d / 2` for an integer `d ≥ 0`.
fn half_round_even(d: i64) -> i64 {
    let k = d / 2;
    if d % 2 == 0 || k % 2 == 0 { k } else { k + 1 }
}

/// Applies a [`Transforms`] pipeline with reused buffers and a reused SIMD resizer. One per
/// thread; after the first few samples it allocates nothing.
pub struct Transformer {
    transforms: Transforms,
    last_producer: usize,
    resizer: Resizer,
    bufs: [Vec<u8>; 2],
    cols: Vec<Option<usize>>,
    tmp: Vec<u8>,
}

impl std::fmt::Debug for Transformer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Transformer")
            .field("transforms", &self.transforms.to_string())
            .finish_non_exhaustive()
    }
}

/// `v` holding `n` bytes: grown, or given back first if one huge image grew it
/// ([`crate::limits::fit`]).
fn grow(v: &mut Vec<u8>, n: usize) -> &mut [u8] {
    crate::limits::fit(v, n)
}

fn check_dims(transform: &'static str, w: u64, h: u64) -> Result<(), AugmentError> {
    if w == 0 || h == 0 || w * h > MAX_PIXELS {
        return Err(AugmentError::TooLarge {
            transform,
            height: h,
            width: w,
        });
    }
    Ok(())
}

fn name(t: &Transform) -> &'static str {
    match t {
        Transform::RandomResizedCrop { .. } => "RandomResizedCrop",
        Transform::RandomCrop { .. } => "RandomCrop",
        Transform::Resize { .. } => "Resize",
        Transform::CenterCrop { .. } => "CenterCrop",
        Transform::RandomHorizontalFlip { .. } => "RandomHorizontalFlip",
        Transform::RandomVerticalFlip { .. } => "RandomVerticalFlip",
        Transform::ColorJitter { .. } => "ColorJitter",
        Transform::RandomGrayscale { .. } => "RandomGrayscale",
        Transform::TrivialAugmentWide { .. } => "TrivialAugmentWide",
    }
}

impl Transformer {
    /// A transformer for `transforms`.
    pub fn new(transforms: Transforms) -> Self {
        Self {
            last_producer: transforms.last_producer(),
            transforms,
            resizer: Resizer::new(),
            bufs: [Vec::new(), Vec::new()],
            cols: Vec::new(),
            tmp: Vec::new(),
        }
    }

    /// The pipeline this applies.
    pub fn transforms(&self) -> &Transforms {
        &self.transforms
    }

    /// Bytes held by the scratch buffers.
    #[cfg(test)]
    pub(crate) fn buffer_bytes(&self) -> usize {
        self.bufs.iter().map(Vec::capacity).sum::<usize>()
            + self.cols.capacity() * size_of::<Option<usize>>()
            + self.tmp.capacity()
    }

    /// Addresses and capacities of the scratch buffers, to check that they are reused.
    #[cfg(test)]
    pub(super) fn scratch(&self) -> [(usize, usize); 4] {
        [
            (self.bufs[0].as_ptr() as usize, self.bufs[0].capacity()),
            (self.bufs[1].as_ptr() as usize, self.bufs[1].capacity()),
            (self.cols.as_ptr() as usize, self.cols.capacity()),
            (self.tmp.as_ptr() as usize, self.tmp.capacity()),
        ]
    }

    /// Transforms `image` (sample `index` of `epoch`) into `out`, which must hold exactly
    /// [`Transforms::output_len`] bytes.
    pub fn apply(
        &mut self,
        image: RgbImage<'_>,
        seed: u64,
        epoch: u64,
        index: u64,
        out: &mut [u8],
    ) -> Result<(), AugmentError> {
        let full_height = image.height;
        self.run(image, full_height, seed, epoch, index, out, None)
    }

    /// How many rows from the top of a `width × height` image the pipeline reads for sample
    /// `index` of `epoch`, when that is known before decoding: the bottom of the box a
    /// leading `RandomResizedCrop` draws (the same draw [`apply`](Self::apply) makes).
    /// `None` when the pipeline may read every row. A decoder can then stop there
    /// ([`Decoder::decode_rows`](crate::decode::Decoder::decode_rows)) and hand the rows to
    /// [`apply_rows`](Self::apply_rows).
    pub fn rows_needed(
        &self,
        width: u32,
        height: u32,
        seed: u64,
        epoch: u64,
        index: u64,
    ) -> Option<u32> {
        let Some(&Transform::RandomResizedCrop { scale, ratio, .. }) =
            self.transforms.list().first()
        else {
            return None;
        };
        if width == 0 || height == 0 {
            return None;
        }
        let mut rng = SampleRng::new(Stream::Augment, seed, epoch, index);
        let c = random_resized_crop(&mut rng, width, height, scale, ratio);
        Some((c.top + c.height) as u32)
    }

    /// [`apply`](Self::apply) on an image of which only the top rows were decoded: the same
    /// draws and the same output as `apply` on the whole image, as long as the rows cover
    /// [`rows_needed`](Self::rows_needed); an error (not a panic) if they do not.
    pub fn apply_rows(
        &mut self,
        rows: Rows<'_>,
        seed: u64,
        epoch: u64,
        index: u64,
        out: &mut [u8],
    ) -> Result<(), AugmentError> {
        self.run(rows.image, rows.full_height, seed, epoch, index, out, None)
    }

    /// [`apply`](Self::apply), also reporting what each transform drew (crop boxes, flips,
    /// jitter factors, the TrivialAugmentWide operation): the same output and the same
    /// random draws, so another implementation can be run with the same parameters.
    pub fn apply_traced(
        &mut self,
        image: RgbImage<'_>,
        seed: u64,
        epoch: u64,
        index: u64,
        out: &mut [u8],
    ) -> Result<Vec<Drawn>, AugmentError> {
        let mut drawn = Vec::with_capacity(self.transforms.list().len());
        let full_height = image.height;
        self.run(
            image,
            full_height,
            seed,
            epoch,
            index,
            out,
            Some(&mut drawn),
        )?;
        Ok(drawn)
    }

    /// Runs the pipeline on `image`, the top `image.height` rows of an image `full_height`
    /// rows tall (the whole image when the two are equal).
    #[allow(clippy::too_many_arguments)]
    fn run(
        &mut self,
        image: RgbImage<'_>,
        full_height: u32,
        seed: u64,
        epoch: u64,
        index: u64,
        out: &mut [u8],
        mut trace: Trace<'_>,
    ) -> Result<(), AugmentError> {
        let size = self.transforms.size();
        let expected = self.transforms.output_len();
        if out.len() != expected {
            return Err(AugmentError::OutputSize {
                len: out.len(),
                expected,
            });
        }
        let (iw, ih, decoded) = (image.width, full_height, image.height);
        if iw == 0
            || ih == 0
            || decoded > ih
            || (image.pixels.len() as u64) < u64::from(iw) * u64::from(decoded) * 3
        {
            return Err(AugmentError::Degenerate {
                width: iw,
                height: ih,
                size,
            });
        }
        let mut rng = SampleRng::new(Stream::Augment, seed, epoch, index);
        let Self {
            transforms,
            last_producer,
            resizer,
            bufs,
            cols,
            tmp,
        } = self;
        let list = transforms.list();
        let (mut w, mut h) = (iw, ih);
        let mut cur = Loc::Source;
        let mut i = 0;
        while i < list.len() {
            let t = &list[i];
            if !t.produces() {
                if cur == Loc::Source {
                    if decoded < h {
                        return Err(missing_rows(decoded, h));
                    }
                    let n = w as usize * h as usize * 3;
                    grow(&mut bufs[0], n).copy_from_slice(&image.pixels[..n]);
                    cur = Loc::Buf0;
                }
                let n = w as usize * h as usize * 3;
                let px = match cur {
                    Loc::Buf1 => &mut bufs[1][..n],
                    Loc::Out => &mut out[..],
                    _ => &mut bufs[0][..n],
                };
                pixel_op(t, &mut rng, px, w as usize, tmp, &mut trace)?;
                i += 1;
                continue;
            }
            let (op, nw, nh, end) = plan(list, i, w, h, &mut rng, &mut trace)?;
            if cur == Loc::Source && decoded < h {
                // Only the crop reads rows selectively; it must lie in the decoded ones.
                let bottom = match op {
                    Op::CropResample { top, height, .. } => top + height,
                    _ => h,
                };
                if bottom > decoded {
                    return Err(missing_rows(decoded, bottom));
                }
            }
            check_dims(name(t), u64::from(nw), u64::from(nh))?;
            let dst = if end == *last_producer {
                Loc::Out
            } else if cur == Loc::Buf0 {
                Loc::Buf1
            } else {
                Loc::Buf0
            };
            let rows_held = if cur == Loc::Source { decoded } else { h };
            let (src_len, dst_len) = (
                w as usize * rows_held as usize * 3,
                nw as usize * nh as usize * 3,
            );
            if dst == Loc::Out && dst_len != out.len() {
                return Err(AugmentError::OutputSize {
                    len: out.len(),
                    expected: dst_len,
                });
            }
            let [b0, b1] = &mut *bufs;
            let (src, dst_px): (&[u8], &mut [u8]) = match (cur, dst) {
                (Loc::Source, Loc::Out) => (&image.pixels[..src_len], &mut out[..]),
                (Loc::Source, _) => (&image.pixels[..src_len], grow(b0, dst_len)),
                (Loc::Buf0, Loc::Out) => (&b0[..src_len], &mut out[..]),
                (Loc::Buf0, _) => (&b0[..src_len], grow(b1, dst_len)),
                (Loc::Buf1, Loc::Out) => (&b1[..src_len], &mut out[..]),
                (Loc::Buf1, _) => (&b1[..src_len], grow(b0, dst_len)),
                (Loc::Out, _) => {
                    return Err(AugmentError::Resize(
                        "internal: a transform after the last producing one".into(),
                    ));
                }
            };
            match op {
                Op::Resample {
                    left,
                    top,
                    width,
                    height,
                } => {
                    let crop = Some((left, top, width, height));
                    resample(resizer, (src, w, h), (dst_px, nw, nh), crop)?;
                }
                Op::CropResample {
                    left,
                    top,
                    width,
                    height,
                } => {
                    let (l, t, cw, ch) =
                        (left as usize, top as usize, width as usize, height as usize);
                    let row = w as usize * 3;
                    // Room for any crop of this image, so that varying boxes stop growing it;
                    // what a far larger image made it grow to is given back first.
                    crate::limits::give_back(tmp, src.len());
                    tmp.clear();
                    tmp.reserve(src.len());
                    for y in t..t + ch {
                        tmp.extend_from_slice(&src[y * row + l * 3..y * row + (l + cw) * 3]);
                    }
                    resample(resizer, (tmp, width, height), (dst_px, nw, nh), None)?;
                }
                Op::Copy { x, y, mode, fill } => {
                    copy_padded(src, (w, h), dst_px, (nw, nh), (x, y), mode, fill, cols);
                }
            }
            cur = dst;
            (w, h) = (nw, nh);
            i = end + 1;
        }
        if cur != Loc::Out || (w, h) != (size, size) {
            return Err(AugmentError::Resize(format!(
                "internal: the pipeline made a {h}x{w} image, not {size}x{size}"
            )));
        }
        Ok(())
    }
}

/// The error for a pipeline that would read rows a partial decode left out.
fn missing_rows(decoded: u32, needed: u32) -> AugmentError {
    AugmentError::Resize(format!(
        "internal: {decoded} rows were decoded but the pipeline reads {needed}"
    ))
}

/// The operation producing transform `i` performs on a `w × h` image, its output size, and
/// the index of the last transform it covers (`i + 1` when a `CenterCrop` is fused).
fn plan(
    list: &[Transform],
    i: usize,
    w: u32,
    h: u32,
    rng: &mut SampleRng,
    trace: &mut Trace<'_>,
) -> Result<(Op, u32, u32, usize), AugmentError> {
    let (wf, hf) = (f64::from(w), f64::from(h));
    Ok(match list[i] {
        Transform::RandomResizedCrop { size, scale, ratio } => {
            let c = random_resized_crop(rng, w, h, scale, ratio);
            record(trace, || Drawn::RandomResizedCrop {
                top: c.top as u32,
                left: c.left as u32,
                height: c.height as u32,
                width: c.width as u32,
            });
            let op = Op::CropResample {
                left: c.left as u32,
                top: c.top as u32,
                width: c.width as u32,
                height: c.height as u32,
            };
            (op, size.1, size.0, i)
        }
        Transform::Resize { size } => {
            let (nw, nh) = match size {
                ResizeTo::Shorter(s) => resized_dims(w, h, s),
                ResizeTo::Exact(rh, rw) => (rw, rh),
            };
            record(trace, || Drawn::Resize {
                height: nh,
                width: nw,
            });
            match list.get(i + 1) {
                Some(&Transform::CenterCrop { size: (ch, cw) }) if cw <= nw && ch <= nh => {
                    // Resize + CenterCrop as one resampling: the source region that the
                    // crop, at torchvision's integer offset round((n - crop) / 2), takes of
                    // the image resized to exactly nw × nh.
                    record(trace, || Drawn::CenterCrop {
                        height: ch,
                        width: cw,
                        fused: true,
                    });
                    let (sx, sy) = (f64::from(nw) / wf, f64::from(nh) / hf);
                    let dx = half_round_even(i64::from(nw) - i64::from(cw)) as f64;
                    let dy = half_round_even(i64::from(nh) - i64::from(ch)) as f64;
                    let op = Op::Resample {
                        left: dx / sx,
                        top: dy / sy,
                        width: (f64::from(cw) / sx).min(wf),
                        height: (f64::from(ch) / sy).min(hf),
                    };
                    (op, cw, ch, i + 1)
                }
                _ => {
                    let op = Op::Resample {
                        left: 0.0,
                        top: 0.0,
                        width: wf,
                        height: hf,
                    };
                    (op, nw, nh, i)
                }
            }
        }
        Transform::CenterCrop { size: (ch, cw) } => {
            // torchvision pads with zeros to the crop size first, then crops at
            // round((n - crop) / 2).
            let axis = |n: u32, c: u32| {
                let (n, c) = (i64::from(n), i64::from(c));
                let pad = (c - n).max(0) / 2;
                let n1 = n.max(c);
                Axis {
                    pad1: pad,
                    n1,
                    pad2: 0,
                    start: half_round_even(n1 - c),
                }
            };
            let op = Op::Copy {
                x: axis(w, cw),
                y: axis(h, ch),
                mode: PaddingMode::Constant,
                fill: [0; 3],
            };
            record(trace, || Drawn::CenterCrop {
                height: ch,
                width: cw,
                fused: false,
            });
            (op, cw, ch, i)
        }
        Transform::RandomCrop {
            size: (ch, cw),
            padding: [left, top, right, bottom],
            pad_if_needed,
            fill,
            padding_mode,
        } => {
            let axis = |n: u32, before: u32, after: u32, c: u32| {
                let n1 = i64::from(n) + i64::from(before) + i64::from(after);
                let c = i64::from(c);
                let pad2 = if pad_if_needed && n1 < c { c - n1 } else { 0 };
                (
                    Axis {
                        pad1: i64::from(before),
                        n1,
                        pad2,
                        start: 0,
                    },
                    n1 + 2 * pad2,
                )
            };
            let (mut x, n2w) = axis(w, left, right, cw);
            let (mut y, n2h) = axis(h, top, bottom, ch);
            check_dims("RandomCrop", n2w as u64, n2h as u64)?;
            if n2h < i64::from(ch) || n2w < i64::from(cw) {
                return Err(AugmentError::CropTooLarge {
                    transform: "RandomCrop",
                    crop_height: ch,
                    crop_width: cw,
                    height: n2h as u64,
                    width: n2w as u64,
                });
            }
            if (n2h, n2w) != (i64::from(ch), i64::from(cw)) {
                y.start = rng.inclusive(0, (n2h - i64::from(ch)) as u64) as i64;
                x.start = rng.inclusive(0, (n2w - i64::from(cw)) as u64) as i64;
            }
            record(trace, || Drawn::RandomCrop {
                padding: [left, top, right, bottom],
                pad_if_needed: [x.pad2 as u32, y.pad2 as u32],
                top: y.start as u32,
                left: x.start as u32,
            });
            let op = Op::Copy {
                x,
                y,
                mode: padding_mode,
                fill,
            };
            (op, cw, ch, i)
        }
        _ => {
            return Err(AugmentError::Resize(
                "internal: not a producing transform".into(),
            ));
        }
    })
}
