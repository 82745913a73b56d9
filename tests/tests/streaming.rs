//! Datasets by shard index (`--dataset http://…/index.json`, WebDataset's `wids` index),
//! streamed from a real web server (nginx, its access log counting the GETs): the first
//! batch comes while shards are still arriving, a dataset larger than the shard cache's
//! budget is read in exact epochs without ever holding more than the budget on disk, and an
//! index that promises more than a shard holds gives bad samples naming the shard, not a
//! hang or a short epoch.

#![allow(clippy::unwrap_used)] // tests fail loudly by design

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use ladle_tests::web::{Serving, nginx_with};
use ladle_tests::{Fixture, wait_for_listener, wait_until};

const GUARD: Duration = Duration::from_secs(120);

/// Eight WebDataset shards of 25 samples in `fx`'s `www/d`, and their index `www/d/index.json`
/// written by `ladle dataset index`; returns `www` and the index.
fn indexed_shards(fx: &mut Fixture) -> (PathBuf, serde_json::Value) {
    let www = fx.path().join("www");
    let out = www.join("d");
    let out = out.to_str().unwrap();
    let done = fx.run(
        &[
            "dataset",
            "generate",
            "--format",
            "wds",
            "--count",
            "200",
            "--shard-size",
            "25",
            "--width",
            "48",
            "--height",
            "40",
            "--out",
            out,
        ],
        GUARD,
    );
    assert!(done.status.success(), "{}", done.stderr);
    let index = format!("{out}/index.json");
    let done = fx.run(&["dataset", "index", out, "--out", &index], GUARD);
    assert!(done.status.success(), "{}", done.stderr);
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&index).unwrap()).unwrap();
    assert_eq!(json["shardlist"].as_array().unwrap().len(), 8);
    assert_eq!(json["__kind__"], "wids-shard-index-v1");
    (www, json)
}

/// Starts `ladle serve` of `url` with `extra`; returns its index and socket.
fn serve(fx: &mut Fixture, url: &str, extra: &[&str]) -> (usize, PathBuf) {
    serve_as(fx, "feed", url, extra)
}

/// [`serve`] on `name`.sock.
fn serve_as(fx: &mut Fixture, name: &str, url: &str, extra: &[&str]) -> (usize, PathBuf) {
    let socket = fx.path().join(format!("{name}.sock"));
    let cache = fx.path().join("shards");
    let mut command = std::process::Command::new(ladle_tests::ladle_bin());
    command
        .args([
            "serve",
            "--dataset",
            url,
            "--socket",
            socket.to_str().unwrap(),
        ])
        .args([
            "--shard-cache",
            cache.to_str().unwrap(),
            "--image-size",
            "32",
        ])
        .args(["--ring-mib", "4", "--threads", "2"])
        .args(extra)
        .env("LADLE_REGISTRY_DIR", fx.registry());
    let i = fx.start(&mut command);
    (i, socket)
}

fn consume_args(socket: &Path, epochs: u32) -> Vec<String> {
    [
        "consume",
        "--socket",
        socket.to_str().unwrap(),
        "--batch-size",
        "10",
        "--epochs",
        &epochs.to_string(),
        "--json",
    ]
    .map(str::to_owned)
    .to_vec()
}

fn shard_gets(gets: &std::collections::BTreeMap<String, usize>) -> usize {
    gets.iter()
        .filter(|(path, _)| path.ends_with(".tar"))
        .map(|(_, n)| n)
        .sum()
}

#[test]
fn the_first_batch_comes_while_shards_are_still_arriving_and_each_shard_is_fetched_once_restarts_included()
 {
    let mut fx = Fixture::new();
    let (www, _) = indexed_shards(&mut fx);
    // Each shard takes about two seconds to send; two at a time, the eight take eight.
    let serving = Serving {
        limit_rate: Some("40k"),
        ..Serving::default()
    };
    let Some(web) = nginx_with(&fx, &www, &serving) else {
        return;
    };
    let url = format!("http://127.0.0.1:{}/d/index.json", web.port);
    let (feed, socket) = serve(
        &mut fx,
        &url,
        &["--fetch-concurrency", "2", "--shuffle-shards", "2"],
    );
    wait_for_listener(&socket, GUARD, "ladle serve of a dataset by shard index");
    let position = fx.path().join("position.json");
    let mut args = consume_args(&socket, 2);
    args.extend(["--save-position".into(), position.to_str().unwrap().into()]);
    let mut command = std::process::Command::new(ladle_tests::ladle_bin());
    command.args(&args);
    let consumer = fx.start(&mut command);
    // The consumer's first batch (it saves its position after each): how many shards had
    // nginx sent by then?
    wait_until("the consumer's first batch", GUARD, || {
        Ok(position.is_file().then_some(()))
    });
    let sent_by_then = shard_gets(&web.gets());
    assert!(
        sent_by_then < 8,
        "all {sent_by_then} shards were sent before the first batch: nothing streamed"
    );
    let done = fx.wait(consumer, GUARD);
    assert!(done.status.success(), "{}", done.stderr);
    done.assert_exact(2, "a consumer of a dataset streamed by shard index");
    // Two epochs, each shard fetched once (the dataset fits the budget), the index once.
    let gets = web.gets();
    assert_eq!(shard_gets(&gets), 8, "{gets:?}");
    assert!(gets.values().all(|&n| n == 1), "{gets:?}");
    fx.signal(feed, 15);
    let done = fx.wait(feed, GUARD);
    assert!(
        done.stderr.contains("200 samples in shards streamed"),
        "{}",
        done.stderr
    );
    // A restarted feed finds the shards on disk: an exact epoch, no shard fetched again.
    let (again, socket) = serve(&mut fx, &url, &[]);
    wait_for_listener(&socket, GUARD, "the restarted feed");
    let args = consume_args(&socket, 1);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let done = fx.run(&args, GUARD);
    assert!(done.status.success(), "{}", done.stderr);
    done.assert_exact(1, "a consumer of the restarted feed");
    assert_eq!(shard_gets(&web.gets()), 8, "{:?}", web.gets());
    fx.signal(again, 15);
    fx.wait(again, GUARD);
}

