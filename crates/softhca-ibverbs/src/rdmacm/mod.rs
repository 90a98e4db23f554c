//! The RDMA connection manager (librdmacm's API) on softhca's own CM: the logic behind the
//! drop-in `librdmacm.so.1`.
//!
//! Linux's librdmacm is a thin library over the kernel's rdma_cm (the `ucma` character
//! device): the kernel resolves addresses, runs the IB CM on QP1 and reports events that the
//! library turns into `rdma_cm_event`s, moving the QPs it created through INIT, RTR and RTS on
//! the way. Here the device is this library's (one per process, see `device`), so the CM
//! lives beside it: the `softhca_rdma_*` functions below are librdmacm's functions, exported
//! under a private version node, and `librdmacm.so.1` (crate `softhca-rdmacm`) forwards each
//! `rdma_*` symbol to them, so that one engine serves both libraries.
//!
//! - Addresses: the device's address is its GID 0 (`::ffff:a.b.c.d` for IPv4). Resolving an
//!   address checks that the kernel has a route to it (a UDP `connect`, which sends nothing)
//!   and completes at once; a route is the one path to that GID. Binding a loopback address
//!   before the device is open opens it on that address (on `SOFTHCA_ADDR` where that is
//!   set); another loopback address binds with no device, as the any address does (Linux's
//!   answer for an address of `lo`); any other local address is ENODEV, a non-local one
//!   EADDRNOTAVAIL. A listener bound to an address takes only the requests addressed to it.
//! - Ports: a port space (TCP, UDP, IB, IPoIB) of 16-bit ports per process, a port shared by
//!   ids on different addresses as Linux's rdma_cm shares it (`Global::check_port`); the
//!   service ID of a REQ is the port space and the destination port (`RDMA_IB_IP_PS_*`), and
//!   its private data starts with the `cma_hdr` of the IP addresses, as Linux's rdma_cm sends
//!   them.
//! - Connections: `transport::cm::Cm` on the device's GSI ([`softhca::CmAgent`]), driven by one
//!   thread per process that waits on the GSI's CQ channel and the CM's next deadline. It moves
//!   an id's QP as librdmacm does (INIT with the access the resources allow, RTR, RTS from the
//!   REQ/REP), before the RTU leaves.
//! - Events: an event channel is a queue with an eventfd in semaphore mode (readable while
//!   events wait; blocking until the program sets O_NONBLOCK). An id made without a channel is
//!   synchronous: its calls wait for their own event, as librdmacm's do.
//!
//! - UD ids (`RDMA_PS_UDP`, `RDMA_PS_IPOIB`): `rdma_connect` resolves the service with a
//!   SIDR REQ; the SIDR REP gives ESTABLISHED with the remote QPN, Q_Key and address handle.
//!
//! - Multicast (`rdma_join_multicast`): as rdma_cm on a RoCEv2 port, no exchange with anyone:
//!   an IPv4 group's MGID is its IPv4-mapped address, the join event comes at once, and the
//!   id's QP is attached to the group as librdmacm attaches it (the UDP link then joins the
//!   group on the device's interface, which Linux's rdma_cm does with IGMP).
//!
//! Not built: alternate paths (LAP). The rsocket API built on this CM is `crate::rsocket`.
//!
//! Here: the CM's state (ids, channels, events, the device and its agent) and the thread that
//! drives it, the QP attributes a connection gives (`rdma_init_qp_attr`), and the helpers the
//! exported functions share (errno, the program's pointers, a request's refusal). The
//! exported functions: `api.rs` (channels, events, ids, options), `conn.rs` (connect, accept,
//! reject, disconnect), `qp.rs` (an id's QP, SRQ, endpoint, `rdma_get_request`),
//! `addrinfo.rs` (`rdma_getaddrinfo`); `abi.rs` is `<rdma/rdma_cma.h>`. Of these files each
//! imports only this one and `api.rs`.

pub mod abi;
mod addrinfo;
pub mod api;
pub(crate) mod conn;
pub(crate) mod qp;

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::ffi::{c_int, c_void};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::ptr::null_mut;
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard, OnceLock};
use std::time::Instant;

use softhca::transport::cm::{sidr_status, CmEvent, CommId};
use softhca::wire::mad::{CmRep, CmReq, CmSidrRep, CmSidrReq, CmaHeader};
use softhca::{CmAgent, CompChannel};

use self::abi::*;
use crate::abi::*;
use crate::set_errno;

const IBV_QPS_INIT: c_int = 1;
const IBV_QPS_RTR: c_int = 2;
const IBV_QPS_RTS: c_int = 3;
const IBV_QPS_ERR: c_int = 6;

/// rdma_cm's CM timings for RoCE, as Linux sends them in its REQ (`CMA_CM_RESPONSE_TIMEOUT`,
/// `CMA_MAX_CM_RETRIES`, and the local ACK timeout from `CMA_IBOE_PACKET_LIFETIME`).
const CM_RESPONSE_TIMEOUT: u8 = 20;
const MAX_CM_RETRIES: u8 = 15;

/// The CM response timeout (4.096 µs × 2^t) and Max CM Retries this side's REQs and SIDR
/// REQs carry: Linux's (20: 4.3 s, and 15 retries: a peer that is not there shows after
/// about 70 s), or `SOFTHCA_CM_RESPONSE_TIMEOUT` (0–31) and `SOFTHCA_CM_MAX_RETRIES` (0–15)
/// for a network where the answer comes sooner (Linux has these as fixed constants).
fn cm_timing() -> (u8, u8) {
    static T: OnceLock<(u8, u8)> = OnceLock::new();
    *T.get_or_init(|| {
        let var = |name: &str, max: u8, default: u8| {
            std::env::var(name).ok().and_then(|v| v.trim().parse::<u8>().ok()).filter(|&v| v <= max).unwrap_or(default)
        };
        (var("SOFTHCA_CM_RESPONSE_TIMEOUT", 31, CM_RESPONSE_TIMEOUT), var("SOFTHCA_CM_MAX_RETRIES", 15, MAX_CM_RETRIES))
    })
}
/// The packet lifetime of a RoCE route (`CMA_IBOE_PACKET_LIFETIME`), unless the program set
/// an ACK timeout before resolving it.
const PACKET_LIFETIME: u8 = 18;
/// The REP's Target ACK Delay: the device's `local_ca_ack_delay`, as Linux reports for rxe.
const TARGET_ACK_DELAY: u8 = 15;
/// IB CM REJ reasons rdma_cm uses (IBA Table 109).
const REJ_CONSUMER: u16 = 28;
const REJ_VENDOR_OPTION_NOT_SUPPORTED: u16 = 35;
/// The CA GUID a REQ and REP carry: locally administered (0x02 first), the device's IPv4
/// address (or the last four bytes of its IPv6 one) last, so that each process's device has
/// its own: Linux's CM tells connections apart by the peer's CA GUID.
pub(crate) fn ca_guid(gid: [u8; 16]) -> u64 {
    0x0200_0000_0000_0000 | u64::from(u32::from_be_bytes([gid[12], gid[13], gid[14], gid[15]]))
}
const ETIMEDOUT: c_int = libc::ETIMEDOUT;

/// Where an id is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Idle,
    AddrBound,
    AddrResolved,
    RouteResolved,
    Listen,
    /// Active: REQ sent.
    Connect,
    /// Passive: REQ received, the program has not answered.
    ReqRcvd,
    /// Passive: REP sent.
    Accepting,
    Connected,
    /// DREQ sent, or received.
    Disconnected,
    /// Rejected, timed out or failed: only destroy is left.
    Failed,
}

/// What the CM keeps of an id (under the [`Global`] lock).
struct IdState {
    phase: Phase,
    comm: Option<CommId>,
    /// The port it holds in its port space.
    port: u16,
    responder_resources: u8,
    initiator_depth: u8,
    retry_count: u8,
    rnr_retry_count: u8,
    flow_control: u8,
    /// The PSN this side puts in its REQ or REP: the one it *receives* from (Linux's CM
    /// takes a REQ's or REP's Starting PSN as the PSN its sender expects, and sends from the
    /// peer's: the rxe captures show it).
    psn: u32,
    /// Passive: the REQ being answered.
    req: Option<Box<CmReq>>,
    /// Active: the REP that answered.
    rep: Option<Box<CmRep>>,
    tos: u8,
    ack_timeout: Option<u8>,
    /// `RDMA_OPTION_ID_REUSEADDR`: the port may be bound beside other ids that set it too.
    reuseaddr: bool,
    /// `RDMA_OPTION_ID_AFONLY` as the program set it (see [`Id::afonly`]).
    afonly: Option<bool>,
    /// A listener made by `rdma_create_ep` with QP attributes: each request gets a QP.
    qp_init: Option<ibv_qp_init_attr>,
    local_ece: crate::abi::ibv_ece,
    /// The multicast groups joined (`rdma_join_multicast`), in join order.
    mcs: Vec<Mc>,
}

