//! Raw packets for the UDP link: Raw Ethertype QPs' Ethernet frames and Raw IPv6 QPs' IPv6
//! datagrams, through AF_PACKET sockets on the interface that holds the device's address
//! (privileged: CAP_NET_RAW; without it the device has no Raw QPs and Create QP says so).
//!
//! A [`PacketPort`] is opened at device open but hears nothing until the device has a Raw QP of
//! its kind: a packet socket bound to a protocol makes the kernel clone every packet of that
//! protocol on the interface for it, RoCE datagrams included, so it is bound to protocol 0 (no
//! packets) while idle and, while such QPs exist ([`PacketPort::listen`], called by Create and
//! Destroy QP through the device's raw listener hook, so that a QP hears from the moment it
//! exists and not from the link's next turn), to
//! - frames: every protocol, with a filter that keeps only non-IP frames (not IPv4, IPv6 or
//!   ARP, which belong to the host's stack);
//! - IPv6: IPv6, with a filter that keeps datagrams to the device's address that are not RoCE
//!   (not UDP to port 4791). They are sent through a raw IPv6 socket (header included), so
//!   the kernel routes them and finds the next hop's MAC. Only a device with an IPv6 address
//!   has them: an IPv4 device's GID is IPv4-mapped, which no IPv6 datagram is addressed to.
//!
//! The device's MAC is the interface's. Loopback has none (all zero) and no MAC filter, and
//! every socket on it sees every frame, its sender's included; there the device takes a MAC
//! of its own, `02:00` and the last four bytes of its address, and the link does the filtering
//! a NIC would: a frame is taken when it is addressed to that MAC or to a group (broadcast,
//! multicast), and not when it comes from that MAC (it is the device's own, looped back).

use std::io;
use std::net::{IpAddr, Ipv6Addr};
use std::ops::Range;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, Ordering};

use super::sys::{self, bpf};
use crate::wire::roce::ROCE_V2_PORT;

const ETH_P_ALL: u16 = 0x0003;
const ETH_P_IPV6: u16 = 0x86DD;
const ETH_HEADER: usize = 14;

/// What a [`PacketPort`] carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Kind {
    /// Raw Ethertype QPs' frames, destination MAC on.
    Frames,
    /// Raw IPv6 QPs' datagrams to (and from) the device's IPv6 address.
    Ipv6(Ipv6Addr),
}

/// A device's packet socket (and, for IPv6, its raw IPv6 sending socket) and what it needs to
/// know of its interface.
pub(super) struct PacketPort {
    kind: Kind,
    fd: OwnedFd,
    /// IPv6: a raw IPv6 socket (`IPPROTO_RAW`: the datagram's own header goes out).
    sender: Option<OwnedFd>,
    ifindex: i32,
    mac: [u8; 6],
    /// Loopback: the link filters frames by MAC itself (see the module docs).
    loopback: bool,
    /// Set by [`PacketPort::listen`] on the thread of Create or Destroy QP; read by the
    /// link's turns.
    listening: AtomicBool,
}

fn socket(domain: libc::c_int, ty: libc::c_int, protocol: libc::c_int) -> io::Result<OwnedFd> {
    sys::socket(domain, ty | libc::SOCK_NONBLOCK, protocol)
}

/// `ldh [12]; jeq IPv4 / IPv6 / ARP -> drop; accept`.
const FRAMES_FILTER: [libc::sock_filter; 6] = [
    bpf(0x28, 0, 0, 12),
    bpf(0x15, 3, 0, 0x0800),
    bpf(0x15, 2, 0, 0x86DD),
    bpf(0x15, 1, 0, 0x0806),
    bpf(0x06, 0, 0, 0x40000),
    bpf(0x06, 0, 0, 0),
];

