//! Datasets given by URL (`--dataset http://…/shard-{000..003}.tar`) against a real web
//! server (nginx from Debian's packages, started here on a free port; its own access log
//! counts the GETs) and a proxy in front of it that fails on purpose: exact epochs, one
//! fetch per shard per node however many feeds ask, transient failures retried, a missing
//! shard an error naming its URL.

#![allow(clippy::unwrap_used)] // tests fail loudly by design

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use ladle_os::Proc;
use ladle_tests::web::{Serving, free_port, nginx, nginx_with};
use ladle_tests::{Fixture, wait_for_listener, wait_until};

const GUARD: Duration = Duration::from_secs(120);

/// Four WebDataset shards of 25 samples in `fx`'s `www/d`.
fn shards(fx: &mut Fixture) -> PathBuf {
    let www = fx.path().join("www");
    let out = www.join("d");
    let done = fx.run(
        &[
            "dataset",
            "generate",
            "--format",
            "wds",
            "--count",
            "100",
            "--shard-size",
            "25",
            "--width",
            "48",
            "--height",
            "40",
            "--out",
            out.to_str().unwrap(),
        ],
        GUARD,
    );
    assert!(done.status.success(), "{}", done.stderr);
    www
}

/// Starts `ladle serve` of `url` on `name`.sock; returns its index and socket.
fn serve(fx: &mut Fixture, url: &str, name: &str, extra: &[&str]) -> (usize, PathBuf) {
    serve_env(fx, url, name, extra, &[])
}

/// [`serve`] with `env` set for the feed.
fn serve_env(
    fx: &mut Fixture,
    url: &str,
    name: &str,
    extra: &[&str],
    env: &[(&str, &Path)],
) -> (usize, PathBuf) {
    let socket = fx.path().join(format!("{name}.sock"));
    let cache = fx.path().join("shards");
    let args = [
        &[
            "serve",
            "--dataset",
            url,
            "--socket",
            socket.to_str().unwrap(),
        ][..],
        &[
            "--shard-cache",
            cache.to_str().unwrap(),
            "--image-size",
            "32",
        ],
        &["--ring-mib", "4", "--threads", "2"],
        extra,
    ]
    .concat();
    let mut command = std::process::Command::new(ladle_tests::ladle_bin());
    command.args(args).env("LADLE_REGISTRY_DIR", fx.registry());
    for (k, v) in env {
        command.env(k, v);
    }
    let i = fx.start(&mut command);
    (i, socket)
}

fn consume(fx: &mut Fixture, socket: &Path, epochs: u32) {
    let done = fx.run(
        &[
            "consume",
            "--socket",
            socket.to_str().unwrap(),
            "--batch-size",
            "10",
            "--epochs",
            &epochs.to_string(),
            "--json",
        ],
        GUARD,
    );
    assert!(done.status.success(), "{}", done.stderr);
    done.assert_exact(epochs as usize, "a consumer of shards fetched over HTTP");
}

#[test]
fn shards_over_http_serve_exact_epochs_and_each_is_fetched_once_per_node_for_every_feed() {
    let mut fx = Fixture::new();
    let www = shards(&mut fx);
    let Some(web) = nginx(&fx, &www) else { return };
    let url = format!(
        "http://127.0.0.1:{}/d/shard-{{000000..000003}}.tar",
        web.port
    );
    // Two feeds asking at once (one fetches, the other waits for it), a third later.
    let (a, sa) = serve(&mut fx, &url, "a", &["--seed", "1"]);
    let (b, sb) = serve(&mut fx, &url, "b", &["--seed", "2"]);
    for socket in [&sa, &sb] {
        wait_for_listener(socket, GUARD, "ladle serve of shards over HTTP");
        consume(&mut fx, socket, 2);
    }
    let (c, sc) = serve(&mut fx, &url, "c", &["--seed", "3"]);
    wait_for_listener(&sc, GUARD, "a third feed");
    consume(&mut fx, &sc, 1);
    let gets = web.gets();
    assert_eq!(gets.len(), 4, "{gets:?}");
    assert!(
        gets.values().all(|&n| n == 1),
        "a shard fetched twice: {gets:?}"
    );
    for i in [a, b, c] {
        fx.signal(i, 15);
        let done = fx.wait(i, GUARD);
        assert!(done.stderr.contains("shards fetched"), "{}", done.stderr);
    }
}

