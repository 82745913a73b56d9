//! The readers, decoder and pipeline on real files written by the generator, including
//! planted bad files.

#![allow(clippy::unwrap_used)] // tests fail loudly by design

use std::path::{Path, PathBuf};

use ladle_datasets::imagefolder::ImageFolder;
use ladle_datasets::inspect::inspect;
use ladle_datasets::prelude::*;
use ladle_datasets::synth::{Encoding, generate};
use ladle_datasets::{OpenError, PipelineError, SampleError};

fn small(format: Format, count: u64) -> SynthConfig {
    SynthConfig {
        format,
        count,
        width: 96,
        height: 64,
        shard_samples: 16,
        ..SynthConfig::default()
    }
}

fn generated(format: Format, count: u64) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    generate(&small(format, count), dir.path(), &|_| {}).unwrap();
    dir
}

fn items(order: &[u64], epoch: u64) -> impl Iterator<Item = WorkItem> + Send + '_ {
    order.iter().enumerate().map(move |(seq, &index)| WorkItem {
        seq: seq as u64,
        index,
        epoch,
    })
}

#[test]
fn every_generated_format_opens_with_its_counts_and_decodes_fully() {
    for (format, count) in [
        (Format::ImageFolder, 40),
        (Format::WebDataset, 40),
        (Format::Cifar10, 40),
        (Format::Cifar100, 40),
    ] {
        let dir = generated(format, count);
        let ds = ladle_datasets::open(dir.path()).unwrap();
        assert_eq!(ds.format(), format);
        assert_eq!(ds.len(), count, "{format}");
        assert_eq!(ds.class_names().len(), 10, "{format}");
        let report = inspect(ds.as_ref(), 2, Default::default(), &|_| {}).unwrap();
        assert_eq!(report.decoded, count, "{format}: {:?}", report.errors);
        assert!(report.bad_files.is_empty(), "{format}: {:?}", report.errors);
        let expected = if matches!(format, Format::Cifar10 | Format::Cifar100) {
            32
        } else {
            96
        };
        assert_eq!(report.max_size.unwrap().0, expected);
        // Classes are balanced: every label appears count / 10 times.
        let mut per_class = [0u64; 10];
        for i in 0..ds.len() {
            per_class[ds.label(i).unwrap() as usize] += 1;
        }
        assert_eq!(per_class, [count / 10; 10], "{format}");
    }
}

#[test]
fn a_single_shard_or_batch_file_opens_on_its_own() {
    let wds = generated(Format::WebDataset, 40);
    let shard = ladle_datasets::open(wds.path().join("shard-000001.tar")).unwrap();
    assert_eq!(shard.len(), 16);
    let cifar = generated(Format::Cifar10, 20);
    let batch = ladle_datasets::open(cifar.path().join("data_batch_1.bin")).unwrap();
    assert_eq!((batch.format(), batch.len()), (Format::Cifar10, 20));
}

#[test]
fn the_generator_mixes_every_encoding_and_each_decodes() {
    let mut seen = std::collections::HashSet::new();
    for i in 0..400 {
        seen.insert(format!("{:?}", Encoding::of(0, i)));
    }
    assert_eq!(seen.len(), 7, "{seen:?}");
    // 100 generated files include at least one of the rare kinds; all decode to RGB.
    let dir = generated(Format::ImageFolder, 100);
    let ds = ladle_datasets::open(dir.path()).unwrap();
    let report = inspect(ds.as_ref(), 2, Default::default(), &|_| {}).unwrap();
    assert_eq!(report.decoded, 100, "{:?}", report.errors);
    let pngs = walk(dir.path())
        .iter()
        .filter(|p| p.extension().unwrap() == "png")
        .count();
    assert!(pngs >= 1);
}

#[test]
fn the_same_seed_writes_the_same_files() {
    let a = generated(Format::WebDataset, 20);
    let b = generated(Format::WebDataset, 20);
    for name in ["shard-000000.tar", "shard-000001.tar", "classes.txt"] {
        assert_eq!(
            std::fs::read(a.path().join(name)).unwrap(),
            std::fs::read(b.path().join(name)).unwrap(),
            "{name}"
        );
    }
}

fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            out.extend(walk(&p))
        } else {
            out.push(p)
        }
    }
    out.sort();
    out
}

