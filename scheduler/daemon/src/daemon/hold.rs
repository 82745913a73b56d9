//! Held jobs: those a damaged journal line may concern (see `state`'s module docs). The
//! daemon neither starts nor guesses about them; `ladle release ID` queues one (journaled
//! `released`), `ladle cancel ID` drops it.

use std::path::Path;

use crate::job::JobId;
use crate::journal::Record;
use crate::protocol::Response;

use super::Daemon;

/// ` --dir DIR` for the commands a message gives, quoted for a shell when needed.
pub(super) fn dir_arg(dir: &Path) -> String {
    let text = dir.display().to_string();
    let plain = text
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || "/._-+,:@%".contains(c));
    if plain {
        format!(" --dir {text}")
    } else {
        format!(" --dir '{}'", text.replace('\'', r"'\''"))
    }
}

impl Daemon {
    /// Says, once at start, which jobs are held and how to release them.
    pub(super) fn report_held(&self, held: &[JobId], dir_arg: &str) {
        if held.is_empty() {
            return;
        }
        for id in held {
            if let Some(reason) = self.jobs.jobs.get(id).and_then(|j| j.held.as_deref()) {
                tracing::warn!(job = id, "held: {reason}");
            }
        }
        let ids: Vec<String> = held.iter().map(JobId::to_string).collect();
        tracing::warn!(
            journal = %self.journal.path().display(),
            "{} jobs held because the journal is damaged: `ladle queue{dir_arg}` lists them, \
             `ladle release{dir_arg} {}` queues them",
            held.len(),
            ids.join(" ")
        );
    }

    /// `ladle release`: a held job goes back to the queue.
    pub(super) fn release(&mut self, id: JobId) -> Response {
        let Some(job) = self.jobs.jobs.get(&id) else {
            return Response::Error {
                message: format!("no job {id}"),
            };
        };
        if job.held.is_none() {
            return Response::Error {
                message: format!("job {id} is not held ({:?})", job.state()),
            };
        }
        if job.spec.command.is_empty() {
            return Response::Error {
                message: format!(
                    "job {id}'s command is unknown (its submission is lost to a damaged journal \
                     line): submit it again, and `ladle cancel {id}` to drop this entry"
                ),
            };
        }
        if let Err(e) = self.commit(Record::Released { id }) {
            return Response::Error {
                message: format!("{e}; job {id} stays held"),
            };
        }
        tracing::info!(job = id, "released: back in the queue");
        Response::Released { id }
    }
}
