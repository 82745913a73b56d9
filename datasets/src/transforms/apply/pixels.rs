//! The pixel work of a transform: resampling, padded copies, flips, colour changes.

use super::*;

/// Resizes the RGB image `src` (`w × h`), or the rectangle `crop` of it, to `dst` (`nw × nh`)
/// with the bilinear convolution filter (antialiased, as torchvision's).
pub(super) fn resample(
    resizer: &mut Resizer,
    (src, w, h): (&[u8], u32, u32),
    (dst, nw, nh): (&mut [u8], u32, u32),
    crop: Option<(f64, f64, f64, f64)>,
) -> Result<(), AugmentError> {
    let resize_err = |e: &dyn std::fmt::Display| AugmentError::Resize(e.to_string());
    let s = ImageRef::new(w, h, src, PixelType::U8x3).map_err(|e| resize_err(&e))?;
    let mut d = Image::from_slice_u8(nw, nh, dst, PixelType::U8x3).map_err(|e| resize_err(&e))?;
    let mut options = ResizeOptions::new().resize_alg(ResizeAlg::Convolution(FilterType::Bilinear));
    if let Some((left, top, width, height)) = crop {
        options = options.crop(left, top, width, height);
    }
    resizer
        .resize(&s, &mut d, &options)
        .map_err(|e| resize_err(&e))
}

/// Copies `dst[y][x] = src[y.map(y)][x.map(x)]`, writing `fill` where the map is outside.
#[allow(clippy::too_many_arguments)]
pub(super) fn copy_padded(
    src: &[u8],
    (sw, sh): (u32, u32),
    dst: &mut [u8],
    (dw, _dh): (u32, u32),
    (x, y): (Axis, Axis),
    mode: PaddingMode,
    fill: [u8; 3],
    cols: &mut Vec<Option<usize>>,
) {
    cols.clear();
    cols.extend((0..i64::from(dw)).map(|o| x.map(o, sw, mode)));
    let row_len = sw as usize * 3;
    for (oy, row) in dst.chunks_exact_mut(dw as usize * 3).enumerate() {
        match y.map(oy as i64, sh, mode) {
            None => {
                for px in row.chunks_exact_mut(3) {
                    px.copy_from_slice(&fill);
                }
            }
            Some(sy) => {
                let src_row = &src[sy * row_len..(sy + 1) * row_len];
                for (px, col) in row.chunks_exact_mut(3).zip(cols.iter()) {
                    match col {
                        Some(sx) => px.copy_from_slice(&src_row[sx * 3..sx * 3 + 3]),
                        None => px.copy_from_slice(&fill),
                    }
                }
            }
        }
    }
}

/// PIL's `convert("L")`: 0.299 R + 0.587 G + 0.114 B in 16-bit fixed point, rounded.
pub(crate) fn gray(px: &[u8]) -> u8 {
    ((u32::from(px[0]) * 19595 + u32::from(px[1]) * 38470 + u32::from(px[2]) * 7471 + 0x8000) >> 16)
        as u8
}

/// Mirrors every row of a `width`-pixel-wide RGB image in place.
pub(crate) fn flip_horizontal(px: &mut [u8], width: usize) {
    for row in px.chunks_exact_mut(width * 3) {
        let (mut i, mut j) = (0, width.saturating_sub(1));
        while i < j {
            let (a, b) = row.split_at_mut(j * 3);
            a[i * 3..i * 3 + 3].swap_with_slice(&mut b[..3]);
            i += 1;
            j -= 1;
        }
    }
}

/// Mirrors the rows of a `width`-pixel-wide RGB image top to bottom in place.
pub(crate) fn flip_vertical(px: &mut [u8], width: usize) {
    let row = width * 3;
    let h = px.len() / row;
    for y in 0..h / 2 {
        let (a, b) = px.split_at_mut((h - 1 - y) * row);
        a[y * row..(y + 1) * row].swap_with_slice(&mut b[..row]);
    }
}

/// torchvision's `_blend` on u8: `ratio * a + (1 - ratio) * b`, clamped, truncated.
pub(super) fn blend(a: u8, b: f32, ratio: f32) -> u8 {
    (ratio * f32::from(a) + (1.0 - ratio) * b).clamp(0.0, 255.0) as u8
}

