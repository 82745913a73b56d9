//! The scheduler's GPUs as real processes on simulated GPUs: which GPUs a scheduler and each
//! job may use (its own and its submitter's CUDA_VISIBLE_DEVICES, Slurm's allocation,
//! `--only-gpus`), the environment a job gets, other users' processes and MPS servers,
//! failing telemetry and compute modes.

#![allow(clippy::unwrap_used)] // tests fail loudly by design

use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use ladle_tests::scheduler::*;
use ladle_tests::{Fixture, wait_until};
use serde_json::Value;

#[test]
fn jobs_needing_more_gpus_than_exist_are_refused() {
    let mut s = Scheduler::start(2, &[]);
    let dir = s.dir_arg();
    let done = s.fx.run(
        &["submit", "--dir", &dir, "--gpus-per-job", "3", "--", "true"],
        GUARD,
    );
    assert!(!done.status.success());
    assert!(done.stderr.contains("3 GPUs"), "{}", done.stderr);
}

#[test]
fn the_old_gpus_option_is_refused_naming_what_replaced_it() {
    let mut s = Scheduler::start(1, &[]);
    let dir = s.dir_arg();
    let done = s.fx.run(
        &["submit", "--dir", &dir, "--gpus", "2", "--", "true"],
        GUARD,
    );
    assert!(!done.status.success());
    assert!(done.stderr.contains("--gpus-per-job 2"), "{}", done.stderr);
    let other = s.fx.path().join("other");
    let done = s.fx.run(
        &[
            "scheduler",
            "--dir",
            other.to_str().unwrap(),
            "--gpu",
            "sim",
            "--gpus",
            "0",
        ],
        GUARD,
    );
    assert!(!done.status.success());
    assert!(done.stderr.contains("--only-gpus 0"), "{}", done.stderr);
}

#[test]
fn without_a_gpu_driver_the_default_refuses_to_start_and_names_gpu_sim() {
    // The default `--gpu auto` once fell back to simulated GPUs: runs then trained on the CPU
    // while the scheduler showed GPUs. This is about machines without a driver.
    if Path::new("/dev/nvidiactl").exists() {
        eprintln!("skipped: this machine has an NVIDIA driver (/dev/nvidiactl)");
        return;
    }
    let mut fx = Fixture::new();
    let dir = fx.path().join("state");
    let dir = dir.to_str().unwrap();
    for gpu in [&[][..], &["--gpu", "auto"], &["--gpu", "nvml"]] {
        let mut args = vec!["scheduler", "--dir", dir];
        args.extend(gpu);
        let done = fx.run(&args, GUARD);
        assert!(!done.status.success(), "{gpu:?} started: {}", done.stderr);
        assert!(
            done.stderr.contains("NVML") && done.stderr.contains("--gpu sim"),
            "{gpu:?}: {}",
            done.stderr
        );
    }
}

#[test]
fn a_job_started_after_a_scheduler_restart_still_gets_its_submitters_environment() {
    // One GPU, one job at a time: the job waits behind another while the scheduler is
    // killed and a scheduler with another environment takes over.
    let one = ["--policy", "exclusive", "--only-gpus", "GPU-aa"];
    let mut s = scheduler_given(&["FOO=first-scheduler"], &one);
    let blocker = s.submit(&[], "sleep 600");
    s.wait_for(blocker, &["running"]);
    let out = s.file("foo");
    let dir = s.dir_arg();
    let ladle = ladle_tests::ladle_bin().to_str().unwrap().to_owned();
    let script = format!("echo \"$FOO\" > {out}");
    let i = s.fx.spawn_program(&[
        "env",
        "FOO=submitter",
        &ladle,
        "submit",
        "--dir",
        &dir,
        "--json",
        "--",
        "sh",
        "-c",
        &script,
    ]);
    let done = s.fx.wait(i, GUARD);
    assert!(done.status.success(), "{}", done.stderr);
    let id = serde_json::from_str::<Value>(done.stdout.trim()).unwrap()["id"]
        .as_u64()
        .unwrap();
    assert_eq!(s.job(id)["state"], "queued");
    s.fx.signal(s.daemon, 9);
    s.fx.wait(s.daemon, GUARD);
    s.daemon = spawn_given(&mut s.fx, &["FOO=second-scheduler"], &one);
    let cancel =
        s.fx.run(&["cancel", "--dir", &dir, &blocker.to_string()], GUARD);
    assert!(cancel.status.success(), "{}", cancel.stderr);
    s.wait_for(id, &["succeeded"]);
    assert_eq!(std::fs::read_to_string(&out).unwrap().trim(), "submitter");
}

