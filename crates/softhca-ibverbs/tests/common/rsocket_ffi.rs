//! The drop-in's rsocket C ABI (`softhca_rs_*`, what `librdmacm.so.1`'s `r*` functions forward
//! to), declared once for the test binaries that call it in process.
#![allow(dead_code)]

use std::ffi::{c_int, c_void};

// The library whose exported functions the declarations below name.
use softhca_ibverbs as _;

extern "C" {
    pub fn softhca_rs_socket(domain: c_int, ty: c_int, protocol: c_int) -> c_int;
    pub fn softhca_rs_bind(fd: c_int, addr: *const libc::sockaddr, len: libc::socklen_t) -> c_int;
    pub fn softhca_rs_listen(fd: c_int, backlog: c_int) -> c_int;
    pub fn softhca_rs_accept(fd: c_int, addr: *mut libc::sockaddr, len: *mut libc::socklen_t) -> c_int;
    pub fn softhca_rs_connect(fd: c_int, addr: *const libc::sockaddr, len: libc::socklen_t) -> c_int;
    pub fn softhca_rs_send(fd: c_int, buf: *const c_void, len: usize, flags: c_int) -> isize;
    pub fn softhca_rs_sendv(fd: c_int, iov: *const libc::iovec, n: c_int, flags: c_int) -> isize;
    pub fn softhca_rs_recv(fd: c_int, buf: *mut c_void, len: usize, flags: c_int) -> isize;
    pub fn softhca_rs_recvmsg(fd: c_int, m: *mut libc::msghdr, flags: c_int) -> isize;
    pub fn softhca_rs_poll(fds: *mut libc::pollfd, nfds: libc::nfds_t, timeout: c_int) -> c_int;
    pub fn softhca_rs_select(
        nfds: c_int,
        read: *mut libc::fd_set,
        write: *mut libc::fd_set,
        except: *mut libc::fd_set,
        timeout: *mut libc::timeval,
    ) -> c_int;
    pub fn softhca_rs_shutdown(fd: c_int, how: c_int) -> c_int;
    pub fn softhca_rs_close(fd: c_int) -> c_int;
    pub fn softhca_rs_getpeername(fd: c_int, addr: *mut libc::sockaddr, len: *mut libc::socklen_t) -> c_int;
    pub fn softhca_rs_setsockopt(
        fd: c_int,
        level: c_int,
        name: c_int,
        val: *const c_void,
        len: libc::socklen_t,
    ) -> c_int;
    pub fn softhca_rs_getsockopt(
        fd: c_int,
        level: c_int,
        name: c_int,
        val: *mut c_void,
        len: *mut libc::socklen_t,
    ) -> c_int;
    pub fn softhca_rs_fcntl(fd: c_int, cmd: c_int, arg: c_int) -> c_int;
    pub fn softhca_rs_iomap(fd: c_int, buf: *mut c_void, len: usize, prot: c_int, flags: c_int, offset: i64) -> i64;
    pub fn softhca_rs_iounmap(fd: c_int, buf: *mut c_void, len: usize) -> c_int;
    pub fn softhca_rs_iowrite(fd: c_int, buf: *const c_void, count: usize, offset: i64, flags: c_int) -> usize;
}

/// An IPv4 socket address of 127.0.0.1 (the in-process device's) and `port`.
pub fn localhost(port: u16) -> libc::sockaddr_in {
    // SAFETY: an all-zero sockaddr_in is valid.
    let mut a: libc::sockaddr_in = unsafe { std::mem::zeroed() };
    a.sin_family = libc::AF_INET as libc::sa_family_t;
    a.sin_port = port.to_be();
    a.sin_addr.s_addr = u32::from(std::net::Ipv4Addr::LOCALHOST).to_be();
    a
}