/// torchvision's `_rgb2hsv` → shift hue → `_hsv2rgb`, on one pixel in `[0, 1]`.
pub(super) fn shift_hue(px: &mut [u8], hue: f32) {
    let [r, g, b] = [px[0], px[1], px[2]].map(|c| f32::from(c) / 255.0);
    let maxc = r.max(g).max(b);
    let minc = r.min(g).min(b);
    let eqc = maxc == minc;
    let cr = maxc - minc;
    let s = cr / if eqc { 1.0 } else { maxc };
    let div = if eqc { 1.0 } else { cr };
    let (rc, gc, bc) = ((maxc - r) / div, (maxc - g) / div, (maxc - b) / div);
    let hh = if maxc == r {
        bc - gc
    } else if maxc == g {
        2.0 + rc - bc
    } else {
        4.0 + gc - rc
    };
    let hh = (hh / 6.0 + 1.0).rem_euclid(1.0);
    let hh = (hh + hue).rem_euclid(1.0);
    let v = maxc;
    let i6 = (hh * 6.0).floor();
    let f = hh * 6.0 - i6;
    let i6 = (i6 as i32).rem_euclid(6);
    let p = (v * (1.0 - s)).clamp(0.0, 1.0);
    let q = (v * (1.0 - s * f)).clamp(0.0, 1.0);
    let t = (v * (1.0 - s * (1.0 - f))).clamp(0.0, 1.0);
    let (r, g, b) = match i6 {
        0 => (v, t, p),
        1 => (q, v, p),
        2 => (p, v, t),
        3 => (p, q, v),
        4 => (t, p, v),
        _ => (v, p, q),
    };
    // convert_image_dtype(float → uint8): times 255.999, truncated.
    px[0] = (r * 255.999) as u8;
    px[1] = (g * 255.999) as u8;
    px[2] = (b * 255.999) as u8;
}

/// Applies one in-place transform to a `width`-pixel-wide RGB image.
pub(super) fn pixel_op(
    t: &Transform,
    rng: &mut SampleRng,
    px: &mut [u8],
    width: usize,
    tmp: &mut Vec<u8>,
    trace: &mut Trace<'_>,
) -> Result<(), AugmentError> {
    match *t {
        Transform::TrivialAugmentWide {
            num_magnitude_bins,
            fill,
        } => super::super::trivial::apply(rng, px, width, num_magnitude_bins, fill, tmp, trace),
        Transform::RandomHorizontalFlip { p } => {
            let flipped = rng.next_f64() < p;
            if flipped {
                flip_horizontal(px, width);
            }
            record(trace, || Drawn::RandomHorizontalFlip { flipped });
        }
        Transform::RandomVerticalFlip { p } => {
            let flipped = rng.next_f64() < p;
            if flipped {
                flip_vertical(px, width);
            }
            record(trace, || Drawn::RandomVerticalFlip { flipped });
        }
        Transform::RandomGrayscale { p } => {
            let applied = rng.next_f64() < p;
            if applied {
                for c in px.chunks_exact_mut(3) {
                    c.fill(gray(c));
                }
            }
            record(trace, || Drawn::RandomGrayscale { applied });
        }
        Transform::ColorJitter {
            brightness,
            contrast,
            saturation,
            hue,
        } => {
            // torchvision: fn_idx = torch.randperm(4), then the four factors in order.
            let mut order = [0usize, 1, 2, 3];
            for k in (1..4).rev() {
                let j = rng.below(k as u64 + 1) as usize;
                order.swap(k, j);
            }
            let mut draw = |r: Option<(f64, f64)>| r.map(|(lo, hi)| rng.uniform(lo, hi) as f32);
            let factors = [
                draw(brightness),
                draw(contrast),
                draw(saturation),
                draw(hue),
            ];
            record(trace, || Drawn::ColorJitter {
                order: order.map(|k| k as u8),
                brightness: factors[0],
                contrast: factors[1],
                saturation: factors[2],
                hue: factors[3],
            });
            for k in order {
                let Some(f) = factors[k] else { continue };
                match k {
                    0 => px.iter_mut().for_each(|c| *c = blend(*c, 0.0, f)),
                    1 => {
                        let n = (px.len() / 3).max(1);
                        let sum: u64 = px.chunks_exact(3).map(|c| u64::from(gray(c))).sum();
                        let mean = (sum as f64 / n as f64) as f32;
                        px.iter_mut().for_each(|c| *c = blend(*c, mean, f));
                    }
                    2 => {
                        for c in px.chunks_exact_mut(3) {
                            let g = f32::from(gray(c));
                            for v in c.iter_mut() {
                                *v = blend(*v, g, f);
                            }
                        }
                    }
                    _ => px.chunks_exact_mut(3).for_each(|c| shift_hue(c, f)),
                }
            }
        }
        _ => {
            return Err(AugmentError::Resize(
                "internal: not an in-place transform".into(),
            ));
        }
    }
    Ok(())
}
