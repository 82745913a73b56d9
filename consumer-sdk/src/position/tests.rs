use proptest::prelude::*;

use super::*;

const IMAGENET: u64 = 1_281_167;

fn identity(len: u64) -> FeedIdentity {
    FeedIdentity {
        source: "/data/imagenet/train".into(),
        len,
        classes: "0123456789abcdef".into(),
        seed: 0,
        transform: "rrc224,flip".into(),
        schema: "image".into(),
        files: "0011223344556677".into(),
        sizes: "8877665544332211".into(),
    }
}

fn position(delivered: Bitmap, group: Option<GroupSpec>) -> SavedPosition {
    SavedPosition {
        identity: identity(delivered.len()),
        epoch: 3,
        delivered,
        wanted: None,
        group,
        batch_size: 256,
        drop_last: true,
    }
}

fn group() -> GroupSpec {
    GroupSpec {
        name: "resnet-ddp".into(),
        rank: 1,
        world_size: 4,
        even: Even::Drop,
    }
}

/// A set of `n` with each index in with probability `p`, from `seed` (splitmix64).
fn random_set(n: u64, p: f64, seed: u64) -> Bitmap {
    let mut set = Bitmap::new(n);
    let mut state = seed;
    for i in 0..n {
        state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^= z >> 31;
        if ((z >> 11) as f64 / (1u64 << 53) as f64) < p {
            set.set(i);
        }
    }
    set
}

/// The delivered encoding's tag of a position with no wanted set (format 3: its flag byte
/// follows the payload).
fn tag_of(bytes: &[u8], payload: u64) -> u8 {
    assert_eq!(bytes[bytes.len() - 9], 0, "a wanted set");
    bytes[bytes.len() - 8 - 1 - payload as usize - 1]
}

/// A format 3 position with no wanted set, rewritten in format 2 (no flag byte).
fn as_version_2(v3: &[u8]) -> Vec<u8> {
    assert_eq!(v3[v3.len() - 9], 0, "a wanted set");
    let mut body = v3[..v3.len() - 9].to_vec();
    body[MAGIC.len()..MAGIC.len() + 4].copy_from_slice(&2u32.to_le_bytes());
    sealed(body)
}

#[test]
fn imagenet_positions_are_small() {
    let empty = position(Bitmap::new(IMAGENET), None).encode();
    let full = position(
        Bitmap::from_words(IMAGENET, {
            let mut w = vec![u64::MAX; IMAGENET.div_ceil(64) as usize];
            *w.last_mut().unwrap() = (1 << (IMAGENET % 64)) - 1;
            w
        })
        .unwrap(),
        None,
    )
    .encode();
    let forty = position(random_set(IMAGENET, 0.4, 7), None).encode();
    let forty_group = position(random_set(IMAGENET, 0.4, 7), Some(group())).encode();
    println!(
        "ImageNet (N = {IMAGENET}) position sizes: 0% {} bytes, 40% random {} bytes \
             ({} with a group), 100% {} bytes",
        empty.len(),
        forty.len(),
        forty_group.len(),
        full.len()
    );
    // The fixed fields take 84 bytes (83 and format 3's wanted flag), the identity's strings
    // theirs, an empty list's count 1.
    let id = identity(IMAGENET);
    let strings = [
        id.source,
        id.classes,
        id.transform,
        id.schema,
        id.files,
        id.sizes,
    ]
    .concat()
    .len();
    assert_eq!(empty.len(), 84 + strings + 1, "{}", empty.len());
    assert_eq!(full.len(), 84 + strings + 1, "{}", full.len());
    assert!(empty.len() - strings < 100);
    let bitmap = IMAGENET.div_ceil(8) as usize;
    // The bitmap, and the same fixed fields and strings.
    assert_eq!(forty.len(), bitmap + 84 + strings);
    assert_eq!(tag_of(&forty, IMAGENET.div_ceil(8)), BITMAP);
    for bytes in [empty, full, forty] {
        let back = SavedPosition::decode(&bytes).unwrap();
        assert_eq!(back.encode(), bytes);
    }
}

