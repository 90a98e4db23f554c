//! The few Linux socket calls std does not offer, as thin `libc` wrappers: socket options,
//! `recvmmsg`/`sendmmsg` with control messages (GRO/GSO), and a raw IPv4 socket with a
//! classic BPF filter (the eventfd and `ppoll` any link's driver uses are in `link::os`).
//! Every `unsafe` block says why it is sound.

use std::io;
use std::mem::{size_of, zeroed};
use std::net::{IpAddr, SocketAddr, SocketAddrV4, SocketAddrV6};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::time::Duration;

use crate::link::os::cvt;
pub use crate::link::os::{eventfd, eventfd_drain, eventfd_signal, ppoll};

pub const SOL_UDP: libc::c_int = 17;
/// `UDP_SEGMENT` (Linux 4.18): GSO segment size, as a socket option or a cmsg (u16).
pub const UDP_SEGMENT: libc::c_int = 103;
/// `UDP_GRO` (Linux 5.0): coalesce on receive; a cmsg (int) reports the segment size.
pub const UDP_GRO: libc::c_int = 104;
/// `IPV6_MULTICAST_ALL` (Linux 4.20; not in the libc crate).
const IPV6_MULTICAST_ALL: libc::c_int = 29;

/// Sets an `int` socket option.
pub fn setsockopt_int(fd: RawFd, level: libc::c_int, name: libc::c_int, value: libc::c_int) -> io::Result<()> {
    setsockopt(fd, level, name, &value)
}

/// Sets a socket option whose value is `value`, a C structure of the option's type (or its
/// bytes): the kernel reads `size_of_val(value)` bytes from it and never writes. A structure
/// with padding must spell it out (see `Fprog`): the kernel would read those bytes too.
fn setsockopt<T: ?Sized>(fd: RawFd, level: libc::c_int, name: libc::c_int, value: &T) -> io::Result<()> {
    // SAFETY: `value` is live for the call and the length passed is its size; the kernel only
    // reads it. An invalid fd yields EBADF, not UB.
    let r = unsafe {
        libc::setsockopt(fd, level, name, (value as *const T).cast(), std::mem::size_of_val(value) as libc::socklen_t)
    };
    cvt(r).map(|_| ())
}

/// A socket address in the C layout, with its length.
#[derive(Clone, Copy)]
pub struct CAddr {
    pub storage: libc::sockaddr_storage,
    pub len: libc::socklen_t,
}

impl CAddr {
    pub fn new(addr: SocketAddr) -> CAddr {
        // SAFETY: sockaddr_storage is plain old data; all-zero is a valid value.
        let mut storage: libc::sockaddr_storage = unsafe { zeroed() };
        let len = match addr {
            SocketAddr::V4(a) => {
                let sin = libc::sockaddr_in {
                    sin_family: libc::AF_INET as libc::sa_family_t,
                    sin_port: a.port().to_be(),
                    sin_addr: libc::in_addr { s_addr: u32::from_ne_bytes(a.ip().octets()) },
                    sin_zero: [0; 8],
                };
                // SAFETY: sockaddr_storage is larger than and suitably aligned for sockaddr_in.
                unsafe { std::ptr::write((&mut storage as *mut libc::sockaddr_storage).cast(), sin) };
                size_of::<libc::sockaddr_in>()
            }
            SocketAddr::V6(a) => {
                let sin6 = libc::sockaddr_in6 {
                    sin6_family: libc::AF_INET6 as libc::sa_family_t,
                    sin6_port: a.port().to_be(),
                    sin6_flowinfo: a.flowinfo(),
                    sin6_addr: libc::in6_addr { s6_addr: a.ip().octets() },
                    sin6_scope_id: a.scope_id(),
                };
                // SAFETY: sockaddr_storage is larger than and suitably aligned for sockaddr_in6.
                unsafe { std::ptr::write((&mut storage as *mut libc::sockaddr_storage).cast(), sin6) };
                size_of::<libc::sockaddr_in6>()
            }
        };
        CAddr { storage, len: len as libc::socklen_t }
    }

    /// Decodes an address the kernel wrote (None for other families or short lengths).
    pub fn decode(storage: &libc::sockaddr_storage, len: libc::socklen_t) -> Option<SocketAddr> {
        let len = len as usize;
        match storage.ss_family as libc::c_int {
            libc::AF_INET if len >= size_of::<libc::sockaddr_in>() => {
                // SAFETY: the family says the storage holds a sockaddr_in, and the length the
                // kernel reported covers it; sockaddr_storage is aligned for it.
                let sin = unsafe { &*(storage as *const libc::sockaddr_storage).cast::<libc::sockaddr_in>() };
                let ip = std::net::Ipv4Addr::from(sin.sin_addr.s_addr.to_ne_bytes());
                Some(SocketAddr::V4(SocketAddrV4::new(ip, u16::from_be(sin.sin_port))))
            }
            libc::AF_INET6 if len >= size_of::<libc::sockaddr_in6>() => {
                // SAFETY: as above, for sockaddr_in6.
                let sin6 = unsafe { &*(storage as *const libc::sockaddr_storage).cast::<libc::sockaddr_in6>() };
                let ip = std::net::Ipv6Addr::from(sin6.sin6_addr.s6_addr);
                Some(SocketAddr::V6(SocketAddrV6::new(
                    ip,
                    u16::from_be(sin6.sin6_port),
                    sin6.sin6_flowinfo,
                    sin6.sin6_scope_id,
                )))
            }
            _ => None,
        }
    }
}

