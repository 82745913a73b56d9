//! Host memory: how much is free for this process, from `/proc/meminfo` and the cgroup (v2)
//! this process runs in (a Slurm job's or a container's limit). Pure parsers apart from the
//! reads, so that each is tested on text.

use std::path::Path;

/// `MemAvailable` of a `/proc/meminfo` text, in bytes.
pub fn parse_meminfo_available(meminfo: &str) -> Option<u64> {
    parse_meminfo(meminfo, "MemAvailable:")
}

/// Field `name` (with its colon) of a `/proc/meminfo` text, in bytes.
fn parse_meminfo(meminfo: &str, name: &str) -> Option<u64> {
    meminfo.lines().find_map(|line| {
        let rest = line.strip_prefix(name)?;
        let kib: u64 = rest.trim().strip_suffix("kB")?.trim().parse().ok()?;
        kib.checked_mul(1024)
    })
}

/// The memory this process may use at most, bytes: the kernel's `MemTotal`, bounded by the
/// `memory.max` of every cgroup (v2) above it that has one. `None` when `/proc/meminfo`
/// cannot be read.
pub fn total() -> Option<u64> {
    let meminfo = std::fs::read_to_string("/proc/meminfo").ok()?;
    let mut total = parse_meminfo(&meminfo, "MemTotal:")?;
    for_each_cgroup_limit(|max, _| total = total.min(max));
    Some(total)
}

/// Calls `f(memory.max, memory.current)` for every cgroup (v2) above this process that has a
/// limit.
fn for_each_cgroup_limit(mut f: impl FnMut(u64, u64)) {
    let cgroup = std::fs::read_to_string("/proc/self/cgroup").unwrap_or_default();
    let Some(path) = parse_cgroup_path(&cgroup) else {
        return;
    };
    let mut dir = Path::new("/sys/fs/cgroup").join(path.trim_start_matches('/'));
    loop {
        let read = |name: &str| std::fs::read_to_string(dir.join(name)).ok();
        if let (Some(max), Some(current)) = (read("memory.max"), read("memory.current"))
            && let (Ok(max), Ok(current)) =
                (max.trim().parse::<u64>(), current.trim().parse::<u64>())
        {
            f(max, current);
        }
        if dir == Path::new("/sys/fs/cgroup") || !dir.pop() {
            break;
        }
    }
}

/// The cgroup v2 path of a `/proc/self/cgroup` text (its `0::` line).
pub fn parse_cgroup_path(cgroup: &str) -> Option<&str> {
    cgroup.lines().find_map(|line| line.strip_prefix("0::"))
}

/// The memory free for this process now, bytes: the kernel's `MemAvailable`, bounded by the
/// headroom of every cgroup (v2) above this process that has a limit. `None` when
/// `/proc/meminfo` cannot be read.
pub fn available() -> Option<u64> {
    let meminfo = std::fs::read_to_string("/proc/meminfo").ok()?;
    let mut free = parse_meminfo_available(&meminfo)?;
    for_each_cgroup_limit(|max, current| free = free.min(max.saturating_sub(current)));
    Some(free)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn meminfo_and_cgroup_limits_parse_and_the_smaller_wins() {
        let meminfo =
            "MemTotal:       24576000 kB\nMemFree:         1000 kB\nMemAvailable:   20000000 kB\n";
        assert_eq!(parse_meminfo_available(meminfo), Some(20_000_000 * 1024));
        assert_eq!(parse_meminfo_available("MemTotal: 5 kB\n"), None);
        assert_eq!(
            parse_cgroup_path("0::/user.slice/job_42\n"),
            Some("/user.slice/job_42")
        );
        assert_eq!(parse_cgroup_path("1:cpu:/x\n"), None);
        assert!(available().is_some_and(|b| b > 0), "this machine's memory");
        assert!(
            total() >= available(),
            "{:?} total, {:?} free",
            total(),
            available()
        );
        assert_eq!(parse_meminfo(meminfo, "MemTotal:"), Some(24_576_000 * 1024));
    }
}
