#![allow(clippy::unwrap_used)] // tests fail loudly by design

use ladle_observe::series::{GpuRow, SchedulerRow};

use super::*;

fn rows() -> Rows {
    let time = 1_700_000_000.0;
    let job = |id: u64, name: &str, state: &str, gpus: &str| JobRow {
        time,
        id,
        name: name.into(),
        state: state.into(),
        gpus: gpus.into(),
        feed: "sweep-42".into(),
        estimate_mib: 4096,
        peak_mib: Some(3000),
        attempts: 1,
        oom_retries: 0,
    };
    let consumer = |id: u64, name: &str, holding_back: bool| ConsumerRow {
        time,
        feed: "sweep-42".into(),
        id,
        name: name.into(),
        pid: 1000 + id as u32,
        batch_size: 32,
        released: 1500,
        epochs: 2.5,
        samples_per_s: 640.0,
        lag: 48,
        attached: true,
        held_back_s: 3.25,
        waited_s: 1.5,
        holding_back,
        rejoins: 0,
        skimming: false,
    };
    Rows {
        gpus_from: Some("CUDA_VISIBLE_DEVICES=0 (CUDA's order)".into()),
        time,
        feeds: vec![FeedRow {
            time,
            feed: "sweep-42".into(),
            published: 12_345,
            bad: 2,
            decode_rate: 1234.0,
            occupancy: 48,
            capacity: 64,
            consumers: 2,
            joins: 2,
            leaves: 0,
            let_gos: 0,
            cpu_s: 30.0,
            cpu_cores: 1.5,
            dataset_len: 600,
            threads: 2,
            cache_hits: 1860,
            cache_misses: 140,
            cache_fills: 140,
        }],
        consumers: vec![consumer(2, "run-01", false), consumer(1, "run-00", true)],
        scheduler: Some(SchedulerRow {
            time,
            policy: "ladle".into(),
            queued: 1,
            running: 2,
            succeeded: 1,
            failed: 0,
            admissions: 3,
            oom_retries: 0,
        }),
        gpus: vec![GpuRow {
            time,
            gpu: 0,
            name: "Simulated GPU".into(),
            memory_used_mib: 20_480,
            memory_total_mib: 40_960,
            utilization: 0.5,
            sm_activity: None,
            sm_activity_risk: 0.25,
            jobs: 2,
        }],
        jobs: vec![
            job(0, "run-03", "succeeded", ""),
            job(1, "run-00", "running", "0"),
            job(2, "run-01", "running", "0"),
            job(3, "run-02", "queued", ""),
        ],
        errors: vec![],
    }
}

fn state(rows: Rows) -> ViewState {
    ViewState {
        scheduler: Some("/tmp/s/scheduler.sock".into()),
        rows: Some(rows),
        paused: false,
        keys: true,
    }
}

fn screen(state: &ViewState) -> String {
    let mut terminal = ratatui::Terminal::new(TestBackend::new(160, 40)).unwrap();
    terminal.draw(|frame| draw(frame, state)).unwrap();
    buffer_text(terminal.backend().buffer())
}

#[test]
fn the_view_shows_the_header_gpus_jobs_feed_and_consumers() {
    let text = screen(&state(rows()));
    let line = |needle: &str| {
        text.lines()
            .find(|l| l.contains(needle))
            .unwrap_or_else(|| panic!("no line with {needle:?} in\n{text}"))
    };
    let header = line("ladle top");
    for part in [
        "/tmp/s/scheduler.sock",
        "policy ladle",
        "queued 1",
        "running 2",
    ] {
        assert!(header.contains(part), "{header}");
    }
    // The GPUs block says which GPUs the scheduler was given, and by what.
    line("GPUs (1, given by CUDA_VISIBLE_DEVICES=0 (CUDA's order))");
    let gpu = line("Simulated GPU");
    for part in ["50%", "20.0G/40.0G", "0.25", "–"] {
        assert!(gpu.contains(part), "{gpu}");
    }
    for run in ["run-00", "run-01", "run-02", "run-03"] {
        line(run);
    }
    let feed = line("Feed sweep-42");
    for part in [
        "published 12345",
        "decode 1234/s",
        "ring 48/64 (75%)",
        "1.5 cores",
        "cache 93% hits (1860 decodes saved)",
    ] {
        assert!(feed.contains(part), "{feed}");
    }
    line("no errors");
}

