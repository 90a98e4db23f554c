//! `rpoll` and `rselect`, as librdmacm's: an rsocket is ready by its own state (data
//! received, room to send, a connection to accept, a hang-up), which only its CQ and CM
//! events change. So `rpoll` first polls the sockets for a while (`polling_time`), then
//! arms their CQs and sleeps in poll(2) on the descriptors whose events move them (the
//! completion channel of a connected socket, the event channel of a connecting one, the
//! accept queue of a listener, the program's other descriptors as given), plus a signal
//! descriptor the service thread writes when it changes a socket that a sleeper may watch.
//! Every sleeper wakes at a signal and looks again.

use std::ffi::c_int;
use std::os::fd::AsRawFd;
use std::sync::atomic::Ordering;
use std::sync::{Mutex, OnceLock};
use std::time::Instant;

use super::stream::st;
use super::{config, is_cq_armed, lock, lookup, poll_all, Rs};

/// The sleepers in poll(2) and whether a signal is out (`pollcnt`, `suspendpoll`), and the
/// signal's semaphore eventfd.
struct Sleepers {
    state: Mutex<(u32, bool)>,
    fd: c_int,
}

fn sleepers() -> Option<&'static Sleepers> {
    static S: OnceLock<Option<Sleepers>> = OnceLock::new();
    S.get_or_init(|| {
        // SAFETY: eventfd with valid flags; kept for the life of the process.
        let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_SEMAPHORE | libc::EFD_CLOEXEC) };
        (fd >= 0).then(|| Sleepers { state: Mutex::new((0, false)), fd })
    })
    .as_ref()
}

fn bump(fd: c_int) {
    let one = 1u64;
    // SAFETY: the signal eventfd and a local count.
    unsafe { libc::write(fd, (&one as *const u64).cast(), 8) };
}

fn take(fd: c_int) {
    let mut v = 0u64;
    // SAFETY: as above.
    unsafe { libc::read(fd, (&mut v as *mut u64).cast(), 8) };
}

/// Wakes every sleeper (`rs_poll_signal`): a socket changed.
pub(super) fn signal() {
    let Some(s) = sleepers() else { return };
    let mut g = lock(&s.state);
    if g.0 > 0 && !g.1 {
        g.1 = true;
        bump(s.fd);
    }
}

/// One more sleeper, unless a signal is out: then everyone looks again first.
fn enter(s: &Sleepers) -> bool {
    let mut g = lock(&s.state);
    if g.1 {
        drop(g);
        std::thread::yield_now();
        return false;
    }
    g.0 += 1;
    true
}

/// A sleeper leaves: the last one clears the signal.
fn exit(s: &Sleepers) {
    let mut g = lock(&s.state);
    g.0 -= 1;
    if g.0 == 0 {
        take(s.fd);
        g.1 = false;
    }
}

/// A sleeper leaves after it woke (`rs_poll_stop`): the others wake too.
fn stop(s: &Sleepers) {
    let mut g = lock(&s.state);
    g.0 -= 1;
    if g.0 == 0 {
        take(s.fd);
        g.1 = false;
    } else if !g.1 {
        g.1 = true;
        bump(s.fd);
    }
}

