//! rsockets: librdmacm's socket API over RDMA (`<rdma/rsocket.h>`: `rsocket`, `rbind`,
//! `rlisten`, `raccept`, `rconnect`, `rsend`, `rrecv`, `rpoll`, …), built as librdmacm 44
//! builds it — on top of the connection manager and the verbs, the public functions of this
//! library — and speaking its protocol, so that an rsocket here talks to one on Linux (rxe
//! or a NIC): Debian's `rstream` runs against either.
//!
//! A stream socket is an rdma_cm id of the TCP port space with its own event channel, whose
//! descriptor is the socket's number (as librdmacm's: a real descriptor, so `rpoll` can mix
//! rsockets and other descriptors), and, once connected, an RC QP with one CQ and completion
//! channel. `stream.rs` has the data path and the protocol's counters; `wire.rs` what is on
//! the wire; `svc.rs` the thread that accepts connections, follows connected sockets' CM
//! events and sends keep-alives (librdmacm's three service threads in one); `poll.rs`
//! `rpoll`/`rselect`.
//!
//! Locks, as librdmacm's: the socket's state (`s`, its `cq_lock`); one waiter on the CQ at a
//! time (`wait`, `cq_wait_lock`, taken while `s` is held and kept while `s` is released for
//! the wait, so a sender and a receiver each make progress); `rsend`s and `rrecv`s each in
//! turn (`send`, `recv`: `slock`, `rlock`).
//!
//! Not built: datagram rsockets (`SOCK_DGRAM`: ENOSYS) and the I/O map (`riomap`,
//! `riounmap`, `riowrite`: ENOSYS); a socket still advertises an empty I/O map, as
//! librdmacm's does by default.

mod poll;
mod stream;
mod svc;
mod wire;

use std::collections::BTreeMap;
use std::ffi::{c_int, c_void};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::ptr::null_mut;
use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

use self::stream::{errno, st, Dest, Sizes, Stream};
use self::wire::{ctrl, ConnData};
use crate::abi::*;
use crate::rdmacm::abi::*;
use crate::rdmacm::api as cm;
use crate::set_errno;

/// librdmacm's defaults, and the files under `/etc/rdma/rsocket` that change them.
struct Config {
    sizes: Sizes,
    /// How long a blocking call polls before it waits for an event.
    polling_time: Duration,
    /// The longest `rpoll` sleeps before it looks at its sockets again.
    wake_up_interval: c_int,
}

const OLAP_START_SIZE: u32 = 2048;
const MAX_TRANSFER: u32 = 65536;
const CONN_RETRIES: u32 = 6;
/// How long `rclose` waits for the socket's sends to complete (librdmacm's waits as long as
/// they take): a peer whose program stopped calling in has stopped reposting its receives,
/// and the sends of its RNR-NAKed Writes are retried for ever (RNR retry 7), so the close
/// would never return. After this the QP is destroyed with them.
const CLOSE_LINGER: Duration = Duration::from_secs(1);
const CONF_DIR: &str = "/etc/rdma/rsocket";

/// The next transfer of a send with `left` bytes to go (librdmacm's `olen`): the overlap size,
/// which starts at OLAP_START_SIZE and doubles each transfer up to MAX_TRANSFER, or what is
/// left when that is less.
fn next_chunk(olen: &mut u32, left: usize) -> u32 {
    let left = left.min(u32::MAX as usize) as u32;
    if *olen >= left {
        return left;
    }
    let c = *olen;
    if *olen < MAX_TRANSFER {
        *olen <<= 1;
    }
    c
}

fn config() -> &'static Config {
    static C: OnceLock<Config> = OnceLock::new();
    C.get_or_init(|| {
        let read = |name: &str| std::fs::read_to_string(format!("{CONF_DIR}/{name}")).ok()?.trim().parse::<i64>().ok();
        let mut c = Config {
            sizes: Sizes { sbuf: 1 << 17, rbuf: 1 << 17, sq: 384, rq: 384, inline: 64, iomap: 0 },
            polling_time: Duration::from_micros(10),
            wake_up_interval: 500,
        };
        if let Some(v) = read("polling_time") {
            c.polling_time = Duration::from_micros(v.clamp(0, u32::MAX.into()) as u64);
        }
        if let Some(v) = read("wake_up_interval") {
            c.wake_up_interval = v.clamp(0, c_int::MAX.into()) as c_int;
        }
        let u16_of = |v: i64| v.clamp(0, u16::MAX.into()) as u16;
        c.sizes.inline = read("inline_default").map_or(c.sizes.inline, u16_of);
        c.sizes.sq = read("sqsize_default").map_or(c.sizes.sq, u16_of);
        c.sizes.rq = read("rqsize_default").map_or(c.sizes.rq, u16_of);
        if let Some(v) = read("mem_default") {
            c.sizes.rbuf = v.clamp(1, u32::MAX.into()) as u32;
        }
        if let Some(v) = read("wmem_default") {
            let v = v.clamp(0, u32::MAX.into()) as u32;
            c.sizes.sbuf = if v < stream::SNDLOWAT { stream::SNDLOWAT << 1 } else { v };
        }
        if let Some(v) = read("iomap_size") {
            c.sizes.iomap = (wire::value_to_scale(wire::scale_to_value(u32::from(u16_of(v)), 8), 8) & 0xFF) as u16;
        }
        c
    })
}

/// Socket options kept for `rgetsockopt` (bits by option name, as librdmacm keeps them).
#[derive(Default)]
struct Opts {
    so: u64,
    tcp: u64,
    ipv6: u64,
    tos: c_int,
    keepalive_time: u32,
    /// `RDMA_ROUTE`'s path records, used by the next connect.
    route: Option<Vec<u8>>,
    retries: u32,
}

/// An rsocket.
pub(crate) struct Rs {
    /// Its number: the descriptor of its id's event channel.
    fd: c_int,
    id: *mut rdma_cm_id,
    s: Mutex<Stream>,
    /// The CQ's waiter, with the completion events taken and not yet acknowledged.
    wait: Mutex<u32>,
    /// The CQ is armed for an event (`cq_armed`): read by a waiter without `s`.
    armed: AtomicBool,
    send: Mutex<()>,
    recv: Mutex<()>,
    /// `O_NONBLOCK` (`fs_flags`) and `FD_CLOEXEC` (`fd_flags`) as the program set them.
    fs_flags: AtomicI32,
    fd_flags: AtomicI32,
    opts: Mutex<Opts>,
    /// A listener's queue of accepted sockets: the service thread writes their numbers.
    accept_queue: OnceLock<(OwnedFd, OwnedFd)>,
    /// Set by `rclose`: until when its wait for the socket's sends may last.
    closing: Mutex<Option<Instant>>,
}

// SAFETY: the id is this library's, live until the socket is freed; everything else is
// behind locks or atomics.
unsafe impl Send for Rs {}
unsafe impl Sync for Rs {}

type Guard<'a> = MutexGuard<'a, Stream>;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// The sockets, by number.
fn table() -> MutexGuard<'static, BTreeMap<c_int, Arc<Rs>>> {
    static T: Mutex<BTreeMap<c_int, Arc<Rs>>> = Mutex::new(BTreeMap::new());
    lock(&T)
}

fn lookup(fd: c_int) -> Option<Arc<Rs>> {
    table().get(&fd).cloned()
}

/// -1 with errno.
fn fail(e: c_int) -> c_int {
    set_errno(e);
    -1
}

fn set_fd_nonblock(fd: c_int, on: bool) -> c_int {
    // SAFETY: fcntl on a descriptor; a bad one gives -1.
    unsafe {
        let f = libc::fcntl(fd, libc::F_GETFL);
        if f < 0 {
            return -1;
        }
        libc::fcntl(fd, libc::F_SETFL, if on { f | libc::O_NONBLOCK } else { f & !libc::O_NONBLOCK })
    }
}