/// A new socket (close-on-exec), made with the `socket` system call itself rather than libc's
/// wrapper. A library interposed on `socket` sees softhca's own sockets otherwise: librdmacm's
/// `librspreload.so` (`LD_PRELOAD`, which turns a program's TCP and UDP sockets into rsockets)
/// took the device's UDP socket, opened while an rsocket bound its address, for one of the
/// program's and made it an rsocket on the very device being opened, which waited for
/// itself. Every socket of softhca's is made here.
pub fn socket(domain: libc::c_int, ty: libc::c_int, protocol: libc::c_int) -> io::Result<OwnedFd> {
    // SAFETY: socket(2) takes no pointers; a non-negative result is a new fd that we own.
    let fd = unsafe { libc::syscall(libc::SYS_socket, domain, ty | libc::SOCK_CLOEXEC, protocol) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: just returned by socket(2), owned by nothing else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
}

/// A (blocking) UDP socket bound to `addr`: `UdpSocket::bind`, made through [`socket`].
pub fn udp_bind(addr: SocketAddr) -> io::Result<std::net::UdpSocket> {
    let family = if addr.is_ipv4() { libc::AF_INET } else { libc::AF_INET6 };
    let fd = socket(family, libc::SOCK_DGRAM, 0)?;
    let a = CAddr::new(addr);
    // SAFETY: `a.storage` holds a sockaddr of `a.len` bytes, alive for the call.
    cvt(unsafe { libc::bind(fd.as_raw_fd(), (&a.storage as *const libc::sockaddr_storage).cast(), a.len) })?;
    Ok(std::net::UdpSocket::from(fd))
}

/// A raw IPv4 socket for UDP bound to `addr`, with a BPF filter that keeps only datagrams to
/// UDP port `port`: it receives them from the IP header on (privileged: CAP_NET_RAW).
pub fn raw_udp_v4(addr: std::net::Ipv4Addr, port: u16) -> io::Result<OwnedFd> {
    let fd = socket(libc::AF_INET, libc::SOCK_RAW | libc::SOCK_NONBLOCK, libc::IPPROTO_UDP)?;
    let a = CAddr::new(SocketAddr::V4(SocketAddrV4::new(addr, 0)));
    // SAFETY: `a.storage` holds a sockaddr_in of `a.len` bytes, alive for the call.
    cvt(unsafe { libc::bind(fd.as_raw_fd(), (&a.storage as *const libc::sockaddr_storage).cast(), a.len) })?;
    // ldxb 4*([0]&0xf); ldh [x+2]; jeq #port, accept, drop; accept: ret #262144; drop: ret #0
    let prog = [
        bpf(0xb1, 0, 0, 0),
        bpf(0x48, 0, 0, 2),
        bpf(0x15, 0, 1, u32::from(port)),
        bpf(0x06, 0, 0, 0x40000),
        bpf(0x06, 0, 0, 0),
    ];
    attach_filter(fd.as_raw_fd(), &prog)?;
    set_buffer(fd.as_raw_fd(), libc::SO_RCVBUF, 8 << 20)?;
    Ok(fd)
}

/// A non-blocking socket of `ty` (`SOCK_DGRAM` or `SOCK_STREAM`) bound to `addr`, with
/// `SO_REUSEPORT` set before the bind when `reuseport`.
pub fn bound_socket(addr: SocketAddr, ty: libc::c_int, reuseport: bool) -> io::Result<OwnedFd> {
    let reuse = if reuseport { libc::SO_REUSEPORT } else { 0 };
    bound_with(addr, ty, reuse)
}

/// A non-blocking socket of type `ty` bound to `addr`, with `reuse` (`SO_REUSEPORT`,
/// `SO_REUSEADDR`, or 0 for none) set first.
fn bound_with(addr: SocketAddr, ty: libc::c_int, reuse: libc::c_int) -> io::Result<OwnedFd> {
    let family = if addr.is_ipv4() { libc::AF_INET } else { libc::AF_INET6 };
    let fd = socket(family, ty | libc::SOCK_NONBLOCK, 0)?;
    if reuse != 0 {
        setsockopt_int(fd.as_raw_fd(), libc::SOL_SOCKET, reuse, 1)?;
    }
    let a = CAddr::new(addr);
    // SAFETY: `a.storage` holds a sockaddr of `a.len` bytes, alive for the call.
    cvt(unsafe { libc::bind(fd.as_raw_fd(), (&a.storage as *const libc::sockaddr_storage).cast(), a.len) })?;
    Ok(fd)
}

/// An epoll instance watching `fds` for input: readable when any of them is.
pub fn epoll_of(fds: &[RawFd]) -> io::Result<OwnedFd> {
    // SAFETY: epoll_create1 takes no pointers; a non-negative result is a new fd that we own.
    let ep = unsafe { OwnedFd::from_raw_fd(cvt(libc::epoll_create1(libc::EPOLL_CLOEXEC))?) };
    for &fd in fds {
        epoll_add(ep.as_raw_fd(), fd)?;
    }
    Ok(ep)
}

/// Adds `fd` to epoll set `ep`, for input. (A closed fd leaves every set by itself.)
pub fn epoll_add(ep: RawFd, fd: RawFd) -> io::Result<()> {
    let mut ev = libc::epoll_event { events: libc::EPOLLIN as u32, u64: fd as u64 };
    // SAFETY: `ev` is a valid epoll_event alive for the call; the kernel copies it.
    cvt(unsafe { libc::epoll_ctl(ep, libc::EPOLL_CTL_ADD, fd, &mut ev) }).map(|_| ())
}

/// A UDP socket that hears multicast group `group` on `port`, on the interface that holds
/// `local`: bound to the group's address, so that it gets that group's datagrams and nothing
/// else, with `SO_REUSEADDR`, so that every socket so bound (in any process) gets its own copy,
/// and joined on the interface (`IP_ADD_MEMBERSHIP`, `IPV6_ADD_MEMBERSHIP`), so that the host
/// takes the group's traffic there; with `IP_MULTICAST_ALL` (`IPV6_MULTICAST_ALL`) off it takes
/// only what arrives on that interface, so that two devices of one host on two interfaces get
/// one copy each, not the looped-back copy and the wire's both.
pub fn group_socket(group: IpAddr, local: IpAddr, port: u16) -> io::Result<OwnedFd> {
    let fd = bound_with(SocketAddr::new(group, port), libc::SOCK_DGRAM, libc::SO_REUSEADDR)?;
    match group {
        IpAddr::V4(_) => {
            let _ = setsockopt_int(fd.as_raw_fd(), libc::IPPROTO_IP, libc::IP_MULTICAST_ALL, 0);
        }
        IpAddr::V6(_) => {
            let _ = setsockopt_int(fd.as_raw_fd(), libc::IPPROTO_IPV6, IPV6_MULTICAST_ALL, 0);
            // IPv6 checks a membership's group, not its interface: the socket is tied to the
            // interface itself (where the process may: CAP_NET_RAW before Linux 5.7).
            if let Some(name) = interface_name(local).and_then(|n| std::ffi::CString::new(n).ok()) {
                let _ = setsockopt(fd.as_raw_fd(), libc::SOL_SOCKET, libc::SO_BINDTODEVICE, name.as_bytes_with_nul());
            }
        }
    }
    match (group, local) {
        (IpAddr::V4(g), IpAddr::V4(l)) => {
            let m = libc::ip_mreq {
                imr_multiaddr: libc::in_addr { s_addr: u32::from_ne_bytes(g.octets()) },
                imr_interface: libc::in_addr { s_addr: u32::from_ne_bytes(l.octets()) },
            };
            setsockopt(fd.as_raw_fd(), libc::IPPROTO_IP, libc::IP_ADD_MEMBERSHIP, &m)?;
        }
        (IpAddr::V6(g), IpAddr::V6(l)) => {
            let m = libc::ipv6_mreq {
                ipv6mr_multiaddr: libc::in6_addr { s6_addr: g.octets() },
                ipv6mr_interface: interface_index(IpAddr::V6(l)).unwrap_or(0),
            };
            setsockopt(fd.as_raw_fd(), libc::IPPROTO_IPV6, libc::IPV6_ADD_MEMBERSHIP, &m)?;
        }
        _ => return Err(io::Error::new(io::ErrorKind::InvalidInput, "a group of the other address family")),
    }
    Ok(fd)
}

/// The index of the interface that holds `addr`, if there is one.
pub fn interface_index(addr: IpAddr) -> Option<u32> {
    let name = std::ffi::CString::new(interface_name(addr)?).ok()?;
    // SAFETY: `name` is a NUL-terminated string alive for the call.
    let i = unsafe { libc::if_nametoindex(name.as_ptr()) };
    (i != 0).then_some(i)
}

/// The reuseport group's program (`SO_ATTACH_REUSEPORT_CBPF`), which the kernel runs on the
/// UDP payload and which names the socket, by its place in the group, that gets the datagram.
/// With `steer`, socket 1 (the response queue) gets the BTH opcodes whose low five bits are
/// 0x0D..=0x12 — RDMA Read Response First/Middle/Last/Only, Acknowledge, Atomic Acknowledge,
/// in RC, RD and XRC alike — and socket 0 everything else; without, socket 0 gets everything.
/// Replacing the program switches at once.
pub fn steer_responses(fd: RawFd, steer: bool) -> io::Result<()> {
    // ldb [0]; and #0x1f; jge #13, next, req; jgt #18, req, resp; resp: ret #1; req: ret #0
    let steering = [
        bpf(0x30, 0, 0, 0),
        bpf(0x54, 0, 0, 0x1f),
        bpf(0x35, 0, 2, 0x0d),
        bpf(0x25, 1, 0, 0x12),
        bpf(0x06, 0, 0, 1),
        bpf(0x06, 0, 0, 0),
    ];
    let prog: &[libc::sock_filter] = if steer { &steering } else { &steering[5..] };
    attach_program(fd, libc::SO_ATTACH_REUSEPORT_CBPF, prog)
}

/// Sets a socket buffer (`SO_RCVBUF` or `SO_SNDBUF`) to `bytes`: past `net.core.rmem_max` /
/// `wmem_max` with the `*FORCE` option where the process may (CAP_NET_ADMIN), else up to the
/// cap. A peer that sends without pacing (Linux rxe sends a 64 KiB message per QP at once, on
/// many QPs) overflows a capped receive buffer, and every datagram dropped there costs a
/// retransmission round.
pub fn set_buffer(fd: RawFd, opt: libc::c_int, bytes: libc::c_int) -> io::Result<()> {
    let force = if opt == libc::SO_RCVBUF { libc::SO_RCVBUFFORCE } else { libc::SO_SNDBUFFORCE };
    setsockopt_int(fd, libc::SOL_SOCKET, force, bytes).or_else(|_| setsockopt_int(fd, libc::SOL_SOCKET, opt, bytes))
}

/// One classic BPF instruction.
pub(super) const fn bpf(code: u16, jt: u8, jf: u8, k: u32) -> libc::sock_filter {
    libc::sock_filter { code, jt, jf, k }
}

/// Attaches a classic BPF program (SO_ATTACH_FILTER).
pub fn attach_filter(fd: RawFd, prog: &[libc::sock_filter]) -> io::Result<()> {
    attach_program(fd, libc::SO_ATTACH_FILTER, prog)
}

/// `struct sock_fprog` with the six bytes of padding after `len` as a field: all of it goes to
/// the kernel, and padding is never initialised in a typed value (valgrind's memcheck fails a
/// program on uninitialised bytes passed to a system call).
#[repr(C)]
struct Fprog {
    len: u16,
    _pad: [u16; 3],
    filter: *const libc::sock_filter,
}
const _: () = assert!(
    size_of::<Fprog>() == size_of::<libc::sock_fprog>()
        && std::mem::offset_of!(Fprog, filter) == std::mem::offset_of!(libc::sock_fprog, filter)
);

/// Hands the kernel a classic BPF program through the socket option `opt` (a socket filter,
/// or a reuseport group's selector).
fn attach_program(fd: RawFd, opt: libc::c_int, prog: &[libc::sock_filter]) -> io::Result<()> {
    // `sock_fprog` with its padding spelled out (checked above), pointing at `prog`, which
    // outlives the call; the kernel copies the program and never writes through the pointer.
    let fprog = Fprog { len: prog.len() as u16, _pad: [0; 3], filter: prog.as_ptr() };
    setsockopt(fd, libc::SOL_SOCKET, opt, &fprog)
}

/// Has the kernel report each datagram's TOS and TTL (IPv6: Traffic Class and Hop Limit) with
/// it (`on`), or stop: a report costs every datagram its cmsgs (0.07 µs of a small Send's
/// one-way latency on loopback).
pub fn report_ip_fields(fd: RawFd, v6: bool, on: bool) -> io::Result<()> {
    let v = libc::c_int::from(on);
    if v6 {
        setsockopt_int(fd, libc::IPPROTO_IPV6, libc::IPV6_RECVTCLASS, v)?;
        setsockopt_int(fd, libc::IPPROTO_IPV6, libc::IPV6_RECVHOPLIMIT, v)
    } else {
        setsockopt_int(fd, libc::IPPROTO_IP, libc::IP_RECVTOS, v)?;
        setsockopt_int(fd, libc::IPPROTO_IP, libc::IP_RECVTTL, v)
    }
}

/// A filter that drops everything: the 4791 socket in raw receive mode only holds the port.
pub fn drop_all(fd: RawFd) -> io::Result<()> {
    attach_filter(fd, &[bpf(0x06, 0, 0, 0)])
}

/// One message's control area, 8-byte aligned as cmsg headers want: 96 bytes, room for the
/// most either direction carries (received: UDP_GRO, the TOS and the TTL; sent: UDP_SEGMENT
/// and two IP header fields), so that a received cmsg is never cut off.
type Ctrl = [u64; 12];

/// Batched receive buffers for `recvmmsg`, each with `headroom` bytes in front of the data so
/// that the link can write the rebuilt IP + UDP header in place. Holds raw pointers into its
/// own heap allocations, which never move (the vectors are never resized).
pub struct RxBatch {
    pub cap: usize,
    pub headroom: usize,
    bufs: Vec<u8>,
    names: Vec<libc::sockaddr_storage>,
    ctrl: Vec<Ctrl>,
    iovs: Vec<libc::iovec>,
    hdrs: Vec<libc::mmsghdr>,
    /// Headers the last `recvmmsg` filled in (they need resetting before the next).
    used: usize,
}

// SAFETY: the raw pointers inside (iovecs and message headers) point only into the batch's
// own heap buffers, are rewritten before every `recvmmsg`, and are never dereferenced by Rust
// code; moving the batch to another thread (under the engine's mutex) moves those buffers'
// ownership with it.
unsafe impl Send for RxBatch {}

/// One received message of an [`RxBatch`].
pub struct RxMsg {
    pub from: Option<SocketAddr>,
    pub len: usize,
    /// The GRO segment size, when the kernel coalesced several datagrams into this one.
    pub gro_size: Option<usize>,
    /// The IPv4 TOS (IPv6 Traffic Class) and TTL (Hop Limit) it came with, where the socket
    /// reports them ([`report_ip_fields`]).
    pub tos: Option<u8>,
    pub ttl: Option<u8>,
    pub truncated: bool,
}

impl RxBatch {
    pub fn new(n: usize, cap: usize, headroom: usize) -> RxBatch {
        let stride = headroom + cap;
        // SAFETY: sockaddr_storage, iovec and mmsghdr are plain old data; all-zero bytes are
        // valid values (null pointers, zero lengths) and every pointer is set below.
        let zero_name: libc::sockaddr_storage = unsafe { zeroed() };
        let zero_iov = libc::iovec { iov_base: std::ptr::null_mut(), iov_len: 0 };
        // SAFETY: as above.
        let zero_hdr: libc::mmsghdr = unsafe { zeroed() };
        let mut b = RxBatch {
            cap,
            headroom,
            bufs: vec![0u8; n * stride],
            names: vec![zero_name; n],
            ctrl: vec![Ctrl::default(); n],
            iovs: vec![zero_iov; n],
            hdrs: vec![zero_hdr; n],
            used: n,
        };
        // The pointers go into the vectors' heap allocations, which never move or resize
        // (moving the RxBatch moves only the Vec handles), so they are set once.
        let base = b.bufs.as_mut_ptr();
        for i in 0..n {
            // SAFETY: i * stride + headroom + cap <= bufs.len(), so the pointer stays inside
            // the buffer allocation.
            b.iovs[i] = libc::iovec { iov_base: unsafe { base.add(i * stride + headroom) }.cast(), iov_len: cap };
        }
        for i in 0..n {
            let h = &mut b.hdrs[i].msg_hdr;
            h.msg_name = (&mut b.names[i] as *mut libc::sockaddr_storage).cast();
            h.msg_iov = &mut b.iovs[i];
            h.msg_iovlen = 1;
            h.msg_control = b.ctrl[i].as_mut_ptr().cast();
        }
        b
    }

    /// Receives up to `max` (at most the batch size) datagrams without blocking; `Ok(0)` when
    /// none are waiting.
    pub fn recv(&mut self, fd: RawFd, out: &mut Vec<RxMsg>, max: usize) -> io::Result<usize> {
        // Only the headers the kernel wrote last time need their in/out fields reset.
        for h in &mut self.hdrs[..self.used] {
            h.msg_hdr.msg_namelen = size_of::<libc::sockaddr_storage>() as libc::socklen_t;
            h.msg_hdr.msg_controllen = size_of::<Ctrl>() as _;
            h.msg_hdr.msg_flags = 0;
            h.msg_len = 0;
        }
        self.used = 0;
        out.clear();
        // SAFETY: every header points at buffers, names, iovecs and control areas owned by
        // self (set in `new`, into heap allocations that never move), sized as declared, alive
        // and unaliased for the call; the kernel writes at most the declared lengths.
        let r = unsafe {
            // The system call itself: libc's wrapper is a cancellation point, and entering
            // and leaving asynchronous cancellation costs two calls per receive.
            libc::syscall(
                libc::SYS_recvmmsg,
                fd,
                self.hdrs.as_mut_ptr(),
                max.clamp(1, self.hdrs.len()) as libc::c_uint,
                libc::MSG_DONTWAIT,
                std::ptr::null_mut::<libc::timespec>(),
            ) as libc::c_int
        };
        if r < 0 {
            // Nothing waiting is every idle busy poll's answer: told by its number, not by
            // the error's kind (a match over every errno).
            let e = io::Error::last_os_error();
            return match e.raw_os_error() {
                Some(libc::EAGAIN | libc::EINTR) => Ok(0),
                _ => Err(e),
            };
        }
        self.used = r as usize;
        for i in 0..r as usize {
            let h = &self.hdrs[i].msg_hdr;
            let (mut gro_size, mut tos, mut ttl) = (None, None, None);
            // SAFETY: the CMSG_* macros walk the control area the kernel filled in, bounded
            // by msg_controllen (which the kernel set to what it wrote); each cmsg's data is
            // read with an unaligned read of the size the option defines (IP_TOS: a byte; the
            // others an int).
            unsafe {
                let mut c = libc::CMSG_FIRSTHDR(h);
                while !c.is_null() {
                    let int = || std::ptr::read_unaligned(libc::CMSG_DATA(c).cast::<libc::c_int>());
                    match ((*c).cmsg_level, (*c).cmsg_type) {
                        (SOL_UDP, UDP_GRO) => gro_size = usize::try_from(int()).ok().filter(|&v| v > 0),
                        (libc::IPPROTO_IP, libc::IP_TOS) => tos = Some(*libc::CMSG_DATA(c)),
                        (libc::IPPROTO_IP, libc::IP_TTL) | (libc::IPPROTO_IPV6, libc::IPV6_HOPLIMIT) => {
                            ttl = u8::try_from(int()).ok()
                        }
                        (libc::IPPROTO_IPV6, libc::IPV6_TCLASS) => tos = u8::try_from(int()).ok(),
                        _ => {}
                    }
                    c = libc::CMSG_NXTHDR(h, c);
                }
            }
            out.push(RxMsg {
                from: CAddr::decode(&self.names[i], h.msg_namelen),
                len: (self.hdrs[i].msg_len as usize).min(self.cap),
                gro_size,
                tos,
                ttl,
                truncated: h.msg_flags & libc::MSG_TRUNC != 0,
            });
        }
        Ok(r as usize)
    }

    /// Message `i`'s buffer: `headroom` bytes, then the data.
    pub fn buf_mut(&mut self, i: usize) -> &mut [u8] {
        let stride = self.headroom + self.cap;
        &mut self.bufs[i * stride..(i + 1) * stride]
    }
}

/// One message to send: the datagrams `segs[first..first + count]` (one datagram, or a GSO
/// run of equal-size segments but the last when `gso` is set) to `to`, or with `to` = None to
/// the socket's connected peer, with the IP header fields `ip`.
#[derive(Clone, Copy)]
pub struct TxMsg {
    pub to: Option<CAddr>,
    pub first: usize,
    pub count: usize,
    pub gso: Option<u16>,
    pub ip: IpFields,
}

/// What a message's IP header is to carry that the socket would not put there itself
/// (PKT-ROCE-3), each as a cmsg: the IPv4 TOS or IPv6 Traffic Class where it is not 0
/// (`IP_TOS`, `IPV6_TCLASS`), and the hop limit of a multicast datagram (`IP_TTL`,
/// `IPV6_HOPLIMIT`: a socket's own multicast hop limit is 1). A unicast datagram takes the
/// route's hop limit, as Linux's RoCE core gives it (the drop-in's `resolve_ah_attr`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct IpFields {
    pub v6: bool,
    pub tos: u8,
    pub hop_limit: Option<u8>,
}

