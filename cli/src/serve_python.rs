//! `ladle serve MODULE:FACTORY`: one `serve` for both producers. Image datasets (`--dataset`)
//! are decoded here, in Rust; a Python dataset is served by the Python package's producer
//! (`python -m ladle serve`, worker processes running the user's `__getitem__`), which this
//! hands the process over to (`exec`: signals, exit status and output are the producer's).

use std::ffi::OsString;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::Command;

use anyhow::{Context, bail};
use clap::parser::ValueSource;

use crate::serve::ServeArgs;

/// The environment variable naming the Python that serves a `MODULE:FACTORY` dataset, when
/// the user sets it; else the host's interpreter ([`crate::Host::python`]: the package's
/// console script), else `python3`.
pub(crate) const PYTHON_ENV: &str = "LADLE_PYTHON";

/// Options of the image pipeline (clap ids): a Python dataset makes its samples itself.
const IMAGE_OPTIONS: [&str; 3] = ["image_size", "eval", "transform"];

/// The `ladle serve` options a Python dataset takes (clap ids); the others are the image
/// pipeline's, the scheduler's or the observers'.
const PYTHON_OPTIONS: [&str; 9] = [
    "python",
    "socket",
    "ring_mib",
    "seed",
    "threads",
    "idle_timeout",
    "stall_timeout",
    "fail_on_bad_sample",
    "timeout",
];

/// Replaces this process with the Python producer serving `spec`; returns only on an error.
pub(crate) fn exec(spec: &str, args: &ServeArgs, given: &clap::ArgMatches) -> anyhow::Result<()> {
    if let Some((id, flag)) = unsupported_flag(given) {
        if IMAGE_OPTIONS.contains(&id.as_str()) {
            bail!(
                "{flag} applies to image datasets (--dataset), not to a Python dataset \
                 ({spec}): its __getitem__ makes each sample as it is"
            );
        }
        bail!(
            "{flag} is not supported with a Python dataset ({spec}): the Python producer \
             takes --socket, --ring-mib, --seed, --threads, --keep-alive, --stall-timeout, \
             --fail-on-bad-sample and --timeout"
        );
    }
    check_values(args)?;
    let python = python();
    check_importable(&python, spec)?;
    let error = Command::new(&python)
        .args(["-m", "ladle", "serve"])
        .args(python_argv(spec, args))
        .exec();
    Err(error).with_context(|| {
        format!(
            "cannot run {} to serve the Python dataset {spec}",
            python.display()
        )
    })
}

/// The first option given on the command line that a Python dataset does not take: its clap
/// id and its flag.
fn unsupported_flag(given: &clap::ArgMatches) -> Option<(String, String)> {
    let command = <crate::Cli as clap::CommandFactory>::command();
    let serve = command.find_subcommand("serve")?;
    serve
        .get_arguments()
        .map(|arg| arg.get_id().as_str())
        .filter(|id| !PYTHON_OPTIONS.contains(id))
        .find(|id| {
            matches!(
                given.value_source(id),
                Some(ValueSource::CommandLine | ValueSource::EnvVariable)
            )
        })
        .map(|id| (id.to_owned(), format!("--{}", id.replace('_', "-"))))
}

/// The same limits as the image path's (`FeedOptions::open`), checked before Python runs.
fn check_values(args: &ServeArgs) -> anyhow::Result<()> {
    let feed = &args.feed;
    if !(feed.stall_timeout.is_finite() && feed.stall_timeout >= 0.1) {
        bail!(
            "--stall-timeout {} is not a number of seconds of at least 0.1",
            feed.stall_timeout
        );
    }
    for (flag, value) in [
        ("--keep-alive", feed.idle_timeout),
        ("--timeout", args.timeout),
    ] {
        if let Some(s) = value
            && !(s.is_finite() && s >= 0.0)
        {
            bail!("{flag} {s} is not a number of seconds");
        }
    }
    if feed.threads == Some(0) {
        bail!("--threads 0: a Python dataset needs at least one worker process");
    }
    Ok(())
}

/// `$LADLE_PYTHON`, else the host's interpreter, else `python3` from `PATH`.
fn python() -> PathBuf {
    match (std::env::var_os(PYTHON_ENV), crate::host().python) {
        (Some(python), _) if !python.is_empty() => python.into(),
        (_, Some(python)) => python,
        _ => "python3".into(),
    }
}