/// Plants a truncated JPEG, a text file named .jpg and an empty .png in an ImageFolder.
fn plant_bad_files(root: &Path) -> Vec<PathBuf> {
    let jpg = walk(root)
        .into_iter()
        .find(|p| p.extension().unwrap() == "jpg")
        .unwrap();
    let bytes = std::fs::read(&jpg).unwrap();
    let truncated = root.join("amber/zz_truncated.jpg");
    std::fs::write(&truncated, &bytes[..bytes.len() / 3]).unwrap();
    let text = root.join("beryl/zz_notes.jpg");
    std::fs::write(&text, "this is not an image\n").unwrap();
    let empty = root.join("cobalt/zz_empty.png");
    std::fs::write(&empty, b"").unwrap();
    vec![truncated, text, empty]
}

#[test]
fn inspect_names_every_planted_bad_file_and_decodes_the_rest() {
    let dir = generated(Format::ImageFolder, 30);
    let planted = plant_bad_files(dir.path());
    let ds = ladle_datasets::open(dir.path()).unwrap();
    assert_eq!(ds.len(), 33);
    let report = inspect(ds.as_ref(), 2, Default::default(), &|_| {}).unwrap();
    assert_eq!(report.decoded, 30);
    let bad: Vec<PathBuf> = report.bad_files.iter().map(PathBuf::from).collect();
    assert_eq!(bad, planted, "{:?}", report.errors);
    assert!(report.errors.iter().all(|e| !e.error.is_empty()));
}

#[test]
fn the_pipeline_skips_and_counts_bad_samples_by_default_and_stops_when_asked() {
    let dir = generated(Format::ImageFolder, 30);
    let planted = plant_bad_files(dir.path());
    let ds = ladle_datasets::open(dir.path()).unwrap();
    let order = EpochSampler::new(ds.len(), 3).order(0);
    let augment = Transforms::train(32);
    let sink = SlotBuffer::new(64, augment.output_len());
    let skip = PipelineConfig {
        threads: 2,
        augment: augment.clone(),
        ..Default::default()
    }
    .build()
    .unwrap();
    let stats = skip.run(ds.as_ref(), items(&order, 0), &sink).unwrap();
    assert_eq!(stats.written + stats.skipped, 33);
    assert_eq!((stats.written, stats.skipped), (30, 3));

    let fail = PipelineConfig {
        threads: 2,
        augment,
        policy: BadSamplePolicy::Fail,
        ..Default::default()
    }
    .build()
    .unwrap();
    match fail.run(ds.as_ref(), items(&order, 0), &sink) {
        Err(PipelineError::Sample { source, .. }) => {
            let location = PathBuf::from(source.location().unwrap());
            assert!(planted.contains(&location), "{location:?}");
        }
        other => panic!("expected a sample error, got {other:?}"),
    }
}

#[test]
fn the_pipeline_writes_every_sample_with_its_label_the_same_for_any_thread_count() {
    let dir = generated(Format::WebDataset, 24);
    let ds = ladle_datasets::open(dir.path()).unwrap();
    let order = EpochSampler::new(ds.len(), 11).order(2);
    let augment = Transforms::train(48);
    let mut outputs = Vec::new();
    for threads in [1, 2] {
        let sink = SlotBuffer::new(order.len(), augment.output_len());
        let p = PipelineConfig {
            threads,
            augment: augment.clone(),
            seed: 5,
            ..Default::default()
        }
        .build()
        .unwrap();
        let stats = p.run(ds.as_ref(), items(&order, 2), &sink).unwrap();
        assert_eq!((stats.written, stats.skipped), (24, 0));
        let samples: Vec<(Vec<u8>, i64)> = (0..order.len() as u64)
            .map(|seq| sink.get(seq).unwrap())
            .collect();
        for (seq, (pixels, label)) in samples.iter().enumerate() {
            assert_eq!(*label, ds.label(order[seq]).unwrap());
            assert!(
                pixels.iter().any(|&b| b != 0),
                "sample {seq} was never written"
            );
        }
        outputs.push(samples);
    }
    assert_eq!(
        outputs[0], outputs[1],
        "augmentation must not depend on the thread count"
    );
}

