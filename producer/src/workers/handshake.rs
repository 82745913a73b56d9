//! The workers' socket's accept loop and handshakes: a connection is admitted (same uid,
//! the pool's token within [`WorkerPoolConfig::hello_timeout`], then its staging buffer) on
//! a thread of its own, at most [`WorkerPoolConfig::max_handshakes`] at once, or refused
//! with a frame saying why.

use std::os::fd::AsFd;
use std::os::unix::net::{UnixListener, UnixStream};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Instant;

use ladle_ring::protocol;
use ladle_ring::sys;
use serde::{Deserialize, Serialize};

#[cfg(doc)]
use super::WorkerPoolConfig;
use super::{POLL, Worker, WorkerPool};

/// A worker's first message.
#[derive(Debug, Serialize, Deserialize)]
pub(super) struct WorkerHello {
    /// The pool's token (proves the worker was started by the producer's own process).
    pub(super) token: String,
    /// The worker's process id, for logs.
    pub(super) pid: u32,
}

/// The answer to [`WorkerHello`]; the worker's staging fd comes with it.
#[derive(Debug, Serialize, Deserialize)]
pub(super) struct WorkerWelcome {
    /// `(offset, length)` of every field of the schema in the staging buffer, in order.
    pub(super) fields: Vec<(u64, usize)>,
    /// The staging buffer's length in bytes.
    pub(super) len: u64,
}

/// What a refused connection gets instead of a welcome.
#[derive(Debug, Serialize, Deserialize)]
pub(super) struct Refusal {
    pub(super) error: String,
}

impl WorkerPool {
    pub(super) fn accept_loop(self: Arc<Self>, listener: &UnixListener) {
        ladle_os::net::accept_loop(listener, &self.stop, POLL, "the worker pool", |conn| {
            self.handshake(conn)
        });
        // The feed is stopping: idle workers are let go (EOF on their socket; they exit).
        while self.idle_rx.try_recv().is_ok() {}
        let _ = std::fs::remove_file(&self.path);
    }

    /// Runs `conn`'s handshake on a thread of its own, or refuses it when
    /// [`WorkerPoolConfig::max_handshakes`] are under way.
    fn handshake(self: &Arc<Self>, conn: UnixStream) {
        let max = self.config.max_handshakes;
        let place = self
            .handshakes
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| {
                (n < max).then_some(n + 1)
            });
        if place.is_err() {
            self.refuse(
                &conn,
                &format!(
                    "{max} connections are already saying hello on {}",
                    self.path.display()
                ),
            );
            return;
        }
        let pool = Arc::clone(self);
        let spawned = std::thread::Builder::new()
            .name("ladle-worker-hello".into())
            .spawn(move || {
                let admitted = pool.admit(conn);
                pool.handshakes.fetch_sub(1, Ordering::SeqCst);
                if let Err(why) = admitted {
                    tracing::warn!("refused a worker on {}: {why}", pool.path.display());
                }
            });
        if let Err(e) = spawned {
            // The closure, and the connection with it, is dropped: the peer sees EOF.
            self.handshakes.fetch_sub(1, Ordering::SeqCst);
            tracing::warn!("cannot start a thread for a worker's hello ({e}); closed it");
        }
    }

    fn refuse(&self, conn: &UnixStream, why: &str) {
        let refused = self.refused.fetch_add(1, Ordering::Relaxed) + 1;
        // Logged at 1, 2, 4, 8, ... refusals: a flood of connections is not a flood of logs.
        if refused.is_power_of_two() {
            tracing::warn!("refused a connection ({refused} so far): {why}");
        }
        // Into an empty socket buffer: never blocks the accept loop.
        let _ = conn.set_nonblocking(true);
        let _ = protocol::send(
            conn,
            &Refusal {
                error: why.to_owned(),
            },
            &[],
        );
    }

    fn admit(&self, conn: UnixStream) -> Result<(), String> {
        conn.set_nonblocking(false).map_err(|e| e.to_string())?;
        let cred = ladle_os::net::peer_cred(&conn).map_err(|e| e.to_string())?;
        let uid = cred.uid;
        if uid != sys::my_uid() {
            return Err(format!("its uid {uid} is not this process's"));
        }
        let deadline = Instant::now() + self.config.hello_timeout;
        let (hello, _) = protocol::recv_by::<WorkerHello>(&conn, deadline)
            .map_err(|e| format!("no hello: {e}"))?;
        if !same_token(&hello.token, &self.config.token) {
            return Err(format!("pid {} presented a wrong token", hello.pid));
        }
        let (fd, staging) = self.plan.create()?;
        let welcome = WorkerWelcome {
            fields: self.plan.fields.clone(),
            len: self.plan.len as u64,
        };
        protocol::send(&conn, &welcome, &[fd.as_fd()]).map_err(|e| e.to_string())?;
        self.connected.fetch_add(1, Ordering::Relaxed);
        tracing::debug!(pid = hello.pid, "worker connected");
        // The kernel's pid for the socket, not the one the hello claims: it is what a
        // timeout kills.
        let pid = cred.pid;
        let process = ladle_os::process::ProcessId::of(pid);
        let worker = Worker {
            conn,
            pid,
            process,
            staging,
        };
        if self.stop.load(Ordering::SeqCst) {
            return Ok(()); // let go at once: the feed is stopping
        }
        self.idle_tx.send(worker).map_err(|e| e.to_string())
    }
}

/// Compares tokens in time that does not depend on where they differ.
pub(super) fn same_token(a: &str, b: &str) -> bool {
    a.len() == b.len() && a.bytes().zip(b.bytes()).fold(0u8, |d, (x, y)| d | (x ^ y)) == 0
}