/// IPv6 to `addr` (its four words at bytes 38..54 of the frame) and not UDP to port 4791.
fn ipv6_filter(addr: Ipv6Addr) -> [libc::sock_filter; 16] {
    let o = addr.octets();
    let w = |i: usize| u32::from_be_bytes([o[4 * i], o[4 * i + 1], o[4 * i + 2], o[4 * i + 3]]);
    [
        bpf(0x28, 0, 0, 12),                      // 0 ldh [12]: EtherType
        bpf(0x15, 0, 13, u32::from(ETH_P_IPV6)),  // 1 not IPv6 -> drop
        bpf(0x20, 0, 0, 38),                      // 2 ld destination word 0
        bpf(0x15, 0, 11, w(0)),                   // 3
        bpf(0x20, 0, 0, 42),                      // 4 word 1
        bpf(0x15, 0, 9, w(1)),                    // 5
        bpf(0x20, 0, 0, 46),                      // 6 word 2
        bpf(0x15, 0, 7, w(2)),                    // 7
        bpf(0x20, 0, 0, 50),                      // 8 word 3
        bpf(0x15, 0, 5, w(3)),                    // 9
        bpf(0x30, 0, 0, 20),                      // 10 ldb [20]: next header
        bpf(0x15, 0, 2, 17),                      // 11 not UDP -> accept
        bpf(0x28, 0, 0, 56),                      // 12 ldh [56]: UDP destination port
        bpf(0x15, 1, 0, u32::from(ROCE_V2_PORT)), // 13 RoCE -> drop, else accept
        bpf(0x06, 0, 0, 0x40000),                 // 14 accept
        bpf(0x06, 0, 0, 0),                       // 15 drop
    ]
}

impl PacketPort {
    /// Opens the socket(s) on the interface of `addr` (loopback for a loopback address),
    /// bound to no protocol yet.
    pub(super) fn open(addr: IpAddr, kind: Kind) -> io::Result<PacketPort> {
        let name = match sys::interface_name(addr) {
            Some(n) => n,
            None if addr.is_loopback() => "lo".to_string(),
            None => return Err(io::Error::new(io::ErrorKind::NotFound, format!("no interface holds {addr}"))),
        };
        let cname = std::ffi::CString::new(name.clone()).map_err(io::Error::other)?;
        // SAFETY: a NUL-terminated string alive for the call.
        let ifindex = unsafe { libc::if_nametoindex(cname.as_ptr()) } as i32;
        if ifindex == 0 {
            return Err(io::Error::last_os_error());
        }
        let fd = socket(libc::AF_PACKET, libc::SOCK_RAW, 0)?;
        let sender = match kind {
            Kind::Frames => None,
            Kind::Ipv6(_) => Some(socket(libc::AF_INET6, libc::SOCK_RAW, libc::IPPROTO_RAW)?),
        };
        let hw = std::fs::read_to_string(format!("/sys/class/net/{name}/address")).unwrap_or_default();
        let mut mac = [0u8; 6];
        for (m, part) in mac.iter_mut().zip(hw.trim().split(':')) {
            *m = u8::from_str_radix(part, 16).unwrap_or(0);
        }
        let loopback = mac == [0; 6];
        if loopback {
            let tail = match addr {
                IpAddr::V4(a) => a.octets(),
                IpAddr::V6(a) => {
                    let o = a.octets();
                    [o[12], o[13], o[14], o[15]]
                }
            };
            mac = [0x02, 0x00, tail[0], tail[1], tail[2], tail[3]];
        }
        let port = PacketPort { kind, fd, sender, ifindex, mac, loopback, listening: AtomicBool::new(false) };
        port.bind(0)?;
        Ok(port)
    }

    pub(super) fn mac(&self) -> [u8; 6] {
        self.mac
    }