#[test]
fn a_missing_shard_is_an_error_naming_its_url() {
    let mut fx = Fixture::new();
    let www = shards(&mut fx);
    let Some(web) = nginx(&fx, &www) else { return };
    let url = format!(
        "http://127.0.0.1:{}/d/shard-{{000000..000004}}.tar",
        web.port
    );
    let (i, _) = serve(&mut fx, &url, "a", &[]);
    let done = fx.wait(i, GUARD);
    assert!(!done.status.success());
    let missing = format!("http://127.0.0.1:{}/d/shard-000004.tar", web.port);
    assert!(done.stderr.contains(&missing), "{}", done.stderr);
    assert!(done.stderr.contains("HTTP 404"), "{}", done.stderr);
}

/// A certificate authority of the test's own, and a certificate it signed for 127.0.0.1:
/// (`ca.pem`, `leaf.pem`, `leaf.key`) in `dir`, made with the openssl command.
fn certificates(dir: &Path) -> (PathBuf, PathBuf, PathBuf) {
    std::fs::create_dir_all(dir).unwrap();
    let ext = dir.join("leaf.ext");
    std::fs::write(
        &ext,
        "subjectAltName=IP:127.0.0.1\nbasicConstraints=CA:FALSE\n\
         keyUsage=digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth\n",
    )
    .unwrap();
    let key = [
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:P-256",
        "-nodes",
    ];
    let steps: [Vec<&str>; 3] = [
        [
            &["req", "-x509"][..],
            &key,
            &["-keyout", "ca.key", "-out", "ca.pem"],
        ]
        .concat(),
        [
            &["req"][..],
            &key,
            &["-keyout", "leaf.key", "-out", "leaf.csr"],
        ]
        .concat(),
        vec![
            "x509",
            "-req",
            "-in",
            "leaf.csr",
            "-CA",
            "ca.pem",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-out",
            "leaf.pem",
            "-extfile",
            "leaf.ext",
        ],
    ];
    for (i, step) in steps.iter().enumerate() {
        let mut args = step.clone();
        args.extend(["-days", "2"]);
        if i < 2 {
            args.extend([
                "-subj",
                if i == 0 {
                    "/CN=ladle test CA"
                } else {
                    "/CN=127.0.0.1"
                },
            ]);
        }
        let out = std::process::Command::new("openssl")
            .args(&args)
            .current_dir(dir)
            .output()
            .expect("the openssl command (Debian's openssl package)");
        assert!(
            out.status.success(),
            "openssl {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    (
        dir.join("ca.pem"),
        dir.join("leaf.pem"),
        dir.join("leaf.key"),
    )
}

#[test]
fn shards_over_https_are_trusted_by_the_systems_roots_and_an_unknown_certificate_is_an_error_naming_the_url()
 {
    let mut fx = Fixture::new();
    let www = shards(&mut fx);
    let (ca, cert, key) = certificates(&fx.path().join("tls"));
    let (stranger, _, _) = certificates(&fx.path().join("other-ca"));
    let serving = Serving {
        tls: Some((cert, key)),
        ..Serving::default()
    };
    let Some(web) = nginx_with(&fx, &www, &serving) else {
        return;
    };
    let url = format!(
        "https://127.0.0.1:{}/d/shard-{{000000..000003}}.tar",
        web.port
    );
    // Roots that do not vouch for the server: an error at once, naming the shard, not retried.
    let (i, _) = serve_env(&mut fx, &url, "a", &[], &[("SSL_CERT_FILE", &stranger)]);
    let done = fx.wait(i, GUARD);
    assert!(!done.status.success(), "{}", done.stderr);
    assert!(done.stderr.contains("TLS failed"), "{}", done.stderr);
    assert!(
        done.stderr
            .contains(&format!("https://127.0.0.1:{}/d/shard-", web.port)),
        "{}",
        done.stderr
    );
    assert!(!done.stderr.contains("retrying"), "{}", done.stderr);
    assert!(web.gets().is_empty(), "{:?}", web.gets());
    // Roots that do (SSL_CERT_FILE, as curl and the AWS SDKs read it): exact epochs, each
    // shard fetched once.
    let (i, socket) = serve_env(&mut fx, &url, "b", &[], &[("SSL_CERT_FILE", &ca)]);
    wait_for_listener(&socket, GUARD, "ladle serve of shards over HTTPS");
    consume(&mut fx, &socket, 2);
    let gets = web.gets();
    assert_eq!(gets.len(), 4, "{gets:?}");
    assert!(gets.values().all(|&n| n == 1), "{gets:?}");
    fx.signal(i, 15);
    let done = fx.wait(i, GUARD);
    assert!(done.stderr.contains("4 shards fetched"), "{}", done.stderr);
}

/// The number before " retries" in a feed's summary of its fetch.
fn retries(stderr: &str) -> u64 {
    let at = stderr
        .find(" retries")
        .unwrap_or_else(|| panic!("no retries said: {stderr}"));
    let digits: String = stderr[..at]
        .chars()
        .rev()
        .take_while(char::is_ascii_digit)
        .collect::<Vec<_>>()
        .into_iter()
        .rev()
        .collect();
    digits.parse().unwrap()
}

#[test]
fn a_web_server_killed_and_restarted_in_the_middle_of_a_shard_loses_no_sample() {
    let mut fx = Fixture::new();
    let www = shards(&mut fx);
    // nginx sends 20 KB/s per response: a shard takes seconds, time to kill it mid-body.
    let serving = Serving {
        limit_rate: Some("20k"),
        ..Serving::default()
    };
    let Some(mut web) = nginx_with(&fx, &www, &serving) else {
        return;
    };
    let url = format!(
        "http://127.0.0.1:{}/d/shard-{{000000..000003}}.tar",
        web.port
    );
    let (i, socket) = serve(&mut fx, &url, "a", &["--fetch-concurrency", "1"]);
    // A shard is in the middle of its body: its `.part` file has bytes in it.
    let cache = fx.path().join("shards");
    let part = wait_until("a shard half fetched", GUARD, || {
        let found = walk(&cache).into_iter().find(|p| {
            p.extension().is_some_and(|e| e == "part")
                && std::fs::metadata(p).is_ok_and(|m| m.len() > 0)
        });
        Ok(found)
    });
    web.kill();
    assert!(
        !part.with_extension("").exists(),
        "the shard was whole before the kill: {}",
        part.display()
    );
    web.start();
    wait_for_listener(&socket, GUARD, "ladle serve after its web server restarted");
    consume(&mut fx, &socket, 2);
    fx.signal(i, 15);
    let done = fx.wait(i, GUARD);
    assert!(done.stderr.contains("4 shards fetched"), "{}", done.stderr);
    assert!(retries(&done.stderr) >= 1, "{}", done.stderr);
}

/// Every file under `dir`, at any depth.
fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    let mut dirs = vec![dir.to_path_buf()];
    while let Some(d) = dirs.pop() {
        for entry in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let path = entry.path();
            if path.is_dir() {
                dirs.push(path);
            } else {
                files.push(path);
            }
        }
    }
    files
}