#[test]
fn sparse_and_dense_sets_take_their_lists() {
    let mut sparse = Bitmap::new(10_000);
    for i in [5, 700, 9_999] {
        sparse.set(i);
    }
    let bytes = position(sparse.clone(), None).encode();
    // count 3, deltas 5, 695, 9299: 1 + 1 + 2 + 2 bytes.
    assert_eq!(tag_of(&bytes, 6), DELIVERED_LIST);
    assert_eq!(SavedPosition::decode(&bytes).unwrap().delivered, sparse);

    let mut dense = sparse.clone();
    dense.complement();
    let bytes = position(dense.clone(), None).encode();
    assert_eq!(tag_of(&bytes, 6), MISSING_LIST);
    assert_eq!(SavedPosition::decode(&bytes).unwrap().delivered, dense);
    dense.clear_all();
    assert_eq!(dense.count(), 0);
}

/// A small position of each encoding.
fn small_positions() -> Vec<Vec<u8>> {
    let mut sparse = Bitmap::new(300);
    sparse.set(0);
    sparse.set(299);
    let mut dense = sparse.clone();
    dense.complement();
    vec![
        position(random_set(100, 0.5, 1), Some(group())).encode(),
        position(sparse, None).encode(),
        position(dense, Some(group())).encode(),
        position(Bitmap::new(0), None).encode(),
    ]
}

#[test]
fn every_truncation_is_an_error() {
    for bytes in small_positions() {
        SavedPosition::decode(&bytes).unwrap();
        for cut in 0..bytes.len() {
            assert!(
                SavedPosition::decode(&bytes[..cut]).is_err(),
                "cut at {cut} of {}",
                bytes.len()
            );
        }
    }
}

#[test]
fn every_changed_byte_is_an_error() {
    for bytes in small_positions() {
        for at in 0..bytes.len() {
            for flip in [0x01, 0x80, 0xff] {
                let mut bad = bytes.clone();
                bad[at] ^= flip;
                assert!(
                    SavedPosition::decode(&bad).is_err(),
                    "byte {at} ^ {flip:#x} of {}",
                    bytes.len()
                );
            }
        }
    }
}

#[test]
fn a_trailing_byte_is_an_error() {
    let mut bytes = small_positions().remove(0);
    bytes.push(0);
    assert_eq!(
        SavedPosition::decode(&bytes),
        Err(PositionError::TrailingBytes { extra: 1 })
    );
}

#[test]
fn other_files_and_versions_are_named() {
    let err = SavedPosition::decode(b"{\"epoch\": 3}").unwrap_err();
    assert_eq!(err, PositionError::NotAPosition);
    assert!(err.to_string().contains("not a ladle consumer position"));
    assert_eq!(SavedPosition::decode(b""), Err(PositionError::NotAPosition));

    let mut bytes = small_positions().remove(1);
    bytes[8..12].copy_from_slice(&7u32.to_le_bytes());
    let err = SavedPosition::decode(&bytes).unwrap_err();
    assert!(matches!(
        err,
        PositionError::UnknownVersion { version: 7, .. }
    ));
    assert!(err.to_string().contains("version 7"), "{err}");
    assert!(err.to_string().contains("reads 1"), "{err}");
}

/// A header up to the delivered set's length, for crafted inputs (format 2: nothing follows
/// the delivered set).
fn header(n: u64) -> Vec<u8> {
    let mut out = position(Bitmap::new(0), None).encode();
    // Cut the empty set's length, tag, the wanted flag and the checksum (no payload: a bitmap
    // of 0 bytes), and set the identity's length.
    out.truncate(out.len() - 8 - 1 - 1 - 8);
    out[MAGIC.len()..MAGIC.len() + 4].copy_from_slice(&2u32.to_le_bytes());
    let id = identity(0);
    let len_at = 8 + 4 + 4 + id.source.len();
    out[len_at..len_at + 8].copy_from_slice(&n.to_le_bytes());
    out.extend_from_slice(&n.to_le_bytes());
    out
}

