//! torchvision's `TrivialAugmentWide`: one operation drawn uniformly from fourteen, at a
//! magnitude drawn uniformly from `num_magnitude_bins` bins, negated with probability 1/2
//! for the signed ones. Each operation follows torchvision's tensor (u8) implementation.

use super::Drawn;
use super::apply::{Trace, gray, record};
use crate::rng::SampleRng;

/// The operations, in torchvision's `_augmentation_space` order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Op {
    Identity,
    ShearX,
    ShearY,
    TranslateX,
    TranslateY,
    Rotate,
    Brightness,
    Color,
    Contrast,
    Sharpness,
    Posterize,
    Solarize,
    AutoContrast,
    Equalize,
}

impl Op {
    /// torchvision's name of the operation (`_apply_op`'s `op_name`).
    fn name(self) -> &'static str {
        match self {
            Self::Identity => "Identity",
            Self::ShearX => "ShearX",
            Self::ShearY => "ShearY",
            Self::TranslateX => "TranslateX",
            Self::TranslateY => "TranslateY",
            Self::Rotate => "Rotate",
            Self::Brightness => "Brightness",
            Self::Color => "Color",
            Self::Contrast => "Contrast",
            Self::Sharpness => "Sharpness",
            Self::Posterize => "Posterize",
            Self::Solarize => "Solarize",
            Self::AutoContrast => "AutoContrast",
            Self::Equalize => "Equalize",
        }
    }
}

const OPS: [Op; 14] = [
    Op::Identity,
    Op::ShearX,
    Op::ShearY,
    Op::TranslateX,
    Op::TranslateY,
    Op::Rotate,
    Op::Brightness,
    Op::Color,
    Op::Contrast,
    Op::Sharpness,
    Op::Posterize,
    Op::Solarize,
    Op::AutoContrast,
    Op::Equalize,
];

/// `torch.linspace(start, end, n)[i]` in f32, as torch computes it (from the nearer end).
fn linspace(start: f32, end: f32, n: u32, i: u32) -> f32 {
    if n <= 1 {
        return start;
    }
    let step = (end - start) / (n - 1) as f32;
    if i < n / 2 {
        start + step * i as f32
    } else {
        end - step * (n - 1 - i) as f32
    }
}

/// The bins of `op` (`None`: the op takes no magnitude) and whether it is signed.
fn magnitude(op: Op, bins: u32, i: u32) -> (Option<f32>, bool) {
    match op {
        Op::Identity | Op::AutoContrast | Op::Equalize => (None, false),
        Op::ShearX | Op::ShearY => (Some(linspace(0.0, 0.99, bins, i)), true),
        Op::TranslateX | Op::TranslateY => (Some(linspace(0.0, 32.0, bins, i)), true),
        Op::Rotate => (Some(linspace(0.0, 135.0, bins, i)), true),
        Op::Brightness | Op::Color | Op::Contrast | Op::Sharpness => {
            (Some(linspace(0.0, 0.99, bins, i)), true)
        }
        Op::Posterize => {
            // 8 - (arange(bins) / ((bins - 1) / 6)).round().int()
            let v = (i as f32 / ((bins - 1) as f32 / 6.0)).round_ties_even();
            (Some(8.0 - v), false)
        }
        Op::Solarize => (Some(linspace(255.0, 0.0, bins, i)), false),
    }
}