/// A multicast group an id joined: its address as the program named it (a leave names it
/// again), its MGID, and whether the join was send-only (no QP attached).
struct Mc {
    addr: SocketAddr,
    mgid: [u8; 16],
    send_only: bool,
}

/// An `rdma_cm_id`: the structure the program sees, then ours.
#[repr(C)]
pub(crate) struct Id {
    c: rdma_cm_id,
    serial: u64,
    /// Made without a channel: calls wait for their events on `own`.
    sync: bool,
    own: *mut Channel,
    st: IdState,
    /// Events handed to the program and acknowledged: destroy waits until they match.
    acks: Mutex<(u64, u64)>,
    acked: Condvar,
    path: Box<ibv_sa_path_rec>,
}

/// An `rdma_event_channel`.
#[repr(C)]
pub(crate) struct Channel {
    c: rdma_event_channel,
    q: Mutex<VecDeque<Box<Event>>>,
    efd: OwnedFd,
}

/// An `rdma_cm_event` with the private data it points into and the ids it names, by serial
/// (to drop an event whose id was destroyed before the program took it).
#[repr(C)]
pub(crate) struct Event {
    c: rdma_cm_event,
    id_serial: u64,
    listen_serial: u64,
    data: [u8; 256],
}

/// The device the CM runs on: the context every id's `verbs` is, its PD for QPs made without
/// one, and the GSI's agent.
struct Dev {
    ctx: *mut ibv_context,
    pd: *mut ibv_pd,
    /// The XRC domain an XRC id's SRQ and target QP get when the program names none
    /// (librdmacm's `ucma_get_xrcd`: one per device, opened on first use).
    xrcd: *mut ibv_xrcd,
    agent: CmAgent,
    waker: Waker,
    addr: IpAddr,
    gid: [u8; 16],
    active_mtu: u8,
    max_resp: u8,
    max_init: u8,
}

/// The process's connection manager.
struct Global {
    ids: BTreeMap<u64, *mut Id>,
    next_serial: u64,
    /// Bound ports: (port space, port) -> the ids that bound it (Linux's bind list), each on
    /// its own address (see [`Global::check_port`]).
    ports: BTreeMap<(c_int, u16), Vec<u64>>,
    next_port: u16,
    conns: BTreeMap<CommId, u64>,
    /// Listening ids by service ID, in the order they listened (on different addresses).
    listeners: BTreeMap<u64, Vec<u64>>,
    dev: Option<Dev>,
    /// The fork generation that opened `dev` (see `fork`).
    generation: u32,
    exit: Exit,
}

// SAFETY: the raw pointers name objects this module owns; they are only used under the lock.
unsafe impl Send for Global {}

static GLOBAL: Mutex<Global> = Mutex::new(Global {
    ids: BTreeMap::new(),
    next_serial: 1,
    ports: BTreeMap::new(),
    next_port: 0,
    conns: BTreeMap::new(),
    listeners: BTreeMap::new(),
    dev: None,
    generation: 0,
    exit: Exit::Running,
});

thread_local! {
    /// The lock [`fork_prepare`] took, for [`fork_release`] on the same thread.
    static FORK_HELD: std::cell::RefCell<Option<MutexGuard<'static, Global>>> = const { std::cell::RefCell::new(None) };
}

/// `pthread_atfork`'s prepare handler (see `fork`): takes the lock.
pub(crate) fn fork_prepare() {
    let g = GLOBAL.lock().unwrap_or_else(|e| e.into_inner());
    let _ = FORK_HELD.try_with(|h| *h.borrow_mut() = Some(g));
}

/// Its parent and child handlers: releases it (in the child, the forking thread's copy).
pub(crate) fn fork_release() {
    let _ = FORK_HELD.try_with(|h| drop(h.borrow_mut().take()));
}

fn global() -> MutexGuard<'static, Global> {
    let mut g = GLOBAL.lock().unwrap_or_else(|e| e.into_inner());
    if g.dev.is_some() && g.generation != crate::fork::generation() {
        g.left_by_fork();
    }
    g
}

/// The objects the program holds (ids and event channels, by address and kind), under a
/// lock of their own (taken inside `GLOBAL` where both are held, never the other way round),
/// so that checking a program's pointer needs no `GLOBAL` (see [`id_of`]).
static LIVE: Mutex<BTreeSet<(usize, Kind)>> = Mutex::new(BTreeSet::new());

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Kind {
    Id,
    Channel,
    /// An event handed to the program and not yet acknowledged.
    Event,
}

fn set_live<T>(p: *const T, kind: Kind, on: bool) {
    let mut l = LIVE.lock().unwrap_or_else(|e| e.into_inner());
    if on {
        l.insert((p as usize, kind));
    } else {
        l.remove(&(p as usize, kind));
    }
}

/// Takes `p` out of the live set; whether it was in (one caller of two racing wins).
fn take_live<T>(p: *const T, kind: Kind) -> bool {
    LIVE.lock().unwrap_or_else(|e| e.into_inner()).remove(&(p as usize, kind))
}

fn is_live<T>(p: *const T, kind: Kind) -> bool {
    LIVE.lock().unwrap_or_else(|e| e.into_inner()).contains(&(p as usize, kind))
}

/// Signalled by the CM thread after each turn (MADs in, events, MADs out).
static PROGRESS: Condvar = Condvar::new();

/// Waits (at most `max`) until the MADs the CM posted have left the device: the kernel's CM
/// outlives a process, this one does not, so what a destroy or an exit sends must be out
/// before the process goes.
fn settle(mut g: MutexGuard<'static, Global>, max: std::time::Duration) -> MutexGuard<'static, Global> {
    let deadline = Instant::now() + max;
    while g.dev.as_ref().is_some_and(|d| d.agent.in_flight() > 0) {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            break;
        }
        wake();
        g = PROGRESS.wait_timeout(g, left).unwrap_or_else(|e| e.into_inner()).0;
    }
    g
}

/// At exit, as the kernel does when a process's rdma_cm file closes: every connection still
/// held is ended (a DREQ for an established one, a REJ for one being set up), and the MADs
/// go out before the process does. The CM thread does it: an exit handler runs after the
/// exiting thread's thread-locals are gone, so it only flags, wakes and waits (a lock, a
/// condition variable, a write to an eventfd: nothing thread-local).
extern "C" fn at_exit() {
    let mut g = global();
    if let Some(d) = g.dev.as_mut().filter(|_| debugging()) {
        // What the CM resent, rejected and dropped, for the person debugging (and the tests
        // that check a burst of connections needed no resend). Written with write(2): the
        // thread-locals eprintln! may use are gone by now.
        let (c, dropped) = (d.agent.cm().counters(), d.agent.dropped);
        let line = format!("softhca-cm: counters at exit: {c:?}, MADs dropped by the GSI: {dropped}\n");
        // SAFETY: writes the bytes of a live String to standard error.
        unsafe { libc::write(2, line.as_ptr().cast(), line.len()) };
    }
    if g.dev.is_none() || g.conns.is_empty() {
        return;
    }
    g.exit = Exit::Requested;
    wake();
    let deadline = Instant::now() + std::time::Duration::from_millis(500);
    while g.exit != Exit::Done {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            break;
        }
        g = PROGRESS.wait_timeout(g, left).unwrap_or_else(|e| e.into_inner()).0;
    }
}

/// The exit handler's request to the CM thread (see [`at_exit`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Exit {
    Running,
    Requested,
    /// The connections are ended; their MADs are leaving.
    Draining,
    Done,
}

/// The CM thread's wake-up descriptor and the GSI's completion channel.
struct Waker {
    wake: OwnedFd,
    gsi: CompChannel,
}

/// The open device's wake-up eventfd ([`Waker::wake`]), -1 before: what [`wake`] writes to
/// without the CM's lock.
static WAKE_FD: AtomicI32 = AtomicI32::new(-1);

/// Tells the CM thread to look again (a new deadline, or MADs queued).
fn wake() {
    let fd = WAKE_FD.load(Ordering::Acquire);
    if fd >= 0 {
        let one: u64 = 1;
        // SAFETY: writes 8 bytes from a local to an eventfd this module owns (the device's,
        // which is never closed once open).
        unsafe { libc::write(fd, (&one as *const u64).cast(), 8) };
    }
}

/// With `SOFTHCA_CM_DEBUG=1`, a line on stderr for each step of a connection (bind, listen,
/// connect, accept, reject, disconnect, and each event queued): what a program's connection
/// manager does, for the person debugging it (Linux shows the like in its rdma_cm trace
/// events). A script can also wait for the `listening` line before it starts a client.
pub(crate) fn debug(line: impl FnOnce() -> String) {
    if debugging() {
        eprintln!("softhca-cm: {}", line());
    }
}

/// The QP type of an id's kernel id (Linux's `ucma_get_qp_type`): RC for the TCP port space
/// and UD for UDP and IPoIB, whatever librdmacm was told; the IB port space's is the id's.
/// It is the type a REQ says and a listener matches (an RC connection on a TCP id, whatever
/// QP the program makes).
pub(super) fn kernel_qp_type(ps: c_int, qp_type: c_int) -> c_int {
    match ps {
        RDMA_PS_TCP => IBV_QPT_RC,
        RDMA_PS_UDP | RDMA_PS_IPOIB => IBV_QPT_UD,
        _ => qp_type,
    }
}

