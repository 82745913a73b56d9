//! Small file and environment helpers of the cluster's set-up, each error a `SlurmError`.

use super::*;

pub(super) fn setup(message: impl Into<String>) -> SlurmError {
    SlurmError::Setup(message.into())
}

pub(super) fn find_program(program: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(["/usr/sbin", "/usr/local/sbin", "/sbin"].map(PathBuf::from))
        .map(|d| d.join(program))
        .find(|p| p.is_file())
}

/// The `munge` user's uid and gid, from `/etc/passwd`.
pub(super) fn munge_ids() -> Result<(u32, u32), SlurmError> {
    let passwd = fs::read_to_string("/etc/passwd")
        .map_err(|e| setup(format!("cannot read /etc/passwd: {e}")))?;
    passwd
        .lines()
        .find_map(|l| {
            let fields: Vec<&str> = l.split(':').collect();
            (fields.first() == Some(&"munge") && fields.len() > 3)
                .then(|| Some((fields[2].parse().ok()?, fields[3].parse().ok()?)))
                .flatten()
        })
        .ok_or_else(|| setup("no munge user (install Debian's munge package)"))
}

pub(super) fn short_hostname() -> Result<String, SlurmError> {
    let name = fs::read_to_string("/proc/sys/kernel/hostname")
        .map_err(|e| setup(format!("cannot read the host name: {e}")))?;
    let short = name.trim().split('.').next().unwrap_or_default().to_owned();
    if short.is_empty() {
        return Err(setup("the host name is empty"));
    }
    Ok(short)
}

pub(super) fn create_dir(path: &Path) -> Result<(), SlurmError> {
    fs::create_dir_all(path).map_err(|e| setup(format!("cannot create {}: {e}", path.display())))
}

pub(super) fn set_mode(path: &Path, mode: u32) -> Result<(), SlurmError> {
    fs::set_permissions(path, fs::Permissions::from_mode(mode))
        .map_err(|e| setup(format!("cannot chmod {mode:o} {}: {e}", path.display())))
}

pub(super) fn write_file(path: &Path, bytes: &[u8], mode: u32) -> Result<(), SlurmError> {
    // A 0400 file left by an earlier attempt cannot be written over: remove it first.
    let _ = fs::remove_file(path);
    fs::write(path, bytes).map_err(|e| setup(format!("cannot write {}: {e}", path.display())))?;
    set_mode(path, mode)
}