impl Rs {
    fn new(id: *mut rdma_cm_id, sizes: Sizes) -> Rs {
        let mut s = Stream::new(sizes);
        s.id = id;
        Rs {
            // SAFETY: a synchronous id of this library has its own channel.
            fd: unsafe { (*(*id).channel).fd },
            id,
            s: Mutex::new(s),
            wait: Mutex::new(0),
            armed: AtomicBool::new(false),
            send: Mutex::new(()),
            recv: Mutex::new(()),
            fs_flags: AtomicI32::new(0),
            fd_flags: AtomicI32::new(0),
            opts: Mutex::new(Opts::default()),
            accept_queue: OnceLock::new(),
            closing: Mutex::new(None),
        }
    }

    fn cm(&self) -> &rdma_cm_id {
        // SAFETY: the socket's id, live until the socket is freed.
        unsafe { &*self.id }
    }

    fn nonblocking(&self, flags: c_int) -> bool {
        self.fs_flags.load(Ordering::Relaxed) & libc::O_NONBLOCK != 0 || flags & libc::MSG_DONTWAIT != 0
    }

    /// `rs_set_nonblocking`: the descriptors a blocking call of this socket waits on.
    fn set_nonblocking(&self, g: &Stream, on: bool) -> c_int {
        let mut ret = 0;
        let ch = g.comp_channel();
        if !g.id.is_null() && !ch.is_null() {
            // SAFETY: the socket's live completion channel.
            ret = set_fd_nonblock(unsafe { (*ch).fd }, on);
        }
        if g.state == st::LISTENING {
            if let Some((r, _)) = self.accept_queue.get() {
                ret = set_fd_nonblock(r.as_raw_fd(), on);
            }
        } else if ret == 0 && g.state < st::CONNECTED {
            ret = set_fd_nonblock(self.fd, on);
        }
        ret
    }

    /// Takes the CQ's completions until `test` holds (`rs_process_cq`): polling, arming the
    /// CQ, and waiting for its event with `s` released.
    fn process_cq<'a>(
        &'a self,
        mut g: Guard<'a>,
        nonblock: bool,
        test: fn(&Rs, &Stream) -> bool,
    ) -> (Guard<'a>, Result<(), c_int>) {
        let ret = loop {
            g.update_credits();
            let polled = g.poll_cq();
            if test(self, &g) {
                break Ok(());
            }
            if let Err(e) = polled {
                break Err(e);
            }
            if nonblock {
                break Err(libc::EWOULDBLOCK);
            }
            if g.cq().is_null() {
                // Nothing will ever complete (no QP was made): the test decides alone.
                break Err(libc::ENOTCONN);
            }
            if !self.armed.load(Ordering::Acquire) {
                // SAFETY: the socket's CQ.
                unsafe { crate::cq::req_notify_cq(g.cq(), 0) };
                self.armed.store(true, Ordering::Release);
                continue;
            }
            g.update_credits();
            let (cq, channel, sizes) = (g.cq(), g.comp_channel(), u32::from(g.sizes.sq) + u32::from(g.sizes.rq));
            let mut w = lock(&self.wait);
            drop(g);
            let got = match *lock(&self.closing) {
                // rclose's wait for the sends is bounded (see `CLOSE_LINGER`).
                Some(by) if !readable_by(channel, by) => Err(libc::ETIMEDOUT),
                _ => self.get_cq_event(&mut w, cq, channel, sizes),
            };
            drop(w);
            g = lock(&self.s);
            if let Err(e) = got {
                if e != libc::EAGAIN && e != libc::EINTR && e != libc::ETIMEDOUT {
                    g.state = st::ERROR;
                }
                break Err(e);
            }
        };
        g.update_credits();
        (g, ret)
    }

    /// Waits for the armed CQ's event (`rs_get_cq_event`); at once if another waiter took it.
    fn get_cq_event(
        &self,
        unacked: &mut u32,
        cq: *mut ibv_cq,
        channel: *mut ibv_comp_channel,
        sizes: u32,
    ) -> Result<(), c_int> {
        if !self.armed.load(Ordering::Acquire) || channel.is_null() {
            return Ok(());
        }
        let (mut got, mut ctx) = (null_mut(), null_mut());
        // SAFETY: the socket's completion channel and local out pointers.
        if unsafe { crate::cq::ibv_get_cq_event(channel, &mut got, &mut ctx) } != 0 {
            return Err(errno());
        }
        *unacked += 1;
        if *unacked >= sizes {
            // SAFETY: the socket's CQ, whose events were taken above.
            unsafe { crate::cq::ibv_ack_cq_events(cq, *unacked) };
            *unacked = 0;
        }
        self.armed.store(false, Ordering::Release);
        Ok(())
    }

    /// `rs_get_comp`: polls without blocking for a while (`polling_time`), then blocks.
    fn get_comp<'a>(
        &'a self,
        mut g: Guard<'a>,
        nonblock: bool,
        test: fn(&Rs, &Stream) -> bool,
    ) -> (Guard<'a>, Result<(), c_int>) {
        let start = Instant::now();
        loop {
            let r;
            (g, r) = self.process_cq(g, true, test);
            if r.is_ok() || nonblock || r != Err(libc::EWOULDBLOCK) {
                return (g, r);
            }
            if start.elapsed() > config().polling_time {
                return self.process_cq(g, false, test);
            }
        }
    }

    /// `rs_do_connect`: the connection's next step; blocking unless the id's channel is
    /// non-blocking (then EINPROGRESS while a step waits for its event).
    fn do_connect(&self) -> Result<(), c_int> {
        let mut g = lock(&self.s);
        let r = self.connect_steps(&mut g);
        match r {
            Err(e) if e == libc::EAGAIN || e == libc::EWOULDBLOCK => Err(libc::EINPROGRESS),
            Err(e) if e == libc::ENOTCONN || e == libc::EINVAL => Err(e),
            Err(e) => {
                g.state = st::CONNECT_ERROR;
                g.err = e;
                Err(e)
            }
            Ok(()) => Ok(()),
        }
    }

    fn connect_steps(&self, g: &mut Stream) -> Result<(), c_int> {
        enum Step {
            ResolveAddr,
            WaitAddr,
            ResolveRoute,
            WaitRoute,
            Connect,
            WaitConnect,
            Connected,
            WaitAccept,
        }
        let mut step = match g.state {
            st::INIT | st::BOUND => Step::ResolveAddr,
            st::RESOLVING_ADDR => Step::WaitAddr,
            st::RESOLVING_ROUTE => Step::WaitRoute,
            st::CONNECTING => Step::WaitConnect,
            st::ACCEPTING => Step::WaitAccept,
            st::CONNECT_ERROR | st::DISCONNECTED | st::ERROR => return Err(libc::ENOTCONN),
            s if s & st::CONNECTED != 0 => return Ok(()),
            _ => return Err(libc::EINVAL),
        };
        let id = self.id;
        // A call's answer: on to `next`, or, where the call waits for its event on a
        // non-blocking channel, EAGAIN in the `waiting` state (the next call takes the event).
        fn advance(g: &mut Stream, rc: c_int, next: Step, waiting: u32) -> Result<Step, c_int> {
            match rc {
                0 => Ok(next),
                _ if errno() == libc::EAGAIN || errno() == libc::EWOULDBLOCK => {
                    g.state = waiting;
                    Err(libc::EAGAIN)
                }
                _ => Err(errno()),
            }
        }
        loop {
            step = match step {
                Step::ResolveAddr => {
                    let to = self.timeout();
                    // SAFETY: the socket's id; its destination set by rconnect.
                    let rc = unsafe {
                        let dst = std::ptr::addr_of_mut!((*id).route.addr.dst).cast();
                        cm::softhca_rdma_resolve_addr(id, null_mut(), dst, to)
                    };
                    advance(g, rc, Step::ResolveRoute, st::RESOLVING_ADDR)?
                }
                // SAFETY: the socket's id.
                Step::WaitAddr => match unsafe { cm::complete_id(id) } {
                    Ok(()) => {
                        lock(&self.opts).retries = 0;
                        Step::ResolveRoute
                    }
                    Err(libc::ETIMEDOUT) if lock(&self.opts).retries <= CONN_RETRIES => Step::ResolveAddr,
                    Err(e) => return Err(e),
                },
                Step::ResolveRoute => {
                    let to = self.timeout();
                    let route = lock(&self.opts).route.take();
                    // SAFETY: the socket's id; the program's path records, copied.
                    let rc = unsafe {
                        match &route {
                            Some(r) => cm::softhca_rdma_set_option(
                                id,
                                RDMA_OPTION_IB,
                                RDMA_OPTION_IB_PATH,
                                r.as_ptr() as *mut c_void,
                                r.len(),
                            ),
                            None => cm::softhca_rdma_resolve_route(id, to),
                        }
                    };
                    // Path records given (RDMA_ROUTE): their event comes as a resolution's.
                    let next = if route.is_some() { Step::WaitRoute } else { Step::Connect };
                    let step = advance(g, rc, next, st::RESOLVING_ROUTE)?;
                    if matches!(step, Step::WaitRoute) {
                        g.state = st::RESOLVING_ROUTE;
                    }
                    step
                }
                // SAFETY: the socket's id.
                Step::WaitRoute => match unsafe { cm::complete_id(id) } {
                    Ok(()) => Step::Connect,
                    Err(libc::ETIMEDOUT) if lock(&self.opts).retries <= CONN_RETRIES => Step::ResolveRoute,
                    Err(e) => return Err(e),
                },
                Step::Connect => {
                    g.create_ep()?;
                    let data = g.conn_data().to_bytes();
                    let mut p = rdma_conn_param {
                        private_data: data.as_ptr().cast(),
                        private_data_len: data.len() as u8,
                        responder_resources: 0,
                        initiator_depth: 0,
                        flow_control: 1,
                        retry_count: 7,
                        rnr_retry_count: 7,
                        srq: 0,
                        qp_num: 0,
                    };
                    lock(&self.opts).retries = 0;
                    // SAFETY: the socket's id with its QP; parameters that outlive the call.
                    let rc = unsafe { crate::rdmacm::conn::softhca_rdma_connect(id, &mut p) };
                    advance(g, rc, Step::Connected, st::CONNECTING)?
                }
                // SAFETY: the socket's id.
                Step::WaitConnect => match unsafe { cm::complete_id(id) } {
                    Ok(()) => Step::Connected,
                    Err(e) => return Err(e),
                },
                Step::Connected => {
                    let Some(c) = self.event_conn_data() else { return Err(libc::ENOTSUP) };
                    g.save_conn_data(&c);
                    g.state = st::CONNECT_RDWR;
                    return Ok(());
                }
                Step::WaitAccept => {
                    if self.fs_flags.load(Ordering::Relaxed) & libc::O_NONBLOCK == 0 {
                        set_fd_nonblock(self.fd, true);
                    }
                    // SAFETY: the socket's id.
                    unsafe { cm::complete_id(id) }?;
                    g.state = st::CONNECT_RDWR;
                    return Ok(());
                }
            }
        }
    }

    /// The timeout of the next resolution: 1 s, doubling with each retry.
    fn timeout(&self) -> c_int {
        let mut o = lock(&self.opts);
        let t = 1000 << o.retries.min(20);
        o.retries += 1;
        t
    }

    /// The peer's connection data in the id's current event (a REQ's or a REP's), if it is
    /// version 1.
    fn event_conn_data(&self) -> Option<ConnData> {
        let ev = self.cm().event;
        if ev.is_null() {
            return None;
        }
        // SAFETY: the id's current event, with its private data.
        let c = unsafe {
            let p = (*ev).param.conn;
            stream::bytes(p.private_data, usize::from(p.private_data_len))
        };
        ConnData::parse(c).filter(|c| c.version == wire::CONN_VERSION)
    }
}