/// Fails, saying what to install, unless `python` can import the ladle package.
fn check_importable(python: &std::path::Path, spec: &str) -> anyhow::Result<()> {
    let probe = Command::new(python)
        .args(["-c", "import ladle._producer"])
        .stdin(std::process::Stdio::null())
        .output();
    let why = match probe {
        Ok(out) if out.status.success() => return Ok(()),
        Ok(out) => format!(
            "{} cannot import the ladle package ({})",
            python.display(),
            String::from_utf8_lossy(&out.stderr)
                .lines()
                .last()
                .unwrap_or("it exited with an error")
        ),
        Err(e) => format!("cannot run {} ({e})", python.display()),
    };
    bail!(
        "cannot serve the Python dataset {spec}: {why}. \
         Install it in the environment your dataset lives in (`pip install ladle-*.whl`, or \
         `pip install ./python` from the source tree), or point ${PYTHON_ENV} at \
         that environment's python"
    )
}

/// `python -m ladle serve`'s arguments for the options given to `ladle serve`, each option
/// one `--flag=value` word (a value may start with `-`).
fn python_argv(spec: &str, args: &ServeArgs) -> Vec<OsString> {
    let feed = &args.feed;
    let mut socket = OsString::from("--socket=");
    socket.push(args.socket.as_deref().unwrap_or(std::path::Path::new("")));
    let mut argv: Vec<OsString> = vec![
        spec.into(),
        socket,
        format!("--ring-mib={}", feed.ring_mib).into(),
        format!("--seed={}", feed.seed).into(),
        format!("--stall-timeout={}", feed.stall_timeout).into(),
    ];
    let optional = [
        ("--threads", feed.threads.map(|n| n.to_string())),
        ("--keep-alive", feed.idle_timeout.map(|s| s.to_string())),
        ("--timeout", args.timeout.map(|s| s.to_string())),
    ];
    for (flag, value) in optional {
        if let Some(value) = value {
            argv.push(format!("{flag}={value}").into());
        }
    }
    if feed.fail_on_bad_sample {
        argv.push("--fail-on-bad-sample".into());
    }
    argv
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::{CommandFactory, FromArgMatches};

    fn parse(argv: &[&str]) -> (ServeArgs, clap::ArgMatches) {
        let matches = crate::Cli::command()
            .try_get_matches_from(std::iter::once("ladle").chain(argv.iter().copied()))
            .unwrap();
        let crate::Command::Serve(args) = crate::Cli::from_arg_matches(&matches).unwrap().command
        else {
            panic!("not a serve command");
        };
        (args, matches.subcommand_matches("serve").unwrap().clone())
    }

    #[test]
    fn the_options_a_python_dataset_takes_are_passed_on_and_the_others_named() {
        let (args, given) = parse(&[
            "serve",
            "m:f",
            "--socket",
            "/s",
            "--threads",
            "3",
            "--keep-alive",
            "2.5",
            "--timeout",
            "9",
            "--fail-on-bad-sample",
        ]);
        assert_eq!(unsupported_flag(&given), None);
        check_values(&args).unwrap();
        let argv: Vec<String> = python_argv("m:f", &args)
            .into_iter()
            .map(|a| a.into_string().unwrap())
            .collect();
        assert_eq!(
            argv.join(" "),
            "m:f --socket=/s --ring-mib=256 --seed=0 --stall-timeout=10 --threads=3 \
             --keep-alive=2.5 --timeout=9 --fail-on-bad-sample"
        );
        for (flag, value) in [
            ("--image-size", Some("64")),
            ("--eval", None),
            ("--pacing", Some("lockstep")),
            ("--name", Some("feed")),
            ("--record", Some("/r")),
        ] {
            let mut argv = vec!["serve", "m:f", "--socket", "/s", flag];
            argv.extend(value);
            let (_, given) = parse(&argv);
            assert_eq!(
                unsupported_flag(&given).map(|(_, f)| f).as_deref(),
                Some(flag)
            );
        }
        // Defaults are not "given".
        let (_, given) = parse(&["serve", "m:f", "--socket", "/s"]);
        assert_eq!(unsupported_flag(&given), None);
        // The image path's limits hold here too, before any Python runs.
        for bad in [
            &["--stall-timeout", "0"][..],
            &["--keep-alive=-1"],
            &["--timeout", "inf"],
            &["--threads", "0"],
        ] {
            let (args, _) = parse(&[&["serve", "m:f", "--socket", "/s"], bad].concat());
            let err = check_values(&args).unwrap_err().to_string();
            assert!(err.contains(bad[0].split('=').next().unwrap()), "{err}");
        }
    }
}