impl IpFields {
    /// The cmsgs (level, type, int value): none for a datagram the socket's defaults fit.
    fn cmsgs(self) -> impl Iterator<Item = (libc::c_int, libc::c_int, libc::c_int)> {
        let (level, tos, hops) = if self.v6 {
            (libc::IPPROTO_IPV6, libc::IPV6_TCLASS, libc::IPV6_HOPLIMIT)
        } else {
            (libc::IPPROTO_IP, libc::IP_TOS, libc::IP_TTL)
        };
        let t = (self.tos != 0).then_some((level, tos, self.tos.into()));
        // 0 is not a hop limit a cmsg takes (IP_TTL wants 1..=255): the socket's then.
        let h = self.hop_limit.filter(|&h| h != 0).map(|h| (level, hops, h.into()));
        t.into_iter().chain(h)
    }
}

/// The C-side arrays [`sendmmsg`] fills, kept between calls so that sending allocates
/// nothing.
#[derive(Default)]
pub struct TxScratch {
    iovs: Vec<libc::iovec>,
    names: Vec<libc::sockaddr_storage>,
    ctrl: Vec<Ctrl>,
    hdrs: Vec<libc::mmsghdr>,
}

// SAFETY: the raw pointers inside are rewritten from the caller's borrows at the start of
// every `sendmmsg` and only read by the kernel during that call; stale pointers left in
// between are never dereferenced.
unsafe impl Send for TxScratch {}