/// Whether the completion channel becomes readable before `by`.
fn readable_by(channel: *mut ibv_comp_channel, by: Instant) -> bool {
    let ms = by.saturating_duration_since(Instant::now()).as_millis().min(c_int::MAX as u128) as c_int;
    // SAFETY: the socket's live completion channel; one local pollfd.
    let mut p = libc::pollfd { fd: unsafe { (*channel).fd }, events: libc::POLLIN, revents: 0 };
    // SAFETY: as above.
    unsafe { libc::poll(&mut p, 1, ms) == 1 }
}

/// Tests a blocking call waits for (librdmacm's `rs_conn_*`).
fn conn_can_send(_: &Rs, s: &Stream) -> bool {
    s.can_send() || s.state & st::WRITABLE == 0
}
fn conn_can_send_ctrl(_: &Rs, s: &Stream) -> bool {
    s.ctrl_avail() || s.state & st::CONNECTED == 0
}
fn conn_have_rdata(_: &Rs, s: &Stream) -> bool {
    s.have_rdata() || s.state & st::READABLE == 0
}
fn conn_all_sends_done(_: &Rs, s: &Stream) -> bool {
    s.all_sends_done()
}
fn poll_all(_: &Rs, _: &Stream) -> bool {
    true
}
fn is_cq_armed(rs: &Rs, _: &Stream) -> bool {
    rs.armed.load(Ordering::Acquire)
}

/// Frees a socket out of the table (`rs_free`): its QP and buffers, its id (a connected one
/// sends its DREQ), a listener's queue.
fn free(rs: &Arc<Rs>) {
    let unacked = std::mem::take(&mut *lock(&rs.wait));
    let mut g = lock(&rs.s);
    g.free_ep(unacked);
    drop(g);
    // SAFETY: the socket's id, destroyed once: the socket is out of the table.
    unsafe { cm::softhca_rdma_destroy_id(rs.id) };
}

// The exported functions (forwarded to from librdmacm.so.1's `r*` symbols).

#[no_mangle]
pub extern "C" fn softhca_rs_socket(domain: c_int, ty: c_int, protocol: c_int) -> c_int {
    const AF_IB: c_int = 27;
    let kind = ty & !(libc::SOCK_CLOEXEC | libc::SOCK_NONBLOCK);
    if (domain != libc::AF_INET && domain != libc::AF_INET6 && domain != AF_IB)
        || (kind != libc::SOCK_STREAM && kind != libc::SOCK_DGRAM)
        || (kind == libc::SOCK_STREAM && protocol != 0 && protocol != libc::IPPROTO_TCP)
        || (kind == libc::SOCK_DGRAM && protocol != 0 && protocol != libc::IPPROTO_UDP)
    {
        return fail(libc::ENOTSUP);
    }
    if kind == libc::SOCK_DGRAM {
        // Datagram rsockets (UD QPs beside a UDP socket) are not built.
        return fail(libc::ENOSYS);
    }
    let mut id = null_mut();
    // SAFETY: a local out pointer; a synchronous id (no channel), as librdmacm makes.
    if unsafe { cm::softhca_rdma_create_id(null_mut(), &mut id, null_mut(), RDMA_PS_TCP) } != 0 {
        return -1;
    }
    // SAFETY: the id just made.
    unsafe { (*id).route.addr.src.ss_family = domain as libc::sa_family_t };
    let rs = Arc::new(Rs::new(id, config().sizes));
    rs.fd_flags.store(if ty & libc::SOCK_CLOEXEC != 0 { libc::FD_CLOEXEC } else { 0 }, Ordering::Relaxed);
    rs.fs_flags.store(if ty & libc::SOCK_NONBLOCK != 0 { libc::O_NONBLOCK } else { 0 }, Ordering::Relaxed);
    let fd = rs.fd;
    if ty & libc::SOCK_NONBLOCK != 0 {
        // As `rfcntl(F_SETFL, O_NONBLOCK)` does: librdmacm 44 records SOCK_NONBLOCK but
        // leaves the id's channel blocking, so its rconnect waited for the connection.
        rs.set_nonblocking(&lock(&rs.s), true);
    }
    table().insert(fd, rs);
    fd
}

