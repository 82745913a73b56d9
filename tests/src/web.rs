//! A real web server for the tests of datasets by URL: nginx from Debian's packages, started
//! on a free port of 127.0.0.1 with a configuration of the test's own; its access log counts
//! the GETs.

use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};

use ladle_os::Proc;

use crate::{Fixture, wait_until};

const GUARD: std::time::Duration = std::time::Duration::from_secs(120);

/// nginx serving `root` on a free port of 127.0.0.1, logging each request to `access.log`.
pub struct Nginx {
    /// Its port on 127.0.0.1.
    pub port: u16,
    log: PathBuf,
    bin: PathBuf,
    prefix: PathBuf,
    proc: Option<Proc>,
}

/// The nginx binary, where Debian puts it.
pub fn nginx_bin() -> Option<PathBuf> {
    ["/usr/sbin/nginx", "/usr/bin/nginx"]
        .iter()
        .map(PathBuf::from)
        .find(|p| p.is_file())
}

/// How nginx serves, past the defaults.
#[derive(Default)]
pub struct Serving {
    /// HTTPS with this certificate and key.
    pub tls: Option<(PathBuf, PathBuf)>,
    /// nginx's `limit_rate`: bytes per second per response (`"20k"`).
    pub limit_rate: Option<&'static str>,
}

/// nginx, or `None` (the test says it skips) where it is not installed and the run does not
/// require it (`scripts/check` installs it and sets `LADLE_REQUIRE_NGINX`).
pub fn nginx(fx: &Fixture, root: &Path) -> Option<Nginx> {
    nginx_with(fx, root, &Serving::default())
}

/// nginx serving `root` as `serving` says, or `None` as [`nginx`].
pub fn nginx_with(fx: &Fixture, root: &Path, serving: &Serving) -> Option<Nginx> {
    let Some(bin) = nginx_bin() else {
        assert!(
            std::env::var_os("LADLE_REQUIRE_NGINX").is_none(),
            "nginx is required (LADLE_REQUIRE_NGINX) but not installed"
        );
        eprintln!("skipped: nginx is not installed (apt-get install nginx-light)");
        return None;
    };
    let prefix = fx.path().join("nginx");
    std::fs::create_dir_all(prefix.join("tmp")).unwrap();
    let port = free_port();
    let log = prefix.join("access.log");
    let root_user = if ladle_os::process::my_uid() == 0 {
        "user root;"
    } else {
        ""
    };
    let (ssl, tls) = match &serving.tls {
        Some((cert, key)) => (
            " ssl",
            format!(
                "ssl_certificate {}; ssl_certificate_key {};",
                cert.display(),
                key.display()
            ),
        ),
        None => ("", String::new()),
    };
    let limit = serving
        .limit_rate
        .map(|r| format!("limit_rate {r};"))
        .unwrap_or_default();
    let conf = format!(
        "{root_user}\nworker_processes 1;\npid {p}/nginx.pid;\nerror_log {p}/error.log;\n\
         events {{ worker_connections 64; }}\n\
         http {{\n access_log {log};\n client_body_temp_path {p}/tmp;\n proxy_temp_path {p}/tmp;\n\
         fastcgi_temp_path {p}/tmp;\n uwsgi_temp_path {p}/tmp;\n scgi_temp_path {p}/tmp;\n\
         server {{ listen 127.0.0.1:{port}{ssl}; {tls} {limit} root {root}; }}\n}}\n",
        p = prefix.display(),
        log = log.display(),
        root = root.display(),
    );
    std::fs::write(prefix.join("nginx.conf"), conf).unwrap();
    let mut web = Nginx {
        port,
        log,
        bin,
        prefix,
        proc: None,
    };
    web.start();
    Some(web)
}

/// A TCP port free on 127.0.0.1 a moment ago.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

impl Nginx {
    /// Starts nginx and waits until it listens.
    pub fn start(&mut self) {
        let proc = Proc::spawn(
            "nginx",
            std::process::Command::new(&self.bin)
                .arg("-p")
                .arg(&self.prefix)
                .arg("-c")
                .arg(self.prefix.join("nginx.conf"))
                .args(["-g", "daemon off;"]),
        )
        .unwrap();
        self.proc = Some(proc);
        let port = self.port;
        wait_until("nginx listening", GUARD, || {
            TcpStream::connect(("127.0.0.1", port))
                .map(|_| Some(()))
                .map_err(|e| e.to_string())
        });
    }

    /// Kills nginx, master and worker (`SIGKILL` to its process group): what it was sending
    /// is cut off mid-body.
    pub fn kill(&mut self) {
        if let Some(mut proc) = self.proc.take() {
            proc.kill();
        }
    }

    /// GETs of each path that nginx answered, from its own access log.
    pub fn gets(&self) -> std::collections::BTreeMap<String, usize> {
        let log = std::fs::read_to_string(&self.log).unwrap_or_default();
        let mut gets = std::collections::BTreeMap::new();
        for line in log.lines() {
            if let Some(path) = line
                .split("\"GET ")
                .nth(1)
                .and_then(|r| r.split(' ').next())
            {
                *gets.entry(path.to_owned()).or_insert(0) += 1;
            }
        }
        gets
    }
}