/// Sends `msgs` with one `sendmmsg`; message payloads are the byte ranges `segs` of `buf`.
/// Returns how many messages went (the kernel stops at the first error, which is returned if
/// none went). Panics if a range or message index is out of bounds (a caller bug).
pub fn sendmmsg(
    fd: RawFd,
    buf: &[u8],
    segs: &[std::ops::Range<usize>],
    msgs: &[TxMsg],
    scratch: &mut TxScratch,
) -> io::Result<usize> {
    let TxScratch { iovs, names, ctrl, hdrs } = scratch;
    iovs.clear();
    names.clear();
    ctrl.clear();
    hdrs.clear();
    for m in msgs {
        for r in &segs[m.first..m.first + m.count] {
            let s = &buf[r.clone()];
            iovs.push(libc::iovec { iov_base: s.as_ptr() as *mut libc::c_void, iov_len: s.len() });
        }
        // SAFETY: sockaddr_storage is plain old data; all-zero is valid (and unused when unnamed).
        names.push(m.to.map_or(unsafe { zeroed() }, |a| a.storage));
        ctrl.push(Ctrl::default());
        // SAFETY: mmsghdr is plain old data; all-zero is valid, and every field used is set
        // below once the vectors stop growing.
        hdrs.push(unsafe { zeroed() });
    }
    let mut at = 0;
    for (i, m) in msgs.iter().enumerate() {
        let h = &mut hdrs[i].msg_hdr;
        if let Some(to) = m.to {
            h.msg_name = (&mut names[i] as *mut libc::sockaddr_storage).cast();
            h.msg_namelen = to.len;
        }
        // SAFETY: at + m.count <= iovs.len(): the iovecs were pushed in this order above.
        h.msg_iov = unsafe { iovs.as_mut_ptr().add(at) };
        h.msg_iovlen = m.count as _;
        at += m.count;
        // The control area: UDP_SEGMENT for a GSO run, then the IP header's fields.
        let int = size_of::<libc::c_int>() as u32;
        // SAFETY: CMSG_SPACE is a pure size computation.
        let len = unsafe {
            m.gso.map_or(0, |_| libc::CMSG_SPACE(size_of::<u16>() as u32))
                + m.ip.cmsgs().map(|_| libc::CMSG_SPACE(int)).sum::<u32>()
        };
        if len > 0 {
            h.msg_control = ctrl[i].as_mut_ptr().cast();
            h.msg_controllen = len as _;
            // SAFETY: the control area (`Ctrl`) is 96 bytes, more than CMSG_SPACE(2) + 2 *
            // CMSG_SPACE(4) (72 on 64-bit Linux), and msg_controllen covers exactly the cmsgs
            // written, so CMSG_FIRSTHDR/CMSG_NXTHDR return headers inside it with room for
            // their data; the writes are unaligned-safe.
            unsafe {
                let mut c = libc::CMSG_FIRSTHDR(h);
                if let Some(size) = m.gso {
                    (*c).cmsg_level = SOL_UDP;
                    (*c).cmsg_type = UDP_SEGMENT;
                    (*c).cmsg_len = libc::CMSG_LEN(size_of::<u16>() as u32) as _;
                    std::ptr::write_unaligned(libc::CMSG_DATA(c).cast::<u16>(), size);
                    c = libc::CMSG_NXTHDR(h, c);
                }
                for (level, kind, v) in m.ip.cmsgs() {
                    (*c).cmsg_level = level;
                    (*c).cmsg_type = kind;
                    (*c).cmsg_len = libc::CMSG_LEN(int) as _;
                    std::ptr::write_unaligned(libc::CMSG_DATA(c).cast::<libc::c_int>(), v);
                    c = libc::CMSG_NXTHDR(h, c);
                }
            }
        }
    }
    // SAFETY: the headers point at names, iovecs and control areas in `scratch` and at
    // payloads in `buf`, all alive and unmoved for the call; the kernel only reads them (and
    // writes msg_len into `hdrs`).
    // (The system call itself, not libc's cancellation-point wrapper, as in `RxBatch::recv`.)
    let r = unsafe {
        libc::syscall(libc::SYS_sendmmsg, fd, hdrs.as_mut_ptr(), hdrs.len() as libc::c_uint, libc::MSG_DONTWAIT)
    } as libc::c_int;
    cvt(r).map(|n| n as usize)
}