#[no_mangle]
pub unsafe extern "C" fn softhca_rs_bind(fd: c_int, addr: *const libc::sockaddr, _len: libc::socklen_t) -> c_int {
    let Some(rs) = lookup(fd) else { return fail(libc::EBADF) };
    // SAFETY: the socket's id; the program's address.
    let ret = unsafe { cm::softhca_rdma_bind_addr(rs.id, addr as *mut _) };
    if ret == 0 {
        lock(&rs.s).state = st::BOUND;
    }
    ret
}

#[no_mangle]
pub extern "C" fn softhca_rs_listen(fd: c_int, backlog: c_int) -> c_int {
    let Some(rs) = lookup(fd) else { return fail(libc::EBADF) };
    if lock(&rs.s).state == st::LISTENING {
        return 0;
    }
    // SAFETY: the socket's id.
    if unsafe { cm::softhca_rdma_listen(rs.id, backlog) } != 0 {
        return -1;
    }
    let mut pair = [0; 2];
    // SAFETY: a local array of two descriptors.
    if unsafe { libc::socketpair(libc::AF_UNIX, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0, pair.as_mut_ptr()) } != 0 {
        return -1;
    }
    // SAFETY: the two descriptors just made, owned from here.
    let q = unsafe { (OwnedFd::from_raw_fd(pair[0]), OwnedFd::from_raw_fd(pair[1])) };
    if rs.fs_flags.load(Ordering::Relaxed) & libc::O_NONBLOCK != 0 {
        set_fd_nonblock(q.0.as_raw_fd(), true);
    }
    let _ = rs.accept_queue.set(q);
    set_fd_nonblock(rs.fd, true);
    lock(&rs.s).state = st::LISTENING;
    svc::add(&rs, svc::What::Listen);
    0
}

/// Accepts one connection request of a listener, on the service thread (`rs_accept`): the
/// new socket's QP and buffers, the REP with this end's connection data, and its number
/// into the listener's queue. Returns false when no request waits.
fn accept_one(l: &Arc<Rs>) -> bool {
    let mut id = null_mut();
    // SAFETY: the listener's id (its channel non-blocking); a local out pointer.
    if unsafe { crate::rdmacm::qp::softhca_rdma_get_request(l.id, &mut id) } != 0 {
        return false;
    }
    let sizes = lock(&l.s).sizes;
    let rs = Arc::new(Rs::new(id, sizes));
    rs.fd_flags.store(l.fd_flags.load(Ordering::Relaxed), Ordering::Relaxed);
    rs.fs_flags.store(l.fs_flags.load(Ordering::Relaxed), Ordering::Relaxed);
    let refuse = |rs: &Arc<Rs>| {
        // SAFETY: the request's id, refused and then freed with the socket.
        unsafe { crate::rdmacm::conn::softhca_rdma_reject(rs.id, std::ptr::null(), 0) };
        free(rs);
    };
    let Some(creq) = rs.event_conn_data() else {
        refuse(&rs);
        return true;
    };
    let mut g = lock(&rs.s);
    if g.create_ep().is_err() {
        drop(g);
        refuse(&rs);
        return true;
    }
    g.save_conn_data(&creq);
    let data = g.conn_data().to_bytes();
    // SAFETY: the request's event, held by the id until its next call.
    let mut p = unsafe { (*rs.cm().event).param.conn };
    p.private_data = data.as_ptr().cast();
    p.private_data_len = data.len() as u8;
    // SAFETY: the new id with its QP; parameters that outlive the call.
    let rc = unsafe { crate::rdmacm::conn::softhca_rdma_accept(rs.id, &mut p) };
    if rc == 0 {
        g.state = st::CONNECT_RDWR;
    } else if errno() == libc::EAGAIN || errno() == libc::EWOULDBLOCK {
        g.state = st::ACCEPTING;
    } else {
        drop(g);
        refuse(&rs);
        return true;
    }
    drop(g);
    let fd = rs.fd;
    table().insert(fd, rs);
    if let Some((_, w)) = l.accept_queue.get() {
        // SAFETY: the queue's write end and a local integer.
        unsafe { libc::write(w.as_raw_fd(), (&fd as *const c_int).cast(), std::mem::size_of::<c_int>()) };
    }
    true
}

#[no_mangle]
pub unsafe extern "C" fn softhca_rs_accept(fd: c_int, addr: *mut libc::sockaddr, len: *mut libc::socklen_t) -> c_int {
    let Some(rs) = lookup(fd) else { return fail(libc::EBADF) };
    let Some((r, _)) = rs.accept_queue.get().filter(|_| lock(&rs.s).state == st::LISTENING) else {
        return fail(libc::EBADF);
    };
    let mut new: c_int = -1;
    // SAFETY: the queue's read end and a local integer.
    let n = unsafe { libc::read(r.as_raw_fd(), (&mut new as *mut c_int).cast(), std::mem::size_of::<c_int>()) };
    if n != std::mem::size_of::<c_int>() as isize {
        return if n < 0 { -1 } else { fail(libc::ECONNABORTED) };
    }
    if !addr.is_null() && !len.is_null() {
        // SAFETY: the program's address buffer.
        unsafe { softhca_rs_getpeername(new, addr, len) };
    }
    if let Some(n) = lookup(new) {
        svc::add(&n, svc::What::Cm);
    }
    new
}

#[no_mangle]
pub unsafe extern "C" fn softhca_rs_connect(fd: c_int, addr: *const libc::sockaddr, len: libc::socklen_t) -> c_int {
    let Some(rs) = lookup(fd) else { return fail(libc::EBADF) };
    if addr.is_null() {
        return fail(libc::EFAULT);
    }
    let n = (len as usize).min(std::mem::size_of::<libc::sockaddr_storage>());
    // SAFETY: the program's address of `len` bytes into the id's destination.
    unsafe {
        std::ptr::copy_nonoverlapping(addr.cast::<u8>(), std::ptr::addr_of_mut!((*rs.id).route.addr.dst).cast(), n)
    };
    match rs.do_connect() {
        Ok(()) => {
            svc::add(&rs, svc::What::Cm);
            0
        }
        Err(libc::EINPROGRESS) => {
            svc::add(&rs, svc::What::Cm);
            fail(libc::EINPROGRESS)
        }
        Err(e) => fail(e),
    }
}

/// A connecting socket's next step, for the calls that move data (EAGAIN while it waits).
fn progress_connect(rs: &Rs) -> Result<(), c_int> {
    if lock(&rs.s).state & st::OPENING == 0 {
        return Ok(());
    }
    rs.do_connect().map_err(|e| if e == libc::EINPROGRESS { libc::EAGAIN } else { e })
}

/// What a send or receive loop returns: the bytes moved, or -1 with errno if none were.
fn moved(done: usize, ret: Result<(), c_int>) -> isize {
    match ret {
        Err(e) if done == 0 => fail(e) as isize,
        _ => done as isize,
    }
}