/// Whether a listener bound to `bound` (AFONLY or not) takes a request addressed to `dst`
/// (Linux's `cma_match_private_data`): on the any address and not AFONLY, every request;
/// else only those of its family, and bound to an address, only those addressed to it.
fn listener_takes(bound: SocketAddr, afonly: bool, dst: IpAddr) -> bool {
    if bound.ip().is_unspecified() && !afonly {
        return true;
    }
    bound.is_ipv4() == dst.is_ipv4() && (bound.ip().is_unspecified() || bound.ip() == dst)
}

/// Whether the calling thread may bind a port below 1024 (Linux's `PROT_SOCK`): it has
/// CAP_NET_BIND_SERVICE (bit 10) in its effective set, as `cma_use_port` asks `capable()`.
/// Capabilities are per thread; where they cannot be read, it may. (The set is the one of the
/// thread's user namespace: root in a container without CAP_NET_BIND_SERVICE in the initial
/// namespace binds here where Linux's rdma_cm refuses it.)
fn may_bind_service_ports() -> bool {
    const CAP_NET_BIND_SERVICE: u32 = 10;
    let Ok(status) = std::fs::read_to_string("/proc/thread-self/status") else { return true };
    let eff = status.lines().find_map(|l| l.strip_prefix("CapEff:")).map(str::trim);
    eff.and_then(|h| u64::from_str_radix(h, 16).ok()).is_none_or(|caps| caps & (1 << CAP_NET_BIND_SERVICE) != 0)
}

/// Whether `SOFTHCA_CM_DEBUG=1` (see [`debug`]).
fn debugging() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| std::env::var("SOFTHCA_CM_DEBUG").is_ok_and(|v| v == "1"))
}

/// Nanoseconds on the CM's clock.
fn now() -> u64 {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    EPOCH.get_or_init(Instant::now).elapsed().as_nanos() as u64
}

fn random_u32() -> u32 {
    let mut v = 0u32;
    // SAFETY: getrandom writes at most 4 bytes into a local.
    let n = unsafe { libc::getrandom((&mut v as *mut u32).cast(), 4, 0) };
    if n != 4 {
        v = (now() as u32).wrapping_mul(0x9E37_79B9);
    }
    v
}

/// GID of an IP address (IPv4 as `::ffff:a.b.c.d`).
fn gid_of(ip: IpAddr) -> [u8; 16] {
    match ip {
        IpAddr::V4(v4) => v4.to_ipv6_mapped().octets(),
        IpAddr::V6(v6) => v6.octets(),
    }
}

/// A C socket address, if it is IPv4 or IPv6.
///
/// # Safety
/// `sa` is null or points to a readable `sockaddr` of its family's size.
unsafe fn read_sa(sa: *const libc::sockaddr) -> Option<SocketAddr> {
    if sa.is_null() {
        return None;
    }
    // SAFETY: the caller's promise; the family decides how much is read.
    unsafe {
        match c_int::from((*sa).sa_family) {
            libc::AF_INET => {
                let s = &*(sa as *const libc::sockaddr_in);
                let ip = Ipv4Addr::from(u32::from_be(s.sin_addr.s_addr));
                Some(SocketAddr::V4(SocketAddrV4::new(ip, u16::from_be(s.sin_port))))
            }
            libc::AF_INET6 => {
                let s = &*(sa as *const libc::sockaddr_in6);
                let ip = Ipv6Addr::from(s.sin6_addr.s6_addr);
                let flowinfo = u32::from_be(s.sin6_flowinfo);
                Some(SocketAddr::V6(SocketAddrV6::new(ip, u16::from_be(s.sin6_port), flowinfo, s.sin6_scope_id)))
            }
            _ => None,
        }
    }
}

/// Writes `a` into a `sockaddr_storage`; returns its length.
fn write_sa(dst: &mut libc::sockaddr_storage, a: SocketAddr) -> libc::socklen_t {
    // SAFETY: an all-zero sockaddr_storage is valid; the casts stay inside its 128 bytes.
    unsafe {
        *dst = std::mem::zeroed();
        match a {
            SocketAddr::V4(v4) => {
                let s = &mut *(dst as *mut _ as *mut libc::sockaddr_in);
                s.sin_family = libc::AF_INET as libc::sa_family_t;
                s.sin_port = v4.port().to_be();
                s.sin_addr.s_addr = u32::from(*v4.ip()).to_be();
                size_of::<libc::sockaddr_in>() as libc::socklen_t
            }
            SocketAddr::V6(v6) => {
                let s = &mut *(dst as *mut _ as *mut libc::sockaddr_in6);
                s.sin6_family = libc::AF_INET6 as libc::sa_family_t;
                s.sin6_port = v6.port().to_be();
                s.sin6_addr.s6_addr = v6.ip().octets();
                s.sin6_flowinfo = v6.flowinfo().to_be();
                s.sin6_scope_id = v6.scope_id();
                size_of::<libc::sockaddr_in6>() as libc::socklen_t
            }
        }
    }
}

fn eventfd(flags: c_int) -> Result<OwnedFd, c_int> {
    // SAFETY: eventfd returns a new descriptor or -1.
    let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | flags) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error().raw_os_error().unwrap_or(libc::EMFILE));
    }
    // SAFETY: a descriptor just made, owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

impl Channel {
    fn new() -> Result<*mut Channel, c_int> {
        let efd = eventfd(libc::EFD_SEMAPHORE)?;
        let c = rdma_event_channel { fd: efd.as_raw_fd() };
        let p = Box::into_raw(Box::new(Channel { c, q: Mutex::new(VecDeque::new()), efd }));
        set_live(p, Kind::Channel, true);
        Ok(p)
    }

    /// Frees a channel made by [`Channel::new`], taking it out of the live set first, so that
    /// no later call takes its address for a channel.
    ///
    /// # Safety
    /// `p` came from `Channel::new`, is not freed yet, and nothing uses it after this.
    unsafe fn free(p: *mut Channel) {
        set_live(p, Kind::Channel, false);
        // SAFETY: the caller's promise: a channel of `new` that nobody holds any more.
        drop(unsafe { Box::from_raw(p) });
    }

    fn push(&self, ev: Box<Event>) {
        self.q.lock().unwrap_or_else(|e| e.into_inner()).push_back(ev);
        let one: u64 = 1;
        // SAFETY: writes 8 bytes from a local to the channel's eventfd.
        unsafe { libc::write(self.efd.as_raw_fd(), (&one as *const u64).cast(), 8) };
    }

    /// Takes the next event: blocks while none waits, unless the program made the
    /// descriptor non-blocking (then EAGAIN). A signal ends the wait as it ends librdmacm's
    /// (a write(2) to the kernel's rdma_cm file that waits): EINTR where the handler was
    /// installed without SA_RESTART, the read restarted where it was.
    fn take(&self) -> Result<Box<Event>, c_int> {
        loop {
            let mut v: u64 = 0;
            // SAFETY: reads 8 bytes into a local from the channel's eventfd.
            let n = unsafe { libc::read(self.efd.as_raw_fd(), (&mut v as *mut u64).cast(), 8) };
            if n != 8 {
                return Err(std::io::Error::last_os_error().raw_os_error().unwrap_or(libc::EIO));
            }
            if let Some(ev) = self.q.lock().unwrap_or_else(|e| e.into_inner()).pop_front() {
                return Ok(ev);
            }
        }
    }
}

impl Event {
    fn new(id: &Id, event: c_int, status: c_int) -> Box<Event> {
        Box::new(Event {
            c: rdma_cm_event {
                id: &id.c as *const rdma_cm_id as *mut rdma_cm_id,
                listen_id: null_mut(),
                event,
                status,
                // SAFETY: the parameters are plain integers and pointers: all-zero is valid.
                param: unsafe { std::mem::zeroed() },
            },
            id_serial: id.serial,
            listen_serial: 0,
            data: [0; 256],
        })
    }

    /// Sets the UD parameters (a SIDR exchange), the private data copied into the event.
    fn ud(&mut self, ah_attr: ibv_ah_attr, qp_num: u32, qkey: u32, data: &[u8]) {
        let n = data.len().min(self.data.len());
        self.data[..n].copy_from_slice(&data[..n]);
        let private_data = if n == 0 { std::ptr::null() } else { self.data.as_ptr().cast() };
        self.c.param.ud = rdma_ud_param { private_data, private_data_len: n.min(255) as u8, ah_attr, qp_num, qkey };
    }

    /// Sets the connection parameters, the private data copied into the event.
    fn conn(&mut self, mut p: rdma_conn_param, data: &[u8]) {
        let n = data.len().min(self.data.len());
        self.data[..n].copy_from_slice(&data[..n]);
        p.private_data = if n == 0 { std::ptr::null() } else { self.data.as_ptr().cast() };
        p.private_data_len = n.min(255) as u8;
        self.c.param.conn = p;
    }
}

