use super::*;
use crate::decode::RgbImage;
use crate::rng::{SampleRng, Stream};

/// A deterministic test pattern: gradients plus a checkerboard, so crops and flips show.
fn pattern(w: u32, h: u32) -> Vec<u8> {
    (0..h)
        .flat_map(|y| {
            (0..w).flat_map(move |x| {
                let check = if (x / 3 + y / 5) % 2 == 0 { 60 } else { 0 };
                [
                    (x * 255 / w.max(2)) as u8,
                    (y * 255 / h.max(2)) as u8,
                    (check + (x * 7 + y * 3) % 128) as u8,
                ]
            })
        })
        .collect()
}

fn run(spec: &str, pixels: &[u8], w: u32, h: u32, seed: u64, index: u64) -> Vec<u8> {
    let t = Transforms::parse(spec).unwrap_or_else(|e| panic!("{spec}: {e}"));
    let mut out = vec![0u8; t.output_len()];
    let image = RgbImage {
        width: w,
        height: h,
        pixels,
    };
    Transformer::new(t)
        .apply(image, seed, 0, index, &mut out)
        .unwrap_or_else(|e| panic!("{spec}: {e}"));
    out
}

fn fnv(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

#[test]
fn the_default_and_eval_presets_are_the_pipelines_they_name_and_are_pinned() {
    // First pinned from the former `Augment`/`Augmenter` code (the default and `--eval`
    // before transform pipelines). Re-pinned when the parity check against torchvision
    // (benches/python/test_transforms_parity.py) showed two differences that are now fixed:
    // RandomResizedCrop's resampling read source pixels beyond the crop box at its edges
    // (torchvision crops, then resizes), and the fused Resize + CenterCrop took the exactly
    // centred source region instead of torchvision's integer crop offset of the resized
    // image. The pin keeps the presets from drifting.
    let mut all = Vec::new();
    let mut rng = SampleRng::new(Stream::Synth, 5, 0, 0);
    for (w, h) in [
        (500, 375),
        (37, 91),
        (32, 32),
        (224, 224),
        (1, 7),
        (300, 20),
    ] {
        let pixels: Vec<u8> = (0..w * h * 3).map(|_| rng.next_u64() as u8).collect();
        let image = RgbImage {
            width: w,
            height: h,
            pixels: &pixels,
        };
        for size in [224, 32, 7] {
            let cases = [
                (
                    Transforms::train(size),
                    format!("RandomResizedCrop({size}), RandomHorizontalFlip()"),
                ),
                (
                    Transforms::eval(size),
                    format!("Resize({}), CenterCrop({size})", (size * 256).div_ceil(224)),
                ),
            ];
            for (preset, spec) in cases {
                let parsed = Transforms::parse(&spec).unwrap();
                assert_eq!(parsed, preset, "{spec}");
                let mut transformer = Transformer::new(parsed);
                for index in 0..20 {
                    let mut b = vec![1u8; preset.output_len()];
                    transformer.apply(image, 9, 2, index, &mut b).unwrap();
                    all.extend_from_slice(&b);
                }
            }
        }
    }
    assert_eq!(all.len(), 36_899_280);
    assert_eq!(fnv(&all), 0x34b2_f261_2408_bb2a);
}

#[test]
fn random_resized_crops_stay_inside_the_image_follow_the_ranges_and_repeat_per_sample() {
    use super::apply::random_resized_crop;
    let crop = |epoch, index| {
        let mut rng = SampleRng::new(Stream::Augment, 1, epoch, index);
        random_resized_crop(&mut rng, 500, 375, (0.08, 1.0), (3.0 / 4.0, 4.0 / 3.0))
    };
    for index in 0..2000 {
        let c = crop(0, index);
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
    }
    assert_eq!(crop(1, 9), crop(1, 9));
    assert_ne!(crop(1, 9), crop(2, 9));
}

#[test]
fn the_call_syntax_and_json_give_the_same_pipeline_and_the_display_parses_back() {
    let a = Transforms::parse("RandomCrop(32, padding=4), RandomHorizontalFlip()").unwrap();
    let b = Transforms::parse(
        r#"[{"name":"RandomCrop","size":32,"padding":4},{"name":"RandomHorizontalFlip"}]"#,
    )
    .unwrap();
    assert_eq!(a, b);
    assert_eq!(a.size(), 32);
    assert_eq!(a.to_string(), b.to_string());
    assert_eq!(
        a.to_string(),
        "RandomCrop(size=(32, 32), padding=(4, 4, 4, 4), pad_if_needed=False, \
         fill=(0, 0, 0), padding_mode='constant'), RandomHorizontalFlip(p=0.5)"
    );
    for spec in [
        "T.RandomResizedCrop(size=[64, 64], scale=(0.5, 1), ratio=(3/4, 4/3)), \
         ColorJitter(0.4, 0.4, 0.4, 0.1), RandomGrayscale(), RandomVerticalFlip(p=0.25)",
        "Resize((40, 50)), CenterCrop(32), ColorJitter(hue=(-0.2, 0.1)),",
        "RandomCrop(8, (1, 2), True, (1, 2, 3), 'reflect')",
        "CenterCrop(8), TrivialAugmentWide(7, fill=3)",
        "RandomCrop(8, padding=(1, 2, 3, 4), padding_mode=\"symmetric\", fill=7)",
    ] {
        let t = Transforms::parse(spec).unwrap_or_else(|e| panic!("{spec}: {e}"));
        assert_eq!(Transforms::parse(&t.to_string()).unwrap(), t, "{spec}");
    }
    // Defaults spelled out or left out are the same pipeline.
    assert_eq!(
        Transforms::parse(
            "RandomResizedCrop(16, scale=(0.08, 1.0), ratio=(3/4, 4/3)), RandomHorizontalFlip(0.5)"
        )
        .unwrap(),
        Transforms::train(16)
    );
    // ColorJitter(0) is the identity and is written as such.
    assert_eq!(
        Transforms::parse("CenterCrop(4), ColorJitter()").unwrap(),
        Transforms::parse("CenterCrop(4), ColorJitter(0, 0.0, saturation=(1, 1), hue=0)").unwrap()
    );
}

fn err(spec: &str) -> String {
    match Transforms::parse(spec) {
        Ok(t) => panic!("{spec} parsed as {t}"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn bad_specs_are_errors_naming_the_transform_and_the_argument() {
    let cases = [
        ("RandomCrap(32)", "unknown transform \"RandomCrap\""),
        (
            "RandomCrop(32, padding=-1)",
            "RandomCrop: padding must be ≥ 0",
        ),
        (
            "RandomCrop(32, padding=(1, -2))",
            "RandomCrop: padding must be ≥ 0",
        ),
        (
            "CenterCrop(8), ColorJitter(hue=0.7)",
            "ColorJitter: hue must be in [0, 0.5]",
        ),
        (
            "CenterCrop(8), ColorJitter(hue=(-0.7, 0))",
            "ColorJitter: hue must be in [-0.5, 0.5]",
        ),
        (
            "CenterCrop(8), ColorJitter(brightness=-1)",
            "ColorJitter: brightness must be ≥ 0",
        ),
        (
            "RandomCrop(32, paddin=4)",
            "RandomCrop: unknown argument \"paddin\"",
        ),
        (
            "CenterCrop(8), TrivialAugmentWide(1)",
            "TrivialAugmentWide: num_magnitude_bins must be",
        ),
        (
            "CenterCrop(8), TrivialAugmentWide(interpolation=0)",
            "is not supported",
        ),
        (
            "RandomCrop(size='32')",
            "RandomCrop: size must be an integer",
        ),
        ("RandomCrop(0)", "RandomCrop: size must be in 1..=8192"),
        (
            "RandomCrop(32, padding_mode='wrap')",
            "RandomCrop: padding_mode must be constant",
        ),
        (
            "RandomCrop(32, fill=256)",
            "RandomCrop: fill must be in 0..=255",
        ),
        (
            "RandomCrop(32, pad_if_needed=1)",
            "RandomCrop: pad_if_needed must be True or False",
        ),
        (
            "RandomCrop(32, 1, 2, 3, 4, 5)",
            "RandomCrop: takes at most 5 positional",
        ),
        (
            "RandomCrop(32, size=32)",
            "RandomCrop: argument \"size\" given twice",
        ),
        (
            "RandomCrop()",
            "RandomCrop: missing required argument \"size\"",
        ),
        (
            "CenterCrop(4), RandomHorizontalFlip(p=1.5)",
            "RandomHorizontalFlip: p must be in [0, 1]",
        ),
        (
            "RandomResizedCrop(8, scale=(0.5, 0.1))",
            "RandomResizedCrop: scale must be",
        ),
        ("RandomResizedCrop(8, interpolation=2)", "is not supported"),
        ("RandomCrop(32) garbage", "syntax error"),
        ("RandomCrop(32))", "syntax error"),
        ("RandomCrop(32", "syntax error"),
        ("RandomCrop 32", "expected '(' after RandomCrop"),
        (
            "RandomCrop(padding=4, 32)",
            "positional argument after a keyword",
        ),
        ("", "empty"),
        ("Resize(256)", "output size is not fixed"),
        ("RandomHorizontalFlip()", "output size is not fixed"),
        ("RandomCrop((32, 16))", "ring needs a square output"),
        ("[{\"name\": \"RandomCrop\"}] x", "bad JSON"),
        ("[{\"size\": 3}]", "has no \"name\""),
        (
            "[{\"name\": \"CenterCrop\", \"size\": 3, \"bogus\": 1}]",
            "CenterCrop: unknown argument \"bogus\"",
        ),
    ];
    for (spec, want) in cases {
        let got = err(spec);
        assert!(got.contains(want), "{spec:?}: got {got:?}, want {want:?}");
    }
}

#[test]
fn random_strings_never_panic_the_parser() {
    let alphabet: Vec<char> =
        "RandomCrop(Resize)CenterCrop[]{}\"':=,.-+/0123456789eE pTFNx_é\u{1F600}\\\t\n"
            .chars()
            .collect();
    let pieces = [
        "RandomCrop(",
        "32",
        ", padding=",
        "(1, 2)",
        ")",
        "ColorJitter(",
        "hue=",
        "0.5",
        "[{\"name\":",
        "\"RandomCrop\"",
        ",\"size\":",
        "}]",
        "'reflect'",
        "1e400",
        "-",
        "/0",
        "((((((((((",
        "True",
        "None",
    ];
    let mut rng = SampleRng::new(Stream::Synth, 1, 2, 3);
    for _ in 0..20_000 {
        let mut s = String::new();
        for _ in 0..rng.below(12) {
            if rng.below(2) == 0 {
                s.push(alphabet[rng.below(alphabet.len() as u64) as usize]);
            } else {
                s.push_str(pieces[rng.below(pieces.len() as u64) as usize]);
            }
        }
        if let Ok(t) = Transforms::parse(&s) {
            assert_eq!(Transforms::parse(&t.to_string()).unwrap(), t, "{s:?}");
        }
    }
}

/// A 3×3 image whose red channel is `10 * y + x`.
fn tiny() -> Vec<u8> {
    (0..3u8)
        .flat_map(|y| (0..3u8).flat_map(move |x| [10 * y + x, 0, 0]))
        .collect()
}

fn reds(out: &[u8], w: usize, row: usize) -> Vec<u8> {
    out[row * w * 3..(row + 1) * w * 3]
        .chunks(3)
        .map(|p| p[0])
        .collect()
}

#[test]
fn random_crop_padding_modes_match_numpy_pad() {
    let img = tiny();
    // A crop the size of the padded image takes all of it (torchvision draws nothing).
    let out = |mode: &str| {
        run(
            &format!("RandomCrop(7, padding=2, padding_mode='{mode}', fill=(99, 1, 2))"),
            &img,
            3,
            3,
            0,
            0,
        )
    };
    let reflect = out("reflect");
    assert_eq!(reds(&reflect, 7, 0), [22, 21, 20, 21, 22, 21, 20]);
    assert_eq!(reds(&reflect, 7, 3), [12, 11, 10, 11, 12, 11, 10]);
    let symmetric = out("symmetric");
    assert_eq!(reds(&symmetric, 7, 0), [11, 10, 10, 11, 12, 12, 11]);
    assert_eq!(reds(&symmetric, 7, 6), [11, 10, 10, 11, 12, 12, 11]);
    let edge = out("edge");
    assert_eq!(reds(&edge, 7, 0), [0, 0, 0, 1, 2, 2, 2]);
    assert_eq!(reds(&edge, 7, 6), [20, 20, 20, 21, 22, 22, 22]);
    let constant = out("constant");
    assert_eq!(reds(&constant, 7, 0), [99; 7]);
    assert_eq!(reds(&constant, 7, 3), [99, 99, 10, 11, 12, 99, 99]);
    assert_eq!(&constant[..3], &[99, 1, 2]);
    // Padding larger than the image reflects repeatedly, as np.pad does.
    let big = run(
        "RandomCrop(11, padding=4, padding_mode='reflect')",
        &img,
        3,
        3,
        0,
        0,
    );
    assert_eq!(reds(&big, 11, 4), [0, 1, 2, 1, 0, 1, 2, 1, 0, 1, 2]);
}

#[test]
fn random_crop_offsets_stay_inside_the_padded_image_and_cover_it() {
    let img = tiny();
    let mut seen = std::collections::BTreeSet::new();
    for index in 0..400 {
        let out = run("RandomCrop(3, padding=1)", &img, 3, 3, 4, index);
        // The source's centre pixel (11) lands at (1 + 1 - top, 1 + 1 - left).
        let pos = out.chunks(3).position(|p| p[0] == 11).unwrap();
        seen.insert(pos);
    }
    assert_eq!(seen.len(), 9, "all 3x3 offsets drawn: {seen:?}");
}

#[test]
fn random_crop_larger_than_the_image_needs_pad_if_needed() {
    let img = tiny();
    let t = Transforms::parse("RandomCrop(5)").unwrap();
    let mut out = vec![0; t.output_len()];
    let image = RgbImage {
        width: 3,
        height: 3,
        pixels: &img,
    };
    let e = Transformer::new(t)
        .apply(image, 0, 0, 0, &mut out)
        .unwrap_err();
    assert!(matches!(e, AugmentError::CropTooLarge { .. }), "{e}");
    // pad_if_needed pads each side by the missing 2 pixels (torchvision), so 7x7 to crop from.
    let mut seen = std::collections::BTreeSet::new();
    for index in 0..300 {
        let out = run("RandomCrop(5, pad_if_needed=True)", &img, 3, 3, 0, index);
        seen.insert(out.chunks(3).position(|p| p[0] == 11));
    }
    assert!(seen.len() > 1);
}

use crate::error::AugmentError;

#[test]
fn center_crop_rounds_half_to_even_and_pads_with_zeros() {
    // 4 -> 1: round(1.5) = 2; 6 -> 1: round(2.5) = 2 (Python's round).
    let four: Vec<u8> = (0..16u8).flat_map(|i| [i, 1, 1]).collect();
    assert_eq!(run("CenterCrop(1)", &four, 4, 4, 0, 0), [2 * 4 + 2, 1, 1]);
    let six: Vec<u8> = (0..36u8).flat_map(|i| [i, 1, 1]).collect();
    assert_eq!(run("CenterCrop(1)", &six, 6, 6, 0, 0), [2 * 6 + 2, 1, 1]);
    // 1 -> 3: padded by (3 - 1) // 2 = 1 on the left/top, zeros around.
    let out = run("CenterCrop(3)", &[9, 8, 7], 1, 1, 0, 0);
    let mut want = vec![0u8; 27];
    want[12..15].copy_from_slice(&[9, 8, 7]);
    assert_eq!(out, want);
    // 2 -> 3 pads 0 before and 1 after.
    let two: Vec<u8> = (1..=4u8).flat_map(|i| [i, i, i]).collect();
    let out = run("CenterCrop(3)", &two, 2, 2, 0, 0);
    assert_eq!(reds(&out, 3, 0), [1, 2, 0]);
    assert_eq!(reds(&out, 3, 2), [0, 0, 0]);
}

#[test]
fn flips_mirror_rows_and_columns() {
    let img = tiny();
    let h = run("CenterCrop(3), RandomHorizontalFlip(p=1)", &img, 3, 3, 0, 0);
    assert_eq!(reds(&h, 3, 0), [2, 1, 0]);
    assert_eq!(reds(&h, 3, 2), [22, 21, 20]);
    let v = run("CenterCrop(3), RandomVerticalFlip(1.0)", &img, 3, 3, 0, 0);
    assert_eq!(reds(&v, 3, 0), [20, 21, 22]);
    assert_eq!(reds(&v, 3, 1), [10, 11, 12]);
    let none = run(
        "CenterCrop(3), RandomVerticalFlip(0), RandomHorizontalFlip(0)",
        &img,
        3,
        3,
        0,
        0,
    );
    assert_eq!(none, img);
    // Flips before the crop work on the source image.
    let early = run("RandomHorizontalFlip(p=1), CenterCrop(3)", &img, 3, 3, 0, 0);
    assert_eq!(early, h);
}

#[test]
fn grayscale_uses_the_0_299_0_587_0_114_weights() {
    let px = [255, 0, 0, 0, 255, 0, 0, 0, 255, 77, 77, 77];
    let out = run("CenterCrop(2), RandomGrayscale(p=1)", &px, 2, 2, 0, 0);
    // 0.299 * 255 = 76.2, 0.587 * 255 = 149.7, 0.114 * 255 = 29.1; gray stays gray.
    assert_eq!(out, [76, 76, 76, 150, 150, 150, 29, 29, 29, 77, 77, 77]);
    assert_eq!(
        run("CenterCrop(2), RandomGrayscale(p=0)", &px, 2, 2, 0, 0),
        px
    );
}

#[test]
fn color_jitter_adjustments_follow_torchvisions_formulas() {
    let px = [201, 100, 0, 10, 20, 30, 255, 255, 255, 0, 0, 0];
    // brightness 0.5: x * 0.5 truncated.
    let b = run(
        "CenterCrop(2), ColorJitter(brightness=(0.5, 0.5))",
        &px,
        2,
        2,
        0,
        0,
    );
    assert_eq!(b, [100, 50, 0, 5, 10, 15, 127, 127, 127, 0, 0, 0]);
    // contrast 0: every channel becomes the mean of the grayscale image.
    let grays = [119u64, 18, 255, 0];
    let mean = (grays.iter().sum::<u64>() as f64 / 4.0) as f32;
    let c = run(
        "CenterCrop(2), ColorJitter(contrast=(0, 0))",
        &px,
        2,
        2,
        0,
        0,
    );
    assert!(c.iter().all(|&v| v == mean as u8), "{c:?} vs {mean}");
    // saturation 0: the pixel's gray value.
    let s = run(
        "CenterCrop(2), ColorJitter(saturation=(0, 0))",
        &px,
        2,
        2,
        0,
        0,
    );
    assert_eq!(s, [119, 119, 119, 18, 18, 18, 255, 255, 255, 0, 0, 0]);
    // hue +0.5: red becomes cyan, green magenta, blue yellow; grays do not change. (Back to
    // u8 as torchvision's convert_image_dtype: times 255.999, truncated, so the f32 rounding
    // of the sector fraction does not turn 255 into 254.)
    let red = [255, 0, 0, 0, 255, 0, 128, 128, 128, 0, 0, 255];
    let hh = run(
        "CenterCrop(2), ColorJitter(hue=(0.5, 0.5))",
        &red,
        2,
        2,
        0,
        0,
    );
    assert_eq!(hh, [0, 255, 255, 255, 0, 255, 128, 128, 128, 255, 255, 0]);
}

#[test]
fn color_jitter_draws_a_random_order_of_its_adjustments() {
    // Brightness 2 then contrast 0 differs from contrast 0 then brightness 2: both orders
    // occur over enough samples.
    let px = [200, 10, 10, 10, 200, 10, 10, 10, 200, 90, 90, 90];
    let mut outputs = std::collections::BTreeSet::new();
    for index in 0..64 {
        outputs.insert(run(
            "CenterCrop(2), ColorJitter(brightness=(2, 2), contrast=(0, 0))",
            &px,
            2,
            2,
            3,
            index,
        ));
    }
    assert_eq!(outputs.len(), 2, "{outputs:?}");
}

#[test]
fn output_sizes_are_inferred_through_the_pipeline() {
    assert_eq!(
        Transforms::parse("RandomResizedCrop(32), Resize(16)")
            .unwrap()
            .size(),
        16
    );
    assert_eq!(Transforms::parse("Resize((20, 20))").unwrap().size(), 20);
    assert_eq!(
        Transforms::parse("Resize([24]), CenterCrop([8])")
            .unwrap()
            .size(),
        8
    );
    assert_eq!(
        Transforms::parse("CenterCrop((9, 12)), Resize(9)").unwrap_err(),
        TransformError::NotSquare {
            height: 9,
            width: 12
        }
    );
    let out = run(
        "RandomResizedCrop(32), Resize(16)",
        &pattern(50, 40),
        50,
        40,
        1,
        1,
    );
    assert_eq!(out.len(), 16 * 16 * 3);
    // Resize((h, w)) + CenterCrop is fused; an unfused CenterCrop larger than the resize pads.
    let out = run("Resize((4, 4)), CenterCrop(6)", &pattern(8, 8), 8, 8, 0, 0);
    assert_eq!(reds(&out, 6, 0), [0; 6]);
}

#[test]
fn transformers_reuse_their_buffers_after_the_first_sample() {
    let spec = "RandomCrop(24, padding=4, padding_mode='reflect'), ColorJitter(0.4, 0.4, 0.4, 0.1), \
                RandomResizedCrop(16), RandomGrayscale(0.5), RandomVerticalFlip(), \
                TrivialAugmentWide(fill=(1, 2, 3))";
    let t = Transforms::parse(spec).unwrap();
    let mut tr = Transformer::new(t.clone());
    let pixels = pattern(40, 30);
    let image = RgbImage {
        width: 40,
        height: 30,
        pixels: &pixels,
    };
    let mut out = vec![0; t.output_len()];
    tr.apply(image, 0, 0, 0, &mut out).unwrap();
    let before = tr.scratch();
    for index in 1..50 {
        tr.apply(image, 0, 0, index, &mut out).unwrap();
    }
    assert_eq!(tr.scratch(), before);
}

#[test]
fn the_same_seed_epoch_and_index_give_the_same_output() {
    let spec = "RandomCrop(24, padding=4), ColorJitter(0.4, 0.4, 0.4, 0.1), RandomGrayscale(0.5)";
    let pixels = pattern(30, 30);
    assert_eq!(
        run(spec, &pixels, 30, 30, 7, 3),
        run(spec, &pixels, 30, 30, 7, 3)
    );
    assert_ne!(
        run(spec, &pixels, 30, 30, 7, 3),
        run(spec, &pixels, 30, 30, 7, 4)
    );
}

#[test]
fn degenerate_images_and_wrong_buffers_are_errors() {
    let t = Transforms::parse("RandomCrop(4), RandomHorizontalFlip()").unwrap();
    let mut tr = Transformer::new(t);
    let mut out = vec![0; 48];
    let empty = RgbImage {
        width: 0,
        height: 4,
        pixels: &[],
    };
    assert!(tr.apply(empty, 0, 0, 0, &mut out).is_err());
    let short = RgbImage {
        width: 4,
        height: 4,
        pixels: &[0; 10],
    };
    assert!(tr.apply(short, 0, 0, 0, &mut out).is_err());
    let pixels = pattern(4, 4);
    let ok = RgbImage {
        width: 4,
        height: 4,
        pixels: &pixels,
    };
    assert!(tr.apply(ok, 0, 0, 0, &mut out[..47]).is_err());
    // A huge resize of a thin image is an error, not an allocation of terabytes.
    let t = Transforms::parse("Resize(8192), CenterCrop(8)").unwrap();
    let thin = pattern(1, 200);
    let image = RgbImage {
        width: 200,
        height: 1,
        pixels: &thin,
    };
    let mut out = vec![0; t.output_len()];
    // Fused with the crop, this never materializes the 8192 x 1.6M image.
    Transformer::new(t).apply(image, 0, 0, 0, &mut out).unwrap();
    let t = Transforms::parse("Resize(8192), RandomCrop(8)").unwrap();
    let mut out = vec![0; t.output_len()];
    let e = Transformer::new(t)
        .apply(image, 0, 0, 0, &mut out)
        .unwrap_err();
    assert!(matches!(e, AugmentError::TooLarge { .. }), "{e}");
}

/// Output hashes of every transform on a fixed image and seed. A change here changes what
/// users train on: update the pins only for an intended, documented behaviour change.
#[test]
fn golden_outputs_are_pinned() {
    let pixels = pattern(61, 47);
    // Resampling goes through fast_image_resize's SIMD kernels: a pin that changes on
    // another CPU family points at the resizer, not at ladle.
    let pinned: [(&str, u64); 18] = [
        ("RandomResizedCrop(24)", 0x4533b6eae90f2d7a),
        (
            "RandomResizedCrop(24, scale=(0.5, 0.9), ratio=(1, 2)), RandomHorizontalFlip()",
            0xc36f98a394691ca6,
        ),
        ("RandomCrop(32, padding=4)", 0x350ad18477b50f18),
        (
            "RandomCrop(40, padding=(3, 5), padding_mode='edge')",
            0x6b0201a8bc517fdf,
        ),
        (
            "RandomCrop(40, padding=4, padding_mode='reflect')",
            0x32a55009446e2299,
        ),
        (
            "RandomCrop(40, padding=4, padding_mode='symmetric')",
            0x4389e720ea3cd7e2,
        ),
        (
            "RandomCrop(64, pad_if_needed=True, fill=(10, 20, 30))",
            0xee6360e88925bf16,
        ),
        ("Resize(32), CenterCrop(24)", 0x3e57a4627c236f05),
        ("Resize((30, 30))", 0xd06eccd96a3375f5),
        ("CenterCrop(40), Resize(20)", 0x5c5bb5418c5d3b75),
        (
            "CenterCrop(24), RandomHorizontalFlip(p=1)",
            0x416661d5471eacbd,
        ),
        (
            "CenterCrop(24), RandomVerticalFlip(p=1)",
            0x695bb4491bb1fe65,
        ),
        (
            "CenterCrop(24), ColorJitter(0.4, 0.4, 0.4, 0.1)",
            0x202b835a64e75fb1,
        ),
        (
            "CenterCrop(24), ColorJitter(brightness=0.8)",
            0x775eded9781449d6,
        ),
        (
            "CenterCrop(24), ColorJitter(contrast=0.8)",
            0x7299fd0693ae1768,
        ),
        (
            "CenterCrop(24), ColorJitter(saturation=0.8)",
            0xd7323d3e36c1eb3e,
        ),
        ("CenterCrop(24), ColorJitter(hue=0.3)", 0xb3e687aa4b8ab92f),
        ("CenterCrop(24), RandomGrayscale(p=1)", 0x6ebf35e494523725),
    ];
    let mut wrong = Vec::new();
    for (spec, want) in pinned {
        let hashes: Vec<u8> = (0..4)
            .flat_map(|index| fnv(&run(spec, &pixels, 61, 47, 1234, index)).to_le_bytes())
            .collect();
        let got = fnv(&hashes);
        if got != want {
            wrong.push(format!("(\"{spec}\", {got:#018x}),"));
        }
    }
    assert!(wrong.is_empty(), "changed outputs:\n{}", wrong.join("\n"));
}

/// `TrivialAugmentWide` over 128 samples (every one of its fourteen operations is drawn),
/// pinned like the others.
#[test]
fn trivial_augment_wide_outputs_are_pinned_and_every_operation_runs() {
    let pixels = pattern(61, 47);
    let spec = "CenterCrop(40), TrivialAugmentWide(fill=(9, 8, 7))";
    let mut identical = 0;
    let hashes: Vec<u8> = (0..128)
        .flat_map(|index| {
            let out = run(spec, &pixels, 61, 47, 99, index);
            let same = run("CenterCrop(40)", &pixels, 61, 47, 99, index);
            identical += usize::from(out == same);
            fnv(&out).to_le_bytes()
        })
        .collect();
    // Identity, and small magnitudes of a few operations, leave the image as it was.
    assert!(identical < 40, "{identical} of 128 unchanged");
    let got = fnv(&hashes);
    assert_eq!(got, 0x7928_6184_b626_b482, "changed output: {got:#018x}");
    // The first draw of each sample picks the operation (CenterCrop draws nothing).
    let ops: std::collections::BTreeSet<u64> = (0..128)
        .map(|index| SampleRng::new(Stream::Augment, 99, 0, index).below(14))
        .collect();
    assert_eq!(ops.len(), 14, "{ops:?}");
}