/// Waits for room to send (`rsend`'s wait): ECONNRESET once the socket cannot write.
fn wait_send<'a>(rs: &'a Rs, g: Guard<'a>, flags: c_int) -> (Guard<'a>, Result<(), c_int>) {
    if g.can_send() {
        return (g, Ok(()));
    }
    let (g, r) = rs.get_comp(g, rs.nonblocking(flags), conn_can_send);
    match r {
        Ok(()) if g.state & st::WRITABLE == 0 => (g, Err(libc::ECONNRESET)),
        r => (g, r),
    }
}

/// Tells the peer of the program's new writable mappings (`rs_send_iomaps`), before data.
fn send_iomaps<'a>(rs: &'a Rs, mut g: Guard<'a>, flags: c_int) -> (Guard<'a>, Result<(), c_int>) {
    while g.iomap_pending() {
        let r;
        (g, r) = wait_send(rs, g, flags);
        if let Err(e) = r.and_then(|()| g.send_next_iomap()) {
            return (g, Err(e));
        }
    }
    (g, Ok(()))
}

/// Sends `len` bytes that `fill(dst, offset)` copies (`rsend` and `rsendv`). Small pieces
/// of one contiguous buffer go inline from it (`direct`).
fn send_with(
    rs: &Rs,
    len: usize,
    flags: c_int,
    direct: Option<&[u8]>,
    mut fill: impl FnMut(&mut [u8], usize),
) -> isize {
    if let Err(e) = progress_connect(rs) {
        return fail(e) as isize;
    }
    let _one = lock(&rs.send);
    let (mut g, r) = send_iomaps(rs, lock(&rs.s), flags);
    if let Err(e) = r {
        return fail(e) as isize;
    }
    let (mut done, mut olen, mut ret) = (0usize, OLAP_START_SIZE, Ok(()));
    while done < len {
        let r;
        (g, r) = wait_send(rs, g, flags);
        if let Err(e) = r {
            ret = Err(e);
            break;
        }
        let (xfer, target) = g.fit(next_chunk(&mut olen, len - done));
        let r = match direct {
            Some(buf) => g.send_some(Dest::Data(target), &buf[done..done + xfer as usize]),
            None => {
                let inline = if xfer <= u32::from(g.sizes.inline) { IBV_SEND_INLINE } else { 0 };
                g.copy_and_write(Dest::Data(target), |dst, at| fill(dst, done + at), xfer, inline)
            }
        }
        .map(|()| xfer);
        match r {
            Ok(n) => done += n as usize,
            Err(e) => {
                ret = Err(e);
                break;
            }
        }
    }
    drop(g);
    moved(done, ret)
}

#[no_mangle]
pub unsafe extern "C" fn softhca_rs_send(fd: c_int, buf: *const c_void, len: usize, flags: c_int) -> isize {
    let Some(rs) = lookup(fd) else { return fail(libc::EBADF) as isize };
    // SAFETY: the program's buffer of `len` bytes.
    let b = unsafe { stream::bytes(buf, len) };
    send_with(&rs, b.len(), flags, Some(b), |_, _| {})
}

/// Copies from an iovec array, at a byte offset into the whole.
struct Iov<'a>(&'a [libc::iovec]);

impl Iov<'_> {
    /// The bytes in all, as `writev` takes them: None (EINVAL) if a length is negative as an
    /// `ssize_t`, else their sum, clipped (Linux clips it to MAX_RW_COUNT; what one call sends
    /// is far less anyway).
    fn len(&self) -> Option<usize> {
        let each = |v: &libc::iovec| (v.iov_len <= isize::MAX as usize).then_some(v.iov_len);
        self.0.iter().try_fold(0usize, |sum, v| Some(sum.saturating_add(each(v)?)))
    }

    fn copy_out(&self, dst: &mut [u8], mut at: usize) {
        let mut put = 0;
        for v in self.0 {
            if put == dst.len() {
                break;
            }
            if at >= v.iov_len {
                at -= v.iov_len;
                continue;
            }
            let n = (v.iov_len - at).min(dst.len() - put);
            // SAFETY: the program's iovec of `iov_len` readable bytes.
            let src = unsafe { stream::bytes(v.iov_base, v.iov_len) };
            dst[put..put + n].copy_from_slice(&src[at..at + n]);
            put += n;
            at = 0;
        }
    }
}

/// # Safety
/// `iov` points to `n` iovecs of readable memory.
unsafe fn iovs<'a>(iov: *const libc::iovec, n: c_int) -> &'a [libc::iovec] {
    if iov.is_null() || n <= 0 {
        return &[];
    }
    // SAFETY: the caller's contract.
    unsafe { std::slice::from_raw_parts(iov, n as usize) }
}

#[no_mangle]
pub unsafe extern "C" fn softhca_rs_sendv(fd: c_int, iov: *const libc::iovec, n: c_int, flags: c_int) -> isize {
    let Some(rs) = lookup(fd) else { return fail(libc::EBADF) as isize };
    // SAFETY: the program's iovecs.
    let v = Iov(unsafe { iovs(iov, n) });
    let Some(len) = v.len() else { return fail(libc::EINVAL) as isize };
    send_with(&rs, len, flags, None, |dst, at| v.copy_out(dst, at))
}

#[no_mangle]
pub unsafe extern "C" fn softhca_rs_sendto(
    fd: c_int,
    buf: *const c_void,
    len: usize,
    flags: c_int,
    dst: *const libc::sockaddr,
    dst_len: libc::socklen_t,
) -> isize {
    if lookup(fd).is_none() {
        return fail(libc::EBADF) as isize;
    }
    if !dst.is_null() || dst_len != 0 {
        return fail(libc::EISCONN) as isize;
    }
    // SAFETY: the program's buffer.
    unsafe { softhca_rs_send(fd, buf, len, flags) }
}

/// A message header's iovecs: EFAULT for none, ENOTSUP with control data (rsockets have no
/// ancillary data, as librdmacm's).
///
/// # Safety
/// `m` is null or the program's message header.
unsafe fn msg_iovs<'a>(m: *const libc::msghdr) -> Result<&'a libc::msghdr, c_int> {
    // SAFETY: the caller's contract.
    let m = unsafe { m.as_ref() }.ok_or(libc::EFAULT)?;
    if !m.msg_control.is_null() && m.msg_controllen != 0 {
        return Err(libc::ENOTSUP);
    }
    Ok(m)
}

#[no_mangle]
pub unsafe extern "C" fn softhca_rs_sendmsg(fd: c_int, m: *const libc::msghdr, flags: c_int) -> isize {
    // SAFETY: the program's message header.
    match unsafe { msg_iovs(m) } {
        // SAFETY: its iovecs.
        Ok(m) => unsafe { softhca_rs_sendv(fd, m.msg_iov, m.msg_iovlen as c_int, flags) },
        Err(e) => fail(e) as isize,
    }
}

#[no_mangle]
pub unsafe extern "C" fn softhca_rs_recv(fd: c_int, buf: *mut c_void, len: usize, flags: c_int) -> isize {
    let Some(rs) = lookup(fd) else { return fail(libc::EBADF) as isize };
    if let Err(e) = progress_connect(&rs) {
        return fail(e) as isize;
    }
    // SAFETY: the program's buffer of `len` writable bytes.
    let dst = unsafe { stream::bytes_mut(buf, len) };
    let _one = lock(&rs.recv);
    let mut g = lock(&rs.s);
    let (mut done, mut ret) = (0, Ok(()));
    loop {
        if !g.have_rdata() {
            let r;
            (g, r) = rs.get_comp(g, rs.nonblocking(flags), conn_have_rdata);
            if let Err(e) = r {
                ret = Err(e);
                break;
            }
        }
        if flags & libc::MSG_PEEK != 0 {
            done = g.read(dst, true);
            break;
        }
        done += g.read(&mut dst[done..], false);
        if !(done < dst.len() && flags & libc::MSG_WAITALL != 0 && g.state & st::READABLE != 0) {
            break;
        }
    }
    drop(g);
    moved(done, ret)
}