#[test]
fn a_huge_length_without_its_payload_is_refused_before_allocating() {
    // Were any of these to allocate the 2^40 bits (128 GiB) first, the test would abort
    // or crawl; each is refused by reading the header only.
    let n = MAX_DATASET_LEN;
    let mut bitmap = header(n);
    bitmap.push(BITMAP);
    bitmap.extend_from_slice(&[0; 10]);
    assert!(matches!(
        SavedPosition::decode(&bitmap),
        Err(PositionError::Truncated {
            field: "delivered bitmap",
            ..
        })
    ));

    let mut list = header(n);
    list.push(MISSING_LIST);
    put_varint(&mut list, n);
    list.extend_from_slice(&[1; 10]);
    assert!(matches!(
        SavedPosition::decode(&list),
        Err(PositionError::Truncated {
            field: "index list",
            ..
        })
    ));

    let mut empty = header(n);
    empty.push(DELIVERED_LIST);
    put_varint(&mut empty, 0);
    empty.extend_from_slice(&[0; 8]);
    assert!(matches!(
        SavedPosition::decode(&empty),
        Err(PositionError::BadChecksum { .. })
    ));

    let mut over = header(n + 1);
    over.push(BITMAP);
    assert!(matches!(
        SavedPosition::decode(&over),
        Err(PositionError::TooLong { .. })
    ));

    let mut string = b"LADLEPOS".to_vec();
    string.extend_from_slice(&1u32.to_le_bytes());
    string.extend_from_slice(&u32::MAX.to_le_bytes());
    assert!(matches!(
        SavedPosition::decode(&string),
        Err(PositionError::Truncated {
            field: "feed source",
            ..
        })
    ));
}

/// Re-checksums a crafted body.
fn sealed(mut body: Vec<u8>) -> Vec<u8> {
    let sum = fnv1a64(&body);
    body.extend_from_slice(&sum.to_le_bytes());
    body
}

#[test]
fn bad_lists_and_bits_are_named_even_with_a_good_checksum() {
    let list = |tag: u8, entries: &[u64]| {
        let mut b = header(100);
        b.push(tag);
        put_varint(&mut b, entries.len() as u64);
        for &e in entries {
            put_varint(&mut b, e);
        }
        sealed(b)
    };
    assert_eq!(
        SavedPosition::decode(&list(DELIVERED_LIST, &[3, 0])),
        Err(PositionError::NotAscending { index: 3 })
    );
    assert_eq!(
        SavedPosition::decode(&list(MISSING_LIST, &[60, 40])),
        Err(PositionError::IndexOutOfRange {
            index: 100,
            len: 100
        })
    );
    assert!(matches!(
        SavedPosition::decode(&list(DELIVERED_LIST, &[1, u64::MAX])),
        Err(PositionError::IndexOutOfRange { .. })
    ));
    let mut varint = header(100);
    varint.push(DELIVERED_LIST);
    varint.push(1);
    varint.extend_from_slice(&[0xff; 10]);
    varint.push(0);
    assert!(matches!(
        SavedPosition::decode(&sealed(varint)),
        Err(PositionError::BadVarint { .. })
    ));
    let mut bits = header(100);
    bits.push(BITMAP);
    bits.extend_from_slice(&[0; 12]);
    bits.push(0x10); // bit 100
    assert_eq!(
        SavedPosition::decode(&sealed(bits)),
        Err(PositionError::BitPastEnd {
            len: 100,
            index: 100
        })
    );
    let mut tag = header(100);
    tag.push(9);
    assert!(matches!(
        SavedPosition::decode(&sealed(tag)),
        Err(PositionError::BadTag {
            field: "delivered encoding",
            value: 9
        })
    ));
}

#[test]
fn a_group_that_cannot_split_the_dataset_is_refused() {
    let mut bad = group();
    bad.rank = 4;
    let bytes = position(Bitmap::new(10), Some(bad)).encode();
    assert!(matches!(
        SavedPosition::decode(&bytes),
        Err(PositionError::BadGroup(PlanError::RankOutOfRange {
            rank: 4,
            ..
        }))
    ));
}