impl Id {
    /// The id's channel; None once the program destroyed it under the id.
    fn channel(&self) -> Option<&Channel> {
        // SAFETY: a non-null `c.channel` is live: destroying a channel nulls it in every id on
        // it (rdma_destroy_event_channel), and an own channel is freed with its id.
        (!self.c.channel.is_null()).then(|| unsafe { &*(self.c.channel as *const Channel) })
    }

    /// Whether binds of the other family share its port (and requests of the other family do
    /// not reach it as a listener), for an id on `addr`: as the program set it, else as Linux
    /// decides at each bind, IPv4 ids AFONLY and IPv6 ids not (`net.ipv6.bindv6only` = 0).
    fn afonly(&self, addr: SocketAddr) -> bool {
        self.st.afonly.unwrap_or(addr.is_ipv4())
    }

    /// The id's source address (`route.addr.src`), once bound or resolved.
    pub(crate) fn src_addr(&self) -> Option<SocketAddr> {
        // SAFETY: the id's own sockaddr_storage.
        unsafe { read_sa(&self.c.route.addr.src as *const _ as *const libc::sockaddr) }
    }

    /// The id's destination address (`route.addr.dst`), once resolved.
    pub(crate) fn dst_addr(&self) -> Option<SocketAddr> {
        // SAFETY: the id's own sockaddr_storage.
        unsafe { read_sa(&self.c.route.addr.dst as *const _ as *const libc::sockaddr) }
    }

    fn queue(&self, ev: Box<Event>) {
        // Its channel destroyed under it, it gets no more events (see rdma_destroy_event_channel).
        let Some(channel) = self.channel() else { return };
        debug(|| {
            let name = usize::try_from(ev.c.event).ok().and_then(|i| EVENT_NAMES.get(i));
            format!("id {}: {} (status {})", self.serial, name.map_or("?".into(), |n| n.to_string_lossy()), ev.c.status)
        });
        channel.push(ev);
    }
}

