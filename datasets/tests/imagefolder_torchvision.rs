//! ImageFolder against torchvision's rules: sample `i` and its label are
//! `torchvision.datasets.ImageFolder(root).samples[i]` on a tree of tricky names, checked
//! against the order written out by hand and against torchvision's own `make_dataset` (the
//! lines copied into `tests/torchvision_order.py`, or torchvision itself where installed);
//! every extension of torchvision's `IMG_EXTENSIONS` decodes; bad files are bad samples.

#![allow(clippy::unwrap_used)] // tests fail loudly by design

use std::ffi::OsStr;
use std::io::Cursor;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use image::codecs::pnm::{PnmSubtype, SampleEncoding};
use image::{ExtendedColorType, ImageEncoder};
use ladle_datasets::decode::{Decoder, MAX_SIDE};
use ladle_datasets::imagefolder::ImageFolder;
use ladle_datasets::inspect::inspect;
use ladle_datasets::synth::Encoding;
use ladle_datasets::{Dataset, DecodeError, LeftOut};

const W: u32 = 6;
const H: u32 = 4;

/// A small RGB gradient, distinct per `seed`.
fn pixels(seed: u8) -> Vec<u8> {
    (0..W * H)
        .flat_map(|i| [seed.wrapping_mul(31), (i * 10) as u8, 200 - (i * 5) as u8])
        .collect()
}

fn grey_of(rgb: &[u8]) -> Vec<u8> {
    rgb.chunks(3).map(|p| p[1]).collect()
}

/// `rgb` encoded as the format its extension names (PGM keeps the green channel as grey).
fn encode(ext: &str, rgb: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    match ext.to_ascii_lowercase().as_str() {
        "jpg" | "jpeg" => {
            ladle_datasets::synth::encode(rgb, W, H, Encoding::Baseline444, 95, &mut out).unwrap()
        }
        "png" => {
            let mut enc = png::Encoder::new(&mut out, W, H);
            enc.set_color(png::ColorType::Rgb);
            enc.write_header().unwrap().write_image_data(rgb).unwrap();
        }
        "bmp" => image::codecs::bmp::BmpEncoder::new(&mut out)
            .write_image(rgb, W, H, ExtendedColorType::Rgb8)
            .unwrap(),
        "tif" | "tiff" => image::codecs::tiff::TiffEncoder::new(Cursor::new(&mut out))
            .write_image(rgb, W, H, ExtendedColorType::Rgb8)
            .unwrap(),
        "ppm" => image::codecs::pnm::PnmEncoder::new(&mut out)
            .with_subtype(PnmSubtype::Pixmap(SampleEncoding::Binary))
            .write_image(rgb, W, H, ExtendedColorType::Rgb8)
            .unwrap(),
        "pgm" => image::codecs::pnm::PnmEncoder::new(&mut out)
            .with_subtype(PnmSubtype::Graymap(SampleEncoding::Binary))
            .write_image(&grey_of(rgb), W, H, ExtendedColorType::L8)
            .unwrap(),
        "webp" => image::codecs::webp::WebPEncoder::new_lossless(&mut out)
            .write_image(rgb, W, H, ExtendedColorType::Rgb8)
            .unwrap(),
        other => panic!("no encoder for {other}"),
    }
    out
}

/// Writes an image named `rel` (its extension picks the format) below `root`.
fn image_at(root: &Path, rel: impl AsRef<Path>, seed: u8) -> PathBuf {
    let path = root.join(rel);
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    let ext = path.extension().unwrap().to_str().unwrap().to_owned();
    std::fs::write(&path, encode(&ext, &pixels(seed))).unwrap();
    path
}

fn text_at(root: &Path, rel: &str, text: &str) {
    let path = root.join(rel);
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, text).unwrap();
}