#[no_mangle]
pub unsafe extern "C" fn softhca_rs_recvfrom(
    fd: c_int,
    buf: *mut c_void,
    len: usize,
    flags: c_int,
    src: *mut libc::sockaddr,
    src_len: *mut libc::socklen_t,
) -> isize {
    // SAFETY: the program's buffer.
    let n = unsafe { softhca_rs_recv(fd, buf, len, flags) };
    if n > 0 && !src.is_null() {
        // SAFETY: the program's address buffer.
        unsafe { softhca_rs_getpeername(fd, src, src_len) };
    }
    n
}

/// `rrecvmsg` and `rreadv` fill the first iovec only, as librdmacm's do.
#[no_mangle]
pub unsafe extern "C" fn softhca_rs_recvv(fd: c_int, iov: *const libc::iovec, n: c_int, flags: c_int) -> isize {
    // SAFETY: the program's iovecs.
    match unsafe { iovs(iov, n) }.first() {
        // SAFETY: the program's first iovec.
        Some(v) => unsafe { softhca_rs_recv(fd, v.iov_base, v.iov_len, flags) },
        None => fail(libc::EINVAL) as isize,
    }
}

#[no_mangle]
pub unsafe extern "C" fn softhca_rs_recvmsg(fd: c_int, m: *mut libc::msghdr, _flags: c_int) -> isize {
    // librdmacm 44 passes the header's `msg_flags`, not the call's.
    // SAFETY: the program's message header.
    match unsafe { msg_iovs(m) } {
        // SAFETY: its iovecs.
        Ok(m) => unsafe { softhca_rs_recvv(fd, m.msg_iov, m.msg_iovlen as c_int, m.msg_flags) },
        Err(e) => fail(e) as isize,
    }
}

#[no_mangle]
pub unsafe extern "C" fn softhca_rs_shutdown(fd: c_int, how: c_int) -> c_int {
    let Some(rs) = lookup(fd) else { return fail(libc::EBADF) };
    match shutdown(&rs, how) {
        Ok(()) => 0,
        Err(e) => fail(e),
    }
}

/// `rshutdown`: tells the peer (a control message), then waits for every send to finish.
fn shutdown(rs: &Arc<Rs>, how: c_int) -> Result<(), c_int> {
    if lock(&rs.s).state & st::CONNECTED != 0 {
        svc::remove(rs, svc::What::Keepalive);
    }
    let nonblock = rs.fs_flags.load(Ordering::Relaxed) & libc::O_NONBLOCK != 0;
    let mut g = lock(&rs.s);
    if nonblock {
        rs.set_nonblocking(&g, false);
    }
    let mut ret = Ok(());
    'out: {
        if g.state & st::CONNECTED != 0 {
            let c = if how == libc::SHUT_RDWR {
                g.state &= !(st::READABLE | st::WRITABLE);
                ctrl::DISCONNECT
            } else if how == libc::SHUT_WR {
                g.state &= !st::WRITABLE;
                if g.state & st::READABLE != 0 {
                    ctrl::SHUTDOWN
                } else {
                    ctrl::DISCONNECT
                }
            } else {
                g.state &= !st::READABLE;
                if g.state & st::WRITABLE != 0 {
                    break 'out;
                }
                ctrl::DISCONNECT
            };
            if !g.ctrl_avail() {
                let r;
                (g, r) = rs.process_cq(g, false, conn_can_send_ctrl);
                if let Err(e) = r {
                    ret = Err(e);
                    break 'out;
                }
            }
            if g.state & st::CONNECTED != 0 && g.ctrl_avail() {
                ret = g.post_ctrl(c);
            }
        }
        if g.state & st::CONNECTED != 0 {
            g = rs.process_cq(g, false, conn_all_sends_done).0;
        }
    }
    // librdmacm 44 restores the program's non-blocking mode only while connected, so an
    // rshutdown of a non-blocking listener left its raccept blocking: restored always here.
    if nonblock {
        rs.set_nonblocking(&g, true);
    }
    if g.state & st::DISCONNECTED != 0 {
        // Flushes the receives, so that a thread in rpoll wakes.
        // SAFETY: the socket's CQ.
        unsafe { crate::cq::req_notify_cq(g.cq(), 0) };
        g.flush();
    }
    ret
}

#[no_mangle]
pub extern "C" fn softhca_rs_close(fd: c_int) -> c_int {
    let Some(rs) = lookup(fd) else {
        // librdmacm 44 returns EBADF itself here, not -1.
        return libc::EBADF;
    };
    if lock(&rs.s).state & st::CONNECTED != 0 {
        *lock(&rs.closing) = Some(Instant::now() + CLOSE_LINGER);
        let _ = shutdown(&rs, libc::SHUT_RDWR);
    }
    // A listener's entry is on the listening thread, which may be inside an accept: only a
    // listener waits for that (as librdmacm's `rs_notify_svc` of `listen_svc`).
    if rs.accept_queue.get().is_some() {
        svc::remove(&rs, svc::What::Listen);
    }
    for w in [svc::What::Keepalive, svc::What::Cm] {
        svc::remove(&rs, w);
    }
    table().remove(&fd);
    free(&rs);
    0
}

/// Copies a socket address of `src` into the program's buffer (`rs_copy_addr`).
///
/// # Safety
/// `dst` and `len` are the program's writable address buffer and its length.
unsafe fn copy_addr(dst: *mut libc::sockaddr, src: &libc::sockaddr_storage, len: *mut libc::socklen_t) -> c_int {
    if dst.is_null() || len.is_null() {
        return fail(libc::EFAULT);
    }
    let size = if c_int::from(src.ss_family) == libc::AF_INET {
        std::mem::size_of::<libc::sockaddr_in>()
    } else {
        std::mem::size_of::<libc::sockaddr_in6>()
    };
    // SAFETY: the caller's contract; at most the smaller of the two lengths is copied.
    unsafe {
        let n = size.min(*len as usize);
        std::ptr::copy_nonoverlapping((src as *const libc::sockaddr_storage).cast::<u8>(), dst.cast(), n);
        *len = size as libc::socklen_t;
    }
    0
}

#[no_mangle]
pub unsafe extern "C" fn softhca_rs_getpeername(
    fd: c_int,
    addr: *mut libc::sockaddr,
    len: *mut libc::socklen_t,
) -> c_int {
    let Some(rs) = lookup(fd) else { return fail(libc::EBADF) };
    // SAFETY: the program's buffer; the id's destination.
    unsafe { copy_addr(addr, &rs.cm().route.addr.dst, len) }
}

#[no_mangle]
pub unsafe extern "C" fn softhca_rs_getsockname(
    fd: c_int,
    addr: *mut libc::sockaddr,
    len: *mut libc::socklen_t,
) -> c_int {
    let Some(rs) = lookup(fd) else { return fail(libc::EBADF) };
    // SAFETY: the program's buffer; the id's source.
    unsafe { copy_addr(addr, &rs.cm().route.addr.src, len) }
}

/// `SOL_RDMA` and its options (`<rdma/rsocket.h>`).
const SOL_RDMA: c_int = 0x10000;
const RDMA_SQSIZE: c_int = 0;
const RDMA_RQSIZE: c_int = 1;
const RDMA_INLINE: c_int = 2;
const RDMA_IOMAPSIZE: c_int = 3;
const RDMA_ROUTE: c_int = 4;

/// Where an option is kept as a bit (by its name) for `rgetsockopt`.
type OptBits = fn(&mut Opts) -> &mut u64;

