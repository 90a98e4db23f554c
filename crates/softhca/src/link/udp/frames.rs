//! Raw Ethertype frames for the UDP link: an AF_PACKET socket on the interface that holds the
//! device's address (privileged: CAP_NET_RAW; without it the device has no Raw Ethertype QPs
//! and Create QP says so).
//!
//! The socket is opened at device open but hears nothing until the device has a Raw Ethertype
//! QP: an `ETH_P_ALL` packet socket makes the kernel clone every packet of the interface for
//! it, RoCE datagrams included, so it is bound to protocol 0 (no packets) while idle and to
//! `ETH_P_ALL` with a filter that keeps only non-IP frames (not IPv4, IPv6 or ARP, which belong
//! to the host's stack) while raw QPs exist ([`FramePort::listen`]).
//!
//! The device's MAC is the interface's. Loopback has none (all zero) and no MAC filter, and
//! every socket on it sees every frame, its sender's included; there the device takes a MAC
//! of its own, `02:00` and its IPv4 address, and the link does the filtering a NIC would:
//! a frame is taken when it is addressed to that MAC or to a group (broadcast, multicast),
//! and not when it comes from that MAC (it is the device's own, looped back).

use std::io;
use std::net::IpAddr;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

use super::sys;

const ETH_P_ALL: u16 = 0x0003;
const ETH_HEADER: usize = 14;

/// A device's AF_PACKET socket and what it needs to know of its interface.
pub(super) struct FramePort {
    fd: OwnedFd,
    ifindex: i32,
    mac: [u8; 6],
    /// Loopback: the link filters by MAC itself (see the module docs).
    loopback: bool,
    listening: bool,
}

impl FramePort {
    /// Opens the socket on the interface of `addr` (loopback for any 127/8 or ::1 address),
    /// bound to no protocol yet.
    pub(super) fn open(addr: IpAddr) -> io::Result<FramePort> {
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
        // SAFETY: socket takes no pointers; a non-negative result is a new fd that we own.
        let fd = unsafe { libc::socket(libc::AF_PACKET, libc::SOCK_RAW | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC, 0) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `fd` was just returned by socket and nothing else owns it.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
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
        let port = FramePort { fd, ifindex, mac, loopback, listening: true };
        port.bind(0)?;
        Ok(FramePort { listening: false, ..port })
    }

    pub(super) fn mac(&self) -> [u8; 6] {
        self.mac
    }

    pub(super) fn fd(&self) -> std::os::fd::RawFd {
        self.fd.as_raw_fd()
    }

    pub(super) fn listening(&self) -> bool {
        self.listening
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

    /// Starts (or stops) hearing the interface's non-IP frames.
    pub(super) fn listen(&mut self, on: bool) -> io::Result<()> {
        if on == self.listening {
            return Ok(());
        }
        if on {
            // ldh [12]; jeq IPv4 -> drop; jeq IPv6 -> drop; jeq ARP -> drop; ret all; drop: ret 0
            let prog = [
                libc::sock_filter { code: 0x28, jt: 0, jf: 0, k: 12 },
                libc::sock_filter { code: 0x15, jt: 3, jf: 0, k: 0x0800 },
                libc::sock_filter { code: 0x15, jt: 2, jf: 0, k: 0x86DD },
                libc::sock_filter { code: 0x15, jt: 1, jf: 0, k: 0x0806 },
                libc::sock_filter { code: 0x06, jt: 0, jf: 0, k: 0x40000 },
                libc::sock_filter { code: 0x06, jt: 0, jf: 0, k: 0 },
            ];
            sys::attach_filter(self.fd.as_raw_fd(), &prog)?;
            self.bind(ETH_P_ALL)?;
        } else {
            self.bind(0)?;
            // What was queued before the unbind is not for anyone now.
            let mut scrap = [0u8; 64];
            while self.recv(&mut scrap).is_some() {}
        }
        self.listening = on;
        Ok(())
    }

    /// Sends one frame (destination MAC on) out of the interface.
    pub(super) fn send(&self, frame: &[u8]) -> io::Result<()> {
        // SAFETY: `frame` is alive and readable for its length for the call.
        let r = unsafe { libc::send(self.fd.as_raw_fd(), frame.as_ptr().cast(), frame.len(), libc::MSG_DONTWAIT) };
        if r < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    /// The next frame for the device, into `buf`: its length, or `None` when none is queued.
    /// Frames the device sent (the outgoing copies, and on loopback the looped-back ones) and,
    /// on loopback, frames for another station are skipped. A frame longer than `buf` comes
    /// truncated and is skipped too.
    pub(super) fn recv(&self, buf: &mut [u8]) -> Option<usize> {
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
            if self.loopback {
                let (dst, src) = (&buf[..6], &buf[6..12]);
                let for_us = dst == self.mac || dst[0] & 1 == 1;
                if !for_us || src == self.mac {
                    continue;
                }
            }
            return Some(n);
        }
    }
}