impl Global {
    fn id(&self, serial: u64) -> Option<&'static mut Id> {
        // SAFETY: an id is in the map from creation until destroy takes it out (under this
        // lock) and frees it.
        self.ids.get(&serial).map(|&p| unsafe { &mut *p })
    }

    /// In a child, the parent's connection manager as a fork left it: its device and thread
    /// are the parent's (see `fork`). The device is kept from being freed and the child's
    /// opens one of its own; the parent's connections and listeners are not the child's (its
    /// copies of the parent's ids stay, as the program's).
    fn left_by_fork(&mut self) {
        if let Some(dev) = self.dev.take() {
            std::mem::forget(dev);
        }
        WAKE_FD.store(-1, Ordering::Release);
        self.conns.clear();
        self.listeners.clear();
        self.exit = Exit::Running;
    }

    /// Opens the device (on `addr` if it is not open yet) and starts the CM thread.
    fn open(&mut self, addr: Option<IpAddr>) -> Result<&mut Dev, c_int> {
        if self.dev.is_none() {
            let dev = open_dev(addr)?;
            // The thread waits for this lock, held here until the device is in place.
            std::thread::Builder::new()
                .name("softhca-cm".into())
                .spawn(run)
                .map_err(|e| e.raw_os_error().unwrap_or(libc::EAGAIN))?;
            WAKE_FD.store(dev.waker.wake.as_raw_fd(), Ordering::Release);
            self.generation = crate::fork::generation();
            self.dev = Some(dev);
        }
        let dev = self.dev.as_mut().ok_or(libc::ENODEV)?;
        Ok(dev)
    }

    /// Binds id `serial` (on `addr`, with its REUSEADDR and AFONLY) to the port of `addr` in
    /// `ps`, or to a free port when that is 0: Linux's `cma_get_port`. A port below 1024 needs
    /// CAP_NET_BIND_SERVICE (EACCES); one other ids hold is shared when their addresses
    /// allow it ([`Global::check_port`]).
    fn take_port(&mut self, ps: c_int, addr: SocketAddr, serial: u64, reuse: bool, afonly: bool) -> Result<u16, c_int> {
        let want = addr.port();
        if want != 0 {
            if want < 1024 && !may_bind_service_ports() {
                return Err(libc::EACCES);
            }
            if let Some(owners) = self.ports.get(&(ps, want)) {
                self.check_port(owners, serial, addr, reuse, afonly)?;
            }
            self.ports.entry((ps, want)).or_default().push(serial);
            return Ok(want);
        }
        // Ephemeral ports as Linux's: 32768..61000, from a random start.
        if self.next_port == 0 {
            self.next_port = 32768 + (random_u32() % 28232) as u16;
        }
        for _ in 0..28232 {
            let p = self.next_port;
            self.next_port = if p >= 60999 { 32768 } else { p + 1 };
            if let std::collections::btree_map::Entry::Vacant(e) = self.ports.entry((ps, p)) {
                e.insert(vec![serial]);
                return Ok(p);
            }
        }
        Err(libc::EADDRNOTAVAIL)
    }

    /// Whether id `serial`, on `addr`, may share a port with its other `owners` (Linux's
    /// `cma_check_port`): not if one of them is on the same address (EADDRINUSE) or either is
    /// on the any address (EADDRNOTAVAIL), unless both allow reuse (`reuse` and theirs), or
    /// both are AFONLY and of different families.
    fn check_port(
        &self,
        owners: &[u64],
        serial: u64,
        addr: SocketAddr,
        reuse: bool,
        afonly: bool,
    ) -> Result<(), c_int> {
        for &s in owners.iter().filter(|&&s| s != serial) {
            let Some(cur) = self.id(s) else { continue };
            if reuse && cur.st.reuseaddr {
                continue;
            }
            let Some(cur_addr) = cur.src_addr() else { continue };
            if afonly && cur.afonly(cur_addr) && addr.is_ipv4() != cur_addr.is_ipv4() {
                continue;
            }
            if addr.ip().is_unspecified() || cur_addr.ip().is_unspecified() {
                return Err(libc::EADDRNOTAVAIL);
            }
            if addr.ip() == cur_addr.ip() {
                return Err(libc::EADDRINUSE);
            }
        }
        Ok(())
    }

    /// Runs the CM's events: the ids they name get theirs, their QPs move.
    fn dispatch(&mut self) {
        loop {
            let Some(ev) = self.dev.as_mut().and_then(|d| d.agent.cm().poll_event()) else { return };
            match ev {
                CmEvent::ConnectRequest { id, peer, req } => self.on_request(id, peer, req),
                CmEvent::Established { id, .. } => self.on_established(id),
                CmEvent::Rejected { id, reason, private_data } => self.on_rejected(id, reason, &private_data),
                CmEvent::Disconnected { id, timed_out } => self.on_disconnected(id, timed_out),
                CmEvent::TimewaitExit { id } => self.on_timewait_exit(id),
                CmEvent::SidrRequest { id, peer, req } => self.on_sidr_request(id, peer, req),
                CmEvent::SidrReply { id, rep } => self.on_sidr_reply(id, rep),
            }
        }
    }

    /// A new id for a request (REQ or SIDR REQ) to a listener: the listener's channel and
    /// context, both ends' addresses from the request's cma header, the device's route.
    /// None (and the request refused by the caller) when nobody listens or the header is bad.
    fn incoming(
        &mut self,
        comm: CommId,
        peer: [u8; 16],
        service_id: u64,
        private_data: &[u8],
        qp_type: c_int,
        path_mtu: u8,
    ) -> Option<(&'static mut Id, &'static mut Id)> {
        let hdr = CmaHeader::parse(private_data)?;
        // Linux's cma_match_private_data: a listener on the any address that is not AFONLY
        // takes every request; any other only those of its address family, and one bound to
        // an address only those addressed to it. Of the listeners on a port (each on its own
        // address, or family), the first that takes it.
        // And only a listener of the request's QP type (Linux's `cma_ib_check_req_qp_type`),
        // the type its kernel id has (`kernel_qp_type`), or none; a request no listener takes
        // is rejected (Consumer Reject, as the kernel's CM id destroyed in REQ Received
        // sends it).
        let takes = |l: &Id| {
            let t = kernel_qp_type(l.c.ps, l.c.qp_type);
            (t == 0 || t == qp_type) && l.src_addr().is_some_and(|a| listener_takes(a, l.afonly(a), hdr.dst))
        };
        let listener = self.listeners.get(&service_id)?.iter().filter_map(|&s| self.id(s)).find(|l| takes(l))?;
        let dev = self.dev.as_ref()?;
        let (ctx, dev_pd, gid, mtu) = (dev.ctx, dev.pd, dev.gid, dev.active_mtu);
        let id = new_id(self, listener.c.channel, listener.c.context, listener.c.ps, qp_type).ok()?;
        if listener.sync {
            // librdmacm moves a synchronous listener's new ids to channels of their own.
            let Ok(ch) = Channel::new() else {
                destroy_unannounced(self, id);
                return None;
            };
            id.sync = true;
            id.own = ch;
            // SAFETY: a channel just made.
            id.c.channel = unsafe { &mut (*ch).c };
        }
        id.c.verbs = ctx;
        // The device's default PD, whatever the listener's (librdmacm's ucma_get_device for
        // the new id); `rdma_get_request` puts the QP on the listener's.
        id.c.pd = dev_pd;
        id.c.port_num = 1;
        write_sa(&mut id.c.route.addr.src, SocketAddr::new(hdr.dst, listener.st.port));
        write_sa(&mut id.c.route.addr.dst, SocketAddr::new(hdr.src, hdr.src_port));
        id.c.route.addr.ibaddr = rdma_ib_addr { sgid: ibv_gid { raw: gid }, dgid: ibv_gid { raw: peer }, pkey: 0xFFFF };
        fill_path(id, mtu.min(path_mtu), 0);
        id.st.phase = Phase::ReqRcvd;
        id.st.comm = Some(comm);
        id.st.port = listener.st.port;
        id.st.qp_init = listener.st.qp_init.as_ref().map(copy_init);
        self.conns.insert(comm, id.serial);
        Some((id, listener))
    }

    fn on_request(&mut self, comm: CommId, peer: [u8; 16], req: Box<CmReq>) {
        // Linux's `cm_req_get_qp_type`: UC, XRC (whose passive side is the target), or RC.
        let qp_type = match (req.transport_service_type, req.extended_transport_type) {
            (1, _) => IBV_QPT_UC,
            (3, 1) => IBV_QPT_XRC_RECV,
            _ => IBV_QPT_RC,
        };
        let Some((id, listener)) = self.incoming(comm, peer, req.service_id, &req.private_data, qp_type, req.path_mtu)
        else {
            if let Some(d) = self.dev.as_mut() {
                d.agent.cm().reject(comm, REJ_CONSUMER);
            }
            return;
        };
        // The REQ's path is this side's path too, its flow label and traffic class included
        // (Linux's cm_format_paths_from_req): the QP's address vector sends with them.
        id.path.flow_label = req.primary_flow_label.to_be();
        id.path.traffic_class = req.primary_traffic_class;
        // The requester's resources seen from this side (Linux's cm_format_req_event): what
        // it can have outstanding toward us is our responder resources, and the other way.
        id.st.responder_resources = req.initiator_depth;
        id.st.initiator_depth = req.responder_resources;
        let mut ev = Event::new(id, RDMA_CM_EVENT_CONNECT_REQUEST, 0);
        ev.c.listen_id = &mut listener.c;
        ev.listen_serial = listener.serial;
        let p = rdma_conn_param {
            private_data: std::ptr::null(),
            private_data_len: 0,
            responder_resources: req.initiator_depth,
            initiator_depth: req.responder_resources,
            flow_control: req.end_to_end_flow_control,
            retry_count: req.retry_count,
            rnr_retry_count: req.rnr_retry_count,
            srq: req.srq,
            qp_num: req.local_qpn,
        };
        ev.conn(p, &req.private_data[CmaHeader::LEN..]);
        id.st.req = Some(req);
        listener.queue(ev);
    }

    /// A SIDR REQ (a UD id's `rdma_connect`) for a listener: CONNECT_REQUEST with the private
    /// data after the cma header and nothing else, as Linux's cma_ib_req_handler fills a SIDR
    /// request's UD parameters (no address handle attributes, QPN or Q_Key: the requester's
    /// address comes with its first datagram).
    fn on_sidr_request(&mut self, comm: CommId, peer: [u8; 16], req: Box<CmSidrReq>) {
        let mtu = self.dev.as_ref().map_or(0, |d| d.active_mtu);
        let Some((id, listener)) = self.incoming(comm, peer, req.service_id, &req.private_data, IBV_QPT_UD, mtu) else {
            if let Some(d) = self.dev.as_mut() {
                d.agent.cm().sidr_reject(comm, sidr_status::REJECT, &[]);
            }
            return;
        };
        let mut ev = Event::new(id, RDMA_CM_EVENT_CONNECT_REQUEST, 0);
        ev.c.listen_id = &mut listener.c;
        ev.listen_serial = listener.serial;
        // SAFETY: ibv_ah_attr is plain old data; all-zero is valid.
        ev.ud(unsafe { std::mem::zeroed() }, 0, 0, &req.private_data[CmaHeader::LEN..]);
        listener.queue(ev);
    }

    /// The SIDR REP for a UD id's `rdma_connect`: ESTABLISHED with the address handle
    /// attributes, QPN and Q_Key of the remote QP, or UNREACHABLE with the REP's status (or
    /// ADDR_ERROR -EINVAL for another Q_Key than the port space's), each with the REP's
    /// private data, as Linux's cma_sidr_rep_handler.
    fn on_sidr_reply(&mut self, comm: CommId, rep: Box<CmSidrRep>) {
        let Some(serial) = self.conns.remove(&comm) else { return };
        let Some(id) = self.id(serial) else { return };
        id.st.comm = None;
        let failed = |id: &mut Id, event, status| {
            id.st.phase = Phase::Failed;
            let mut ev = Event::new(id, event, status);
            // SAFETY: ibv_ah_attr is plain old data; all-zero is valid.
            ev.ud(unsafe { std::mem::zeroed() }, 0, 0, &rep.private_data);
            ev
        };
        let ev = if rep.status != sidr_status::SUCCESS {
            failed(id, RDMA_CM_EVENT_UNREACHABLE, c_int::from(rep.status))
        } else if rep.qkey != qkey_of(id.c.ps) {
            failed(id, RDMA_CM_EVENT_ADDR_ERROR, -libc::EINVAL)
        } else {
            id.st.phase = Phase::Connected;
            let mut ev = Event::new(id, RDMA_CM_EVENT_ESTABLISHED, 0);
            ev.ud(self.ah_attr(id), rep.qpn, rep.qkey, &rep.private_data);
            ev
        };
        id.queue(ev);
    }

    fn on_established(&mut self, comm: CommId) {
        let Some(id) = self.conns.get(&comm).and_then(|&s| self.id(s)) else { return };
        match id.st.phase {
            Phase::Connect => {
                let Some(rep) = self.dev.as_mut().and_then(|d| d.agent.cm().reply(comm).cloned()) else { return };
                id.st.phase = Phase::Connected;
                // The REP's resources seen from this side (Linux's cm_rep_handler).
                id.st.responder_resources = rep.initiator_depth;
                id.st.initiator_depth = rep.responder_resources;
                let p = rdma_conn_param {
                    private_data: std::ptr::null(),
                    private_data_len: 0,
                    responder_resources: rep.initiator_depth,
                    initiator_depth: rep.responder_resources,
                    flow_control: rep.end_to_end_flow_control,
                    retry_count: 0,
                    rnr_retry_count: rep.rnr_retry_count,
                    srq: rep.srq,
                    qp_num: rep.local_qpn,
                };
                let data = rep.private_data;
                id.st.rep = Some(Box::new(rep));
                // As librdmacm's ucma_process_conn_resp: the QP to RTR and RTS, then the RTU;
                // without a QP the program does both (rdma_establish sends the RTU).
                let mut ev = if id.c.qp.is_null() {
                    Event::new(id, RDMA_CM_EVENT_CONNECT_RESPONSE, 0)
                } else {
                    match self.ready_qp(id) {
                        Ok(()) => {
                            if let Some(d) = self.dev.as_mut() {
                                d.agent.cm().establish(comm);
                            }
                            Event::new(id, RDMA_CM_EVENT_ESTABLISHED, 0)
                        }
                        Err(_) => {
                            // librdmacm reports status -1 and leaves the QP in error; the
                            // responder is told at once instead of waiting out its REP.
                            let _ = modify_err(id);
                            id.st.phase = Phase::Failed;
                            self.conns.remove(&comm);
                            id.st.comm = None;
                            if let Some(d) = self.dev.as_mut() {
                                d.agent.cm().reject(comm, REJ_CONSUMER);
                            }
                            Event::new(id, RDMA_CM_EVENT_CONNECT_ERROR, -1)
                        }
                    }
                };
                ev.conn(p, &data);
                id.queue(ev);
            }
            Phase::Accepting => {
                id.st.phase = Phase::Connected;
                id.queue(Event::new(id, RDMA_CM_EVENT_ESTABLISHED, 0));
            }
            _ => {}
        }
    }

    fn on_rejected(&mut self, comm: CommId, reason: u16, private_data: &[u8]) {
        let Some(serial) = self.conns.remove(&comm) else { return };
        let Some(id) = self.id(serial) else { return };
        id.st.comm = None;
        id.st.phase = Phase::Failed;
        // As Linux (cma_ib_handler, and librdmacm again): a rejected or unreachable
        // connection's QP goes to the error state, its work requests flush.
        let _ = modify_err(id);
        // A REJ always carries its 148 bytes of private data; none means this side's retries
        // ran out, which rdma_cm reports as unreachable with -ETIMEDOUT.
        if private_data.is_empty() {
            id.queue(Event::new(id, RDMA_CM_EVENT_UNREACHABLE, -ETIMEDOUT));
        } else {
            let mut ev = Event::new(id, RDMA_CM_EVENT_REJECTED, c_int::from(reason));
            // SAFETY: reading the union's conn member, which Event::new zeroed.
            let p = unsafe { ev.c.param.conn };
            ev.conn(p, private_data);
            id.queue(ev);
        }
    }

    /// The connection is over: the id keeps its CM connection through the time wait (its
    /// DREP, when the peer disconnected, goes at the program's `rdma_disconnect` or
    /// `rdma_destroy_id`; then TIMEWAIT_EXIT). A DREQ of this side's that nobody answered
    /// (`timed_out`) is DISCONNECTED with -ETIMEDOUT, as rdma_cm reports `IB_CM_DREQ_ERROR`.
    fn on_disconnected(&mut self, comm: CommId, timed_out: bool) {
        let Some(id) = self.conns.get(&comm).and_then(|&s| self.id(s)) else { return };
        // A DREQ can also end a connection whose RTU this side is still waiting for: rdma_cm
        // reports it as disconnected all the same.
        if matches!(id.st.phase, Phase::Connected | Phase::Accepting | Phase::Disconnected) {
            id.st.phase = Phase::Disconnected;
            // The connection is gone: its QP flushes (rdma_disconnect does the same).
            let _ = modify_err(id);
            id.queue(Event::new(id, RDMA_CM_EVENT_DISCONNECTED, if timed_out { -ETIMEDOUT } else { 0 }));
        }
    }

    /// The connection's time wait is over: RDMA_CM_EVENT_TIMEWAIT_EXIT, as Linux's rdma_cm
    /// reports it, and the id has no CM connection any more.
    fn on_timewait_exit(&mut self, comm: CommId) {
        let Some(serial) = self.conns.remove(&comm) else { return };
        let Some(id) = self.id(serial) else { return };
        id.st.comm = None;
        id.queue(Event::new(id, RDMA_CM_EVENT_TIMEWAIT_EXIT, 0));
    }

    /// Moves an id's QP to RTS for its connection, as librdmacm does on a REP (INIT again for
    /// the access rights, then RTR, then RTS).
    fn ready_qp(&self, id: &Id) -> Result<(), c_int> {
        for state in [IBV_QPS_INIT, IBV_QPS_RTR, IBV_QPS_RTS] {
            let (mut attr, mask) = self.qp_attr(id, state)?;
            // SAFETY: the id's QP is live while the id holds it (rdma_destroy_qp clears it
            // under this lock).
            let rc = unsafe { crate::qp::ibv_modify_qp(id.c.qp, &mut attr, mask) };
            if rc != 0 {
                return Err(rc);
            }
        }
        Ok(())
    }

    /// `rdma_init_qp_attr`: the attributes and mask that move the id's QP to `state`.
    fn qp_attr(&self, id: &Id, state: c_int) -> Result<(ibv_qp_attr, c_int), c_int> {
        // SAFETY: an all-zero ibv_qp_attr is valid.
        let mut a: ibv_qp_attr = unsafe { std::mem::zeroed() };
        a.qp_state = state;
        let st = &id.st;
        // XRC's QPs take RC's attributes; Modify QP takes out those of the side each lacks,
        // as uverbs does (`modify_mask::applicable`).
        let rc = matches!(id.c.qp_type, IBV_QPT_RC | IBV_QPT_XRC_SEND | IBV_QPT_XRC_RECV);
        // A connection under way (REQ sent or received) has its resources: INIT gets its access.
        let connected = matches!(st.phase, Phase::Connected | Phase::Accepting | Phase::ReqRcvd | Phase::Connect);
        let answered = st.req.is_some() || st.rep.is_some();
        let mut mask = IBV_QP_STATE;
        match state {
            IBV_QPS_INIT => {
                a.pkey_index = 0;
                a.port_num = 1;
                mask |= IBV_QP_PKEY_INDEX | IBV_QP_PORT;
                if id.c.qp_type == IBV_QPT_UD {
                    a.qkey = qkey_of(id.c.ps);
                    mask |= IBV_QP_QKEY;
                } else {
                    // Before a connection: no remote access (Linux's cma_ib_init_qp_attr);
                    // after: Write, and Read and Atomic when this side answers them.
                    if connected {
                        a.qp_access_flags = IBV_ACCESS_REMOTE_WRITE;
                        if st.responder_resources > 0 {
                            a.qp_access_flags |= IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC;
                        }
                    }
                    mask |= IBV_QP_ACCESS_FLAGS;
                }
            }
            IBV_QPS_RTR => {
                if id.c.qp_type == IBV_QPT_UD {
                    return Ok((a, mask));
                }
                let (dest, mtu) = match (&st.req, &st.rep) {
                    (Some(req), _) => (req.local_qpn, id.path.mtu.min(req.path_mtu)),
                    (None, Some(rep)) => (rep.local_qpn, id.path.mtu),
                    _ => return Err(libc::EINVAL),
                };
                a.ah_attr = self.ah_attr(id);
                a.path_mtu = c_int::from(mtu);
                a.dest_qp_num = dest;
                a.rq_psn = st.psn;
                mask |= IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN;
                if rc {
                    a.max_dest_rd_atomic = st.responder_resources;
                    a.min_rnr_timer = 0;
                    mask |= IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER;
                }
            }
            IBV_QPS_RTS => {
                mask |= IBV_QP_SQ_PSN;
                if id.c.qp_type == IBV_QPT_UD {
                    a.sq_psn = st.psn;
                    return Ok((a, mask));
                }
                // This side sends from the PSN the peer gave in its REQ or REP.
                a.sq_psn = match (&st.req, &st.rep) {
                    (Some(req), _) => req.starting_psn,
                    (None, Some(rep)) => rep.starting_psn,
                    _ => return Err(libc::EINVAL),
                };
                if !answered {
                    return Err(libc::EINVAL);
                }
                if rc {
                    let (retry, rnr, timeout) = match (&st.req, &st.rep) {
                        (Some(req), _) => (req.retry_count, req.rnr_retry_count, req.primary_local_ack_timeout),
                        // The REP's Target ACK Delay, as Linux's cm_rep_handler takes it.
                        (None, Some(rep)) => (
                            st.retry_count,
                            rep.rnr_retry_count,
                            cm_ack_timeout(rep.target_ack_delay, id.path.packet_life_time),
                        ),
                        _ => return Err(libc::EINVAL),
                    };
                    a.timeout = st.ack_timeout.unwrap_or(timeout);
                    a.retry_cnt = retry;
                    a.rnr_retry = rnr;
                    a.max_rd_atomic = st.initiator_depth;
                    mask |= IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC;
                }
            }
            IBV_QPS_ERR => {}
            _ => return Err(libc::EINVAL),
        }
        Ok((a, mask))
    }

    fn ah_attr(&self, id: &Id) -> ibv_ah_attr {
        ibv_ah_attr {
            grh: ibv_global_route {
                dgid: id.c.route.addr.ibaddr.dgid,
                flow_label: u32::from_be(id.path.flow_label),
                sgid_index: 0,
                hop_limit: 64,
                // The path's (the id's type of service when its route resolved, or the REQ's
                // on the passive side), as Linux builds the address vector from the path.
                traffic_class: id.path.traffic_class,
            },
            dlid: 0,
            sl: 0,
            src_path_bits: 0,
            static_rate: 0,
            is_global: 1,
            port_num: 1,
        }
    }
}