/// Applies `TrivialAugmentWide(num_magnitude_bins=bins, fill=fill)` to a `width`-pixel-wide
/// RGB image in place; `tmp` is reused scratch.
pub(super) fn apply(
    rng: &mut SampleRng,
    px: &mut [u8],
    width: usize,
    bins: u32,
    fill: [u8; 3],
    tmp: &mut Vec<u8>,
    trace: &mut Trace<'_>,
) {
    let op = OPS[rng.below(OPS.len() as u64) as usize];
    let (mag, signed) = magnitude(op, bins, 0);
    let mut m = 0.0f32;
    if mag.is_some() {
        let bin = rng.below(u64::from(bins)) as u32;
        m = magnitude(op, bins, bin).0.unwrap_or(0.0);
        if signed && rng.below(2) == 1 {
            m = -m;
        }
    }
    record(trace, || Drawn::TrivialAugmentWide {
        op: op.name(),
        magnitude: mag.map(|_| m),
    });
    let height = px.len() / (width * 3).max(1);
    match op {
        Op::Identity => {}
        Op::ShearX | Op::ShearY => {
            let shear = f64::from(m).atan().to_degrees();
            let (sx, sy) = if op == Op::ShearX {
                (shear, 0.0)
            } else {
                (0.0, shear)
            };
            // center=[0, 0]: the top-left corner, in centred coordinates.
            let center = (-(width as f64) * 0.5, -(height as f64) * 0.5);
            let matrix = inverse_affine(center, 0.0, (0.0, 0.0), (sx, sy));
            affine(px, width, height, matrix, fill, tmp);
        }
        Op::TranslateX | Op::TranslateY => {
            let t = f64::from(m.trunc());
            let translate = if op == Op::TranslateX {
                (t, 0.0)
            } else {
                (0.0, t)
            };
            let matrix = inverse_affine((0.0, 0.0), 0.0, translate, (0.0, 0.0));
            affine(px, width, height, matrix, fill, tmp);
        }
        Op::Rotate => {
            // F.rotate passes -angle to the inverse matrix.
            let matrix = inverse_affine((0.0, 0.0), -f64::from(m), (0.0, 0.0), (0.0, 0.0));
            affine(px, width, height, matrix, fill, tmp);
        }
        Op::Brightness => px.iter_mut().for_each(|c| *c = blend(*c, 0.0, m)),
        Op::Color => {
            for c in px.chunks_exact_mut(3) {
                let g = f32::from(gray(c));
                c.iter_mut().for_each(|v| *v = blend(*v, g, m));
            }
        }
        Op::Contrast => {
            let n = (px.len() / 3).max(1);
            let sum: u64 = px.chunks_exact(3).map(|c| u64::from(gray(c))).sum();
            let mean = (sum as f64 / n as f64) as f32;
            px.iter_mut().for_each(|c| *c = blend(*c, mean, m));
        }
        Op::Sharpness => sharpness(px, width, height, m, tmp),
        Op::Posterize => {
            let bits = m as u32;
            let mask = if bits == 0 {
                0
            } else {
                (0xFFu32 << (8 - bits.min(8))) as u8
            };
            px.iter_mut().for_each(|c| *c &= mask);
        }
        Op::Solarize => px.iter_mut().for_each(|c| {
            if f32::from(*c) >= m {
                *c = 255 - *c;
            }
        }),
        Op::AutoContrast => autocontrast(px),
        Op::Equalize => equalize(px),
    }
}

/// torchvision's `_blend` on u8 with `ratio = 1 + m`: `ratio * a + (1 - ratio) * b`,
/// clamped, truncated. torchvision computes `1 + m` and `1 - ratio` in Python's f64, so the
/// second weight is exactly `-m` (not `1 - f32(1 + m)`, which truncates `a` to `a - 1`
/// wherever `a == b`).
fn blend(a: u8, b: f32, m: f32) -> u8 {
    ((1.0 + m) * f32::from(a) - m * b).clamp(0.0, 255.0) as u8
}

/// torchvision's `_get_inverse_affine_matrix` (angles in degrees, centred coordinates).
fn inverse_affine(
    center: (f64, f64),
    angle: f64,
    translate: (f64, f64),
    shear: (f64, f64),
) -> [f64; 6] {
    let rot = angle.to_radians();
    let (sx, sy) = (shear.0.to_radians(), shear.1.to_radians());
    let (cx, cy) = center;
    let (tx, ty) = translate;
    let a = (rot - sy).cos() / sy.cos();
    let b = -(rot - sy).cos() * sx.tan() / sy.cos() - rot.sin();
    let c = (rot - sy).sin() / sy.cos();
    let d = -(rot - sy).sin() * sx.tan() / sy.cos() + rot.cos();
    let mut m = [d, -b, 0.0, -c, a, 0.0];
    m[2] += m[0] * (-cx - tx) + m[1] * (-cy - ty);
    m[5] += m[3] * (-cx - tx) + m[4] * (-cy - ty);
    m[2] += cx;
    m[5] += cy;
    m
}

/// torchvision's tensor `affine` with nearest interpolation: the output pixel centred at
/// `(x, y)` (origin at the image centre) samples the input at `matrix · (x, y, 1)`, in f32 as
/// `_gen_affine_grid` + `grid_sample(align_corners=False)`; outside is `fill`.
fn affine(px: &mut [u8], w: usize, h: usize, m: [f64; 6], fill: [u8; 3], tmp: &mut Vec<u8>) {
    tmp.clear();
    tmp.extend_from_slice(px);
    let m = m.map(|v| v as f32);
    let (wf, hf) = (w as f32, h as f32);
    for (oy, row) in px.chunks_exact_mut(w * 3).enumerate() {
        let yc = oy as f32 - hf * 0.5 + 0.5;
        for (ox, out) in row.chunks_exact_mut(3).enumerate() {
            let xc = ox as f32 - wf * 0.5 + 0.5;
            let gx = (m[0] * xc + m[1] * yc + m[2]) / (0.5 * wf);
            let gy = (m[3] * xc + m[4] * yc + m[5]) / (0.5 * hf);
            let ix = (((gx + 1.0) * wf - 1.0) * 0.5).round_ties_even();
            let iy = (((gy + 1.0) * hf - 1.0) * 0.5).round_ties_even();
            if ix >= 0.0 && iy >= 0.0 && ix < wf && iy < hf {
                let at = (iy as usize * w + ix as usize) * 3;
                out.copy_from_slice(&tmp[at..at + 3]);
            } else {
                out.copy_from_slice(&fill);
            }
        }
    }
}

