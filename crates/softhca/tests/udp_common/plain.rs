//! A plain UDP socket as a test's peer on the wire: the IP header fields the kernel reports
//! with each datagram it receives (the UDP link's headers are the kernel's to write), once
//! `softhca::link::udp::sys::report_ip_fields` asked it to.

use std::net::UdpSocket;
use std::os::fd::AsRawFd;

/// A datagram's length and the header fields reported with it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Received {
    pub len: usize,
    pub tos: Option<u8>,
    pub ttl: Option<u8>,
}

/// Receives one datagram on `s`; `None` after the socket's read timeout.
pub fn recv(s: &UdpSocket) -> Option<Received> {
    let mut data = vec![0u8; 9000];
    let mut ctrl = [0u64; 8];
    let mut iov = libc::iovec { iov_base: data.as_mut_ptr().cast(), iov_len: data.len() };
    // SAFETY: msghdr is plain old data; every pointer set below is to a live local buffer of
    // the length given, which the kernel fills for the call only.
    let mut h: libc::msghdr = unsafe { std::mem::zeroed() };
    h.msg_iov = &mut iov;
    h.msg_iovlen = 1;
    h.msg_control = ctrl.as_mut_ptr().cast();
    h.msg_controllen = std::mem::size_of_val(&ctrl) as _;
    // SAFETY: as above.
    let n = unsafe { libc::recvmsg(s.as_raw_fd(), &mut h, 0) };
    if n < 0 {
        return None;
    }
    let mut got = Received { len: n as usize, tos: None, ttl: None };
    // SAFETY: the CMSG_* macros walk the control area the kernel filled, bounded by
    // msg_controllen; IP_TOS carries a byte, IP_TTL an int.
    unsafe {
        let mut c = libc::CMSG_FIRSTHDR(&h);
        while !c.is_null() {
            match ((*c).cmsg_level, (*c).cmsg_type) {
                (libc::IPPROTO_IP, libc::IP_TOS) => got.tos = Some(*libc::CMSG_DATA(c)),
                (libc::IPPROTO_IP, libc::IP_TTL) => {
                    got.ttl = u8::try_from(std::ptr::read_unaligned(libc::CMSG_DATA(c).cast::<libc::c_int>())).ok()
                }
                _ => {}
            }
            c = libc::CMSG_NXTHDR(&h, c);
        }
    }
    Some(got)
}
