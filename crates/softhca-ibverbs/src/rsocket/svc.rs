//! The service threads: what librdmacm's three (`listen_svc`, `connect_svc`, `tcp_svc`) do,
//! in two threads that poll the sockets' event channels, listeners apart (an accept waits for
//! its connection to be established, up to the CM's timeouts, as librdmacm's `listen_svc`
//! does; the other sockets' events and keep-alives, and closing them, do not wait for it):
//! - a listener's connection requests are accepted as they come (the program's `raccept`
//!   then takes a connected socket from the listener's queue);
//! - a connecting or connected socket's CM events move it on: a non-blocking connect
//!   progresses without the program calling in, a DISCONNECTED marks the socket so;
//! - a socket with `SO_KEEPALIVE` sends a keep-alive each `TCP_KEEPIDLE` seconds.
//!
//! A socket's entry is handled with its thread's entry list locked, so that `rclose`, which
//! removes the socket's entries first, never frees a socket a thread is working on.

use std::ffi::c_int;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use super::{lock, Rs};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum What {
    Listen,
    Cm,
    Keepalive,
}

struct Entry {
    rs: Arc<Rs>,
    what: What,
    /// A keep-alive's next time.
    due: Option<Instant>,
}

struct Svc {
    entries: Mutex<Vec<Entry>>,
    /// Written when the entries change, so the thread polls the new set.
    wake: OwnedFd,
}

/// The thread that serves entries of this kind: one for listeners, one for the rest.
fn svc(what: What) -> &'static Svc {
    static LISTEN: OnceLock<Svc> = OnceLock::new();
    static OTHER: OnceLock<Svc> = OnceLock::new();
    let (cell, name) = match what {
        What::Listen => (&LISTEN, "softhca-rs-listen"),
        What::Cm | What::Keepalive => (&OTHER, "softhca-rsocket"),
    };
    cell.get_or_init(|| {
        // SAFETY: eventfd with valid flags; the descriptor is owned from here.
        let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
        assert!(fd >= 0, "rsocket service thread: eventfd: {}", std::io::Error::last_os_error());
        // SAFETY: just made.
        let wake = unsafe { OwnedFd::from_raw_fd(fd) };
        // Its first `svc` waits until this initialization is done.
        let _ = std::thread::Builder::new().name(name.into()).spawn(move || run(what));
        Svc { entries: Mutex::new(Vec::new()), wake }
    })
}

fn wake(s: &Svc) {
    let one = 1u64;
    // SAFETY: the service's eventfd and a local 8-byte count.
    unsafe { libc::write(s.wake.as_raw_fd(), (&one as *const u64).cast(), 8) };
}

fn keepalive_due(rs: &Rs) -> Instant {
    Instant::now() + Duration::from_secs(u64::from(lock(&rs.opts).keepalive_time.max(1)))
}

/// Adds a socket's entry of that kind (once).
pub(super) fn add(rs: &Arc<Rs>, what: What) {
    let s = svc(what);
    let mut e = lock(&s.entries);
    if !e.iter().any(|x| Arc::ptr_eq(&x.rs, rs) && x.what == what) {
        let due = (what == What::Keepalive).then(|| keepalive_due(rs));
        e.push(Entry { rs: rs.clone(), what, due });
    }
    drop(e);
    wake(s);
}

/// Removes a socket's entry of that kind; when this returns, the thread is not using it.
pub(super) fn remove(rs: &Arc<Rs>, what: What) {
    let s = svc(what);
    lock(&s.entries).retain(|x| !(Arc::ptr_eq(&x.rs, rs) && x.what == what));
    wake(s);
}

/// Restarts a socket's keep-alive time (`TCP_KEEPIDLE` changed).
pub(super) fn rearm(rs: &Arc<Rs>) {
    let s = svc(What::Keepalive);
    for x in lock(&s.entries).iter_mut().filter(|x| Arc::ptr_eq(&x.rs, rs) && x.what == What::Keepalive) {
        x.due = Some(keepalive_due(rs));
    }
    wake(s);
}

fn run(what: What) {
    let s = svc(what);
    let mut fds: Vec<libc::pollfd> = Vec::new();
    let mut who: Vec<(c_int, What)> = Vec::new();
    loop {
        fds.clear();
        who.clear();
        fds.push(libc::pollfd { fd: s.wake.as_raw_fd(), events: libc::POLLIN, revents: 0 });
        let mut timeout: c_int = -1;
        {
            let e = lock(&s.entries);
            let now = Instant::now();
            for x in e.iter() {
                match x.due {
                    Some(due) => {
                        let ms = due.saturating_duration_since(now).as_millis().min(c_int::MAX as u128) as c_int;
                        timeout = if timeout < 0 { ms } else { timeout.min(ms) };
                    }
                    None => {
                        fds.push(libc::pollfd { fd: x.rs.fd, events: libc::POLLIN, revents: 0 });
                        who.push((x.rs.fd, x.what));
                    }
                }
            }
        }
        // SAFETY: a local array of pollfds.
        let n = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, timeout) };
        if n < 0 {
            continue;
        }
        if fds[0].revents != 0 {
            let mut v = 0u64;
            // SAFETY: the service's eventfd and a local count.
            unsafe { libc::read(s.wake.as_raw_fd(), (&mut v as *mut u64).cast(), 8) };
        }
        let mut e = lock(&s.entries);
        for (p, &(fd, what)) in fds[1..].iter().zip(&who) {
            if p.revents == 0 {
                continue;
            }
            let Some(x) = e.iter().find(|x| x.rs.fd == fd && x.what == what) else { continue };
            let rs = x.rs.clone();
            match what {
                What::Listen => while super::accept_one(&rs) {},
                _ => super::handle_cm_event(&rs),
            }
        }
        let now = Instant::now();
        for x in e.iter_mut() {
            if x.due.is_some_and(|d| d <= now) {
                super::send_keepalive(&x.rs);
                x.due = Some(keepalive_due(&x.rs));
            }
        }
    }
}
