//! `ladle top`: a live terminal view of the scheduler's GPUs and jobs and of every feed's
//! consumers, redrawn about once a second.
//!
//! What it shows, top to bottom:
//! - a header: the scheduler's socket and policy, its queued / running / done / failed jobs,
//!   admissions and out-of-memory retries since it started, and the time of the look (UTC);
//! - GPUs: index, name, memory used of total (a bar and %), utilisation, SM activity (`–`
//!   where the GPU does not expose it), the scheduler's risk score, its jobs there;
//! - jobs: id, run name (`LADLE_RUN`, as a sweep names its runs), state, GPUs, memory
//!   estimate, observed peak, attempts and OOM retries; running and queued first, then the
//!   most recent finished ones;
//! - per feed: samples published, decode rate, bad samples, ring occupancy of capacity,
//!   the producer's CPU use in cores; then its consumers: batch size, epochs, samples/s, lag,
//!   seconds it has held the feed back (`HOLDING` while it does so now), seconds it has
//!   waited for data, rejoins;
//! - a footer, in red, with whatever could not be read this time (a feed or the scheduler
//!   that stopped answering): the view goes on with what did answer.
//!
//! Where the data comes from: nothing but the existing sockets, no metrics port. A fetch
//! thread asks the scheduler (`Queue` and `Feeds` requests on its socket; every feed
//! registered with it is watched) and each feed (a `Stats` request on its own control
//! socket, plus the feeds named with `--feed`) through [`ladle_observe::Sockets`], and turns
//! the answers into [`Rows`] with [`ladle_observe::Rates`]: the same rows `--metrics` and
//! `--record` serve, so all three agree. The thread hands each look to the drawing loop over
//! a channel, so a feed that takes its full `LOOK_TIMEOUT` to not answer never holds up a
//! key press.
//!
//! Drawing is a pure function of the rows and the view's state ([`draw`]); `--once` draws
//! one frame into an off-screen buffer and prints it as plain text (for scripts and docs).
//!
//! Keys: `q`, Esc or Ctrl-C quit; `p` pauses and resumes the display. The terminal is
//! restored on every way out (quit, error, SIGTERM, panic).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use clap::Args;
use crossterm::event::{self, Event, KeyCode, KeyEventKind, KeyModifiers};
use ladle_observe::series::{ConsumerRow, FeedRow, JobRow};
use ladle_observe::{LOOK_TIMEOUT, Rates, Rows, Sockets, Source};
use ladle_scheduler::daemon;
use ladle_scheduler::protocol::{self, Request};
use ratatui::Frame;
use ratatui::backend::TestBackend;
use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::style::{Color, Modifier, Style};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, Borders, Cell, Paragraph, Row, Table};

use crate::scheduler::DirArg;

/// How long the drawing loop waits for a key before it looks for new rows.
const KEY_POLL: Duration = Duration::from_millis(100);

/// Most finished jobs listed (after every running and queued one).
const FINISHED_SHOWN: usize = 8;

/// Width of `--once`'s frame when `$COLUMNS` does not say.
const ONCE_WIDTH: u16 = 160;

#[derive(Debug, Args)]
pub(crate) struct TopArgs {
    #[command(flatten)]
    dir: DirArg,
    /// Also watch the feed on this control socket (repeatable); with --feed, a scheduler
    /// that does not answer is left out instead of being an error.
    #[arg(long = "feed", value_name = "SOCKET")]
    feeds: Vec<PathBuf>,
    /// Seconds between looks.
    #[arg(long, value_name = "SECONDS", default_value_t = 1.0)]
    interval: f64,
    /// Print one frame as plain text on stdout and exit (two looks an interval apart, so
    /// that rates are real); no terminal needed.
    #[arg(long)]
    once: bool,
}

/// What the view shows besides the rows.
#[derive(Debug, Clone, Default)]
pub(crate) struct ViewState {
    /// The scheduler's socket, if one is watched.
    pub(crate) scheduler: Option<PathBuf>,
    /// The latest rows; `None` before the first look.
    pub(crate) rows: Option<Rows>,
    /// Display frozen (`p`).
    pub(crate) paused: bool,
    /// Whether to show the key help (not in `--once`).
    pub(crate) keys: bool,
}