#[test]
fn a_cifar_file_of_the_wrong_size_is_an_error_naming_it() {
    let dir = generated(Format::Cifar10, 10);
    let path = dir.path().join("data_batch_1.bin");
    let mut bytes = std::fs::read(&path).unwrap();
    bytes.truncate(bytes.len() - 100);
    std::fs::write(&path, &bytes).unwrap();
    let err = ladle_datasets::open(dir.path()).unwrap_err();
    assert!(
        matches!(&err, OpenError::CifarSize { path: p, .. } if *p == path),
        "{err:?}"
    );
    assert!(err.to_string().contains("data_batch_1.bin"));
}

#[test]
fn a_cifar_label_outside_the_classes_is_a_sample_error() {
    let dir = generated(Format::Cifar10, 10);
    let path = dir.path().join("data_batch_1.bin");
    let mut bytes = std::fs::read(&path).unwrap();
    bytes[3073 * 4] = 200; // record 4's label byte
    std::fs::write(&path, &bytes).unwrap();
    let ds = ladle_datasets::open(dir.path()).unwrap();
    let err = ds.label(4).unwrap_err();
    assert!(matches!(err, SampleError::BadLabel { .. }), "{err:?}");
    assert!(
        err.to_string().contains("data_batch_1.bin#record4"),
        "{err}"
    );
    let report = inspect(ds.as_ref(), 1, Default::default(), &|_| {}).unwrap();
    assert_eq!(report.bad_files.len(), 1);
}

fn tar_with(members: &[(&str, &[u8])]) -> Vec<u8> {
    let mut tar = tar::Builder::new(Vec::new());
    for (name, data) in members {
        let mut h = tar::Header::new_gnu();
        h.set_size(data.len() as u64);
        h.set_mode(0o644);
        h.set_cksum();
        tar.append_data(&mut h, name, *data).unwrap();
    }
    tar.into_inner().unwrap()
}

#[test]
fn tar_members_without_or_with_a_bad_label_are_reported_by_name_and_left_out() {
    let dir = tempfile::tempdir().unwrap();
    let mut jpeg = Vec::new();
    let rgb = vec![128u8; 16 * 16 * 3];
    ladle_datasets::synth::encode(&rgb, 16, 16, Encoding::Baseline420, 90, &mut jpeg).unwrap();
    let shard = tar_with(&[
        ("a.jpg", &jpeg),
        ("a.cls", b"1"),
        ("b.jpg", &jpeg), // no label
        ("c.jpg", &jpeg),
        ("c.cls", b"cat"), // not a number
        ("d.json", b"{}"), // metadata only: ignored
    ]);
    let path = dir.path().join("s.tar");
    std::fs::write(&path, shard).unwrap();
    let ds = ladle_datasets::open(&path).unwrap();
    assert_eq!(ds.len(), 1);
    assert_eq!(ds.label(0).unwrap(), 1);
    let problems: Vec<String> = ds.problems().iter().map(|p| p.to_string()).collect();
    assert_eq!(problems.len(), 2, "{problems:?}");
    assert!(matches!(ds.problems()[0], SampleError::MissingLabel { .. }));
    assert!(problems[0].contains("s.tar:b.jpg"), "{problems:?}");
    assert!(
        problems[1].contains("s.tar:c.jpg") && problems[1].contains("cat"),
        "{problems:?}"
    );
    let report = inspect(ds.as_ref(), 1, Default::default(), &|_| {}).unwrap();
    assert_eq!(report.bad_files.len(), 2);
}

#[test]
fn a_tar_member_above_the_file_limit_is_refused_from_its_header_before_it_is_read() {
    let dir = tempfile::tempdir().unwrap();
    let mut jpeg = Vec::new();
    let rgb = vec![128u8; 16 * 16 * 3];
    ladle_datasets::synth::encode(&rgb, 16, 16, Encoding::Baseline420, 90, &mut jpeg).unwrap();
    let big = vec![0u8; (1 << 20) + 1];
    let shard = tar_with(&[
        ("a.jpg", &jpeg),
        ("a.cls", b"1"),
        ("b.jpg", &big),
        ("b.cls", b"2"),
    ]);
    let path = dir.path().join("s.tar");
    std::fs::write(&path, shard).unwrap();
    let ds = ladle_datasets::open(&path).unwrap();
    let limits = ladle_datasets::SampleLimits {
        max_file_bytes: 1 << 20,
        ..Default::default()
    };
    let mut scratch = Vec::new();
    assert!(ds.read(0, &mut scratch, &limits).is_ok());
    let err = ds.read(1, &mut scratch, &limits).unwrap_err();
    assert!(
        matches!(&err, SampleError::FileTooLarge { location, bytes, max }
            if location.ends_with("s.tar:b.jpg") && *bytes == (1 << 20) + 1 && *max == 1 << 20),
        "{err}"
    );
    assert!(scratch.capacity() < 1 << 20, "{}", scratch.capacity());
    let report = inspect(ds.as_ref(), 1, limits, &|_| {}).unwrap();
    assert_eq!(report.bad_files.len(), 1, "{:?}", report.errors);
    assert!(report.bad_files[0].ends_with("s.tar:b.jpg"));
}