/// `RDMA_UDP_QKEY`: the Q_Key of UD ids of the UDP port space.
const RDMA_UDP_QKEY: u32 = 0x0123_4567;

/// The Q_Key of a port space's UD QPs (rdma_cm's: RDMA_UDP_QKEY; IPoIB's would be the
/// broadcast group's, which softhca has none of).
pub(crate) fn qkey_of(ps: c_int) -> u32 {
    if ps == RDMA_PS_IPOIB {
        0
    } else {
        RDMA_UDP_QKEY
    }
}

/// Takes an id that was never handed to the program out of the registry and frees it.
fn destroy_unannounced(g: &mut Global, id: &mut Id) {
    g.ids.remove(&id.serial);
    set_live(id as *const Id, Kind::Id, false);
    // SAFETY: made by new_id, out of the registry, never seen by the program.
    drop(unsafe { Box::from_raw(id as *mut Id) });
}

/// Takes a QP that the program destroys with `ibv_destroy_qp` from the id that holds it
/// (`rdma_create_qp` made it): the CM thread moves an id's QP on a REP, a REJ or a DREQ, under
/// `GLOBAL`, and must not find the freed QP there. Destroy QP's hook (`qp::on_destroy`, set
/// by `rdma_create_qp`), run after the QP is destroyed and before it is freed; a QP no id
/// holds costs a look at the ids.
pub(crate) fn forget_qp(qp: *mut ibv_qp) {
    let g = global();
    for &id in g.ids.values() {
        // SAFETY: the registry's ids are live while it holds them, and changed under its lock.
        let id = unsafe { &mut *id };
        if id.c.qp == qp {
            id.c.qp = std::ptr::null_mut();
        }
    }
}