/// A proxy in front of `upstream` that answers each shard's first GET with 503, cuts its
/// second short (the length announced, half the bytes sent), and passes the rest.
fn flaky_proxy(upstream: u16) -> (u16, Arc<AtomicU32>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let requests = Arc::new(AtomicU32::new(0));
    let seen = Arc::new(std::sync::Mutex::new(std::collections::HashMap::<
        String,
        u32,
    >::new()));
    let counter = requests.clone();
    std::thread::spawn(move || {
        for client in listener.incoming() {
            let Ok(client) = client else { continue };
            let (seen, counter) = (seen.clone(), counter.clone());
            std::thread::spawn(move || {
                let _ = relay(client, upstream, &seen, &counter);
            });
        }
    });
    (port, requests)
}

fn relay(
    mut client: TcpStream,
    upstream: u16,
    seen: &std::sync::Mutex<std::collections::HashMap<String, u32>>,
    counter: &AtomicU32,
) -> std::io::Result<()> {
    let mut reader = BufReader::new(client.try_clone()?);
    let mut head = String::new();
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line)? == 0 {
            return Ok(());
        }
        head.push_str(&line);
        if line == "\r\n" {
            break;
        }
    }
    counter.fetch_add(1, Ordering::SeqCst);
    let path = head.split(' ').nth(1).unwrap_or("").to_owned();
    let visit = {
        let mut seen = seen.lock().unwrap();
        let n = seen.entry(path).or_insert(0);
        *n += 1;
        *n
    };
    if visit == 1 {
        return client.write_all(
            b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
        );
    }
    let mut server = TcpStream::connect(("127.0.0.1", upstream))?;
    // One request per upstream connection, so that its answer ends where the stream does.
    let mut upstream_head: String = head
        .lines()
        .filter(|l| !l.is_empty() && !l.to_ascii_lowercase().starts_with("connection:"))
        .map(|l| format!("{l}\r\n"))
        .collect();
    upstream_head.push_str("Connection: close\r\n\r\n");
    server.write_all(upstream_head.as_bytes())?;
    let mut answer = Vec::new();
    server.read_to_end(&mut answer)?;
    if visit == 2 {
        // The headers and half the body: the announced length is not met.
        let body_at = answer
            .windows(4)
            .position(|w| w == b"\r\n\r\n")
            .map_or(0, |p| p + 4);
        let cut = body_at + (answer.len() - body_at) / 2;
        client.write_all(&answer[..cut])?;
        return Ok(());
    }
    client.write_all(&answer)
}

