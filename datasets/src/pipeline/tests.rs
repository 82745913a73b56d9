use super::*;

/// A source shaped like the producer's: it lends 3 items, then can lend no more until the
/// workers have finished those 3 (a consumer waits for them before it releases room).
struct Gated<'a> {
    lent: u64,
    finished: &'a AtomicU64,
    deadline: Instant,
}

impl WorkSource for Gated<'_> {
    type Item = u64;

    fn next(&mut self, wait: bool) -> Poll<Option<u64>> {
        if self.lent == 3 {
            if !wait {
                return Poll::Pending;
            }
            while self.finished.load(Ordering::SeqCst) < 3 {
                if Instant::now() > self.deadline {
                    return Poll::Ready(None); // hung: the test fails below
                }
                std::thread::sleep(Duration::from_millis(1));
            }
        }
        if self.lent == 6 {
            return Poll::Ready(None);
        }
        self.lent += 1;
        Poll::Ready(Some(self.lent))
    }
}

#[test]
fn items_gathered_before_the_source_blocks_reach_the_workers() {
    let finished = AtomicU64::new(0);
    let source = Gated {
        lent: 0,
        finished: &finished,
        deadline: Instant::now() + Duration::from_secs(10),
    };
    for_each_parallel(
        source,
        2,
        || (),
        |(), _| {
            finished.fetch_add(1, Ordering::SeqCst);
            ControlFlow::Continue(())
        },
    )
    .unwrap();
    assert_eq!(
        finished.load(Ordering::SeqCst),
        6,
        "the first 3 items sat in a half-filled chunk while the source waited for them"
    );
}

#[test]
fn crop_aware_decoding_gives_the_same_samples_as_decoding_whole_images() {
    let dir = tempfile::tempdir().unwrap();
    let config = crate::synth::SynthConfig {
        count: 40,
        width: 200,
        height: 150,
        ..Default::default()
    };
    crate::synth::generate(&config, dir.path(), &|_| {}).unwrap();
    let dataset = crate::open(dir.path()).unwrap();
    for spec in [
        "RandomResizedCrop(64), RandomHorizontalFlip()",
        "RandomResizedCrop(48, scale=(0.01, 0.1))",
        "Resize(80), CenterCrop(64)",
    ] {
        let transforms = Transforms::parse(spec).unwrap();
        let mut whole = SampleProcessor::new(transforms.clone(), 3);
        whole.set_crop_aware_decode(false);
        let mut cut = SampleProcessor::new(transforms.clone(), 3);
        let (mut a, mut b) = (
            vec![0; transforms.output_len()],
            vec![0; transforms.output_len()],
        );
        for epoch in 0..3 {
            for index in 0..dataset.len() {
                let la = whole.process(dataset.as_ref(), index, epoch, &mut a);
                let lb = cut.process(dataset.as_ref(), index, epoch, &mut b);
                assert_eq!(la.unwrap(), lb.unwrap());
                assert!(a == b, "{spec}: sample {index} of epoch {epoch} differs");
            }
        }
    }
}

#[test]
fn a_transient_read_error_is_retried_and_a_lasting_one_is_not() {
    let item = WorkItem {
        seq: 0,
        index: 7,
        epoch: 0,
    };
    let io = |source| SampleError::Io {
        location: "x.jpg".into(),
        source,
    };
    let mut tries = 0;
    let outcome = with_retries(&item, || {
        tries += 1;
        if tries < 3 {
            Err(io(ladle_os::fs::too_many_open_files()))
        } else {
            Ok(tries)
        }
    });
    assert_eq!(
        outcome.unwrap(),
        3,
        "too many open files must not make a bad sample"
    );
    let mut tries = 0;
    let outcome: Result<(), _> = with_retries(&item, || {
        tries += 1;
        Err(io(std::io::ErrorKind::NotFound.into()))
    });
    assert!(outcome.is_err());
    assert_eq!(tries, 1, "a missing file is not transient");
}

#[test]
fn buffers_grown_for_one_huge_image_are_given_back_at_the_next_ordinary_one() {
    let dir = tempfile::tempdir().unwrap();
    let config = crate::synth::SynthConfig {
        count: 4,
        classes: 1,
        width: 200,
        height: 150,
        ..Default::default()
    };
    crate::synth::generate(&config, dir.path(), &|_| {}).unwrap();
    let class = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.is_dir())
        .unwrap();
    // 25 megapixels in a few KB: 75 MB of RGB, under the pixel budget.
    std::fs::write(class.join("zz.png"), crate::decode::bombs::png(5000, 5000)).unwrap();
    let dataset = crate::open(dir.path()).unwrap();
    let huge = (0..dataset.len())
        .find(|&i| dataset.location(i).ends_with("zz.png"))
        .unwrap();
    let transforms = Transforms::parse("RandomResizedCrop(64)").unwrap();
    let mut out = vec![0; transforms.output_len()];
    let mut processor = SampleProcessor::new(transforms, 1);
    processor.process(dataset.as_ref(), 0, 0, &mut out).unwrap();
    let ordinary = processor.buffer_bytes();
    processor
        .process(dataset.as_ref(), huge, 0, &mut out)
        .unwrap();
    let grown = processor.buffer_bytes();
    assert!(grown >= 5000 * 5000 * 3, "{grown}");
    processor.process(dataset.as_ref(), 1, 0, &mut out).unwrap();
    let after = processor.buffer_bytes();
    assert!(
        after < crate::limits::KEEP_BYTES,
        "{after} bytes kept after a {ordinary}-byte sample, {grown} for the huge one"
    );
}
