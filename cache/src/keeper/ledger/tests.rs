use super::*;

const MIB: u64 = 1 << 20;

/// A grant of exactly `bytes`: the arena's id.
fn grant(ledger: &mut Ledger, lane: Lane, bytes: u64) -> Option<u32> {
    let granted = ledger.grant("a", lane, (bytes, bytes)).unwrap();
    granted.map(|(id, got)| {
        assert_eq!(got, bytes);
        id
    })
}

fn data(key: &str, len: u64) -> DatasetKey {
    DatasetKey {
        key: key.into(),
        root: format!("/data/{key}"),
        len,
    }
}

#[test]
fn grants_stop_at_the_budget_and_nothing_is_evicted_to_admit() {
    let mut ledger = Ledger::new(10 * MIB);
    assert!(ledger.attach(&data("a", 100), 1).unwrap());
    let index = index_file_len(100);
    assert_eq!(ledger.used(), index);
    let first = grant(&mut ledger, 1, 4 * MIB).unwrap();
    let second = grant(&mut ledger, 1, 4 * MIB).unwrap();
    assert_eq!((first, second), (0, 1));
    // 8 MiB and the index are in; another 4 MiB does not fit: refused, nothing out. Not
    // full while the arenas granted have room for such a record; full once they are filled.
    assert_eq!(grant(&mut ledger, 1, 4 * MIB), None);
    assert!(!ledger.full());
    for id in [first, second] {
        ledger.adopt("a", 1, id).unwrap();
        ledger
            .publish("a", 1, u64::from(id), (id, 0, 4 * MIB), false)
            .unwrap();
    }
    assert_eq!(grant(&mut ledger, 1, 4 * MIB), None);
    assert!(ledger.full());
    assert_eq!(ledger.used(), index + 8 * MIB);
    assert_eq!(ledger.claim("a", 5, 1).unwrap(), Claim::Skip);
    // A smaller grant that fits is still given (and full stays until room returns).
    assert!(grant(&mut ledger, 1, MIB).is_some());
}

#[test]
fn a_gone_lanes_untouched_arena_tail_returns_to_the_budget_and_clears_full() {
    let mut ledger = Ledger::new(10 * MIB);
    ledger.attach(&data("a", 100), 1).unwrap();
    ledger.attach(&data("a", 100), 2).unwrap();
    let id = grant(&mut ledger, 1, 8 * MIB).unwrap();
    assert_eq!(ledger.adopt("a", 1, id).unwrap(), 8 * MIB);
    ledger.publish("a", 1, 7, (id, 0, 1000), false).unwrap();
    // A record larger than any room left, in the budget or in lane 1's arena: full.
    assert_eq!(ledger.grant("a", 2, (9 * MIB, 9 * MIB)).unwrap(), None);
    assert!(ledger.full());
    let now = Instant::now();
    ledger.lane_gone(1, now);
    assert!(!ledger.full());
    assert_eq!(ledger.used(), index_file_len(100) + page_up(1000));
    ledger.lane_gone(2, now);
    // The dataset is idle from then; another lane finds its entry counted.
    assert_eq!(ledger.expired(now, Duration::ZERO), vec!["a".to_owned()]);
    ledger.attach(&data("a", 100), 3).unwrap();
    assert!(ledger.expired(now, Duration::ZERO).is_empty());
    assert_eq!(ledger.views(now)[0].entries, 1);
}

#[test]
fn a_publish_outside_its_own_arena_is_refused() {
    let mut ledger = Ledger::new(100 * MIB);
    ledger.attach(&data("a", 100), 1).unwrap();
    ledger.attach(&data("a", 100), 2).unwrap();
    let id = grant(&mut ledger, 1, MIB).unwrap();
    // Not adopted yet; then another lane's; then out of bounds or off the alignment.
    assert!(ledger.publish("a", 1, 0, (id, 0, 64), false).is_err());
    ledger.adopt("a", 1, id).unwrap();
    assert!(ledger.adopt("a", 1, id).is_err(), "adopted twice");
    assert!(ledger.adopt("a", 2, id).is_err(), "another lane's");
    assert!(ledger.publish("a", 2, 0, (id, 0, 64), false).is_err());
    assert!(
        ledger
            .publish("a", 1, 0, (id, MIB - 64, 128), false)
            .is_err()
    );
    assert!(ledger.publish("a", 1, 0, (id, 32, 64), false).is_err());
    assert!(
        ledger
            .publish("a", 1, 0, (id, u64::MAX - 63, 128), false)
            .is_err()
    );
    assert!(
        ledger.publish("a", 1, 100, (id, 0, 64), false).is_err(),
        "index past the end"
    );
    assert!(
        ledger.publish("a", 1, 0, (9, 0, 64), false).is_err(),
        "no such arena"
    );
    ledger
        .publish("a", 1, 0, (id, MIB - 64, 64), false)
        .unwrap();
    assert_eq!(ledger.views(Instant::now())[0].fills, 1);
}