/// Connects a datagram socket to `peer`: the kernel keeps its route, and sends without an
/// address skip the per-call route lookup.
pub fn connect(fd: RawFd, peer: SocketAddr) -> io::Result<()> {
    let a = CAddr::new(peer);
    // SAFETY: `a.storage` holds a sockaddr of length `a.len`, alive for the call; the kernel
    // only reads it.
    cvt(unsafe { libc::connect(fd, (&a.storage as *const libc::sockaddr_storage).cast(), a.len) }).map(|_| ())
}

/// Dissolves a datagram socket's association (connect to AF_UNSPEC); its local binding stays.
pub fn disconnect(fd: RawFd) -> io::Result<()> {
    // SAFETY: sockaddr_storage is plain old data; all-zero is valid.
    let mut a: libc::sockaddr_storage = unsafe { zeroed() };
    a.ss_family = libc::AF_UNSPEC as libc::sa_family_t;
    let len = size_of::<libc::sockaddr>() as libc::socklen_t;
    // SAFETY: `a` is a live sockaddr_storage, larger than the length passed; read only.
    cvt(unsafe { libc::connect(fd, (&a as *const libc::sockaddr_storage).cast(), len) }).map(|_| ())
}

/// What an Identification probe sends (to the device's own sink socket; it never leaves the host).
const PROBE: &[u8] = b"softhca: IPv4 Identification probe";

