//! Progress bars on stderr, drawn only when stderr is a terminal.

use indicatif::{ProgressBar, ProgressStyle};

/// A bar counting `len` items, labelled `what`; hidden when stderr is not a terminal.
pub(crate) fn bar(len: u64, what: &str) -> ProgressBar {
    let bar = ProgressBar::new(len);
    let style =
        ProgressStyle::with_template("{msg:>10} [{bar:40}] {pos}/{len} ({per_sec}, eta {eta})")
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("=> ");
    bar.set_style(style);
    bar.set_message(what.to_owned());
    bar
}

/// `ladle sweep`'s live table on stderr (a terminal): one line per row of
/// [`ladle_sweep::Progress`], redrawn in place by indicatif, each cut to the terminal's width
/// (a line that wrapped would throw a count of lines to move back over off).
pub(crate) struct LiveTable {
    multi: indicatif::MultiProgress,
    lines: Vec<ProgressBar>,
}

impl LiveTable {
    pub(crate) fn new() -> Self {
        Self {
            multi: indicatif::MultiProgress::with_draw_target(
                indicatif::ProgressDrawTarget::stderr(),
            ),
            lines: Vec::new(),
        }
    }

    /// Shows `progress` in place of what was shown.
    pub(crate) fn show(&mut self, progress: &ladle_sweep::Progress) {
        let rows: Vec<&String> = progress
            .table
            .iter()
            .chain(std::iter::once(&progress.feed))
            .collect();
        let style = ProgressStyle::with_template("{wide_msg}")
            .unwrap_or_else(|_| ProgressStyle::default_spinner());
        while self.lines.len() < rows.len() {
            let line = self.multi.add(ProgressBar::new_spinner());
            line.set_style(style.clone());
            self.lines.push(line);
        }
        for (line, row) in self.lines.iter().zip(&rows) {
            line.set_message((*row).clone());
        }
    }
}

impl Drop for LiveTable {
    /// Leaves the last table on the screen.
    fn drop(&mut self) {
        for line in &self.lines {
            line.abandon();
        }
    }
}