#[test]
fn failing_and_cut_responses_are_retried_and_lose_no_sample() {
    let mut fx = Fixture::new();
    let www = shards(&mut fx);
    let Some(web) = nginx(&fx, &www) else { return };
    let (port, requests) = flaky_proxy(web.port);
    let url = format!("http://127.0.0.1:{port}/d/shard-{{000000..000003}}.tar");
    let (i, socket) = serve(&mut fx, &url, "a", &[]);
    wait_for_listener(&socket, GUARD, "ladle serve through a flaky proxy");
    consume(&mut fx, &socket, 2);
    assert_eq!(
        requests.load(Ordering::SeqCst),
        12,
        "three GETs per shard: 503, cut, whole"
    );
    fx.signal(i, 15);
    let done = fx.wait(i, GUARD);
    assert!(done.stderr.contains("4 shards fetched"), "{}", done.stderr);
    assert!(done.stderr.contains("8 retries"), "{}", done.stderr);
}

/// A real S3-compatible server: moto's standalone server, from the Python environment
/// `$LADLE_MOTO_PYTHON` (`scripts/check` makes one with `pip install 'moto[server]'`), on a
/// free port; `None` (the test says it skips) where there is none and the run does not
/// require it (`LADLE_REQUIRE_MOTO`).
struct Moto {
    port: u16,
    python: PathBuf,
    log: PathBuf,
    _proc: Proc,
}