pub(crate) fn run(args: TopArgs) -> anyhow::Result<()> {
    if !(args.interval.is_finite() && args.interval > 0.0) {
        bail!(
            "--interval {}: must be a positive number of seconds",
            args.interval
        );
    }
    let interval = Duration::from_secs_f64(args.interval);
    let source = sources(&args)?;
    let mut state = ViewState {
        scheduler: source.scheduler.clone(),
        rows: None,
        paused: false,
        keys: !args.once,
    };
    if args.once {
        let mut rates = Rates::default();
        rates.rows(&source.clone().look());
        std::thread::sleep(interval);
        state.rows = Some(rates.rows(&source.clone().look()));
        let width = std::env::var("COLUMNS")
            .ok()
            .and_then(|c| c.parse().ok())
            .unwrap_or(ONCE_WIDTH);
        print!("{}", render_text(&state, width));
        return Ok(());
    }
    live(source, interval, state)
}

/// The scheduler (if any) and feeds to watch, checked once: with no `--feed`, a scheduler
/// that does not answer is an error naming its socket.
fn sources(args: &TopArgs) -> anyhow::Result<Sockets> {
    let feeds: Vec<(String, PathBuf)> = args
        .feeds
        .iter()
        .map(|socket| {
            // The scheduler knows feeds by canonical socket path: the same one twice is
            // watched once.
            let socket = socket.canonicalize().unwrap_or_else(|_| socket.clone());
            (file_name(&socket), socket)
        })
        .collect();
    let socket = match args.dir.resolve() {
        Ok(dir) => Some(daemon::socket_path(&dir)),
        Err(e) if feeds.is_empty() => return Err(e.context("finding the scheduler")),
        Err(_) => None,
    };
    let answer = socket
        .as_deref()
        .map(|s| protocol::request(s, &Request::Queue, LOOK_TIMEOUT));
    let scheduler = match (socket, answer) {
        (Some(socket), Some(Ok(_))) => Some(socket),
        // Named on purpose: watch it, and show that it does not answer.
        (Some(socket), Some(Err(_))) if !feeds.is_empty() && args.dir.dir.is_some() => Some(socket),
        (Some(_), Some(Err(_))) if !feeds.is_empty() => None,
        (Some(socket), Some(Err(e))) => {
            // An I/O error names the socket already; the others do not.
            let e = e.to_string();
            let on = if e.contains(&*socket.to_string_lossy()) {
                String::new()
            } else {
                format!(" on {}", socket.display())
            };
            bail!(
                "no scheduler answers{on}: {e}. Start one with `ladle scheduler` (or `ladle \
                 sweep`), point at its state directory with --dir, or watch a feed with --feed \
                 SOCKET"
            )
        }
        _ => None,
    };
    Ok(Sockets {
        feeds,
        scheduler_feeds: scheduler.is_some(),
        scheduler,
    })
}

/// Restores the terminal when dropped: on return, on error and while unwinding.
struct TerminalGuard;

impl Drop for TerminalGuard {
    fn drop(&mut self) {
        ratatui::restore();
    }
}