/// The tree: nested folders whose names sort differently as whole paths and as components
/// (`a`, `a b`, `a-b`, `a.b`, `a/b`), files beside sub-folders, mixed-case extensions, hidden
/// files and a hidden class folder, non-image files, a corrupt WebP, a broken link, a link to
/// a folder, and names that are not ASCII or not even UTF-8.
fn tricky_tree(root: &Path) {
    text_at(root, ".ipynb_checkpoints/notebook.ipynb", "{}");
    image_at(root, "Zeta/one.PNG", 1);
    image_at(root, "cat/b.JPG", 2);
    image_at(root, "cat/a.jpeg", 3);
    image_at(root, "cat/Z.png", 4);
    image_at(root, "cat/.hidden.png", 5);
    text_at(root, "cat/notes.txt", "not an image");
    image_at(root, "cat/a/x.png", 6);
    image_at(root, "cat/a b/x.png", 7);
    image_at(root, "cat/a-b/x.png", 8);
    image_at(root, "cat/a.b/x.png", 9);
    image_at(root, "cat/a/b/x.png", 10);
    image_at(root, "cat/a/b/c/y.webp", 11);
    text_at(
        root,
        "cat/sub/corrupt.webp",
        "RIFF\x10\0\0\0WEBPVP8 garbage!",
    );
    std::os::unix::fs::symlink(root.join("nowhere.jpg"), root.join("cat/broken.jpg")).unwrap();
    std::os::unix::fs::symlink(root.join("Zeta"), root.join("cat/link")).unwrap();
    for (i, ext) in ["bmp", "jpg", "pgm", "png", "ppm", "tif", "tiff", "webp"]
        .iter()
        .enumerate()
    {
        image_at(root, format!("dog/img.{ext}"), 20 + i as u8);
    }
    text_at(root, "dog/readme.md", "# dogs");
    text_at(root, "dog/anim.GIF", "GIF89a");
    image_at(root, "é/u.png", 30);
    image_at(root, "é/ü.png", 31);
    image_at(root, "é/\u{e000}.png", 32);
    let not_utf8 = OsStr::from_bytes(b"\xff.png");
    image_at(&root.join("é"), not_utf8, 33);
}

/// The samples of [`tricky_tree`], in the order the rules give, worked out by hand:
/// classes `.ipynb_checkpoints` (0, no images) < `Zeta` < `cat` < `dog` < `é` (code points
/// 0x2E < 0x5A < 0x63 < 0x64 < 0xE9); in `cat`, its own files first (`.hidden.png` <
/// `Z.png` < `a.jpeg` < `b.JPG` < `broken.jpg`), then its folders by whole path: `a` <
/// `a b` < `a-b` < `a.b` < `a/b` < `a/b/c` < `link` < `sub` (space, `-`, `.` are below `/`);
/// in `é`, `\xff` is U+DCFF to Python, after `ü` (U+FC) and before U+E000.
fn expected() -> Vec<(Vec<u8>, i64)> {
    let cat = [
        ".hidden.png",
        "Z.png",
        "a.jpeg",
        "b.JPG",
        "broken.jpg",
        "a/x.png",
        "a b/x.png",
        "a-b/x.png",
        "a.b/x.png",
        "a/b/x.png",
        "a/b/c/y.webp",
        "link/one.PNG",
        "sub/corrupt.webp",
    ];
    let dog = ["bmp", "jpg", "pgm", "png", "ppm", "tif", "tiff", "webp"];
    let mut out = vec![(b"Zeta/one.PNG".to_vec(), 1)];
    out.extend(cat.iter().map(|f| (format!("cat/{f}").into_bytes(), 2)));
    out.extend(dog.iter().map(|e| (format!("dog/img.{e}").into_bytes(), 3)));
    for name in ["u.png".as_bytes(), "ü.png".as_bytes(), b"\xff.png"] {
        out.push(([&b"\xc3\xa9/"[..], name].concat(), 4));
    }
    out.push(("é/\u{e000}.png".as_bytes().to_vec(), 4));
    out
}

/// Every sample's path relative to `root`, as bytes, with its label.
fn relative_samples(ds: &ImageFolder, root: &Path) -> Vec<(Vec<u8>, i64)> {
    (0..ds.len())
        .map(|i| {
            let path = ds.path(i).unwrap().strip_prefix(root).unwrap();
            (path.as_os_str().as_bytes().to_vec(), ds.label(i).unwrap())
        })
        .collect()
}

#[test]
fn samples_and_labels_follow_torchvision_order_written_out_by_hand() {
    let dir = tempfile::tempdir().unwrap();
    tricky_tree(dir.path());
    let ds = ImageFolder::open(dir.path()).unwrap();
    assert_eq!(
        ds.class_names(),
        [".ipynb_checkpoints", "Zeta", "cat", "dog", "é"]
    );
    let got = relative_samples(&ds, dir.path());
    let show = |v: &[(Vec<u8>, i64)]| {
        v.iter()
            .map(|(p, l)| format!("{l} {}", String::from_utf8_lossy(p)))
            .collect::<Vec<_>>()
    };
    assert_eq!(show(&got), show(&expected()));
    assert_eq!(got, expected());
}