    pub(super) fn fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }

    pub(super) fn listening(&self) -> bool {
        self.listening.load(Ordering::Acquire)
    }

    fn bind(&self, protocol: u16) -> io::Result<()> {
        // SAFETY: sockaddr_ll is plain old data; all-zero is valid.
        let mut sll: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
        sll.sll_family = libc::AF_PACKET as u16;
        sll.sll_protocol = protocol.to_be();
        sll.sll_ifindex = self.ifindex;
        // SAFETY: `sll` is a sockaddr_ll of the size passed, alive for the call.
        let r = unsafe {
            libc::bind(
                self.fd.as_raw_fd(),
                (&sll as *const libc::sockaddr_ll).cast(),
                std::mem::size_of::<libc::sockaddr_ll>() as libc::socklen_t,
            )
        };
        if r < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    /// Starts (or stops) hearing the interface's packets of this port's kind. Called one at a
    /// time (the device calls its raw listener hook under its Raw QP list's lock); the link's
    /// turns may receive meanwhile.
    pub(super) fn listen(&self, on: bool) -> io::Result<()> {
        if on == self.listening() {
            return Ok(());
        }
        if on {
            let protocol = match self.kind {
                Kind::Frames => {
                    sys::attach_filter(self.fd.as_raw_fd(), &FRAMES_FILTER)?;
                    ETH_P_ALL
                }
                Kind::Ipv6(addr) => {
                    sys::attach_filter(self.fd.as_raw_fd(), &ipv6_filter(addr))?;
                    ETH_P_IPV6
                }
            };
            self.bind(protocol)?;
        } else {
            self.bind(0)?;
            // What was queued before the unbind is not for anyone now.
            let mut scrap = [0u8; 64];
            while self.recv(&mut scrap).is_some() {}
        }
        self.listening.store(on, Ordering::Release);
        Ok(())
    }

    /// Sends one packet: a frame (destination MAC on) out of the interface, or an IPv6
    /// datagram (header on) through the kernel's routing.
    pub(super) fn send(&self, packet: &[u8]) -> io::Result<()> {
        let r = match (&self.sender, self.kind) {
            (Some(sender), Kind::Ipv6(_)) => {
                let dst = crate::wire::roce::raw_ipv6_dst(packet)
                    .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "not a raw IPv6 datagram"))?;
                // SAFETY: sockaddr_in6 is plain old data; all-zero is valid.
                let mut sin6: libc::sockaddr_in6 = unsafe { std::mem::zeroed() };
                sin6.sin6_family = libc::AF_INET6 as u16;
                sin6.sin6_addr.s6_addr = dst.octets();
                // SAFETY: `packet` is readable for its length and `sin6` is a sockaddr_in6 of
                // the size passed, both alive for the call.
                unsafe {
                    libc::sendto(
                        sender.as_raw_fd(),
                        packet.as_ptr().cast(),
                        packet.len(),
                        libc::MSG_DONTWAIT,
                        (&sin6 as *const libc::sockaddr_in6).cast(),
                        std::mem::size_of::<libc::sockaddr_in6>() as libc::socklen_t,
                    )
                }
            }
            // SAFETY: `packet` is alive and readable for its length for the call.
            _ => unsafe { libc::send(self.fd.as_raw_fd(), packet.as_ptr().cast(), packet.len(), libc::MSG_DONTWAIT) },
        };
        if r < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    /// The next packet for the device, into `buf`: where it lies in `buf` (a frame whole; an
    /// IPv6 datagram without its Ethernet header), or `None` when none is queued. Packets the
    /// device sent (the outgoing copies, and on loopback the looped-back frames) and, on
    /// loopback, frames for another station are skipped; so is one longer than `buf`.
    pub(super) fn recv(&self, buf: &mut [u8]) -> Option<Range<usize>> {
        loop {
            // SAFETY: sockaddr_ll is plain old data; all-zero is valid.
            let mut sll: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
            let mut len = std::mem::size_of::<libc::sockaddr_ll>() as libc::socklen_t;
            // SAFETY: `buf` is writable for its length and `sll` for `len` bytes, for the call.
            let n = unsafe {
                libc::recvfrom(
                    self.fd.as_raw_fd(),
                    buf.as_mut_ptr().cast(),
                    buf.len(),
                    libc::MSG_DONTWAIT | libc::MSG_TRUNC,
                    (&mut sll as *mut libc::sockaddr_ll).cast(),
                    &mut len,
                )
            };
            if n < 0 {
                return None;
            }
            let n = n as usize;
            if n > buf.len() || n < ETH_HEADER || sll.sll_pkttype == libc::PACKET_OUTGOING {
                continue;
            }
            match self.kind {
                Kind::Ipv6(_) => return Some(ETH_HEADER..n),
                Kind::Frames if self.loopback => {
                    let (dst, src) = (&buf[..6], &buf[6..12]);
                    if (dst == self.mac || dst[0] & 1 == 1) && src != self.mac {
                        return Some(0..n);
                    }
                }
                Kind::Frames => return Some(0..n),
            }
        }
    }
}