/// The live view, until a quit key or SIGINT / SIGTERM / SIGHUP.
fn live(mut source: Sockets, interval: Duration, mut state: ViewState) -> anyhow::Result<()> {
    let stop = Arc::new(AtomicBool::new(false));
    for signal in [
        signal_hook::consts::SIGINT,
        signal_hook::consts::SIGTERM,
        signal_hook::consts::SIGHUP,
    ] {
        signal_hook::flag::register(signal, stop.clone()).context("installing signal handlers")?;
    }
    let (tx, rx) = mpsc::channel::<Rows>();
    // The fetch thread is never joined: a look can take LOOK_TIMEOUT per socket, and quitting
    // must not wait for it. It ends when it finds the channel closed, or with the process.
    std::thread::Builder::new()
        .name("ladle-top-fetch".into())
        .spawn(move || {
            let mut rates = Rates::default();
            loop {
                let started = Instant::now();
                if tx.send(rates.rows(&source.look())).is_err() {
                    return;
                }
                std::thread::sleep(interval.saturating_sub(started.elapsed()));
            }
        })
        .context("starting the fetch thread")?;
    // `init` also installs a panic hook that restores the terminal before the panic message.
    let mut terminal = ratatui::init();
    let _guard = TerminalGuard;
    while !stop.load(Ordering::SeqCst) {
        loop {
            match rx.try_recv() {
                Ok(rows) if !state.paused => state.rows = Some(rows),
                Ok(_) => {}
                Err(mpsc::TryRecvError::Empty) => break,
                Err(mpsc::TryRecvError::Disconnected) => bail!("the fetch thread stopped"),
            }
        }
        terminal
            .draw(|frame| draw(frame, &state))
            .context("drawing the view")?;
        if !event::poll(KEY_POLL).context("reading the terminal")? {
            continue;
        }
        match event::read().context("reading the terminal")? {
            Event::Key(key) if key.kind != KeyEventKind::Release => match key.code {
                KeyCode::Char('q') | KeyCode::Esc => break,
                KeyCode::Char('c') if key.modifiers.contains(KeyModifiers::CONTROL) => break,
                KeyCode::Char('p') => state.paused = !state.paused,
                _ => {}
            },
            _ => {}
        }
    }
    Ok(())
}

/// One frame of `state`, `width` columns wide and as tall as it needs, as plain text lines
/// (trailing blanks trimmed).
pub(crate) fn render_text(state: &ViewState, width: u16) -> String {
    let height = needed_height(state.rows.as_ref());
    let drawn = ratatui::Terminal::new(TestBackend::new(width, height)).and_then(|mut terminal| {
        terminal.draw(|frame| draw(frame, state))?;
        Ok(buffer_text(terminal.backend().buffer()))
    });
    drawn.unwrap_or_else(|e| format!("drawing failed: {e}\n"))
}