#[no_mangle]
pub unsafe extern "C" fn softhca_rs_setsockopt(
    fd: c_int,
    level: c_int,
    name: c_int,
    val: *const c_void,
    len: libc::socklen_t,
) -> c_int {
    let Some(rs) = lookup(fd) else { return fail(libc::EBADF) };
    if val.is_null() {
        return fail(libc::EFAULT);
    }
    // SAFETY: the program's option value (an int for every option but RDMA_ROUTE's).
    let int = || unsafe { std::ptr::read_unaligned(val.cast::<c_int>()) };
    let mut on = false;
    // Ok(Some(bits)): the option is kept on (or off) in those bits.
    let r: Result<Option<OptBits>, c_int> = match (level, name) {
        (libc::SOL_SOCKET, libc::SO_REUSEADDR) => {
            // SAFETY: the socket's id and the program's value.
            unsafe {
                cm::softhca_rdma_set_option(
                    rs.id,
                    RDMA_OPTION_ID,
                    RDMA_OPTION_ID_REUSEADDR,
                    val as *mut _,
                    len as usize,
                )
            };
            on = int() != 0;
            Ok(Some(|o| &mut o.so))
        }
        (libc::SOL_SOCKET, libc::SO_RCVBUF) => {
            let mut g = lock(&rs.s);
            if g.state < st::CONNECTED && g.sizes.rbuf > 0 && g.cq().is_null() {
                g.sizes.rbuf = (int() as u32).saturating_mul(2);
            }
            Ok(None)
        }
        (libc::SOL_SOCKET, libc::SO_SNDBUF) => {
            let mut g = lock(&rs.s);
            if g.cq().is_null() {
                g.sizes.sbuf = (int() as u32).saturating_mul(2);
            }
            if g.sizes.sbuf < stream::SNDLOWAT {
                g.sizes.sbuf = stream::SNDLOWAT << 1;
            }
            Ok(None)
        }
        (libc::SOL_SOCKET, libc::SO_LINGER) => {
            // SAFETY: a `struct linger`; kept inverted (off by default means on).
            on = unsafe { (*val.cast::<libc::linger>()).l_onoff } == 0;
            Ok(Some(|o| &mut o.so))
        }
        (libc::SOL_SOCKET, libc::SO_KEEPALIVE) => {
            on = int() != 0;
            if on {
                let t = lock(&rs.opts).keepalive_time;
                if t == 0 {
                    let secs = std::fs::read_to_string("/proc/sys/net/ipv4/tcp_keepalive_time")
                        .ok()
                        .and_then(|s| s.trim().parse().ok())
                        .unwrap_or(7200);
                    lock(&rs.opts).keepalive_time = secs;
                }
                svc::add(&rs, svc::What::Keepalive);
            } else {
                svc::remove(&rs, svc::What::Keepalive);
            }
            Ok(Some(|o| &mut o.so))
        }
        (libc::SOL_SOCKET, libc::SO_OOBINLINE) => {
            on = int() != 0;
            Ok(Some(|o| &mut o.so))
        }
        (libc::IPPROTO_IP, libc::IP_TOS) => {
            lock(&rs.opts).tos = int();
            // SAFETY: the socket's id and the program's value.
            match unsafe {
                cm::softhca_rdma_set_option(rs.id, RDMA_OPTION_ID, RDMA_OPTION_ID_TOS, val as *mut _, len as usize)
            } {
                0 => Ok(None),
                _ => Err(errno()),
            }
        }
        (libc::IPPROTO_TCP, libc::TCP_KEEPCNT | libc::TCP_KEEPINTVL | libc::TCP_MAXSEG | libc::TCP_CONGESTION) => {
            Ok(Some(|o| &mut o.tcp))
        }
        (libc::IPPROTO_TCP, libc::TCP_KEEPIDLE) => {
            if int() <= 0 {
                Err(libc::EINVAL)
            } else {
                lock(&rs.opts).keepalive_time = int() as u32;
                svc::rearm(&rs);
                Ok(Some(|o| &mut o.tcp))
            }
        }
        (libc::IPPROTO_TCP, libc::TCP_NODELAY) => {
            on = int() != 0;
            Ok(Some(|o| &mut o.tcp))
        }
        (libc::IPPROTO_IPV6, libc::IPV6_V6ONLY) => {
            // SAFETY: the socket's id and the program's value.
            unsafe {
                cm::softhca_rdma_set_option(rs.id, RDMA_OPTION_ID, RDMA_OPTION_ID_AFONLY, val as *mut _, len as usize)
            };
            on = int() != 0;
            Ok(Some(|o| &mut o.ipv6))
        }
        (SOL_RDMA, _) if lock(&rs.s).state >= st::OPENING => Err(libc::EINVAL),
        (SOL_RDMA, RDMA_SQSIZE | RDMA_RQSIZE | RDMA_INLINE) => {
            let v = (int() as u32).min(u32::from(stream::QP_MAX_SIZE)) as u16;
            let mut g = lock(&rs.s);
            match name {
                RDMA_SQSIZE => g.sizes.sq = v,
                RDMA_RQSIZE => g.sizes.rq = v,
                _ => g.sizes.inline = v,
            }
            Ok(None)
        }
        (SOL_RDMA, RDMA_IOMAPSIZE) => {
            lock(&rs.s).sizes.iomap = wire::scale_to_value(wire::value_to_scale(int() as u32, 8) & 0xFF, 8) as u16;
            Ok(None)
        }
        (SOL_RDMA, RDMA_ROUTE) => {
            // SAFETY: the program's `len` bytes of path records.
            lock(&rs.opts).route = Some(unsafe { stream::bytes(val, len as usize) }.to_vec());
            Ok(None)
        }
        _ => Err(libc::ENOTSUP),
    };
    match r {
        Ok(bits) => {
            if let Some(bits) = bits {
                let mut o = lock(&rs.opts);
                let b = bits(&mut o);
                let bit = 1u64.checked_shl(name as u32).unwrap_or(0);
                *b = if on { *b | bit } else { *b & !bit };
            }
            0
        }
        Err(e) => fail(e),
    }
}