/// A socket's ready events (`rs_poll_rs`), taking its completions on the way.
fn poll_rs(rs: &Rs, events: i16, nonblock: bool, test: fn(&Rs, &super::Stream) -> bool) -> i16 {
    loop {
        let g = lock(&rs.s);
        let state = g.state;
        if state & st::CONNECTED != 0 || state == st::DISCONNECTED || state & st::ERROR != 0 {
            let (g, _) = rs.process_cq(g, nonblock, test);
            let mut r = 0;
            if events & libc::POLLIN != 0 && (g.have_rdata() || g.state & st::READABLE == 0) {
                r |= libc::POLLIN;
            }
            if events & libc::POLLOUT != 0 && g.can_send() {
                r |= libc::POLLOUT;
            }
            // An orderly disconnect is reported once the data before it has been read. The
            // peer's last bytes and its disconnect often land in one engine turn here, where
            // librdmacm on a kernel HCA mostly sees them apart; programs such as `rstream -T a`
            // take a POLLHUP beside POLLIN for an error (a TCP socket reports a peer's close
            // beside unread data as POLLIN alone). The order is one librdmacm can show too.
            let unread = r & libc::POLLIN != 0 && g.have_rdata();
            if g.state & st::CONNECTED == 0 && !(g.state == st::DISCONNECTED && unread) {
                r |= if g.state == st::DISCONNECTED { libc::POLLHUP } else { libc::POLLERR };
            }
            return r;
        }
        drop(g);
        if state == st::LISTENING {
            let Some((q, _)) = rs.accept_queue.get() else { return 0 };
            let mut p = libc::pollfd { fd: q.as_raw_fd(), events, revents: 0 };
            // SAFETY: one local pollfd.
            unsafe { libc::poll(&mut p, 1, 0) };
            return p.revents;
        }
        if state & st::OPENING != 0 {
            match rs.do_connect() {
                Err(libc::EINPROGRESS) => return 0,
                _ => continue,
            }
        }
        if state == st::CONNECT_ERROR {
            return (events & (libc::POLLIN | libc::POLLOUT)) | libc::POLLERR;
        }
        return 0;
    }
}

/// Every descriptor once, without sleeping; the number ready.
fn check(fds: &mut [libc::pollfd]) -> c_int {
    let mut n = 0;
    for p in fds.iter_mut() {
        match lookup(p.fd) {
            Some(rs) => p.revents = poll_rs(&rs, p.events, true, poll_all),
            // SAFETY: one of the program's pollfds.
            None => unsafe {
                libc::poll(p, 1, 0);
            },
        }
        n += c_int::from(p.revents != 0);
    }
    n
}

/// Arms the sockets' CQs and fills the descriptors to sleep on; the number already ready
/// (then no sleep).
fn arm(rfds: &mut [libc::pollfd], fds: &mut [libc::pollfd]) -> c_int {
    let mut n = 0;
    for (r, p) in rfds.iter_mut().zip(fds.iter_mut()) {
        r.revents = 0;
        match lookup(p.fd) {
            Some(rs) => {
                p.revents = poll_rs(&rs, p.events, false, is_cq_armed);
                n += c_int::from(p.revents != 0);
                let g = lock(&rs.s);
                let channel = g.comp_channel();
                r.fd = if g.state == st::LISTENING {
                    rs.accept_queue.get().map_or(rs.fd, |(q, _)| q.as_raw_fd())
                } else if g.state >= st::CONNECTED && !g.id.is_null() && !channel.is_null() {
                    // SAFETY: the socket's live completion channel.
                    unsafe { (*channel).fd }
                } else {
                    rs.fd
                };
                r.events = libc::POLLIN;
            }
            None => {
                r.fd = p.fd;
                r.events = p.events;
            }
        }
    }
    n
}

/// Whether `fd` is readable now (a completion event another thread has not taken).
fn readable(fd: c_int) -> bool {
    let mut p = libc::pollfd { fd, events: libc::POLLIN, revents: 0 };
    // SAFETY: one local pollfd.
    unsafe { libc::poll(&mut p, 1, 0) == 1 }
}

/// After the sleep: takes the completion events that woke it and looks at every socket.
fn events(rfds: &[libc::pollfd], fds: &mut [libc::pollfd]) -> c_int {
    let mut n = 0;
    for (r, p) in rfds.iter().zip(fds.iter_mut()) {
        match lookup(p.fd) {
            Some(rs) => {
                if r.revents != 0 {
                    let g = lock(&rs.s);
                    let (cq, channel) = (g.cq(), g.comp_channel());
                    let sizes = u32::from(g.sizes.sq) + u32::from(g.sizes.rq);
                    let connected = g.state >= st::CONNECTED && !channel.is_null();
                    drop(g);
                    if connected {
                        let mut w = lock(&rs.wait);
                        if rs.armed.load(Ordering::Acquire) && readable(r.fd) {
                            let _ = rs.get_cq_event(&mut w, cq, channel, sizes);
                        }
                    }
                }
                p.revents = poll_rs(&rs, p.events, true, poll_all);
            }
            None => p.revents = r.revents,
        }
        n += c_int::from(p.revents != 0);
    }
    n
}