#[test]
fn a_claim_is_one_lanes_until_it_publishes_releases_or_goes() {
    let mut ledger = Ledger::new(100 * MIB);
    ledger.attach(&data("a", 100), 1).unwrap();
    ledger.attach(&data("a", 100), 2).unwrap();
    assert_eq!(ledger.claim("a", 3, 1).unwrap(), Claim::Fill);
    assert_eq!(ledger.claim("a", 3, 2).unwrap(), Claim::Wait);
    assert_eq!(
        ledger.claim("a", 3, 1).unwrap(),
        Claim::Wait,
        "once, even for its lane"
    );
    ledger.release("a", 3, 2).unwrap(); // not 2's: nothing
    assert_eq!(ledger.claim("a", 3, 2).unwrap(), Claim::Wait);
    ledger.release("a", 3, 1).unwrap();
    assert_eq!(ledger.claim("a", 3, 2).unwrap(), Claim::Fill);
    ledger.lane_gone(2, Instant::now());
    assert_eq!(ledger.claim("a", 3, 1).unwrap(), Claim::Fill);
    let id = grant(&mut ledger, 1, MIB).unwrap();
    ledger.adopt("a", 1, id).unwrap();
    ledger.publish("a", 1, 3, (id, 0, 64), false).unwrap();
    ledger.attach(&data("a", 100), 3).unwrap();
    assert_eq!(
        ledger.claim("a", 3, 3).unwrap(),
        Claim::Fill,
        "the claim went with the publish"
    );
    assert!(ledger.claim("a", 100, 3).is_err());
}

#[test]
fn the_first_of_two_publishes_of_one_index_stays_and_the_second_counts_as_a_duplicate() {
    let mut ledger = Ledger::new(100 * MIB);
    ledger.attach(&data("a", 10), 1).unwrap();
    let id = grant(&mut ledger, 1, MIB).unwrap();
    ledger.adopt("a", 1, id).unwrap();
    ledger.publish("a", 1, 4, (id, 0, 64), false).unwrap();
    ledger.publish("a", 1, 4, (id, 64, 64), true).unwrap();
    let view = &ledger.views(Instant::now())[0];
    assert_eq!((view.entries, view.fills, view.duplicates), (1, 1, 1));
    ledger.stale("a").unwrap();
    assert_eq!(ledger.views(Instant::now())[0].entries, 0);
}

#[test]
fn a_dataset_of_another_length_under_a_held_key_is_refused_and_a_dropped_one_is_gone() {
    let mut ledger = Ledger::new(100 * MIB);
    ledger.attach(&data("a", 10), 1).unwrap();
    assert!(ledger.attach(&data("a", 11), 2).is_err());
    assert!(ledger.drop_dataset("a"));
    assert!(ledger.is_empty());
    assert!(ledger.claim("a", 0, 1).is_err());
    // An index over the budget is refused.
    let mut small = Ledger::new(4096);
    assert!(small.attach(&data("b", 1000), 1).is_err());
    assert!(small.is_empty());
}

#[test]
fn a_grant_gets_a_quarter_of_what_the_budget_has_left_and_one_record_at_least() {
    let index = index_file_len(100);
    let mut ledger = Ledger::new(index + 4 * MIB);
    ledger.attach(&data("a", 100), 1).unwrap();
    let granted = |ledger: &mut Ledger, at_least| {
        ledger
            .grant("a", 1, (64 * MIB, at_least))
            .unwrap()
            .map(|(id, bytes)| {
                ledger.adopt("a", 1, id).unwrap();
                ledger.publish("a", 1, 0, (id, 0, bytes), false).unwrap();
                bytes
            })
    };
    assert_eq!(granted(&mut ledger, 4096), Some(MIB));
    assert_eq!(granted(&mut ledger, 4096), Some(768 * 1024));
    // A record larger than the quarter gets its own size.
    assert_eq!(granted(&mut ledger, 2 * MIB), Some(2 * MIB));
    assert!(!ledger.full());
    assert_eq!(ledger.used(), index + 3 * MIB + 768 * 1024);
    // A record larger than what is left, with every arena filled: full.
    assert_eq!(granted(&mut ledger, MIB), None);
    assert!(ledger.full(), "no room anywhere");
    assert!(
        ledger.grant("a", 1, (4096, 8192)).is_err(),
        "at least more than asked"
    );
    assert!(
        ledger.grant("a", 1, (4097, 4096)).is_err(),
        "not whole pages"
    );
}

#[test]
fn a_lane_without_room_does_not_make_the_cache_full_while_another_arena_has_room() {
    let mut ledger = Ledger::new(index_file_len(100) + 4 * MIB);
    ledger.attach(&data("a", 100), 1).unwrap();
    ledger.attach(&data("a", 100), 2).unwrap();
    let (id, _) = ledger.grant("a", 1, (4 * MIB, 4 * MIB)).unwrap().unwrap();
    ledger.adopt("a", 1, id).unwrap();
    assert_eq!(ledger.grant("a", 2, (MIB, MIB)).unwrap(), None);
    assert!(!ledger.full(), "lane 1's arena has room");
    ledger.publish("a", 1, 0, (id, 0, 4 * MIB), false).unwrap();
    assert_eq!(ledger.grant("a", 2, (MIB, MIB)).unwrap(), None);
    assert!(ledger.full());
}