#[test]
fn running_and_queued_jobs_come_before_finished_ones() {
    let text = screen(&state(rows()));
    let at = |s: &str| text.find(&format!("{s}  ")).unwrap();
    // In the jobs table (before the feed's consumers list them again).
    assert!(at("running") < at("queued"), "{text}");
    assert!(at("queued") < at("succeeded"), "{text}");
}

#[test]
fn a_consumer_holding_the_feed_back_now_is_marked_holding() {
    let text = screen(&state(rows()));
    let consumers: Vec<&str> = text
        .lines()
        .skip_while(|l| !l.contains("Feed sweep-42"))
        .collect();
    let holding = consumers.iter().find(|l| l.contains("run-00")).unwrap();
    assert!(holding.contains("HOLDING"), "{text}");
    let not = consumers.iter().find(|l| l.contains("run-01")).unwrap();
    assert!(!not.contains("HOLDING"), "{text}");
}

#[test]
fn what_could_not_be_read_is_shown_in_the_footer_and_the_rest_still_draws() {
    let mut rows = rows();
    rows.scheduler = None;
    rows.gpus.clear();
    rows.jobs.clear();
    rows.errors = vec!["scheduler: connection refused".into()];
    let text = screen(&state(rows));
    assert!(text.contains("not answering"), "{text}");
    assert!(text.contains("scheduler: connection refused"), "{text}");
    assert!(text.contains("Feed sweep-42"), "{text}");
}

#[test]
fn the_once_frame_is_as_tall_as_its_content_and_has_no_key_help() {
    let mut state = state(rows());
    state.keys = false;
    let text = render_text(&state, 120);
    assert!(!text.contains("q quit"), "{text}");
    assert!(text.contains("run-01"), "{text}");
    // The footer is the last line: nothing was cut off.
    assert!(text.trim_end().ends_with("no errors"), "{text}");
}

#[test]
fn an_idle_gpu_shows_zero_not_minus_zero() {
    assert_eq!(percent(-0.0), "0%");
    assert_eq!(format!("{:.2}", non_negative(-0.0)), "0.00");
}

/// Every cell of `state` drawn `width` × `height`.
fn cells(state: &ViewState, width: u16, height: u16) -> Vec<String> {
    let mut terminal = ratatui::Terminal::new(TestBackend::new(width, height)).unwrap();
    terminal.draw(|frame| draw(frame, state)).unwrap();
    let buffer = terminal.backend().buffer();
    buffer
        .content()
        .iter()
        .map(|c| c.symbol().to_owned())
        .collect()
}

#[test]
fn control_characters_in_names_are_shown_escaped_never_sent_to_the_terminal() {
    let evil = "\x1b[2J\x1b]0;pwned\x07run\r\n";
    let mut rows = rows();
    rows.consumers[0].name = evil.into();
    rows.feeds[0].feed = format!("feed{evil}");
    for c in &mut rows.consumers {
        c.feed = rows.feeds[0].feed.clone();
    }
    rows.jobs[0].name = evil.into();
    rows.jobs[0].feed = evil.into();
    rows.gpus[0].name = evil.into();
    rows.scheduler.as_mut().unwrap().policy = evil.into();
    rows.errors = vec![format!("feed {evil}: refused")];
    let mut state = state(rows);
    state.scheduler = Some(format!("/tmp/{evil}.sock").into());
    let drawn = cells(&state, 200, 40);
    let raw: Vec<&String> = drawn
        .iter()
        .filter(|s| s.contains(char::is_control))
        .collect();
    assert!(raw.is_empty(), "control characters drawn: {raw:?}");
    let text = drawn.concat();
    assert!(text.contains("\\u{1b}[2J"), "{text}");
    let once = render_text(&state, 200);
    assert!(!once.contains(['\x1b', '\x07', '\r']), "{once:?}");
}

#[test]
fn tiny_and_empty_terminals_draw_without_panicking() {
    let mut many = rows();
    for id in 10..40 {
        let mut c = many.consumers[0].clone();
        c.id = id;
        many.consumers.push(c);
    }
    many.errors = vec!["x".repeat(500); 20];
    for state in [state(rows()), state(many), ViewState::default()] {
        for (width, height) in [(20, 5), (1, 1), (0, 0), (3, 40), (300, 2)] {
            cells(&state, width, height);
        }
        render_text(&state, 0);
        render_text(&state, 1);
    }
}

#[test]
fn before_the_first_look_the_view_says_it_is_waiting() {
    let text = screen(&ViewState::default());
    assert!(text.contains("waiting for the first look"), "{text}");
    assert!(text.contains("no scheduler"), "{text}");
}