/// `rpoll`.
///
/// # Safety
/// `fds` points to `nfds` pollfds of the program.
#[no_mangle]
pub unsafe extern "C" fn softhca_rs_poll(fds: *mut libc::pollfd, nfds: libc::nfds_t, timeout: c_int) -> c_int {
    let fds: &mut [libc::pollfd] = if fds.is_null() || nfds == 0 {
        &mut []
    } else {
        // SAFETY: the caller's contract.
        unsafe { std::slice::from_raw_parts_mut(fds, nfds as usize) }
    };
    let start = Instant::now();
    loop {
        let n = check(fds);
        if n > 0 || timeout == 0 {
            return n;
        }
        if start.elapsed() > config().polling_time {
            break;
        }
    }
    let Some(s) = sleepers() else { return super::fail(libc::ENOMEM) };
    let mut rfds = vec![libc::pollfd { fd: -1, events: 0, revents: 0 }; fds.len() + 1];
    let last = fds.len();
    rfds[last] = libc::pollfd { fd: s.fd, events: libc::POLLIN, revents: 0 };
    loop {
        let n = arm(&mut rfds[..last], fds);
        if n > 0 {
            return n;
        }
        if !enter(s) {
            continue;
        }
        let sleep = if timeout >= 0 {
            let left = timeout as i128 - start.elapsed().as_millis() as i128;
            if left <= 0 {
                exit(s);
                return 0;
            }
            (left as c_int).min(config().wake_up_interval)
        } else {
            config().wake_up_interval
        };
        // SAFETY: a local array of pollfds.
        let r = unsafe { libc::poll(rfds.as_mut_ptr(), rfds.len() as libc::nfds_t, sleep) };
        if r < 0 {
            let e = super::errno();
            exit(s);
            return super::fail(e);
        }
        let n = events(&rfds[..last], fds);
        stop(s);
        if n > 0 {
            return n;
        }
    }
}

/// `rselect`: the sets as pollfds, `rpoll`, the sets again.
///
/// # Safety
/// The sets are null or the program's `fd_set`s; `timeout` is null or its timeval.
#[no_mangle]
pub unsafe extern "C" fn softhca_rs_select(
    nfds: c_int,
    read: *mut libc::fd_set,
    write: *mut libc::fd_set,
    except: *mut libc::fd_set,
    timeout: *mut libc::timeval,
) -> c_int {
    let isset = |set: *mut libc::fd_set, fd: c_int| {
        // SAFETY: the program's set; fd < nfds ≤ FD_SETSIZE.
        !set.is_null() && unsafe { libc::FD_ISSET(fd, set) }
    };
    let mut fds = Vec::new();
    for fd in 0..nfds.clamp(0, libc::FD_SETSIZE as c_int) {
        let mut events = 0;
        if isset(read, fd) {
            events |= libc::POLLIN;
        }
        if isset(write, fd) {
            events |= libc::POLLOUT;
        }
        if isset(except, fd) {
            events |= libc::POLLERR;
        }
        if events != 0 {
            fds.push(libc::pollfd { fd, events, revents: 0 });
        }
    }
    let ms = if timeout.is_null() {
        -1
    } else {
        // SAFETY: the program's timeval.
        let t = unsafe { &*timeout };
        // As select(2): a negative time is EINVAL, a huge one waits as long as poll can.
        if t.tv_sec < 0 || t.tv_usec < 0 {
            return super::fail(libc::EINVAL);
        }
        let ms = t.tv_sec.saturating_mul(1000).saturating_add(t.tv_usec / 1000);
        ms.min(c_int::MAX as i64) as c_int
    };
    // SAFETY: a local array.
    let n = unsafe { softhca_rs_poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, ms) };
    for set in [read, write, except] {
        if !set.is_null() {
            // SAFETY: the program's set.
            unsafe { libc::FD_ZERO(set) };
        }
    }
    if n <= 0 {
        return n;
    }
    let mut count = 0;
    for p in &fds {
        for (set, bit) in [(read, libc::POLLIN), (write, libc::POLLOUT), (except, libc::POLLERR)] {
            if !set.is_null() && p.revents & bit != 0 {
                // SAFETY: the program's set.
                unsafe { libc::FD_SET(p.fd, set) };
                count += 1;
            }
        }
    }
    count
}