/// A buffer's cells as lines of text.
fn buffer_text(buffer: &ratatui::buffer::Buffer) -> String {
    let area = buffer.area;
    let mut out = String::new();
    for y in area.top()..area.bottom() {
        let mut line = String::new();
        for x in area.left()..area.right() {
            if let Some(cell) = buffer.cell((x, y)) {
                line.push_str(cell.symbol());
            }
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

/// Lines the whole view needs.
fn needed_height(rows: Option<&Rows>) -> u16 {
    let Some(rows) = rows else { return 3 };
    let mut lines = 1 + 1; // header, footer
    if rows.scheduler.is_some() {
        lines += table_height(rows.gpus.len()) + table_height(shown_jobs(&rows.jobs).len());
    }
    for feed in &rows.feeds {
        lines += table_height(consumers_of(rows, feed).len());
    }
    lines += rows.errors.len();
    u16::try_from(lines).unwrap_or(u16::MAX)
}

/// A bordered table of `n` rows: top border, header, rows, bottom border.
fn table_height(n: usize) -> usize {
    n.max(1) + 3
}

/// Draws the whole view of `state` into `frame`.
pub(crate) fn draw(frame: &mut Frame<'_>, state: &ViewState) {
    let area = frame.area();
    let Some(rows) = &state.rows else {
        let header = header_line(state, None);
        let waiting = Line::from("waiting for the first look…");
        frame.render_widget(Paragraph::new(vec![header, waiting]), area);
        return;
    };
    let jobs = shown_jobs(&rows.jobs);
    let mut constraints = vec![Constraint::Length(1)];
    if rows.scheduler.is_some() {
        constraints.push(length(table_height(rows.gpus.len())));
        constraints.push(length(table_height(jobs.len())));
    }
    let feeds: Vec<(&FeedRow, Vec<&ConsumerRow>)> = rows
        .feeds
        .iter()
        .map(|f| (f, consumers_of(rows, f)))
        .collect();
    for (_, consumers) in &feeds {
        constraints.push(length(table_height(consumers.len())));
    }
    constraints.push(length(rows.errors.len().max(1)));
    constraints.push(Constraint::Min(0));
    let areas = Layout::vertical(constraints).split(area);
    let mut next = areas.iter().copied();
    let mut take = || next.next().unwrap_or_default();
    frame.render_widget(Paragraph::new(header_line(state, Some(rows))), take());
    if rows.scheduler.is_some() {
        draw_gpus(frame, take(), rows);
        draw_jobs(frame, take(), &jobs);
    }
    for (feed, consumers) in &feeds {
        draw_feed(frame, take(), feed, consumers);
    }
    let footer: Vec<Line<'_>> = if rows.errors.is_empty() {
        vec![Line::from(Span::styled(
            format!("{} feed(s), no errors", rows.feeds.len()),
            Style::default().fg(Color::DarkGray),
        ))]
    } else {
        rows.errors
            .iter()
            .map(|e| Line::from(Span::styled(printable(e), Style::default().fg(Color::Red))))
            .collect()
    };
    frame.render_widget(Paragraph::new(footer), take());
}

fn length(n: usize) -> Constraint {
    Constraint::Length(u16::try_from(n).unwrap_or(u16::MAX))
}

fn header_line(state: &ViewState, rows: Option<&Rows>) -> Line<'static> {
    let bold = Style::default().add_modifier(Modifier::BOLD);
    let mut spans = vec![Span::styled("ladle top", bold)];
    match &state.scheduler {
        Some(socket) => spans.push(Span::raw(format!(
            "  scheduler {}",
            printable(&socket.display().to_string())
        ))),
        None => spans.push(Span::raw("  no scheduler")),
    }
    if let Some(s) = rows.and_then(|r| r.scheduler.as_ref()) {
        spans.push(Span::raw(format!(
            "  policy {}  queued {}  running {}  done {}  failed {}  admissions {}  OOM retries {}",
            printable(&s.policy),
            s.queued,
            s.running,
            s.succeeded,
            s.failed,
            s.admissions,
            s.oom_retries
        )));
    } else if state.scheduler.is_some() && rows.is_some() {
        spans.push(Span::styled(
            "  not answering",
            Style::default().fg(Color::Red),
        ));
    }
    if let Some(rows) = rows {
        spans.push(Span::raw(format!("  {}", clock(rows.time))));
    }
    if state.paused {
        spans.push(Span::styled("  PAUSED", bold.fg(Color::Yellow)));
    }
    if state.keys {
        spans.push(Span::styled(
            "  (q quit, p pause)",
            Style::default().fg(Color::DarkGray),
        ));
    }
    Line::from(spans)
}

/// Unix time as `HH:MM:SS UTC`.
fn clock(unix: f64) -> String {
    let s = unix.max(0.0) as u64 % 86_400;
    format!("{:02}:{:02}:{:02} UTC", s / 3600, s / 60 % 60, s % 60)
}

fn block(title: String) -> Block<'static> {
    Block::default().borders(Borders::ALL).title(Span::styled(
        title,
        Style::default().add_modifier(Modifier::BOLD),
    ))
}