#[test]
fn a_scheduler_takes_only_the_gpus_its_process_was_given_and_says_why() {
    // Simulated GPU i stands for CUDA device i; a UUID in a job's CUDA_VISIBLE_DEVICES says
    // which it got.
    let uuid = |i: u32| format!("GPU-00000000-0000-4000-8000-{i:012x}");
    // (environment, options, the GPUs' UUIDs, why)
    type Case<'a> = (&'a [&'a str], &'a [&'a str], Vec<String>, &'a str);
    let cases: [Case<'_>; 4] = [
        (&[], &[], (0..3).map(uuid).collect(), "every GPU"),
        (
            &["CUDA_VISIBLE_DEVICES=2,1"],
            &[],
            vec![uuid(2), uuid(1)],
            "CUDA_VISIBLE_DEVICES=2,1 (CUDA's order)",
        ),
        // --only-gpus chooses whatever the environment says.
        (
            &["CUDA_VISIBLE_DEVICES=2,1"],
            &["--only-gpus", "GPU-feed"],
            vec!["GPU-simulated-GPU-feed".to_owned()],
            "--only-gpus GPU-feed",
        ),
        // Inside a Slurm job, Slurm's devices (not CUDA's renumbered ones).
        (
            &[
                "SLURM_JOB_ID=9",
                "SLURM_JOB_GPUS=7",
                "CUDA_VISIBLE_DEVICES=0",
            ],
            &[],
            vec!["GPU-simulated-dev-nvidia7".to_owned()],
            "SLURM_JOB_GPUS=7",
        ),
    ];
    for (env, extra, uuids, why) in cases {
        let mut s = scheduler_given(env, extra);
        let q = s.queue();
        let got: Vec<&str> = (q["gpus"].as_array().unwrap().iter())
            .map(|g| g["uuid"].as_str().unwrap())
            .collect();
        assert_eq!(got, uuids, "{env:?} {extra:?}: {q}");
        match q["gpus_from"].as_str() {
            Some(from) => assert_eq!(from, why, "{env:?}"),
            None => assert_eq!(why, "every GPU", "{env:?}: {q}"),
        }
        let dir = s.dir_arg();
        let text = s.fx.run(&["queue", "--dir", &dir], GUARD);
        assert!(text.stdout.contains(why), "{env:?}: {}", text.stdout);
        // Every job runs on the given GPUs only.
        let out = s.file("cvd");
        let id = s.submit(&[], &format!("echo $CUDA_VISIBLE_DEVICES > {out}"));
        s.wait_for(id, &["succeeded"]);
        let seen = std::fs::read_to_string(&out).unwrap();
        assert!(uuids.iter().any(|u| seen.trim() == u), "{env:?}: {seen}");
        s.fx.signal(s.daemon, 15);
        s.fx.wait(s.daemon, GUARD);
    }
}

#[test]
fn a_job_gets_its_submitters_environment_not_the_schedulers_and_no_secret_is_shown() {
    let mut s = scheduler_given(&["FOO=scheduler", "ONLY_SCHEDULER=1"], &[]);
    let dir = s.dir_arg();
    let ladle = ladle_tests::ladle_bin().to_str().unwrap().to_owned();
    let submit = |s: &mut Scheduler, export: &str, out: &str| -> u64 {
        let script = format!(
            "echo \"$FOO|$BAR|$ONLY_SCHEDULER|$CUDA_VISIBLE_DEVICES|$CUDA_MPS_PINNED_DEVICE_MEM_LIMIT\" > {out}"
        );
        let i = s.fx.spawn_program(&[
            "env",
            "FOO=submitter",
            "BAR=bar",
            "WANDB_API_KEY=s3cret-value",
            // Inside the scheduler's GPUs (a GPU outside them is refused: the next test).
            "CUDA_VISIBLE_DEVICES=1",
            "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=1M",
            &ladle,
            "submit",
            "--dir",
            &dir,
            "--json",
            "--export",
            export,
            "--",
            "sh",
            "-c",
            &script,
        ]);
        let done = s.fx.wait(i, GUARD);
        assert!(done.status.success(), "{}", done.stderr);
        let v: Value = serde_json::from_str(done.stdout.trim()).unwrap();
        v["id"].as_u64().unwrap()
    };
    let gpu = "GPU-00000000-0000-4000-8000-";
    for (export, want) in [
        // As sbatch --export=ALL: the submitter's, nothing of the scheduler's.
        ("ALL", "submitter|bar||"),
        // Today's: the scheduler's.
        ("NONE", "scheduler||1|"),
        ("BAR", "scheduler|bar|1|"),
    ] {
        let out = s.file(&format!("env-{export}"));
        let id = submit(&mut s, export, &out);
        s.wait_for(id, &["succeeded"]);
        let seen = std::fs::read_to_string(&out).unwrap();
        // Whatever the submitter had, the job runs on its own GPU, under no limit of theirs.
        assert!(
            seen.starts_with(want) && seen.contains(gpu) && seen.trim_end().ends_with('|'),
            "--export {export}: {seen:?}"
        );
    }
    // No answer and no log of the scheduler shows a secret (nor the rest of a submitter's
    // environment).
    let dir_arg = s.dir_arg();
    for args in [
        vec!["queue", "--dir", &dir_arg, "--json"],
        vec!["queue", "--dir", &dir_arg, "--json", "--all"],
        vec!["queue", "--dir", &dir_arg],
    ] {
        let q = s.fx.run(&args, GUARD);
        assert!(q.status.success(), "{}", q.stderr);
        assert!(!q.stdout.contains("s3cret"), "{}", q.stdout);
    }
    // A named variable that is not set is refused, naming it.
    let i = s.fx.spawn_program(&[
        &ladle,
        "submit",
        "--dir",
        &dir,
        "--export",
        "NOT_SET_ANYWHERE",
        "--",
        "true",
    ]);
    let done = s.fx.wait(i, GUARD);
    assert!(!done.status.success());
    assert!(done.stderr.contains("NOT_SET_ANYWHERE"), "{}", done.stderr);
    // The journal keeps the environments, for jobs started after a restart: its owner's only.
    let journal = std::fs::metadata(s.dir().join("journal.jsonl")).unwrap();
    assert_eq!(journal.permissions().mode() & 0o777, 0o600);
    s.fx.signal(s.daemon, 15);
    let stopped = s.fx.wait(s.daemon, GUARD);
    assert!(!stopped.stderr.contains("s3cret"), "{}", stopped.stderr);
}

#[test]
fn a_job_runs_only_on_the_gpus_its_submitter_was_given_and_one_given_others_is_refused() {
    // The scheduler has CUDA devices 2 and 1 of a simulated machine of 3 (its GPUs 0 and 1,
    // in that order); simulated GPU i stands for CUDA device i.
    let uuid = |i: u32| format!("GPU-00000000-0000-4000-8000-{i:012x}");
    let mut s = scheduler_given(&["CUDA_VISIBLE_DEVICES=2,1"], &[]);
    // (submitter's environment, options, the GPUs the job must see)
    let u1 = format!("CUDA_VISIBLE_DEVICES={}", uuid(1));
    let cases: [(&[&str], &[&str], &str); 4] = [
        // Left to itself the scheduler would take its first GPU, CUDA device 2.
        (&["CUDA_VISIBLE_DEVICES=1"], &[], &uuid(1)),
        (&[&u1], &[], &uuid(1)),
        (
            &["CUDA_VISIBLE_DEVICES=1,2"],
            &["--gpus-per-job", "2"],
            &format!("{},{}", uuid(2), uuid(1)),
        ),
        // --export NONE: the submitter's GPUs do not come with the job, nor confine it.
        (&["CUDA_VISIBLE_DEVICES=0"], &["--export", "NONE"], &uuid(2)),
    ];
    for (env, args, want) in cases {
        let out = s.file("cvd");
        let id = submit_in(
            &mut s,
            env,
            args,
            &format!("echo $CUDA_VISIBLE_DEVICES > {out}"),
        )
        .unwrap_or_else(|e| panic!("{env:?} {args:?} refused: {e}"));
        s.wait_for(id, &["succeeded"]);
        let seen = std::fs::read_to_string(&out).unwrap();
        assert_eq!(seen.trim(), want, "{env:?} {args:?}");
    }
    // A GPU of the machine the scheduler does not have: refused, naming both sets.
    let err = submit_in(&mut s, &["CUDA_VISIBLE_DEVICES=0"], &[], "true").unwrap_err();
    assert!(
        err.contains("CUDA_VISIBLE_DEVICES=0")
            && err.contains(&uuid(0))
            && err.contains(&uuid(1))
            && err.contains(&uuid(2))
            && err.contains("given by CUDA_VISIBLE_DEVICES=2,1"),
        "{err}"
    );
    // More GPUs than the submitter was given, and a device the machine lacks.
    let err = submit_in(
        &mut s,
        &["CUDA_VISIBLE_DEVICES=1"],
        &["--gpus-per-job", "2"],
        "true",
    )
    .unwrap_err();
    assert!(
        err.contains("asks for 2 GPUs") && err.contains("gives it 1"),
        "{err}"
    );
    let err = submit_in(&mut s, &["CUDA_VISIBLE_DEVICES=5"], &[], "true").unwrap_err();
    assert!(
        err.contains("CUDA device 5") && err.contains("3 GPUs"),
        "{err}"
    );
    // Nothing refused was queued: the four jobs above are all the scheduler knows.
    let q = s.queue();
    assert_eq!(q["jobs"].as_array().map_or(0, Vec::len), 4, "{q}");
}

#[test]
fn a_queued_job_whose_gpus_a_restarted_scheduler_lacks_is_cancelled_not_run_elsewhere() {
    // CUDA devices 2 and 1, one job at a time: a job given device 1 waits behind a blocker.
    let one_at_a_time = ["--policy", "exclusive"];
    let mut s = scheduler_given(&["CUDA_VISIBLE_DEVICES=2,1"], &one_at_a_time);
    let blocker = submit_in(&mut s, &["CUDA_VISIBLE_DEVICES=1"], &[], "sleep 600").unwrap();
    s.wait_for(blocker, &["running"]);
    let waiting = submit_in(&mut s, &["CUDA_VISIBLE_DEVICES=1"], &[], "true").unwrap();
    assert_eq!(s.job(waiting)["state"], "queued");
    // The scheduler comes back with device 2 only: the waiting job's GPU is not there.
    s.fx.signal(s.daemon, 9);
    s.fx.wait(s.daemon, GUARD);
    s.daemon = spawn_given(&mut s.fx, &["CUDA_VISIBLE_DEVICES=2"], &one_at_a_time);
    let job = s.wait_for(waiting, &["cancelled", "succeeded", "running"]);
    assert_eq!(job["state"], "cancelled", "{job}");
    // The blocker outlived the first scheduler and was adopted: nothing left running.
    let dir = s.dir_arg();
    let done =
        s.fx.run(&["cancel", "--dir", &dir, &blocker.to_string()], GUARD);
    assert!(done.status.success(), "{}", done.stderr);
}

#[test]
fn a_cuda_device_the_machine_lacks_is_refused_naming_it() {
    let mut fx = Fixture::new();
    let dir = fx.path().join("sched");
    let i = fx.spawn_program(&[
        "env",
        "-u",
        "SLURM_JOB_ID",
        "CUDA_VISIBLE_DEVICES=0,5",
        ladle_tests::ladle_bin().to_str().unwrap(),
        "scheduler",
        "--dir",
        dir.to_str().unwrap(),
        "--gpu",
        "sim",
        "--sim-gpus",
        "2",
    ]);
    let done = fx.wait(i, GUARD);
    assert!(!done.status.success());
    assert!(
        done.stderr.contains("CUDA device 5") && done.stderr.contains("2 GPUs"),
        "{}",
        done.stderr
    );
}

#[test]
fn a_gpu_with_another_users_process_is_not_idle_and_its_memory_counts() {
    // GPU 0 holds 30 GiB of an MPS client of someone else's, seen only through NVML's MPS
    // process call: a 20 GiB job does not fit there, though the scheduler runs nothing on it.
    let (_keep, path) = scenario(
        r#"{"gpus": [{"gpu": 0, "foreign": [{"pid": 999999, "mem_mib": 30720, "mps_only": true}]}]}"#,
    );
    let mut s = Scheduler::start(2, &["--sim-scenario", &path]);
    let release = s.file("release");
    let hold = format!("while [ ! -e {release} ]; do sleep 0.05; done");
    let big = s.submit(&["--gpu-mem", "20GiB"], &hold);
    assert_eq!(gpus_of(&mut s, big), serde_json::json!([1]));
    std::fs::write(&release, "").unwrap();
    s.wait_for(big, &["succeeded"]);
}

#[test]
fn a_gpu_whose_process_query_fails_is_not_taken_for_idle() {
    // NVML's MPS process call fails on GPU 0: its process list is unknown, not empty, so an
    // idle-looking GPU 0 is not where a job that must run alone goes.
    let (_keep, path) = scenario(r#"{"gpus": [{"gpu": 0, "failing": ["mps_processes"]}]}"#);
    let mut s = Scheduler::start(2, &["--sim-scenario", &path]);
    let release = s.file("release");
    let hold = format!("while [ ! -e {release} ]; do sleep 0.05; done");
    let guess = s.submit(&[], &hold);
    assert_eq!(gpus_of(&mut s, guess), serde_json::json!([1]));
    std::fs::write(&release, "").unwrap();
    s.wait_for(guess, &["succeeded"]);
}

#[test]
fn a_gpu_whose_sample_fails_takes_no_job_until_it_answers() {
    // Every memory query of GPU 0 fails: its last sample is stale, so it takes nothing.
    let (_keep, path) = scenario(r#"{"gpus": [{"gpu": 0, "failing": ["memory_info"]}]}"#);
    let mut s = Scheduler::start_unchecked(2, &["--sim-scenario", &path]);
    let release = s.file("release");
    let hold = format!("while [ ! -e {release} ]; do sleep 0.05; done");
    let a = s.submit(&["--gpu-mem", "1GiB"], &hold);
    assert_eq!(gpus_of(&mut s, a), serde_json::json!([1]));
    std::fs::write(&release, "").unwrap();
    s.wait_for(a, &["succeeded"]);
}

#[test]
fn a_gpu_in_exclusive_process_mode_without_mps_runs_one_job_at_a_time() {
    let (_keep, path) = scenario(r#"{"gpus": [{"gpu": 0, "compute_mode": "exclusive_process"}]}"#);
    let mut s = Scheduler::start(1, &["--sim-scenario", &path]);
    let release = s.file("release");
    let hold = format!("while [ ! -e {release} ]; do sleep 0.05; done");
    let first = s.submit(&["--gpu-mem", "1GiB"], &hold);
    s.wait_for(first, &["running"]);
    let second = s.submit(&["--gpu-mem", "1GiB"], "true");
    // Twenty admission rounds with the second job queued: in the default mode a 1 GiB job
    // joins a GPU in the first round whose sample is fresh. The daemon counts its rounds,
    // so the test waits for them, not for a time.
    let after_submit = s.queue()["admission_rounds"].as_u64().unwrap();
    wait_until("twenty admission rounds", GUARD, || {
        let q = s.queue();
        let job = q["jobs"]
            .as_array()
            .unwrap()
            .iter()
            .find(|j| j["id"] == second)
            .unwrap();
        assert_eq!(job["state"], "queued", "{q}");
        if q["admission_rounds"].as_u64().unwrap() >= after_submit + 20 {
            Ok(Some(()))
        } else {
            Err(format!("no admission rounds: {q}"))
        }
    });
    std::fs::write(&release, "").unwrap();
    s.wait_for(second, &["succeeded"]);
}

#[test]
fn under_its_mps_a_scheduler_leaves_a_gpu_to_another_users_mps_server() {
    // Every GPU shows another user's MPS server (NVIDIA's MPS serves one user per GPU at a
    // time). Under this scheduler's own MPS (a stand-in control program) a job waits; without
    // MPS it shares the GPU as with any other user's process.
    let server = r#"{"pid": 999998, "mem_mib": 300, "other_users_mps_server": true}"#;
    let gpus: Vec<String> = (0..3)
        .map(|g| format!(r#"{{"gpu": {g}, "foreign": [{server}]}}"#))
        .collect();
    let (keep, path) = scenario(&format!(r#"{{"gpus": [{}]}}"#, gpus.join(", ")));
    let bin = keep.path().join("bin");
    std::fs::create_dir(&bin).unwrap();
    let control = bin.join("nvidia-cuda-mps-control");
    std::fs::write(&control, "#!/bin/sh\n[ \"$1\" = -d ] || cat >/dev/null\n").unwrap();
    std::fs::set_permissions(&control, std::fs::Permissions::from_mode(0o755)).unwrap();
    let with_path = format!(
        "PATH={}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let mut s = scheduler_given(&[&with_path], &["--sim-scenario", &path, "--mps", "on"]);
    let id = s.submit(&["--gpu-mem", "1GiB"], "true");
    // A GPU someone else uses takes a job only once its telemetry window is full: from then
    // on, twenty admission rounds.
    let after_full = wait_until("full telemetry windows", GUARD, || {
        let q = s.queue();
        let full = (q["gpus"].as_array().unwrap().iter()).all(|g| g["window_full"] == true);
        Ok::<_, String>(full.then(|| q["admission_rounds"].as_u64().unwrap()))
    });
    wait_until("twenty admission rounds", GUARD, || {
        let q = s.queue();
        let job = (q["jobs"].as_array().unwrap().iter()).find(|j| j["id"] == id);
        assert_eq!(job.unwrap()["state"], "queued", "{q}");
        let rounds = q["admission_rounds"].as_u64().unwrap();
        Ok::<_, String>((rounds >= after_full + 20).then_some(()))
    });
    let dir = s.dir_arg();
    let cancel = s.fx.run(&["cancel", "--dir", &dir, &id.to_string()], GUARD);
    assert!(cancel.status.success(), "{}", cancel.stderr);
    s.fx.signal(s.daemon, 15);
    s.fx.wait(s.daemon, GUARD);
    let mut s = scheduler_given(&[], &["--sim-scenario", &path]);
    let id = s.submit(&["--gpu-mem", "1GiB"], "true");
    s.wait_for(id, &["succeeded"]);
}