/// A program destroyed a CQ or completion channel itself: the ids that name it forget it
/// (`rdma_destroy_qp` would destroy it again otherwise).
pub(crate) fn forget_cq(object: *mut std::ffi::c_void) {
    let g = global();
    for &id in g.ids.values() {
        // SAFETY: the registry's ids are live while it holds them, and changed under its lock.
        let c = unsafe { &mut (*id).c };
        for field in [&mut c.recv_cq, &mut c.send_cq] {
            if field.cast() == object {
                *field = std::ptr::null_mut();
            }
        }
        for field in [&mut c.recv_cq_channel, &mut c.send_cq_channel] {
            if field.cast() == object {
                *field = std::ptr::null_mut();
            }
        }
    }
}

/// Moves an id's QP to the error state (its work requests flush).
fn modify_err(id: &Id) -> Result<(), c_int> {
    if id.c.qp.is_null() {
        return Ok(());
    }
    // SAFETY: an all-zero ibv_qp_attr is valid.
    let mut a: ibv_qp_attr = unsafe { std::mem::zeroed() };
    a.qp_state = IBV_QPS_ERR;
    // SAFETY: the id's QP is live while the id holds it.
    match unsafe { crate::qp::ibv_modify_qp(id.c.qp, &mut a, IBV_QP_STATE) } {
        0 => Ok(()),
        e => Err(e),
    }
}

fn copy_init(a: &ibv_qp_init_attr) -> ibv_qp_init_attr {
    ibv_qp_init_attr {
        qp_context: a.qp_context,
        send_cq: a.send_cq,
        recv_cq: a.recv_cq,
        srq: a.srq,
        cap: a.cap,
        qp_type: a.qp_type,
        sq_sig_all: a.sq_sig_all,
    }
}

/// The flow label of a RoCE v2 connection, as Linux's rdma_cm puts it in the route it resolves
/// (`cma_get_roce_udp_flow_label`): an IPv6 source address's own flow label if it has one,
/// else source port × 31 + destination port, in 20 bits. The REQ carries it (Primary Flow
/// Label) and both ends' QPs send with it (the responder takes the REQ's: Linux's
/// `cm_format_paths_from_req`); it is the IPv6 header's flow label, and RoCE NICs derive the
/// UDP source port from it.
pub(crate) fn roce_flow_label(src: SocketAddr, dst: SocketAddr) -> u32 {
    const MASK: u32 = 0xF_FFFF;
    match src {
        SocketAddr::V6(s) if s.flowinfo() & MASK != 0 => s.flowinfo() & MASK,
        _ => (u32::from(src.port()) * 31 + u32::from(dst.port())) & MASK,
    }
}

/// The Local ACK Timeout of a connection on the id's route, as Linux's CM derives it from the
/// path's packet lifetime and the CA's ACK delay (`cm_ack_timeout`): what the REQ carries, and
/// the active side's QP takes unless the program set its own.
pub(crate) fn local_ack_timeout(id: &Id) -> u8 {
    cm_ack_timeout(TARGET_ACK_DELAY, id.path.packet_life_time)
}

/// Linux's `cm_ack_timeout`: a Local ACK Timeout from a CA's ACK delay and a packet lifetime.
/// `delay` may be the peer's (a REP's 5-bit field): nothing here overflows.
fn cm_ack_timeout(delay: u8, life: u8) -> u8 {
    let t = life.saturating_add(1);
    let t = if t >= delay {
        t.saturating_add(u8::from(delay >= t - 1))
    } else {
        delay.saturating_add(u8::from(t >= delay - 1)) // delay > t ≥ 1 here
    };
    t.min(31)
}

/// The one path a route has: the id's GIDs, the MTU, the flow label (host order), what Linux's
/// rdma_cm reports for RoCE.
fn fill_path(id: &mut Id, mtu: u8, flow_label: u32) {
    let a = &id.c.route.addr.ibaddr;
    *id.path = ibv_sa_path_rec {
        dgid: a.dgid,
        sgid: a.sgid,
        dlid: 0,
        slid: 0,
        raw_traffic: 0,
        flow_label: flow_label.to_be(),
        hop_limit: 64,
        traffic_class: id.st.tos,
        // An int in host order (the kernel copies its 1 as it is: rxe's path shows 1).
        reversible: 1,
        numb_path: 1,
        pkey: 0xFFFFu16.to_be(),
        sl: 0,
        mtu_selector: 2,
        mtu,
        rate_selector: 2,
        rate: 0,
        packet_life_time_selector: 2,
        // RDMA_OPTION_ID_ACK_TIMEOUT set before: one less (Linux's cma_resolve_iboe_route).
        packet_life_time: id.st.ack_timeout.filter(|&t| t > 0).map_or(PACKET_LIFETIME, |t| t - 1),
        preference: 0,
    };
    id.c.route.path_rec = &mut *id.path;
    id.c.route.num_paths = 1;
}

/// A new id on `channel` (which the caller made or owns), registered.
fn new_id(
    g: &mut Global,
    channel: *mut rdma_event_channel,
    context: *mut std::ffi::c_void,
    ps: c_int,
    qp_type: c_int,
) -> Result<&'static mut Id, c_int> {
    let serial = g.next_serial;
    g.next_serial += 1;
    // SAFETY: rdma_cm_id is plain integers and pointers: all-zero is valid.
    let mut c: rdma_cm_id = unsafe { std::mem::zeroed() };
    c.channel = channel;
    c.context = context;
    c.ps = ps;
    c.qp_type = qp_type;
    let id = Box::new(Id {
        c,
        serial,
        sync: false,
        own: null_mut(),
        st: IdState {
            phase: Phase::Idle,
            comm: None,
            port: 0,
            responder_resources: 0,
            initiator_depth: 0,
            retry_count: 7,
            rnr_retry_count: 7,
            flow_control: 0,
            psn: random_u32() & 0xFF_FFFF,
            req: None,
            rep: None,
            tos: 0,
            ack_timeout: None,
            reuseaddr: false,
            afonly: None,
            qp_init: None,
            local_ece: Default::default(),
            mcs: Vec::new(),
        },
        acks: Mutex::new((0, 0)),
        acked: Condvar::new(),
        // SAFETY: the path record is plain integers: all-zero is valid.
        path: Box::new(unsafe { std::mem::zeroed() }),
    });
    let p = Box::into_raw(id);
    g.ids.insert(serial, p);
    set_live(p, Kind::Id, true);
    // SAFETY: just made and registered; freed only by destroy.
    Ok(unsafe { &mut *p })
}

/// Opens the process's device for the CM: a context kept for the life of the process (as
/// librdmacm keeps its devices open), its PD for QPs made without one, the GSI's agent, and
/// the thread that drives it.
fn open_dev(addr: Option<IpAddr>) -> Result<Dev, c_int> {
    let ctx = crate::device::open_context(crate::device::the_device(), addr, None);
    if ctx.is_null() {
        // SAFETY: errno of the calling thread.
        return Err(unsafe { *libc::__errno_location() });
    }
    // SAFETY: a context just opened.
    let pd = unsafe { crate::mem::ibv_alloc_pd(ctx) };
    if pd.is_null() {
        return Err(libc::ENOMEM);
    }
    // SAFETY: as above.
    let cx = unsafe { crate::context::ctx(ctx) };
    let core = &cx.ctx;
    let fail = |_| libc::ENOMEM;
    let port = core.query_port(1).map_err(fail)?;
    let attr = core.query_device().map_err(fail)?;
    let gsi_pd = core.alloc_pd().map_err(fail)?;
    let waker = Waker { wake: eventfd(libc::EFD_NONBLOCK)?, gsi: core.create_comp_channel().map_err(fail)? };
    let agent =
        CmAgent::with_channel(core, &gsi_pd, random_u32(), Some(&waker.gsi)).map_err(|e| crate::errno_of(&e))?;
    let addr = cx.shared.dev.addr();
    static AT_EXIT: std::sync::Once = std::sync::Once::new();
    // SAFETY: registers a function with no arguments that takes only this module's lock.
    AT_EXIT.call_once(|| unsafe {
        libc::atexit(at_exit);
    });
    Ok(Dev {
        ctx,
        pd,
        xrcd: std::ptr::null_mut(),
        agent,
        waker,
        addr,
        gid: gid_of(addr),
        active_mtu: port.active_mtu as u8,
        max_resp: attr.max_qp_rd_atom.min(255) as u8,
        max_init: attr.max_qp_init_rd_atom.min(255) as u8,
    })
}

