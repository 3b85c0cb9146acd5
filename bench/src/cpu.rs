//! [`cpu_time`]: what a process has cost so far, for the CPU-per-operation
//! columns.

use std::time::Duration;

/// A process's CPU time so far (user + system), from `/proc/PID/stat`.
pub(crate) fn cpu_time(pid: u32) -> Option<Duration> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command name, which is in parentheses.
    let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    let ticks: u64 = fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?;
    // In USER_HZ, which Linux fixes at 100 for what /proc shows.
    Some(Duration::from_millis(ticks * 10))
}