#[no_mangle]
pub unsafe extern "C" fn softhca_rs_getsockopt(
    fd: c_int,
    level: c_int,
    name: c_int,
    val: *mut c_void,
    len: *mut libc::socklen_t,
) -> c_int {
    let Some(rs) = lookup(fd) else { return fail(libc::EBADF) };
    if val.is_null() || len.is_null() {
        return fail(libc::EFAULT);
    }
    let put = |v: c_int| {
        // SAFETY: the program's int-sized value and its length.
        unsafe {
            std::ptr::write_unaligned(val.cast::<c_int>(), v);
            *len = std::mem::size_of::<c_int>() as libc::socklen_t;
        }
        0
    };
    let bit = |b: u64| c_int::from(b & 1u64.checked_shl(name as u32).unwrap_or(0) != 0);
    let o = lock(&rs.opts);
    match (level, name) {
        (libc::SOL_SOCKET, libc::SO_REUSEADDR | libc::SO_KEEPALIVE | libc::SO_OOBINLINE) => put(bit(o.so)),
        (libc::SOL_SOCKET, libc::SO_RCVBUF) => put(lock(&rs.s).sizes.rbuf as c_int),
        (libc::SOL_SOCKET, libc::SO_SNDBUF) => put(lock(&rs.s).sizes.sbuf as c_int),
        (libc::SOL_SOCKET, libc::SO_LINGER) => {
            // SAFETY: the program's `struct linger` and its length.
            unsafe {
                *val.cast::<libc::linger>() = libc::linger { l_onoff: 1 - bit(o.so), l_linger: 0 };
                *len = std::mem::size_of::<libc::linger>() as libc::socklen_t;
            }
            0
        }
        (libc::SOL_SOCKET, libc::SO_ERROR) => {
            let e = std::mem::take(&mut lock(&rs.s).err);
            put(e)
        }
        (libc::SOL_SOCKET, libc::SO_BROADCAST) => 0,
        (libc::IPPROTO_IP, libc::IP_TOS) => put(o.tos),
        (libc::IPPROTO_TCP, libc::TCP_CONGESTION | libc::TCP_KEEPCNT | libc::TCP_KEEPINTVL) => {
            // SAFETY: as `put`, the length left as the program gave it (as librdmacm does).
            unsafe { std::ptr::write_unaligned(val.cast::<c_int>(), 1) };
            0
        }
        (libc::IPPROTO_TCP, libc::TCP_KEEPIDLE) => put(o.keepalive_time as c_int),
        (libc::IPPROTO_TCP, libc::TCP_NODELAY) => put(bit(o.tcp)),
        (libc::IPPROTO_TCP, libc::TCP_MAXSEG) => {
            let r = &rs.cm().route;
            // SAFETY: the route's path record, when it has one.
            let mtu =
                if r.num_paths > 0 && !r.path_rec.is_null() { 1 << (7 + unsafe { (*r.path_rec).mtu }) } else { 2048 };
            put(mtu)
        }
        (libc::IPPROTO_TCP, libc::TCP_INFO) => {
            let g = lock(&rs.s);
            // SAFETY: the program's `struct tcp_info` (all-zero is valid) and its length.
            unsafe {
                let mut info: libc::tcp_info = std::mem::zeroed();
                info.tcpi_state = if g.state == st::CONNECTED { 1 } else { 7 }; // TCP_ESTABLISHED, TCP_CLOSE
                info.tcpi_snd_cwnd = u32::from(g.sizes.sq);
                std::ptr::write_unaligned(val.cast::<libc::tcp_info>(), info);
                *len = std::mem::size_of::<libc::tcp_info>() as libc::socklen_t;
            }
            0
        }
        (libc::IPPROTO_IPV6, libc::IPV6_V6ONLY) => put(bit(o.ipv6)),
        (SOL_RDMA, RDMA_SQSIZE) => put(c_int::from(lock(&rs.s).sizes.sq)),
        (SOL_RDMA, RDMA_RQSIZE) => put(c_int::from(lock(&rs.s).sizes.rq)),
        (SOL_RDMA, RDMA_INLINE) => put(c_int::from(lock(&rs.s).sizes.inline)),
        (SOL_RDMA, RDMA_IOMAPSIZE) => put(c_int::from(lock(&rs.s).sizes.iomap)),
        _ => fail(libc::ENOTSUP),
    }
}

/// `rfcntl(fd, cmd, ...)`: C's variadic third argument, an int when there is one, arrives
/// where a third int parameter does (the SysV and AAPCS64 calling conventions agree), and is
/// read only for the commands that have it.
#[no_mangle]
pub extern "C" fn softhca_rs_fcntl(fd: c_int, cmd: c_int, arg: c_int) -> c_int {
    let Some(rs) = lookup(fd) else { return fail(libc::EBADF) };
    match cmd {
        libc::F_GETFL => rs.fs_flags.load(Ordering::Relaxed),
        libc::F_SETFL => {
            let was = rs.fs_flags.load(Ordering::Relaxed);
            let mut ret = 0;
            if (was ^ arg) & libc::O_NONBLOCK != 0 {
                ret = rs.set_nonblocking(&lock(&rs.s), arg & libc::O_NONBLOCK != 0);
            }
            if ret == 0 {
                rs.fs_flags.store(arg, Ordering::Relaxed);
            }
            ret
        }
        libc::F_GETFD => rs.fd_flags.load(Ordering::Relaxed),
        libc::F_SETFD => {
            rs.fd_flags.store(arg, Ordering::Relaxed);
            0
        }
        _ => fail(libc::ENOTSUP),
    }
}

/// Sends a keep-alive now (the service thread, when the socket's time is up).
fn send_keepalive(rs: &Rs) {
    let mut g = lock(&rs.s);
    if g.ctrl_avail() && g.state & st::CONNECTED != 0 {
        let _ = g.post_keepalive();
    }
}

/// A CM event on a connecting or connected socket (`rs_handle_cm_event`, service thread).
fn handle_cm_event(rs: &Rs) {
    let opening = lock(&rs.s).state & st::OPENING != 0;
    if opening {
        let _ = rs.do_connect();
    } else {
        // SAFETY: the socket's id.
        let r = unsafe { cm::complete_id(rs.id) };
        let ev = rs.cm().event;
        let mut g = lock(&rs.s);
        // SAFETY: the id's current event.
        if r.is_ok()
            && !ev.is_null()
            && g.state & st::CONNECTED != 0
            && unsafe { (*ev).event } == RDMA_CM_EVENT_DISCONNECTED
        {
            g.state = st::DISCONNECTED;
        }
    }
    if lock(&rs.s).state & st::OPENING == 0 {
        poll::signal();
    }
}

/// `riomap`: maps the program's memory for the peer's `riowrite` (PROT_WRITE), or only
/// registers it (PROT_NONE); the peer learns of a writable one before this end's next data.
#[no_mangle]
pub unsafe extern "C" fn softhca_rs_iomap(
    fd: c_int,
    buf: *mut c_void,
    len: usize,
    prot: c_int,
    _flags: c_int,
    offset: i64,
) -> i64 {
    let Some(rs) = lookup(fd) else { return fail(libc::EBADF).into() };
    let mut g = lock(&rs.s);
    if rs.cm().pd.is_null() || prot & !(libc::PROT_WRITE | libc::PROT_NONE) != 0 {
        return fail(libc::EINVAL).into();
    }
    match g.map(buf, len, prot & libc::PROT_WRITE != 0, offset) {
        Ok(o) => o,
        Err(e) => fail(e).into(),
    }
}

#[no_mangle]
pub unsafe extern "C" fn softhca_rs_iounmap(fd: c_int, buf: *mut c_void, len: usize) -> c_int {
    let Some(rs) = lookup(fd) else { return fail(libc::EBADF) };
    let r = lock(&rs.s).unmap(buf, len);
    match r {
        Ok(()) => 0,
        Err(e) => fail(e),
    }
}

/// `riowrite`: writes into what the peer mapped at `offset` (no message: the peer learns of
/// it from a message sent after). Stops at the end of the peer's mapping.
#[no_mangle]
pub unsafe extern "C" fn softhca_rs_iowrite(
    fd: c_int,
    buf: *const c_void,
    count: usize,
    offset: i64,
    flags: c_int,
) -> usize {
    let Some(rs) = lookup(fd) else { return fail(libc::EBADF) as usize };
    // SAFETY: the program's buffer of `count` bytes.
    let src = unsafe { stream::bytes(buf, count) };
    let _one = lock(&rs.send);
    let (mut g, r) = send_iomaps(&rs, lock(&rs.s), flags);
    if let Err(e) = r {
        return fail(e) as usize;
    }
    let (mut done, mut olen, mut ret) = (0usize, OLAP_START_SIZE, Ok(()));
    while done < src.len() {
        let at = (offset as u64).wrapping_add(done as u64);
        let Some(e) = g.find_iomap(at) else { break };
        let r;
        (g, r) = wait_send(&rs, g, flags);
        if let Err(e) = r {
            ret = Err(e);
            break;
        }
        let chunk = next_chunk(&mut olen, src.len() - done);
        match g.write_direct(&e, at, &src[done..], chunk) {
            Ok(n) => done += n as usize,
            Err(e) => {
                ret = Err(e);
                break;
            }
        }
    }
    drop(g);
    moved(done, ret) as usize
}