#[test]
fn bad_utf8_is_named() {
    let mut bytes = position(Bitmap::new(10), None).encode();
    bytes[8 + 4 + 4] = 0xff; // the source's first byte
    let body = bytes.len() - 8;
    bytes.truncate(body);
    assert_eq!(
        SavedPosition::decode(&sealed(bytes)),
        Err(PositionError::BadUtf8 {
            field: "feed source"
        })
    );
}

#[test]
fn check_feed_names_the_field_that_differs() {
    let saved = position(Bitmap::new(10), None);
    assert_eq!(saved.check_feed(&identity(10)), Ok(()));
    let mut served = identity(10);
    served.seed = 1;
    let err = saved.check_feed(&served).unwrap_err();
    assert_eq!(
        err,
        PositionError::OtherFeed {
            field: "seed",
            saved: "0".into(),
            served: "1".into()
        }
    );
    assert!(err.to_string().contains("seed"), "{err}");
    let err = saved.check_feed(&identity(11)).unwrap_err();
    assert!(matches!(
        err,
        PositionError::OtherFeed {
            field: "length",
            ..
        }
    ));
}

fn naive_list_size(indices: &[u64]) -> u64 {
    let mut size = varint_len(indices.len() as u64);
    for (k, &i) in indices.iter().enumerate() {
        size += varint_len(if k == 0 { i } else { i - indices[k - 1] });
    }
    size
}

#[test]
fn varints_take_the_bytes_they_say() {
    for v in [0, 1, 127, 128, 16_383, 16_384, u64::MAX >> 1, u64::MAX] {
        let mut out = Vec::new();
        put_varint(&mut out, v);
        assert_eq!(out.len() as u64, varint_len(v), "{v}");
        let mut r = Reader { bytes: &out, at: 0 };
        assert_eq!(r.varint("v").unwrap(), v);
        assert_eq!(r.left(), 0);
    }
}

proptest! {
    #[test]
    fn positions_round_trip_in_their_smallest_encoding(
        n in 0u64..5000,
        density in prop_oneof![Just(0.0), Just(0.001), Just(0.05), 0.0..1.0, Just(0.999), Just(1.0)],
        seed: u64,
        epoch: u64,
        grouped: bool,
    ) {
        let set = random_set(n, density, seed);
        let group = (grouped && n >= 4).then(group);
        let mut pos = position(set.clone(), group);
        pos.epoch = epoch;
        let bytes = pos.encode();
        prop_assert_eq!(&SavedPosition::decode(&bytes).unwrap(), &pos);

        let ones: Vec<u64> = set.iter_ones().collect();
        let zeros: Vec<u64> = set.iter_zeros().collect();
        let smallest = n
            .div_ceil(8)
            .min(naive_list_size(&ones))
            .min(naive_list_size(&zeros));
        let mut header = pos.clone();
        header.delivered = Bitmap::new(0);
        header.identity.len = 0;
        header.group = None;
        let fixed = header.encode().len() as u64; // an empty bitmap: no payload
        let group_bytes = pos.group.as_ref().map_or(0, |g| 4 + g.name.len() as u64 + 9);
        prop_assert_eq!(bytes.len() as u64, fixed + group_bytes + smallest);
    }

    #[test]
    fn garbage_is_an_error_not_a_panic(bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
        let _ = SavedPosition::decode(&bytes);
        let mut prefixed = MAGIC.to_vec();
        prefixed.extend_from_slice(&1u32.to_le_bytes());
        prefixed.extend_from_slice(&bytes);
        prop_assert!(SavedPosition::decode(&prefixed).is_err());
    }

    #[test]
    fn garbage_after_a_valid_header_is_an_error_not_a_panic(
        tail in proptest::collection::vec(any::<u8>(), 0..200),
        n in 0u64..2000,
    ) {
        let mut bytes = header(n);
        bytes.extend_from_slice(&tail);
        prop_assert!(SavedPosition::decode(&bytes).is_err());
        // Even re-checksummed, it is refused or read back into a set of `n`.
        if let Ok(pos) = SavedPosition::decode(&sealed(bytes)) {
            prop_assert_eq!(pos.delivered.len(), n);
        }
    }
}