/// The bytes of shards (whole and `.part`) under `dir`.
fn shard_bytes(dir: &Path) -> u64 {
    let mut total = 0;
    for folder in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        for file in std::fs::read_dir(folder.path())
            .into_iter()
            .flatten()
            .flatten()
        {
            let name = file.file_name().to_string_lossy().into_owned();
            if name.ends_with(".tar") || name.ends_with(".part") {
                total += file.metadata().map_or(0, |m| m.len());
            }
        }
    }
    total
}

#[test]
fn a_dataset_larger_than_the_shard_cache_budget_streams_exact_epochs_never_holding_more_on_disk() {
    let mut fx = Fixture::new();
    let (www, index) = indexed_shards(&mut fx);
    let Some(web) = nginx_with(&fx, &www, &Serving::default()) else {
        return;
    };
    // A budget of four of the largest shards: half the dataset.
    let largest = (index["shardlist"].as_array().unwrap().iter())
        .map(|s| s["filesize"].as_u64().unwrap())
        .max()
        .unwrap();
    let total: u64 = (index["shardlist"].as_array().unwrap().iter())
        .map(|s| s["filesize"].as_u64().unwrap())
        .sum();
    let budget = 4 * largest;
    assert!(budget < total);
    let gib = format!("{:.12}", budget as f64 / f64::from(1u32 << 30));
    let budget = (gib.parse::<f64>().unwrap() * f64::from(1u32 << 30)) as u64;
    let url = format!("http://127.0.0.1:{}/d/index.json", web.port);
    // Watch the shard cache for the whole run.
    let cache = fx.path().join("shards");
    let (stop, most) = (
        Arc::new(AtomicBool::new(false)),
        Arc::new(AtomicU64::new(0)),
    );
    let watcher = {
        let (stop, most, cache) = (stop.clone(), most.clone(), cache.clone());
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                most.fetch_max(shard_bytes(&cache), Ordering::Relaxed);
                std::thread::sleep(Duration::from_millis(2));
            }
        })
    };
    let (feed, socket) = serve(&mut fx, &url, &["--shard-cache-gib", &gib]);
    wait_for_listener(
        &socket,
        GUARD,
        "ladle serve of a dataset larger than its budget",
    );
    let args = consume_args(&socket, 3);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let done = fx.run(&args, GUARD);
    assert!(done.status.success(), "{}", done.stderr);
    done.assert_exact(
        3,
        "a consumer of a dataset larger than the shard cache's budget",
    );
    stop.store(true, Ordering::Relaxed);
    watcher.join().unwrap();
    let most = most.load(Ordering::Relaxed);
    assert!(most > 0, "the watcher never saw a shard");
    assert!(
        most <= budget,
        "{most} bytes of shards on disk at once, over the budget of {budget}"
    );
    // It could not keep them all: shards were fetched again in later epochs.
    let gets = shard_gets(&web.gets());
    assert!(gets > 8, "{gets} shard GETs: the dataset was never evicted");
    fx.signal(feed, 15);
    let done = fx.wait(feed, GUARD);
    assert!(
        done.stderr.contains("shuffling 2 shards at a time"),
        "{}",
        done.stderr
    );
}