/// The CM thread: waits for MADs on the GSI's CQ channel, for a wake-up, or for the CM's
/// next deadline; then takes the MADs in, runs the events and sends the answers.
fn run() {
    // The device's descriptors, for the wait outside the lock: never closed once open.
    let fds = global().dev.as_ref().map(|d| (d.waker.gsi.fd(), d.waker.wake.as_raw_fd()));
    let Some((gsi, wake)) = fds else { return };
    loop {
        let deadline = {
            let mut g = global();
            let Some(dev) = g.dev.as_mut() else { return };
            while dev.waker.gsi.try_get_cq_event().is_some() {}
            let _ = dev.agent.arm();
            let _ = dev.agent.receive(now());
            g.dispatch();
            if g.exit == Exit::Requested {
                let comms: Vec<CommId> = std::mem::take(&mut g.conns).into_keys().collect();
                let dev = g.dev.as_mut().expect("checked above");
                for comm in comms {
                    dev.agent.cm().destroy(comm);
                }
                g.exit = Exit::Draining;
            }
            let dev = g.dev.as_mut().expect("checked above");
            dev.agent.transmit();
            let drained = dev.agent.in_flight() == 0;
            let deadline = dev.agent.poll_timeout();
            if g.exit == Exit::Draining && drained {
                g.exit = Exit::Done;
            }
            PROGRESS.notify_all();
            deadline
        };
        let timeout = match deadline {
            None => -1,
            Some(d) => (d.saturating_sub(now()).div_ceil(1_000_000)).min(60_000) as c_int,
        };
        let mut fds = [
            libc::pollfd { fd: gsi, events: libc::POLLIN, revents: 0 },
            libc::pollfd { fd: wake, events: libc::POLLIN, revents: 0 },
        ];
        // SAFETY: two pollfds in a local array.
        unsafe { libc::poll(fds.as_mut_ptr(), 2, timeout) };
        let mut v: u64 = 0;
        // SAFETY: reads 8 bytes into a local from the non-blocking wake eventfd.
        unsafe { libc::read(wake, (&mut v as *mut u64).cast(), 8) };
    }
}

// The helpers every exported function of the CM uses (errno, the program's pointers, a
// port's service ID), and the refusal of a request, which both `rdma_reject` and the event
// path (a request whose listener went first) make.

/// -1 with errno.
pub(super) fn err(e: c_int) -> c_int {
    set_errno(e);
    -1
}

pub(super) fn result(r: Result<(), c_int>) -> c_int {
    match r {
        Ok(()) => 0,
        Err(e) => err(e),
    }
}

/// The id behind a program's pointer: EINVAL for null and for anything that is not an id
/// the program holds now (one it destroyed, or a stray pointer), which is never dereferenced.
/// perftest 4.5's rdma_cm client retries a rejected connection with the ids it has just
/// destroyed (`scripts/rxe-interop`, cm.send_lat); librdmacm then fails the call on a closed
/// descriptor, and so does this one, where it used to read freed memory and crash.
///
/// # Safety
/// While the program does not destroy it on another thread meanwhile, a live id stays live.
pub(super) unsafe fn id_of<'a>(p: *mut rdma_cm_id) -> Result<&'a mut Id, c_int> {
    if p.is_null() || !is_live(p as *const Id, Kind::Id) {
        return Err(libc::EINVAL);
    }
    // SAFETY: the program's pointer is the `c` field, the first of a live `Id`.
    Ok(unsafe { &mut *(p as *mut Id) })
}

/// The channel behind a program's pointer; `None` for null and for anything that is not a
/// channel the program holds now (see [`id_of`]).
///
/// # Safety
/// While the program does not destroy it on another thread meanwhile, a live channel stays
/// live.
pub(super) unsafe fn channel_of<'a>(p: *mut rdma_event_channel) -> Option<&'a Channel> {
    let live = !p.is_null() && is_live(p as *const Channel, Kind::Channel);
    // SAFETY: the program's pointer is the first field of a live `Channel`.
    live.then(|| unsafe { &*(p as *const Channel) })
}

/// The service ID of a port in a port space (`RDMA_IB_IP_PS_*` | port).
pub(super) fn service_id(ps: c_int, port: u16) -> u64 {
    ((ps as u64) << 16) | u64::from(port)
}

/// Rejects a connection request with `reason`.
pub(super) unsafe fn reject(p: *mut rdma_cm_id, data: *const c_void, len: u8, reason: u16) -> c_int {
    // SAFETY: the program's id.
    let id = match unsafe { id_of(p) } {
        Ok(id) => id,
        Err(e) => return err(e),
    };
    let mut g = global();
    if id.st.phase != Phase::ReqRcvd {
        return err(libc::EINVAL);
    }
    let Some(comm) = id.st.comm.take() else { return err(libc::EINVAL) };
    let d: &[u8] = if data.is_null() {
        &[]
    } else {
        // SAFETY: the program's private data of the length it gives.
        unsafe { std::slice::from_raw_parts(data.cast(), len.into()) }
    };
    // The kernel's limits: a REJ's private data (148 bytes), a SIDR REP's (136).
    let room = if id.c.qp_type == IBV_QPT_UD { 136 } else { 148 };
    if d.len() > room {
        id.st.comm = Some(comm);
        return err(libc::EINVAL);
    }
    g.conns.remove(&comm);
    if let Some(dev) = g.dev.as_mut() {
        if id.c.qp_type == IBV_QPT_UD {
            dev.agent.cm().sidr_reject(comm, sidr_status::REJECT, d);
        } else {
            dev.agent.cm().reject_with(comm, reason, d);
        }
        dev.agent.transmit();
    }
    id.st.phase = Phase::Failed;
    0
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Linux's `cm_ack_timeout` on its own values (rxe's ACK delay 15, rdma_cm's lifetimes)
    /// and on any a peer's REP may carry, which must not overflow.
    #[test]
    fn cm_ack_timeout_as_linux() {
        assert_eq!(cm_ack_timeout(15, 18), 19);
        assert_eq!(cm_ack_timeout(15, 13), 16);
        assert_eq!(cm_ack_timeout(15, 16), 17);
        assert_eq!(cm_ack_timeout(0, 0), 2);
        // Every delay a REP can carry, and more: an overflow would panic here (overflow checks
        // are on in every profile), which is what this loop is for.
        for delay in 0..=u8::MAX {
            for life in [0, 1, 30, 31, u8::MAX] {
                assert!(cm_ack_timeout(delay, life) <= 31);
            }
        }
    }

    /// Which listener takes a request, as Linux's `cma_match_private_data` decides: by the
    /// listener's address, its family and AFONLY, and the request's destination.
    #[test]
    fn a_listener_takes_what_linuxs_takes() {
        let v4 = |a: [u8; 4]| SocketAddr::from((a, 7402));
        let v6 = |a: Ipv6Addr| SocketAddr::from((a, 7402));
        let (any4, any6) = (v4([0, 0, 0, 0]), v6(Ipv6Addr::UNSPECIFIED));
        let lo: IpAddr = Ipv4Addr::new(127, 0, 0, 178).into();
        let lo6: IpAddr = Ipv4Addr::new(127, 0, 0, 178).to_ipv6_mapped().into();
        for (bound, afonly, dst, takes) in [
            (any4, true, lo, true),
            (any4, true, lo6, false), // an IPv4 id is AFONLY: no IPv6 request
            (any4, false, lo6, true), // one that cleared AFONLY takes every request
            (any6, false, lo, true),  // `::`, not AFONLY (bindv6only = 0): every request
            (any6, true, lo, false),
            (any6, true, lo6, true),
            (v4([127, 0, 0, 178]), true, lo, true),
            (v4([127, 0, 0, 179]), true, lo, false),
            (v4([127, 0, 0, 178]), false, lo6, false), // not converted: the family differs
            (v6(Ipv4Addr::new(127, 0, 0, 178).to_ipv6_mapped()), false, lo, false),
            (v6(Ipv4Addr::new(127, 0, 0, 178).to_ipv6_mapped()), false, lo6, true),
        ] {
            assert_eq!(listener_takes(bound, afonly, dst), takes, "{bound} afonly {afonly}, a request to {dst}");
        }
    }

    /// The flow label of Linux's own REQs in the rxe interop captures (scripts/rxe-interop,
    /// `cm.ucmatose.shca-srv`): ucmatose's client on rxe, source port 0xcdb8 to port 7471,
    /// sent Primary Flow Label 0x90677 (the REQ's bytes 88-90: 90 67 7).
    #[test]
    fn the_flow_label_is_linuxs() {
        let a = |ip: [u8; 4], port| SocketAddr::from((ip, port));
        assert_eq!(roce_flow_label(a([198, 18, 0, 1], 0xcdb8), a([198, 18, 0, 2], 7471)), 0x90677);
        // 20 bits: 65535 × 31 + 65535 wraps.
        assert_eq!(roce_flow_label(a([10, 0, 0, 1], 65535), a([10, 0, 0, 2], 65535)), (65535 * 32) & 0xF_FFFF);
        // An IPv6 source with a flow label of its own keeps it.
        let v6 = |fl| SocketAddr::V6(SocketAddrV6::new(Ipv6Addr::LOCALHOST, 4000, fl, 0));
        assert_eq!(roce_flow_label(v6(0x1234), v6(0)), 0x1234);
        assert_eq!(roce_flow_label(v6(0), v6(0)), 4000 * 31 + 4000);
    }
}