#[test]
fn samples_and_labels_match_torchvision_make_dataset_run_by_python() {
    let dir = tempfile::tempdir().unwrap();
    tricky_tree(dir.path());
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/torchvision_order.py");
    let out = Command::new("python3")
        .arg(&script)
        .arg(dir.path())
        .output()
        .expect("python3 runs tests/torchvision_order.py");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    let hex = |s: &str| -> Vec<u8> {
        (0..s.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
            .collect()
    };
    let mut classes = Vec::new();
    let mut samples = Vec::new();
    for line in text.lines() {
        let fields: Vec<&str> = line.split(' ').collect();
        match fields[..] {
            ["class", name] => classes.push(String::from_utf8_lossy(&hex(name)).into_owned()),
            ["sample", label, path] => samples.push((hex(path), label.parse::<i64>().unwrap())),
            _ => panic!("unexpected line {line:?}"),
        }
    }
    let root = dir.path().as_os_str().as_bytes();
    let python: Vec<(Vec<u8>, i64)> = samples
        .into_iter()
        .map(|(p, l)| (p[root.len() + 1..].to_vec(), l))
        .collect();
    let ds = ImageFolder::open(dir.path()).unwrap();
    assert_eq!(ds.class_names(), classes);
    assert_eq!(relative_samples(&ds, dir.path()), python);
    assert_eq!(python, expected());
}

#[test]
fn inspect_counts_left_out_files_by_extension_and_names_the_bad_samples() {
    let dir = tempfile::tempdir().unwrap();
    tricky_tree(dir.path());
    let ds = ImageFolder::open(dir.path()).unwrap();
    let report = inspect(&ds, 2, Default::default(), &|_| {}).unwrap();
    assert_eq!(report.samples, expected().len() as u64);
    let left_out = |extension: &str, files| LeftOut {
        extension: extension.into(),
        files,
    };
    assert_eq!(
        report.left_out,
        [
            left_out(".gif", 1),
            left_out(".ipynb", 1),
            left_out(".md", 1),
            left_out(".txt", 1)
        ]
    );
    let bad: Vec<PathBuf> = report.bad_files.iter().map(PathBuf::from).collect();
    assert_eq!(
        bad,
        [
            dir.path().join("cat/broken.jpg"),
            dir.path().join("cat/sub/corrupt.webp")
        ],
        "{:?}",
        report.errors
    );
    assert_eq!(report.decoded, report.samples - 2);
    let webp = &report.errors[1].error;
    assert!(
        webp.contains("corrupt.webp") && webp.contains("WebP"),
        "{webp}"
    );
    assert!(
        report
            .warnings
            .iter()
            .any(|w| w.contains(".ipynb_checkpoints") && w.contains("hidden")),
        "{:?}",
        report.warnings
    );
    assert!(
        report
            .warnings
            .iter()
            .any(|w| w.contains(".ipynb_checkpoints") && w.contains("no image file")),
        "{:?}",
        report.warnings
    );
}

#[test]
fn every_torchvision_extension_decodes_to_the_pixels_written() {
    let mut decoder = Decoder::new();
    for ext in [
        "jpg", "jpeg", "png", "ppm", "bmp", "pgm", "tif", "tiff", "webp",
    ] {
        let rgb = pixels(7);
        let image = decoder.decode(&encode(ext, &rgb)).unwrap();
        assert_eq!((image.width, image.height), (W, H), "{ext}");
        let want = if ext == "pgm" {
            grey_of(&rgb).iter().flat_map(|&g| [g, g, g]).collect()
        } else {
            rgb
        };
        if ext.starts_with("jp") {
            let err = image
                .pixels
                .iter()
                .zip(&want)
                .map(|(&a, &b)| u32::from(a.abs_diff(b)))
                .max()
                .unwrap();
            assert!(err < 12, "{ext}: max error {err}");
        } else {
            assert_eq!(image.pixels, &want[..], "{ext}");
        }
    }
}

#[test]
fn sixteen_bit_tiffs_convert_as_pil_convert_rgb_does() {
    // PIL opens 16-bit grey as mode I;16 and `convert("RGB")` clips it to 255; 16-bit RGB is
    // unpacked to its high bytes.
    let grey: [u16; 4] = [3, 255, 256, 40_000];
    let mut tiff = Vec::new();
    image::codecs::tiff::TiffEncoder::new(Cursor::new(&mut tiff))
        .write_image(
            &grey
                .iter()
                .flat_map(|v| v.to_ne_bytes())
                .collect::<Vec<_>>(),
            2,
            2,
            ExtendedColorType::L16,
        )
        .unwrap();
    let mut decoder = Decoder::new();
    let image = decoder.decode(&tiff).unwrap();
    assert_eq!(
        image.pixels,
        [3, 3, 3, 255, 255, 255, 255, 255, 255, 255, 255, 255]
    );

    let rgb: [u16; 3] = [0x0102, 0xA0FF, 0xFFFF];
    let mut tiff = Vec::new();
    image::codecs::tiff::TiffEncoder::new(Cursor::new(&mut tiff))
        .write_image(
            &rgb.iter().flat_map(|v| v.to_ne_bytes()).collect::<Vec<_>>(),
            1,
            1,
            ExtendedColorType::Rgb16,
        )
        .unwrap();
    assert_eq!(decoder.decode(&tiff).unwrap().pixels, [0x01, 0xA0, 0xFF]);
}

#[test]
fn grey_alpha_and_rgba_inputs_lose_their_alpha_without_compositing() {
    let mut webp = Vec::new();
    image::codecs::webp::WebPEncoder::new_lossless(&mut webp)
        .write_image(
            &[10, 20, 30, 0, 40, 50, 60, 128],
            2,
            1,
            ExtendedColorType::Rgba8,
        )
        .unwrap();
    let mut decoder = Decoder::new();
    assert_eq!(
        decoder.decode(&webp).unwrap().pixels,
        [10, 20, 30, 40, 50, 60]
    );
    let mut bmp = Vec::new();
    image::codecs::bmp::BmpEncoder::new(&mut bmp)
        .write_image(&[90, 0, 91, 255], 2, 1, ExtendedColorType::La8)
        .unwrap();
    assert_eq!(
        decoder.decode(&bmp).unwrap().pixels,
        [90, 90, 90, 91, 91, 91]
    );
}

#[test]
fn headers_claiming_more_than_max_side_are_refused_before_decoding() {
    let huge = MAX_SIDE + 1;
    let mut decoder = Decoder::new();
    let pgm = format!("P5\n{huge} 2\n255\n").into_bytes();
    assert!(
        matches!(decoder.decode(&pgm), Err(DecodeError::TooLarge { .. })),
        "{:?}",
        decoder.decode(&pgm)
    );
    let mut bmp = encode("bmp", &pixels(1));
    bmp[18..22].copy_from_slice(&(huge as i32).to_le_bytes());
    bmp[22..26].copy_from_slice(&(huge as i32).to_le_bytes());
    let err = decoder.decode(&bmp).unwrap_err();
    assert!(
        matches!(
            err,
            DecodeError::TooLarge { .. } | DecodeError::Image { .. }
        ),
        "{err:?}"
    );
}

#[test]
fn truncated_and_garbage_files_of_each_new_format_are_errors_not_panics() {
    let mut decoder = Decoder::new();
    for ext in ["ppm", "bmp", "pgm", "tif", "webp"] {
        let good = encode(ext, &pixels(3));
        for cut in [4, 12, 30, good.len() / 2, good.len() * 3 / 4] {
            let result = decoder.decode(&good[..cut]);
            assert!(result.is_err(), "{ext} cut at {cut} decoded");
        }
        let mut flipped = good.clone();
        for b in flipped.iter_mut().skip(16).step_by(7) {
            *b ^= 0x5A;
        }
        // May decode to noise or fail; must not panic or hang.
        let _ = decoder.decode(&flipped);
    }
}

#[test]
fn a_listed_file_no_decoder_reads_is_a_sample_error_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    image_at(dir.path(), "a/good.bmp", 1);
    text_at(dir.path(), "a/fake.tiff", "II*\0 this is no TIFF");
    text_at(dir.path(), "a/text.ppm", "hello");
    let ds = ImageFolder::open(dir.path()).unwrap();
    assert_eq!(ds.len(), 3);
    let report = inspect(&ds, 1, Default::default(), &|_| {}).unwrap();
    assert_eq!(report.decoded, 1);
    assert_eq!(report.bad_files.len(), 2);
    assert!(
        report.errors[0].error.contains("fake.tiff"),
        "{:?}",
        report.errors
    );
    assert!(
        report.errors[1].error.contains("text.ppm"),
        "{:?}",
        report.errors
    );
}
