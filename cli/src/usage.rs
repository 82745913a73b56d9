//! CPU time from `getrusage`, for the reports of `bench` and `sweep`.

use std::time::Duration;

/// CPU time (user + system) of `who`: `libc::RUSAGE_SELF` (this process, all its threads) or
/// `libc::RUSAGE_CHILDREN` (every child waited for so far). Zero if the call fails.
pub(crate) fn cpu_time(who: libc::c_int) -> Duration {
    let mut usage = std::mem::MaybeUninit::<libc::rusage>::zeroed();
    // SAFETY: getrusage writes a `rusage` into memory of that type; `who` is one of the two
    // documented values (an invalid one is EINVAL, handled below).
    let rc = unsafe { libc::getrusage(who, usage.as_mut_ptr()) };
    if rc != 0 {
        return Duration::ZERO;
    }
    // SAFETY: getrusage succeeded, so the struct is initialised (it was zeroed anyway).
    let usage = unsafe { usage.assume_init() };
    let tv = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    tv(usage.ru_utime) + tv(usage.ru_stime)
}