fn header_row(cells: &[&'static str]) -> Row<'static> {
    Row::new(cells.iter().copied().map(Cell::from))
        .style(Style::default().add_modifier(Modifier::BOLD | Modifier::UNDERLINED))
}

fn draw_gpus(frame: &mut Frame<'_>, area: Rect, rows: &Rows) {
    let body: Vec<Row<'_>> = rows
        .gpus
        .iter()
        .map(|g| {
            let share = if g.memory_total_mib > 0 {
                g.memory_used_mib as f64 / g.memory_total_mib as f64
            } else {
                0.0
            };
            Row::new(vec![
                Cell::from(g.gpu.to_string()),
                Cell::from(printable(&g.name)),
                Cell::from(format!(
                    "{} {:>3.0}% {}/{}",
                    bar(share, 10),
                    share * 100.0,
                    gib(g.memory_used_mib),
                    gib(g.memory_total_mib)
                )),
                Cell::from(percent(g.utilization)),
                Cell::from(g.sm_activity.map_or_else(|| "–".to_owned(), percent)),
                Cell::from(format!("{:.2}", non_negative(g.sm_activity_risk))),
                Cell::from(g.jobs.to_string()),
            ])
        })
        .collect();
    let widths = [
        Constraint::Length(3),
        Constraint::Length(24),
        Constraint::Length(34),
        Constraint::Length(5),
        Constraint::Length(7),
        Constraint::Length(5),
        Constraint::Length(4),
    ];
    let table = Table::new(body, widths)
        .header(header_row(&[
            "GPU", "name", "memory", "util", "SM act", "risk", "jobs",
        ]))
        .block(block(match &rows.gpus_from {
            Some(from) => format!("GPUs ({}, given by {from})", rows.gpus.len()),
            None => format!("GPUs ({}, every GPU of this machine)", rows.gpus.len()),
        }));
    frame.render_widget(table, area);
}

/// Running and queued jobs, then the most recent finished ones.
fn shown_jobs(jobs: &[JobRow]) -> Vec<&JobRow> {
    let rank = |j: &JobRow| match j.state.as_str() {
        "running" => 0,
        "queued" => 1,
        _ => 2,
    };
    let mut live: Vec<&JobRow> = jobs.iter().filter(|j| rank(j) < 2).collect();
    live.sort_by_key(|j| (rank(j), j.id));
    let mut finished: Vec<&JobRow> = jobs.iter().filter(|j| rank(j) == 2).collect();
    finished.sort_by_key(|j| std::cmp::Reverse(j.id));
    finished.truncate(FINISHED_SHOWN);
    live.extend(finished);
    live
}

fn draw_jobs(frame: &mut Frame<'_>, area: Rect, jobs: &[&JobRow]) {
    let body: Vec<Row<'_>> = jobs
        .iter()
        .map(|j| {
            let color = match j.state.as_str() {
                "running" => Color::Green,
                "queued" => Color::Yellow,
                "succeeded" => Color::Reset,
                _ => Color::Red,
            };
            Row::new(vec![
                Cell::from(j.id.to_string()),
                Cell::from(printable(&j.name)),
                Cell::from(Span::styled(
                    printable(&j.state),
                    Style::default().fg(color),
                )),
                Cell::from(if j.gpus.is_empty() {
                    "–".to_owned()
                } else {
                    printable(&j.gpus)
                }),
                Cell::from(gib(j.estimate_mib)),
                Cell::from(j.peak_mib.map_or_else(|| "–".to_owned(), gib)),
                Cell::from(format!("{} / {}", j.attempts, j.oom_retries)),
                Cell::from(printable(&j.feed)),
            ])
        })
        .collect();
    let widths = [
        Constraint::Length(5),
        Constraint::Length(16),
        Constraint::Length(11),
        Constraint::Length(5),
        Constraint::Length(9),
        Constraint::Length(9),
        Constraint::Length(11),
        Constraint::Min(10),
    ];
    let table = Table::new(body, widths)
        .header(header_row(&[
            "id",
            "run",
            "state",
            "GPUs",
            "estimate",
            "peak",
            "tries / OOM",
            "feed",
        ]))
        .block(block(format!("Jobs ({})", jobs.len())));
    frame.render_widget(table, area);
}

fn consumers_of<'r>(rows: &'r Rows, feed: &FeedRow) -> Vec<&'r ConsumerRow> {
    let mut consumers: Vec<&ConsumerRow> = rows
        .consumers
        .iter()
        .filter(|c| c.feed == feed.feed)
        .collect();
    consumers.sort_by(|a, b| a.name.cmp(&b.name).then(a.id.cmp(&b.id)));
    consumers
}

