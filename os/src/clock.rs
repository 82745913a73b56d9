//! CPU time: this process's, and the calling thread's (what a decode thread adds to a feed's
//! decode-CPU counter).

use std::time::Duration;

use rustix::time::{ClockId, Timespec, clock_gettime};

/// CPU time this process has used, all its threads together.
pub fn process_cpu() -> Duration {
    duration(clock_gettime(ClockId::ProcessCPUTime))
}

/// CPU time the calling thread has used.
pub fn thread_cpu() -> Duration {
    duration(clock_gettime(ClockId::ThreadCPUTime))
}

fn duration(t: Timespec) -> Duration {
    Duration::new(
        t.tv_sec.max(0) as u64,
        t.tv_nsec.clamp(0, 999_999_999) as u32,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_clocks_move_with_work_and_a_thread_never_exceeds_its_process() {
        let (process, thread) = (process_cpu(), thread_cpu());
        let mut x = 0u64;
        for i in 0..20_000_000u64 {
            x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(i));
        }
        assert!(thread_cpu() > thread, "{x}");
        assert!(process_cpu() >= thread_cpu());
        assert!(process_cpu() > process);
    }
}