/// A well-formed position (valid checksum, empty delivered list) claiming `len` samples,
/// as an attacker would write one: its header costs nothing to make whatever `len` says.
fn crafted(len: u64) -> Vec<u8> {
    let mut out = Vec::new();
    out.extend_from_slice(&MAGIC);
    out.extend_from_slice(&2u32.to_le_bytes());
    put_str(&mut out, "data");
    out.extend_from_slice(&len.to_le_bytes());
    put_str(&mut out, "classes");
    out.extend_from_slice(&7u64.to_le_bytes());
    put_str(&mut out, "transform");
    put_str(&mut out, "schema");
    put_str(&mut out, "files");
    put_str(&mut out, "sizes");
    out.extend_from_slice(&0u64.to_le_bytes()); // epoch
    out.extend_from_slice(&32u32.to_le_bytes()); // batch size
    out.push(0); // drop_last
    out.push(0); // no group
    out.extend_from_slice(&len.to_le_bytes());
    out.push(DELIVERED_LIST);
    put_varint(&mut out, 0);
    let sum = fnv1a64(&out);
    out.extend_from_slice(&sum.to_le_bytes());
    out
}

#[test]
fn a_position_claiming_another_length_is_refused_before_anything_is_allocated_for_it() {
    // The same bytes with the feed's length decode (the crafted position is well-formed).
    let fits = SavedPosition::decode_for(&crafted(100), 100).unwrap();
    assert_eq!(fits.delivered.len(), 100);
    for claimed in [1u64 << 33, 1 << 36, 1 << 40] {
        let bytes = crafted(claimed);
        assert!(bytes.len() < 300, "{} bytes", bytes.len());
        assert_eq!(SavedPosition::identity_of(&bytes).unwrap().len, claimed);
        // Refused by length, not by memory: nothing of 2^33 bits (1 GiB) or more was tried.
        match SavedPosition::decode_for(&bytes, 100) {
            Err(PositionError::OtherFeed {
                field: "length",
                saved,
                served,
            }) => assert_eq!((saved, served), (claimed.to_string(), "100".to_owned())),
            other => panic!("{claimed}: {other:?}"),
        }
    }
    assert_eq!(
        SavedPosition::identity_of(b"not a position"),
        Err(PositionError::NotAPosition)
    );
}

#[test]
fn a_version_1_position_still_reads_with_no_data_digests_and_is_checked_by_its_path() {
    let mut saved = position(random_set(1000, 0.3, 5), Some(group()));
    saved.identity.files.clear();
    saved.identity.sizes.clear();
    // Version 1 is version 2 without the two (here empty) strings after the schema.
    let v2 = as_version_2(&saved.encode());
    let id = &saved.identity;
    let after_schema = MAGIC.len()
        + 4
        + [&id.source, &id.classes, &id.transform, &id.schema]
            .iter()
            .map(|s| 4 + s.len())
            .sum::<usize>()
        + 16;
    let mut v1 = v2[..v2.len() - 8].to_vec();
    assert_eq!(&v1[after_schema..after_schema + 8], &[0; 8]);
    v1.drain(after_schema..after_schema + 8);
    v1[MAGIC.len()..MAGIC.len() + 4].copy_from_slice(&1u32.to_le_bytes());
    let checksum = fnv1a64(&v1);
    v1.extend_from_slice(&checksum.to_le_bytes());
    let read = SavedPosition::decode(&v1).unwrap();
    assert_eq!(read, saved);
    // Against a feed with digests: its path decides, as when it was saved.
    let served = identity(1000);
    assert!(read.check_feed(&served).is_ok());
    let moved = FeedIdentity {
        source: "/elsewhere".into(),
        ..served
    };
    let err = read.check_feed(&moved).unwrap_err();
    assert!(
        matches!(
            err,
            PositionError::OtherFeed {
                field: "source",
                ..
            }
        ),
        "{err}"
    );
}

#[test]
fn a_version_2_position_still_reads_as_one_without_a_wanted_set() {
    for bytes in small_positions() {
        let v2 = as_version_2(&bytes);
        let read = SavedPosition::decode(&v2).unwrap();
        assert_eq!(read, SavedPosition::decode(&bytes).unwrap());
        assert_eq!(read.wanted, None);
    }
}

