//! The system calls any OS-facing link's driver needs beyond std: an eventfd (the doorbell),
//! `ppoll` (the engine thread's sleep) and the coarse monotonic clock (a poll's "could a
//! timer be due?"), as thin `libc` wrappers. Every `unsafe` block says why it is sound.

use std::io;
use std::os::fd::{FromRawFd, OwnedFd, RawFd};
use std::time::{Duration, Instant};

pub(crate) fn cvt(r: libc::c_int) -> io::Result<libc::c_int> {
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

/// A non-blocking eventfd (the doorbell).
pub fn eventfd() -> io::Result<OwnedFd> {
    // SAFETY: eventfd takes no pointers; a non-negative result is a new fd that we own.
    let fd = cvt(unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) })?;
    // SAFETY: `fd` was just returned by eventfd and nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Adds 1 to an eventfd (wakes a poller). Errors (counter overflow: already signalled) are
/// harmless and ignored.
pub fn eventfd_signal(fd: RawFd) {
    let one: u64 = 1;
    // SAFETY: writes 8 bytes from a live u64; the kernel only reads them.
    let _ = unsafe { libc::write(fd, (&one as *const u64).cast(), 8) };
}

/// Resets an eventfd to 0.
pub fn eventfd_drain(fd: RawFd) {
    let mut v: u64 = 0;
    // SAFETY: reads at most 8 bytes into a live, writable u64.
    let _ = unsafe { libc::read(fd, (&mut v as *mut u64).cast(), 8) };
}

/// Waits until one of `fds` is ready for `events` or `timeout` passes (None: forever).
/// Returns the number of ready fds (0 on timeout or signal).
pub fn ppoll(fds: &mut [libc::pollfd], timeout: Option<Duration>) -> io::Result<usize> {
    let ts = timeout.map(|t| libc::timespec {
        tv_sec: t.as_secs().min(i64::MAX as u64) as libc::time_t,
        tv_nsec: t.subsec_nanos() as libc::c_long,
    });
    let tsp = ts.as_ref().map_or(std::ptr::null(), |t| t as *const libc::timespec);
    // SAFETY: `fds` is a valid mutable slice of pollfd of the length passed; `tsp` is null or
    // points at `ts`, alive until the call returns; no signal mask is passed.
    let r = unsafe { libc::ppoll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, tsp, std::ptr::null()) };
    match cvt(r) {
        Ok(n) => Ok(n as usize),
        Err(e) if e.kind() == io::ErrorKind::Interrupted => Ok(0),
        Err(e) => Err(e),
    }
}

fn clock_ns(clock: libc::clockid_t) -> u64 {
    let mut t = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_gettime writes one timespec into the live local `t`; the clocks passed
    // here exist on every Linux, so it cannot fail.
    unsafe { libc::clock_gettime(clock, &mut t) };
    (t.tv_sec as u64).wrapping_mul(1_000_000_000).wrapping_add(t.tv_nsec as u64)
}

/// A cheap upper bound of a link's clock (`Instant` since its epoch, in ns): a poll that finds
/// nothing to do asks it whether a timer could be due without reading the clock source.
///
/// `CLOCK_MONOTONIC_COARSE` is `CLOCK_MONOTONIC` (what `Instant` reads) as of the kernel's last
/// tick, read from the vDSO page without touching the clock source: 3 ns here against 20 for
/// the exact clock, and in a guest whose clock source is the HPET (qemu TCG) 32 ns against
/// 760 (a system call and an emulated device read). The exact time lies at most one tick after
/// it; a tick that comes late (a busy host) only makes a timer fire late, never early.
#[derive(Debug, Clone, Copy)]
pub struct CoarseClock {
    /// `CLOCK_MONOTONIC` at the epoch, in ns (at most a few ns late).
    epoch: u64,
    /// One tick (the coarse clock's resolution) and as much again for a late one.
    slack: u64,
}

impl CoarseClock {
    pub fn new(epoch: Instant) -> CoarseClock {
        let since = epoch.elapsed().as_nanos() as u64;
        let now = clock_ns(libc::CLOCK_MONOTONIC);
        let mut res = libc::timespec { tv_sec: 0, tv_nsec: 0 };
        // SAFETY: clock_getres writes one timespec into the live local `res`.
        unsafe { libc::clock_getres(libc::CLOCK_MONOTONIC_COARSE, &mut res) };
        let tick = (res.tv_sec as u64).saturating_mul(1_000_000_000).saturating_add(res.tv_nsec as u64);
        CoarseClock { epoch: now.saturating_sub(since), slack: tick.clamp(1_000_000, 100_000_000) * 2 }
    }

    /// A time (ns since the epoch) the link's clock has not passed yet.
    pub fn upper_bound(&self) -> u64 {
        clock_ns(libc::CLOCK_MONOTONIC_COARSE).saturating_sub(self.epoch).saturating_add(self.slack)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_coarse_bound_lies_ahead_of_the_clock_by_at_most_its_slack() {
        let epoch = Instant::now();
        let c = CoarseClock::new(epoch);
        for _ in 0..1000 {
            let before = epoch.elapsed().as_nanos() as u64;
            let bound = c.upper_bound();
            let after = epoch.elapsed().as_nanos() as u64;
            assert!(bound >= before, "bound {bound} behind the clock {before}");
            assert!(bound <= after + c.slack, "bound {bound} too far ahead of {after}");
        }
    }
}