/// Learns the IPv4 Identification a connected IPv4 socket gives its datagrams (Linux numbers
/// them from a per-socket counter that `connect` starts at random): sends one probe datagram
/// from `fd` to `sink` (a socket of this host that drops what it gets) with a software
/// transmit timestamp, whose error-queue copy carries the headers as sent, and reads the
/// Identification there. The socket's next datagram gets the returned value + 1. Fails where
/// the kernel withholds the packet copy (`net.core.tstamp_allow_data = 0` without
/// CAP_NET_RAW) or the timestamp does not come within `patience`.
pub fn probe_identification(
    fd: RawFd,
    local: std::net::Ipv4Addr,
    sink: SocketAddrV4,
    patience: Duration,
) -> io::Result<u16> {
    let on = (libc::SOF_TIMESTAMPING_TX_SOFTWARE | libc::SOF_TIMESTAMPING_SOFTWARE) as libc::c_int;
    setsockopt_int(fd, libc::SOL_SOCKET, libc::SO_TIMESTAMPING, on)?;
    let got = probe_once(fd, local, sink, patience);
    let off = setsockopt_int(fd, libc::SOL_SOCKET, libc::SO_TIMESTAMPING, 0);
    drain_errqueue(fd);
    let id = got?;
    off.map(|_| id)
}