/// `ladle_datasets::open(path)` on a thread, with a deadline that only a hang reaches.
fn open_or_hang(path: &Path) -> Result<Box<dyn Dataset>, OpenError> {
    let (tx, rx) = std::sync::mpsc::channel();
    let path = path.to_owned();
    std::thread::spawn(move || tx.send(ladle_datasets::open(&path)));
    rx.recv_timeout(std::time::Duration::from_secs(60))
        .expect("opening the dataset hung (a hang guard)")
}

#[test]
fn a_fifo_named_like_a_shard_or_a_batch_file_is_an_error_naming_it_not_a_hang() {
    let wds = generated(Format::WebDataset, 16);
    let fifo = wds.path().join("shard-999999.tar");
    assert!(
        std::process::Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .unwrap()
            .success()
    );
    // A class-name file that never ends is not a file either: left unread.
    let classes = wds.path().join("classes.txt");
    let _ = std::fs::remove_file(&classes);
    std::os::unix::fs::symlink("/dev/zero", &classes).unwrap();
    // Shards are the regular files named *.tar: the FIFO is not one, and is never opened.
    let ds = open_or_hang(wds.path()).unwrap();
    assert_eq!(ds.len(), 16);
    let cifar = generated(Format::Cifar10, 10);
    let fifo = cifar.path().join("data_batch_2.bin");
    assert!(
        std::process::Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .unwrap()
            .success()
    );
    let err = open_or_hang(cifar.path()).unwrap_err();
    assert!(
        err.to_string().contains("data_batch_2.bin is a FIFO"),
        "{err}"
    );
}

#[test]
fn a_truncated_shard_loses_only_the_cut_member() {
    let dir = generated(Format::WebDataset, 16);
    let path = dir.path().join("shard-000000.tar");
    let bytes = std::fs::read(&path).unwrap();
    // Cut inside the last image's data, before its .cls member.
    let cut = bytes.len() - 1024 * 3;
    std::fs::write(&path, &bytes[..cut]).unwrap();
    match ladle_datasets::open(dir.path()) {
        Ok(ds) => {
            assert!(ds.len() < 16);
            let report = inspect(ds.as_ref(), 1, Default::default(), &|_| {}).unwrap();
            assert_eq!(report.decoded, ds.len(), "{:?}", report.errors);
        }
        Err(e) => assert!(e.to_string().contains("shard-000000.tar"), "{e}"),
    }
}

#[test]
fn missing_paths_unknown_layouts_and_unreadable_directories_are_typed_errors() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("nope");
    assert!(
        matches!(ladle_datasets::open(&missing), Err(OpenError::Io { path, .. }) if path == missing)
    );
    std::fs::write(dir.path().join("readme.txt"), "hi").unwrap();
    assert!(matches!(
        ladle_datasets::open(dir.path()),
        Err(OpenError::UnknownFormat { .. })
    ));
    let file = dir.path().join("readme.txt");
    assert!(
        matches!(ImageFolder::open(&file), Err(OpenError::UnreadableDir { path, .. }) if path == file)
    );
    let empty_class = dir.path().join("root");
    std::fs::create_dir_all(empty_class.join("only_class")).unwrap();
    assert!(matches!(
        ladle_datasets::open(&empty_class),
        Err(OpenError::Empty { .. })
    ));
}

#[test]
fn a_symbolic_link_loop_in_an_image_folder_is_an_error_not_a_crash() {
    let dir = generated(Format::ImageFolder, 10);
    let class = dir.path().join("amber");
    std::os::unix::fs::symlink(&class, class.join("loop")).unwrap();
    let err = ladle_datasets::open(dir.path()).unwrap_err();
    assert!(matches!(err, OpenError::UnreadableDir { .. }), "{err:?}");
    assert!(err.to_string().contains("amber/loop"), "{err}");
}