#[test]
fn two_feeds_of_a_dataset_over_the_budget_sharing_one_shard_cache_lose_no_sample_to_each_others_evictions()
 {
    let mut fx = Fixture::new();
    let (www, index) = indexed_shards(&mut fx);
    let Some(web) = nginx_with(&fx, &www, &Serving::default()) else {
        return;
    };
    let largest = (index["shardlist"].as_array().unwrap().iter())
        .map(|s| s["filesize"].as_u64().unwrap())
        .max()
        .unwrap();
    let gib = format!("{:.12}", (4 * largest) as f64 / f64::from(1u32 << 30));
    let url = format!("http://127.0.0.1:{}/d/index.json", web.port);
    // Two seeds: two orders over one folder of shards, each feed fetching, adopting and
    // removing shards the other may be about to read.
    let feeds: Vec<(usize, PathBuf)> = ["a", "b"]
        .iter()
        .enumerate()
        .map(|(k, name)| {
            let seed = (k + 1).to_string();
            serve_as(
                &mut fx,
                name,
                &url,
                &["--shard-cache-gib", &gib, "--seed", &seed],
            )
        })
        .collect();
    let mut consumers = Vec::new();
    for (_, socket) in &feeds {
        wait_for_listener(socket, GUARD, "a feed of a dataset over the budget");
        let mut command = std::process::Command::new(ladle_tests::ladle_bin());
        command.args(consume_args(socket, 3));
        consumers.push(fx.start(&mut command));
    }
    for consumer in consumers {
        let done = fx.wait(consumer, GUARD);
        assert!(done.status.success(), "{}", done.stderr);
        for epoch in done.assert_exact(3, "a consumer of one of two feeds over the budget") {
            assert_eq!(epoch["bad_samples"], 0, "{epoch}");
        }
    }
    for (feed, _) in feeds {
        fx.signal(feed, 15);
        fx.wait(feed, GUARD);
    }
}

#[test]
fn an_index_promising_more_than_a_shard_holds_gives_bad_samples_naming_it_and_a_missing_index_is_an_error()
 {
    let mut fx = Fixture::new();
    let (www, mut index) = indexed_shards(&mut fx);
    // Shard 3 holds 25 images; the index says 30.
    index["shardlist"][3]["nsamples"] = 30.into();
    std::fs::write(www.join("d/lying.json"), index.to_string()).unwrap();
    let Some(web) = nginx_with(&fx, &www, &Serving::default()) else {
        return;
    };
    let url = format!("http://127.0.0.1:{}/d/lying.json", web.port);
    let (feed, socket) = serve(&mut fx, &url, &[]);
    wait_for_listener(&socket, GUARD, "ladle serve of a lying index");
    let args = consume_args(&socket, 1);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let done = fx.run(&args, GUARD);
    assert!(done.status.success(), "{}", done.stderr);
    let epochs = done.assert_exact(1, "a consumer of a lying index");
    assert_eq!(epochs[0]["samples"], 205, "{:?}", epochs[0]);
    assert_eq!(epochs[0]["bad_samples"], 5, "{:?}", epochs[0]);
    fx.signal(feed, 15);
    let done = fx.wait(feed, GUARD);
    assert!(
        done.stderr.contains("shard-000003.tar")
            && done
                .stderr
                .contains("the index says the shard holds 30 samples"),
        "{}",
        done.stderr
    );
    // No index there: an error naming its URL, at once.
    let missing = format!("http://127.0.0.1:{}/d/nothing.json", web.port);
    let (feed, _) = serve(&mut fx, &missing, &[]);
    let done = fx.wait(feed, GUARD);
    assert!(!done.status.success());
    assert!(
        done.stderr.contains(&missing) && done.stderr.contains("HTTP 404"),
        "{}",
        done.stderr
    );
}

#[test]
fn consumers_naming_a_dataset_by_url_start_one_feed_on_demand_and_share_it() {
    let mut fx = Fixture::new();
    let (www, _) = indexed_shards(&mut fx);
    let Some(web) = nginx_with(&fx, &www, &Serving::default()) else {
        return;
    };
    // The feeds started on demand keep their shards under $XDG_CACHE_HOME/ladle/shards.
    let cache = fx.path().join("cache");
    for url in [
        format!("http://127.0.0.1:{}/d/index.json", web.port),
        format!(
            "http://127.0.0.1:{}/d/shard-{{000000..000007}}.tar",
            web.port
        ),
    ] {
        // The first starts the feed; the second joins it (the registry's key is the URL as
        // written, and so is the feed's source).
        for _ in 0..2 {
            let mut command = std::process::Command::new(ladle_tests::ladle_bin());
            command
                .args(["consume", "--dataset", &url, "--image-size", "32"])
                .args(["--epochs", "1", "--json"])
                .env("LADLE_REGISTRY_DIR", fx.registry())
                .env("XDG_CACHE_HOME", &cache);
            let i = fx.start(&mut command);
            let done = fx.wait(i, GUARD);
            assert!(done.status.success(), "{url}: {}", done.stderr);
            done.assert_exact(1, "a consumer naming a dataset by URL");
        }
    }
    let listed = fx.run(&["feeds", "ls"], GUARD);
    assert!(listed.status.success(), "{}", listed.stderr);
    let feeds: Vec<&str> = listed
        .stdout
        .lines()
        .filter(|l| l.contains("http://"))
        .collect();
    assert_eq!(feeds.len(), 2, "one feed per URL: {}", listed.stdout);
    // Each shard fetched once for the index's feed and once for the braces' (two shard
    // cache folders: two spellings).
    let gets = web.gets();
    assert!(
        gets.iter()
            .filter(|(p, _)| p.ends_with(".tar"))
            .all(|(_, &n)| n == 2),
        "{gets:?}"
    );
    assert!(cache.join("ladle/shards").is_dir());
    let _ = fx.run(&["feeds", "stop", "--all"], GUARD);
}