fn probe_once(fd: RawFd, local: std::net::Ipv4Addr, sink: SocketAddrV4, patience: Duration) -> io::Result<u16> {
    drain_errqueue(fd);
    let to = CAddr::new(SocketAddr::V4(sink));
    // SAFETY: PROBE and `to.storage` are live for the call and read only.
    let sent = unsafe {
        libc::sendto(
            fd,
            PROBE.as_ptr().cast(),
            PROBE.len(),
            libc::MSG_DONTWAIT,
            (&to.storage as *const libc::sockaddr_storage).cast(),
            to.len,
        )
    };
    if sent < 0 {
        return Err(io::Error::last_os_error());
    }
    // The copy is queued on transmit (synchronously on loopback); POLLERR reports it.
    let mut fds = [libc::pollfd { fd, events: 0, revents: 0 }];
    ppoll(&mut fds, Some(patience))?;
    let mut frame = [0u8; 512];
    let mut ctrl = [0u64; 64];
    let mut iov = libc::iovec { iov_base: frame.as_mut_ptr().cast(), iov_len: frame.len() };
    // SAFETY: msghdr is plain old data; all-zero is valid.
    let mut h: libc::msghdr = unsafe { zeroed() };
    h.msg_iov = &mut iov;
    h.msg_iovlen = 1;
    h.msg_control = ctrl.as_mut_ptr().cast();
    h.msg_controllen = size_of::<[u64; 64]>() as _;
    // SAFETY: `h` points at `iov` (into `frame`) and `ctrl`, all live and writable for the
    // call and of the lengths given.
    let n = unsafe { libc::recvmsg(fd, &mut h, libc::MSG_ERRQUEUE | libc::MSG_DONTWAIT) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    let frame = &frame[..(n as usize).min(frame.len())];
    identification_of_probe(frame, local, *sink.ip())
        .ok_or_else(|| io::Error::new(io::ErrorKind::Unsupported, "the transmit timestamp carried no packet copy"))
}

/// The Identification of the probe in an error-queue frame (link-layer header, IPv4, UDP,
/// [`PROBE`]): the IPv4 header is the 20 bytes before the UDP header that precedes the probe.
fn identification_of_probe(frame: &[u8], src: std::net::Ipv4Addr, dst: std::net::Ipv4Addr) -> Option<u16> {
    let at = frame.len().checked_sub(PROBE.len() + 8 + 20)?;
    let ip = crate::wire::roce::Ipv4Repr::parse(&frame[at..]).ok()?.0;
    let ok = frame.ends_with(PROBE) && ip.src == src && ip.dst == dst;
    ok.then_some(ip.identification)
}

fn drain_errqueue(fd: RawFd) {
    let mut buf = [0u8; 512];
    for _ in 0..64 {
        // SAFETY: reads at most buf.len() bytes into a live, writable buffer.
        let n = unsafe { libc::recv(fd, buf.as_mut_ptr().cast(), buf.len(), libc::MSG_ERRQUEUE | libc::MSG_DONTWAIT) };
        if n < 0 {
            return;
        }
    }
}

/// The name of the interface that holds `addr` exactly (getifaddrs), if there is one.
pub fn interface_name(addr: IpAddr) -> Option<String> {
    let mut list: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs fills `list` with a list it allocates, freed below.
    if unsafe { libc::getifaddrs(&mut list) } != 0 {
        return None;
    }
    let mut name = None;
    let mut at = list;
    while !at.is_null() {
        // SAFETY: a node of the list getifaddrs returned, alive until freeifaddrs.
        let ifa = unsafe { &*at };
        // SAFETY: a non-null ifa_addr points at a sockaddr, whose family field comes first.
        let family = (!ifa.ifa_addr.is_null()).then(|| unsafe { (*ifa.ifa_addr).sa_family } as libc::c_int);
        let len = match family {
            Some(libc::AF_INET) => size_of::<libc::sockaddr_in>(),
            Some(libc::AF_INET6) => size_of::<libc::sockaddr_in6>(),
            _ => 0,
        };
        if len > 0 {
            // SAFETY: sockaddr_storage is plain old data; all-zero is valid.
            let mut ss: libc::sockaddr_storage = unsafe { zeroed() };
            // SAFETY: the family says ifa_addr holds `len` bytes (its sockaddr type), and
            // sockaddr_storage is larger than either.
            unsafe {
                std::ptr::copy_nonoverlapping(
                    ifa.ifa_addr.cast::<u8>(),
                    (&mut ss as *mut libc::sockaddr_storage).cast::<u8>(),
                    len,
                )
            };
            if CAddr::decode(&ss, len as libc::socklen_t).is_some_and(|a| a.ip() == addr) {
                // SAFETY: ifa_name is a NUL-terminated string owned by the list.
                name = Some(unsafe { std::ffi::CStr::from_ptr(ifa.ifa_name) }.to_string_lossy().into_owned());
                break;
            }
        }
        at = ifa.ifa_next;
    }
    // SAFETY: the list getifaddrs returned, freed once.
    unsafe { libc::freeifaddrs(list) };
    name
}

/// The MTU of the interface that holds `addr` (getifaddrs, then sysfs), if it can be found.
pub fn interface_mtu(addr: IpAddr) -> Option<u32> {
    let name = interface_name(addr)?;
    std::fs::read_to_string(format!("/sys/class/net/{name}/mtu")).ok()?.trim().parse().ok()
}

/// Whether the socket family of `ip` is IPv6.
pub fn is_v6(ip: IpAddr) -> bool {
    matches!(ip, IpAddr::V6(_))
}