fn moto(fx: &Fixture) -> Option<Moto> {
    let python = std::env::var_os("LADLE_MOTO_PYTHON")
        .map(PathBuf::from)
        .filter(|p| p.is_file());
    let Some(python) = python else {
        assert!(
            std::env::var_os("LADLE_REQUIRE_MOTO").is_none(),
            "an S3-compatible server is required (LADLE_REQUIRE_MOTO) but LADLE_MOTO_PYTHON names no Python with moto"
        );
        eprintln!(
            "skipped: no S3-compatible server (set LADLE_MOTO_PYTHON to a Python with moto[server])"
        );
        return None;
    };
    let port = free_port();
    let log = fx.path().join("moto.log");
    // Its stderr (werkzeug's request log) into `log`: `Proc` pipes a child's own stderr, so
    // a shell redirects it.
    let proc = Proc::spawn(
        "moto_server",
        std::process::Command::new("sh")
            .args(["-c", "exec \"$@\" 2>\"$MOTO_LOG\"", "sh"])
            .arg(&python)
            .args([
                "-m",
                "moto.server",
                "-H",
                "127.0.0.1",
                "-p",
                &port.to_string(),
            ])
            .env("MOTO_LOG", &log),
    )
    .unwrap();
    wait_until("moto listening", GUARD, || {
        TcpStream::connect(("127.0.0.1", port))
            .map(|_| Some(()))
            .map_err(|e| {
                format!(
                    "{e}; its log: {}",
                    std::fs::read_to_string(&log).unwrap_or_default()
                )
            })
    });
    Some(Moto {
        port,
        python,
        log,
        _proc: proc,
    })
}

const SECRET: &str = "secret-that-must-never-be-printed";

impl Moto {
    /// GETs of each object that moto answered with 200, from its own request log (the query,
    /// a presigned URL's signature, cut off).
    fn gets(&self) -> std::collections::BTreeMap<String, usize> {
        let log = std::fs::read_to_string(&self.log).unwrap_or_default();
        let mut gets = std::collections::BTreeMap::new();
        // werkzeug's lines, coloured for some statuses: `"\x1b[33mGET /b/k?… HTTP/1.1\x1b[0m" 200 -`
        for line in log.lines().filter(|l| l.contains("\" 200 ")) {
            if let Some(path) = line
                .split("GET ")
                .nth(1)
                .and_then(|r| r.split([' ', '?']).next())
            {
                *gets.entry(path.to_owned()).or_insert(0) += 1;
            }
        }
        gets
    }

    fn env(&self) -> Vec<(&'static str, String)> {
        vec![
            (
                "AWS_ENDPOINT_URL",
                format!("http://127.0.0.1:{}", self.port),
            ),
            ("AWS_ACCESS_KEY_ID", "testing-key".into()),
            ("AWS_SECRET_ACCESS_KEY", SECRET.into()),
            ("AWS_REGION", "us-east-1".into()),
        ]
    }