/// torchvision's `adjust_sharpness`: blend with the image whose interior is smoothed by
/// `[[1, 1, 1], [1, 5, 1], [1, 1, 1]] / 13` (rounded), borders kept.
fn sharpness(px: &mut [u8], w: usize, h: usize, m: f32, tmp: &mut Vec<u8>) {
    if w <= 2 || h <= 2 {
        return;
    }
    tmp.clear();
    tmp.extend_from_slice(px);
    for y in 1..h - 1 {
        for x in 1..w - 1 {
            for ch in 0..3 {
                let mut sum = 0u32;
                for dy in 0..3 {
                    for dx in 0..3 {
                        let v = u32::from(tmp[((y + dy - 1) * w + x + dx - 1) * 3 + ch]);
                        sum += if dy == 1 && dx == 1 { 5 * v } else { v };
                    }
                }
                let blurred = (sum as f32 / 13.0).round_ties_even();
                let at = (y * w + x) * 3 + ch;
                px[at] = blend(tmp[at], blurred, m);
            }
        }
    }
}

/// torchvision's `autocontrast`: each channel stretched to `[0, 255]`.
fn autocontrast(px: &mut [u8]) {
    for ch in 0..3 {
        let (mut lo, mut hi) = (255u8, 0u8);
        for c in px.chunks_exact(3) {
            lo = lo.min(c[ch]);
            hi = hi.max(c[ch]);
        }
        if hi == lo {
            continue;
        }
        let scale = 255.0 / (f32::from(hi) - f32::from(lo));
        for c in px.chunks_exact_mut(3) {
            c[ch] = ((f32::from(c[ch]) - f32::from(lo)) * scale).clamp(0.0, 255.0) as u8;
        }
    }
}

/// torchvision's `equalize`: per-channel histogram equalization (`_scale_channel`).
fn equalize(px: &mut [u8]) {
    for ch in 0..3 {
        let mut hist = [0u64; 256];
        for c in px.chunks_exact(3) {
            hist[usize::from(c[ch])] += 1;
        }
        let last = hist.iter().rposition(|&n| n != 0).unwrap_or(0);
        let step = (hist.iter().sum::<u64>() - hist[last]) / 255;
        if step == 0 {
            continue;
        }
        let mut lut = [0u8; 256];
        let mut cum = 0u64;
        for (i, &n) in hist.iter().enumerate().take(255) {
            cum += n;
            lut[i + 1] = ((cum + step / 2) / step).min(255) as u8;
        }
        for c in px.chunks_exact_mut(3) {
            c[ch] = lut[usize::from(c[ch])];
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bins_match_torchvisions_augmentation_space() {
        assert_eq!(magnitude(Op::Rotate, 31, 30).0, Some(135.0));
        assert_eq!(magnitude(Op::TranslateX, 31, 15).0, Some(16.0));
        assert_eq!(magnitude(Op::Solarize, 31, 0).0, Some(255.0));
        // 8 - round(i / 5): bins 0..=30 give 8, 8, 8, 7, ... 2.
        let post: Vec<f32> = (0..31)
            .map(|i| magnitude(Op::Posterize, 31, i).0.unwrap())
            .collect();
        assert_eq!(post[0], 8.0);
        assert_eq!(post[3], 7.0);
        assert_eq!(post[30], 2.0);
        assert_eq!(magnitude(Op::Equalize, 31, 0), (None, false));
    }

    #[test]
    fn translation_shifts_pixels_and_fills_the_rest() {
        let mut px: Vec<u8> = (0..16u8).flat_map(|i| [i, i, i]).collect();
        let m = inverse_affine((0.0, 0.0), 0.0, (1.0, 0.0), (0.0, 0.0));
        let mut tmp = Vec::new();
        affine(&mut px, 4, 4, m, [99, 99, 99], &mut tmp);
        let reds: Vec<u8> = px.chunks(3).map(|c| c[0]).take(4).collect();
        assert_eq!(reds, [99, 0, 1, 2]);
    }

    #[test]
    fn rotation_by_90_degrees_turns_the_image() {
        let mut px: Vec<u8> = (0..9u8).flat_map(|i| [i, i, i]).collect();
        let mut tmp = Vec::new();
        // torchvision rotates counter-clockwise for positive angles.
        let m = inverse_affine((0.0, 0.0), -90.0, (0.0, 0.0), (0.0, 0.0));
        affine(&mut px, 3, 3, m, [0; 3], &mut tmp);
        let reds: Vec<u8> = px.chunks(3).map(|c| c[0]).collect();
        assert_eq!(reds, [2, 5, 8, 1, 4, 7, 0, 3, 6]);
    }

    #[test]
    fn posterize_solarize_autocontrast_and_equalize_follow_torchvision() {
        let mut px = vec![10u8, 100, 200, 50, 150, 250];
        autocontrast(&mut px);
        assert_eq!(px, [0, 0, 0, 255, 255, 255]);
        let mut flat = vec![7u8; 12];
        equalize(&mut flat);
        assert_eq!(flat, [7; 12]);
    }
}
