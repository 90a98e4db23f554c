//! The system calls any OS-facing link's driver needs beyond std: an eventfd (the doorbell),
//! `ppoll` (the engine thread's sleep), the thread's timer slack and the CPU a thread runs
//! on, as thin `libc` wrappers.
//! Every `unsafe` block says why it is sound.

use std::io;
use std::os::fd::{FromRawFd, OwnedFd, RawFd};
use std::time::Duration;

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

/// Makes the calling thread's timed sleeps (`ppoll`'s timeout, `nanosleep`) end when asked,
/// not up to the default slack of 50 µs later, which Linux allows itself to batch wake-ups.
/// Errors (a kernel without `PR_SET_TIMERSLACK`) leave the default and are ignored.
pub fn precise_timers() {
    // SAFETY: PR_SET_TIMERSLACK takes an integer (the slack in ns; 0 would restore the
    // default) and touches no memory.
    let _ = unsafe { libc::prctl(libc::PR_SET_TIMERSLACK, 1 as libc::c_ulong) };
}

/// The CPU the calling thread runs on, `u32::MAX` if unknown. glibc reads it from the
/// thread's rseq area where the kernel keeps it (no system call).
pub fn current_cpu() -> u32 {
    // SAFETY: sched_getcpu takes no arguments and touches no memory of ours.
    let cpu = unsafe { libc::sched_getcpu() };
    u32::try_from(cpu).unwrap_or(u32::MAX)
}

#[cfg(test)]
mod tests {
    /// The engine thread's sleeps end when asked: its timer slack is 1 ns, not the default
    /// 50 µs (the thread's own setting; other threads keep theirs).
    #[test]
    fn precise_timers_set_this_threads_slack() {
        std::thread::spawn(|| {
            super::precise_timers();
            // SAFETY: PR_GET_TIMERSLACK takes no pointer and returns the slack in ns.
            let slack = unsafe { libc::prctl(libc::PR_GET_TIMERSLACK) };
            assert_eq!(slack, 1);
        })
        .join()
        .unwrap();
        // SAFETY: as above.
        assert_ne!(unsafe { libc::prctl(libc::PR_GET_TIMERSLACK) }, 1, "this thread's own slack is untouched");
    }
}