fn draw_feed(frame: &mut Frame<'_>, area: Rect, feed: &FeedRow, consumers: &[&ConsumerRow]) {
    let occupancy = if feed.capacity > 0 {
        feed.occupancy as f64 / feed.capacity as f64
    } else {
        0.0
    };
    let cache = feed.cache_hit_rate().map_or_else(String::new, |rate| {
        format!(
            "  cache {:.0}% hits ({} decodes saved)",
            rate * 100.0,
            feed.cache_hits
        )
    });
    let title = format!(
        "Feed {}  published {}  decode {:.0}/s  bad {}  ring {}/{} ({:.0}%)  producer {:.1} cores  consumers {}{cache}",
        printable(&feed.feed),
        feed.published,
        feed.decode_rate,
        feed.bad,
        feed.occupancy,
        feed.capacity,
        occupancy * 100.0,
        feed.cpu_cores,
        feed.consumers,
    );
    let body: Vec<Row<'_>> = consumers
        .iter()
        .map(|c| {
            let held = format!("{:.1}", c.held_back_s);
            let held = if c.holding_back {
                Cell::from(Line::from(vec![
                    Span::raw(held),
                    Span::styled(
                        " HOLDING",
                        Style::default().fg(Color::Red).add_modifier(Modifier::BOLD),
                    ),
                ]))
            } else {
                Cell::from(held)
            };
            Row::new(vec![
                Cell::from(printable(&c.name)),
                Cell::from(c.pid.to_string()),
                Cell::from(c.batch_size.to_string()),
                Cell::from(format!("{:.2}", c.epochs)),
                Cell::from(format!("{:.0}", c.samples_per_s)),
                Cell::from(c.lag.to_string()),
                held,
                Cell::from(format!("{:.1}", c.waited_s)),
                Cell::from(c.rejoins.to_string()),
                Cell::from(if c.skimming {
                    "skims"
                } else if c.attached {
                    ""
                } else {
                    "let go"
                }),
            ])
        })
        .collect();
    let widths = [
        Constraint::Length(16),
        Constraint::Length(8),
        Constraint::Length(6),
        Constraint::Length(8),
        Constraint::Length(10),
        Constraint::Length(8),
        Constraint::Length(17),
        Constraint::Length(9),
        Constraint::Length(8),
        Constraint::Min(6),
    ];
    let table = Table::new(body, widths)
        .header(header_row(&[
            "consumer",
            "pid",
            "batch",
            "epochs",
            "samples/s",
            "lag",
            "held back s",
            "waited s",
            "rejoins",
            "",
        ]))
        .block(block(title));
    frame.render_widget(table, area);
}

/// A bar of `width` cells, `share` (0 – 1) of them full.
fn bar(share: f64, width: usize) -> String {
    let full = ((share.clamp(0.0, 1.0) * width as f64).round() as usize).min(width);
    format!("{}{}", "█".repeat(full), "░".repeat(width - full))
}

/// A share (0 – 1) in whole percent; never `-0%`.
fn percent(share: f64) -> String {
    format!("{:.0}%", non_negative(share * 100.0))
}

/// `x`, at least +0 (`-0.0` and small negatives print as `0`).
fn non_negative(x: f64) -> f64 {
    // `max` may keep -0.0; adding +0.0 turns it into +0.0.
    x.max(0.0) + 0.0
}

/// MiB as GiB with one decimal.
fn gib(mib: u64) -> String {
    format!("{:.1}G", mib as f64 / 1024.0)
}

/// `text` safe to hand to the terminal: names come from other processes (a consumer names
/// itself), and a control character drawn as it is (`\x1b[2J`, an OSC title sequence) would
/// be obeyed by the terminal, not shown. Each is shown escaped instead (`\u{1b}[2J`).
fn printable(text: &str) -> String {
    if !text.chars().any(char::is_control) {
        return text.to_owned();
    }
    text.chars()
        .map(|c| {
            if c.is_control() {
                c.escape_default().to_string()
            } else {
                c.to_string()
            }
        })
        .collect()
}

/// A socket's file name: a feed's name when it is watched with `--feed`.
fn file_name(socket: &Path) -> String {
    socket.file_name().map_or_else(
        || socket.display().to_string(),
        |f| f.to_string_lossy().into_owned(),
    )
}

#[cfg(test)]
mod tests;
