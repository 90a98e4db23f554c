//! A counting eventfd: readable while events are pending, so completion channels and the
//! asynchronous event queue work with poll/epoll like libibverbs' `fd`s.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

#[derive(Debug)]
pub(crate) struct EventFd(OwnedFd);

impl EventFd {
    pub fn new() -> io::Result<EventFd> {
        // SAFETY: eventfd takes no pointers; it returns a new descriptor or -1.
        let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC | libc::EFD_SEMAPHORE) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: fd is a descriptor we just opened and own exclusively.
        Ok(EventFd(unsafe { OwnedFd::from_raw_fd(fd) }))
    }

    /// One more pending event.
    pub fn notify(&self) {
        let one: u64 = 1;
        // SAFETY: writes the 8 bytes of `one`, a live local, to our own descriptor. A full
        // counter (2^64 - 2 pending events) would fail with EAGAIN; nothing to do then.
        unsafe {
            libc::write(self.0.as_raw_fd(), (&one as *const u64).cast(), 8);
        }
    }

    /// One pending event less (semaphore mode: each read takes one).
    pub fn consume(&self) {
        let mut v: u64 = 0;
        // SAFETY: reads at most 8 bytes into `v`, a live local; non-blocking, so an empty
        // counter just fails with EAGAIN.
        unsafe {
            libc::read(self.0.as_raw_fd(), (&mut v as *mut u64).cast(), 8);
        }
    }

    pub fn raw(&self) -> RawFd {
        self.0.as_raw_fd()
    }
}