    /// Uploads every file of `dir` to `bucket` under `prefix`, with boto3 (moto's own).
    fn upload(&self, dir: &Path, bucket: &str, prefix: &str) {
        let script = [
            "import boto3, os, sys".to_owned(),
            format!(
                "s3 = boto3.client('s3', endpoint_url='http://127.0.0.1:{}', region_name='us-east-1', aws_access_key_id='testing-key', aws_secret_access_key='{SECRET}')",
                self.port
            ),
            format!("s3.create_bucket(Bucket='{bucket}')"),
            "d = sys.argv[1]".to_owned(),
            "for f in sorted(os.listdir(d)):".to_owned(),
            format!("    s3.upload_file(os.path.join(d, f), '{bucket}', '{prefix}' + f)"),
        ]
        .join("\n");
        let out = std::process::Command::new(&self.python)
            .args(["-c", &script])
            .arg(dir)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

#[test]
fn shards_in_an_s3_compatible_store_serve_exact_epochs_listed_by_prefix_and_fetched_once() {
    let mut fx = Fixture::new();
    let www = shards(&mut fx);
    // A shard index beside the shards, for a feed that streams them.
    let d = www.join("d");
    let index = d.join("index.json");
    let done = fx.run(
        &[
            "dataset",
            "index",
            d.to_str().unwrap(),
            "--out",
            index.to_str().unwrap(),
        ],
        GUARD,
    );
    assert!(done.status.success(), "{}", done.stderr);
    let Some(store) = moto(&fx) else { return };
    store.upload(&d, "photos", "train/");
    let cache = fx.path().join("shards");
    let serve_s3 = |fx: &mut Fixture, name: &str, spec: &str| {
        let socket = fx.path().join(format!("{name}.sock"));
        let mut command = std::process::Command::new(ladle_tests::ladle_bin());
        command
            .args([
                "serve",
                "--dataset",
                spec,
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
            .env("LADLE_REGISTRY_DIR", fx.registry());
        for (k, v) in store.env() {
            command.env(k, v);
        }
        let i = fx.start(&mut command);
        (i, socket)
    };
    // A prefix, listed: the four shards (and not classes.txt) in key order.
    let (a, sa) = serve_s3(&mut fx, "a", "s3://photos/train/");
    wait_for_listener(&sa, GUARD, "ladle serve of an S3 prefix");
    consume(&mut fx, &sa, 2);
    // The same objects by braces: another spelling, a folder of its own in the shard cache.
    let (b, sb) = serve_s3(&mut fx, "b", "s3://photos/train/shard-{000000..000003}.tar");
    wait_for_listener(&sb, GUARD, "ladle serve of S3 keys by braces");
    consume(&mut fx, &sb, 1);
    let (c, sc) = serve_s3(&mut fx, "c", "s3://photos/train/");
    wait_for_listener(&sc, GUARD, "a second feed of the prefix");
    consume(&mut fx, &sc, 1);
    // The index's object: streamed, its shards' keys taken relative to it and signed.
    let (e, se) = serve_s3(&mut fx, "e", "s3://photos/train/index.json");
    wait_for_listener(&se, GUARD, "a feed of an S3 shard index");
    consume(&mut fx, &se, 2);
    let mut said = Vec::new();
    for i in [a, b, c, e] {
        fx.signal(i, 15);
        let done = fx.wait(i, GUARD);
        assert!(
            !done.stderr.contains(SECRET),
            "a secret printed: {}",
            done.stderr
        );
        assert!(
            !done.stderr.contains("X-Amz-Signature"),
            "a signed URL printed: {}",
            done.stderr
        );
        said.push(done.stderr);
    }
    assert!(said[0].contains("4 shards fetched"), "{}", said[0]);
    assert!(
        said[2].contains("0 shards fetched") && said[2].contains("4 already"),
        "{}",
        said[2]
    );
    assert!(
        said[3].contains("100 samples in shards streamed"),
        "{}",
        said[3]
    );
    // A bucket that does not exist: an error naming it, not the signed URL.
    let (d, _) = serve_s3(&mut fx, "d", "s3://nothing-here/x/");
    let done = fx.wait(d, GUARD);
    assert!(!done.status.success());
    assert!(
        done.stderr.contains("s3://nothing-here/x/"),
        "{}",
        done.stderr
    );
    assert!(!done.stderr.contains(SECRET));
}

#[test]
fn a_four_run_sweep_over_shards_in_an_s3_compatible_store_fetches_each_shard_once_and_every_run_reads_exact_epochs()
 {
    let mut fx = Fixture::new();
    let www = shards(&mut fx);
    let Some(store) = moto(&fx) else { return };
    store.upload(&www.join("d"), "photos", "train/");
    let out = fx.path().join("sweep");
    let cache = fx.path().join("shards");
    let ladle = ladle_tests::ladle_bin();
    let mut command = std::process::Command::new(ladle);
    command
        .args([
            "sweep",
            "--dataset",
            "s3://photos/train/",
            "--shard-cache",
            cache.to_str().unwrap(),
            "--image-size",
            "32",
            "--ring-mib",
            "2",
            "--gpu",
            "sim",
            "--sim-gpus",
            "4",
            "--settle-s",
            "0",
            "--tick-ms",
            "100",
            "--measure-s",
            "1",
            "--private-scheduler",
            "--out",
            out.to_str().unwrap(),
            "--json",
            "--",
            ladle.to_str().unwrap(),
            "consume",
            "--batch-size",
            "{8,16,32,64}",
            "--epochs",
            "2",
            "--json",
        ])
        .env("LADLE_REGISTRY_DIR", fx.registry());
    for (k, v) in store.env() {
        command.env(k, v);
    }
    let i = fx.start(&mut command);
    let done = fx.wait(i, Duration::from_secs(300));
    assert!(done.status.success(), "{}", done.stderr);
    assert!(!done.stderr.contains(SECRET), "{}", done.stderr);
    let report: serde_json::Value = serde_json::from_str(done.stdout.trim()).unwrap();
    let runs = report["runs"].as_array().unwrap();
    assert_eq!(runs.len(), 4, "{report}");
    for run in runs {
        assert_eq!(run["exit_code"], 0, "{run}");
        let (epochs, log) = ladle_tests::sweep_run_epochs(run);
        assert_eq!(epochs.len(), 2, "{log}");
        for e in &epochs {
            assert_eq!(e["exact_coverage"], true, "{e}");
            assert_eq!(e["samples"], 100, "{e}");
        }
    }
    // The store's own log: each of the four shards sent once, for all four runs.
    let gets: std::collections::BTreeMap<_, _> = store
        .gets()
        .into_iter()
        .filter(|(path, _)| path.ends_with(".tar"))
        .collect();
    assert_eq!(gets.len(), 4, "{gets:?}");
    assert!(
        gets.values().all(|&n| n == 1),
        "a shard sent twice: {gets:?}"
    );
}

#[test]
fn an_imagefolder_stored_as_tar_shards_over_http_has_the_folders_classes_and_serves_exact_epochs() {
    let mut fx = Fixture::new();
    let folder = fx.path().join("folder");
    let done = fx.run(
        &[
            "dataset",
            "generate",
            "--format",
            "imagefolder",
            "--count",
            "60",
            "--width",
            "32",
            "--height",
            "24",
            "--out",
            folder.to_str().unwrap(),
        ],
        GUARD,
    );
    assert!(done.status.success(), "{}", done.stderr);
    // Two shards as `tar -C ROOT` writes them: the first five classes, then the rest.
    let www = fx.path().join("www");
    std::fs::create_dir_all(www.join("f")).unwrap();
    let mut classes: Vec<String> = std::fs::read_dir(&folder)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    classes.sort();
    for (k, part) in classes.chunks(5).enumerate() {
        let out = std::process::Command::new("tar")
            .arg("-cf")
            .arg(www.join(format!("f/part-{k}.tar")))
            .arg("-C")
            .arg(&folder)
            .args(part.iter().map(|c| format!("./{c}")))
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let Some(web) = nginx(&fx, &www) else { return };
    let url = format!("http://127.0.0.1:{}/f/part-{{0..1}}.tar", web.port);
    let inspect = |fx: &mut Fixture, what: &str| -> serde_json::Value {
        let cache = fx.path().join("shards");
        let done = fx.run(
            &[
                "dataset",
                "inspect",
                what,
                "--json",
                "--shard-cache",
                cache.to_str().unwrap(),
            ],
            GUARD,
        );
        assert!(done.status.success(), "{}", done.stderr);
        serde_json::from_str(done.stdout.trim()).unwrap()
    };
    let local = inspect(&mut fx, folder.to_str().unwrap());
    let remote = inspect(&mut fx, &url);
    assert_eq!(remote["samples"], 60, "{remote}");
    assert_eq!(remote["class_names"], local["class_names"], "{remote}");
    assert!(remote["errors"].as_array().unwrap().is_empty(), "{remote}");
    let (i, socket) = serve(&mut fx, &url, "a", &[]);
    wait_for_listener(
        &socket,
        GUARD,
        "ladle serve of an ImageFolder in tar shards",
    );
    consume(&mut fx, &socket, 2);
    fx.signal(i, 15);
    fx.wait(i, GUARD);
}