#[test]
fn a_wanted_set_travels_in_format_3_and_one_delivered_outside_it_is_refused() {
    let n = 1000;
    let wanted = random_set(n, 0.3, 11);
    let mut delivered = Bitmap::new(n);
    for i in wanted.iter_ones().take(40) {
        delivered.set(i);
    }
    let mut saved = position(delivered, Some(group()));
    saved.wanted = Some(wanted.clone());
    let bytes = saved.encode();
    assert_eq!(SavedPosition::decode(&bytes).unwrap(), saved);
    // Every truncation and changed byte is still caught with the second set.
    for cut in 0..bytes.len() {
        assert!(
            SavedPosition::decode(&bytes[..cut]).is_err(),
            "cut at {cut}"
        );
    }
    // A delivered index the wanted set lacks is a corrupt position, even re-checksummed.
    let stray = (0..n).find(|&i| !wanted.get(i)).unwrap();
    saved.delivered.set(stray);
    assert!(matches!(
        SavedPosition::decode(&saved.encode()),
        Err(PositionError::BadGroup(PlanError::NotWanted { index })) if index == stray
    ));
    // A bad flag is named.
    let mut body = position(Bitmap::new(10), None).encode();
    body.truncate(body.len() - 8);
    *body.last_mut().unwrap() = 7;
    assert!(matches!(
        SavedPosition::decode(&sealed(body)),
        Err(PositionError::BadTag {
            field: "wanted flag",
            value: 7
        })
    ));
}

fn rank_position(rank: u32, world_size: u32, delivered: Bitmap) -> SavedPosition {
    let mut p = position(
        delivered,
        Some(GroupSpec {
            rank,
            world_size,
            ..group()
        }),
    );
    p.epoch = 5;
    p
}

#[test]
fn a_groups_state_needs_every_rank_once_of_one_epoch_and_group() {
    let n = 100;
    let ranks: Vec<SavedPosition> = (0..3)
        .map(|r| rank_position(r, 3, Bitmap::new(n)))
        .collect();
    let (epoch, spec) = group_state(&ranks).unwrap();
    assert_eq!((epoch, spec.world_size), (5, 3));
    assert!(
        group_state(&ranks[..2])
            .unwrap_err()
            .contains("lacks rank 2 of 3")
    );
    let twice = [ranks[0].clone(), ranks[0].clone(), ranks[1].clone()];
    let e = group_state(&twice).unwrap_err();
    assert!(e.contains("lacks rank 2") || e.contains("twice"), "{e}");
    let mut later = ranks.clone();
    later[1].epoch = 6;
    assert!(
        group_state(&later)
            .unwrap_err()
            .contains("mixes epochs 5 and 6")
    );
    let mut other = ranks.clone();
    other[2].group.as_mut().unwrap().name = "other".into();
    assert!(group_state(&other).unwrap_err().contains("mixes groups"));
    assert!(group_state(&[]).unwrap_err().contains("empty"));
}

#[test]
fn a_groups_remainder_is_what_its_ranks_wanted_and_none_delivered() {
    let n = 103;
    let spec = |rank| GroupSpec {
        rank,
        world_size: 3,
        ..group()
    };
    // Each rank delivered the first half of its share.
    let ranks: Vec<SavedPosition> = (0..3)
        .map(|r| {
            let share = crate::plan::deal(n, &spec(r), 5).unwrap();
            let mut delivered = Bitmap::new(n);
            for &i in &share[..share.len() / 2] {
                delivered.set(i);
            }
            rank_position(r, 3, delivered)
        })
        .collect();
    let left = remainder(n, &ranks, 5).unwrap();
    let mut expected = Bitmap::new(n);
    for r in 0..3 {
        let share = crate::plan::deal(n, &spec(r), 5).unwrap();
        for &i in &share[share.len() / 2..] {
            expected.set(i);
        }
    }
    for p in &ranks {
        for i in p.delivered.iter_ones() {
            expected.clear(i);
        }
    }
    assert_eq!(left, expected);
    assert!(left.count() > 0 && left.count() < n);
}
