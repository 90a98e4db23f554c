//! The drop-in `librdmacm.so.1`: librdmacm 44's export table, each `rdma_*` function
//! forwarded to its `softhca_rdma_*` counterpart in softhca's `libibverbs.so.1`.
//!
//! Why forwarding: librdmacm's ids hold the device's objects (`verbs`, `qp`, `pd`, CQs), and
//! its connection manager runs on the device's QP1, so it must live with the device, in the
//! one engine of the process. A second copy of softhca in this library would be a second
//! device. So this library holds no state and no logic: the functions' C signatures (as
//! `<rdma/rdma_cma.h>` declares them, with opaque pointers) and a call through the dynamic
//! linker (`SOFTHCA_RDMACM_PRIVATE` in `libibverbs.so.1`). See `softhca-ibverbs`'s `rdmacm`
//! module for what the calls do.
//!
//! The rsocket API (`rsocket`, `rsend`, `riomap`, …: sockets over RDMA) likewise forwards to
//! `softhca_rs_*`, built on the same CM and device.

#![allow(clippy::missing_safety_doc)]

use std::ffi::{c_char, c_int, c_void};

type Ptr = *mut c_void;

/// Declares each forwarded function and its target, and defines the exported wrapper: a
/// plain call with the same arguments (the compiler makes it a tail jump).
macro_rules! forward {
    ($($name:ident => $target:ident($($arg:ident: $ty:ty),*) -> $ret:ty;)*) => {
        extern "C" {
            $(fn $target($($arg: $ty),*) -> $ret;)*
        }
        $(
            #[no_mangle]
            pub unsafe extern "C" fn $name($($arg: $ty),*) -> $ret {
                // SAFETY: the same contract as librdmacm's function; the target checks what
                // librdmacm checks.
                unsafe { $target($($arg),*) }
            }
        )*
    };
}

forward! {
    rdma_create_event_channel => softhca_rdma_create_event_channel() -> Ptr;
    rdma_destroy_event_channel => softhca_rdma_destroy_event_channel(channel: Ptr) -> ();
    rdma_create_id => softhca_rdma_create_id(channel: Ptr, id: *mut Ptr, context: Ptr, ps: c_int) -> c_int;
    rdma_destroy_id => softhca_rdma_destroy_id(id: Ptr) -> c_int;
    rdma_bind_addr => softhca_rdma_bind_addr(id: Ptr, addr: Ptr) -> c_int;
    rdma_resolve_addr => softhca_rdma_resolve_addr(id: Ptr, src: Ptr, dst: Ptr, timeout_ms: c_int) -> c_int;
    rdma_resolve_route => softhca_rdma_resolve_route(id: Ptr, timeout_ms: c_int) -> c_int;
    rdma_create_qp => softhca_rdma_create_qp(id: Ptr, pd: Ptr, attr: Ptr) -> c_int;
    rdma_create_qp_ex => softhca_rdma_create_qp_ex(id: Ptr, attr: Ptr) -> c_int;
    rdma_destroy_qp => softhca_rdma_destroy_qp(id: Ptr) -> ();
    rdma_connect => softhca_rdma_connect(id: Ptr, param: Ptr) -> c_int;
    rdma_establish => softhca_rdma_establish(id: Ptr) -> c_int;
    rdma_listen => softhca_rdma_listen(id: Ptr, backlog: c_int) -> c_int;
    rdma_get_request => softhca_rdma_get_request(listen: Ptr, id: *mut Ptr) -> c_int;
    rdma_accept => softhca_rdma_accept(id: Ptr, param: Ptr) -> c_int;
    rdma_reject => softhca_rdma_reject(id: Ptr, data: *const c_void, len: u8) -> c_int;
    rdma_reject_ece => softhca_rdma_reject_ece(id: Ptr, data: *const c_void, len: u8) -> c_int;
    rdma_notify => softhca_rdma_notify(id: Ptr, event: c_int) -> c_int;
    rdma_disconnect => softhca_rdma_disconnect(id: Ptr) -> c_int;
    rdma_init_qp_attr => softhca_rdma_init_qp_attr(id: Ptr, attr: Ptr, mask: *mut c_int) -> c_int;
    rdma_get_cm_event => softhca_rdma_get_cm_event(channel: Ptr, event: *mut Ptr) -> c_int;
    rdma_ack_cm_event => softhca_rdma_ack_cm_event(event: Ptr) -> c_int;
    rdma_event_str => softhca_rdma_event_str(event: c_int) -> *const c_char;
    rdma_create_srq => softhca_rdma_create_srq(id: Ptr, pd: Ptr, attr: Ptr) -> c_int;
    rdma_create_srq_ex => softhca_rdma_create_srq_ex(id: Ptr, attr: Ptr) -> c_int;
    rdma_destroy_srq => softhca_rdma_destroy_srq(id: Ptr) -> ();
    rdma_create_ep => softhca_rdma_create_ep(id: *mut Ptr, res: Ptr, pd: Ptr, qp_init: Ptr) -> c_int;
    rdma_destroy_ep => softhca_rdma_destroy_ep(id: Ptr) -> ();
    rdma_migrate_id => softhca_rdma_migrate_id(id: Ptr, channel: Ptr) -> c_int;
    rdma_set_option => softhca_rdma_set_option(id: Ptr, level: c_int, optname: c_int, optval: Ptr, optlen: usize) -> c_int;
    rdma_get_src_port => softhca_rdma_get_src_port(id: Ptr) -> u16;
    rdma_get_dst_port => softhca_rdma_get_dst_port(id: Ptr) -> u16;
    rdma_get_devices => softhca_rdma_get_devices(num: *mut c_int) -> *mut Ptr;
    rdma_free_devices => softhca_rdma_free_devices(list: *mut Ptr) -> ();
    rdma_join_multicast => softhca_rdma_join_multicast(id: Ptr, addr: Ptr, context: Ptr) -> c_int;
    rdma_join_multicast_ex => softhca_rdma_join_multicast_ex(id: Ptr, attr: Ptr, context: Ptr) -> c_int;
    rdma_leave_multicast => softhca_rdma_leave_multicast(id: Ptr, addr: Ptr) -> c_int;
    rdma_set_local_ece => softhca_rdma_set_local_ece(id: Ptr, ece: Ptr) -> c_int;
    rdma_get_remote_ece => softhca_rdma_get_remote_ece(id: Ptr, ece: Ptr) -> c_int;
    rdma_getaddrinfo => softhca_rdma_getaddrinfo(node: *const c_char, service: *const c_char, hints: Ptr, res: *mut Ptr) -> c_int;
    rdma_freeaddrinfo => softhca_rdma_freeaddrinfo(res: Ptr) -> ();
}

forward! {
    rsocket => softhca_rs_socket(domain: c_int, ty: c_int, protocol: c_int) -> c_int;
    rbind => softhca_rs_bind(socket: c_int, addr: Ptr, len: u32) -> c_int;
    rlisten => softhca_rs_listen(socket: c_int, backlog: c_int) -> c_int;
    raccept => softhca_rs_accept(socket: c_int, addr: Ptr, len: Ptr) -> c_int;
    rconnect => softhca_rs_connect(socket: c_int, addr: Ptr, len: u32) -> c_int;
    rshutdown => softhca_rs_shutdown(socket: c_int, how: c_int) -> c_int;
    rclose => softhca_rs_close(socket: c_int) -> c_int;
    rrecv => softhca_rs_recv(socket: c_int, buf: Ptr, len: usize, flags: c_int) -> isize;
    rrecvfrom => softhca_rs_recvfrom(socket: c_int, buf: Ptr, len: usize, flags: c_int, src: Ptr, src_len: Ptr) -> isize;
    rrecvmsg => softhca_rs_recvmsg(socket: c_int, msg: Ptr, flags: c_int) -> isize;
    rsend => softhca_rs_send(socket: c_int, buf: Ptr, len: usize, flags: c_int) -> isize;
    rsendto => softhca_rs_sendto(socket: c_int, buf: Ptr, len: usize, flags: c_int, dst: Ptr, dst_len: u32) -> isize;
    rsendmsg => softhca_rs_sendmsg(socket: c_int, msg: Ptr, flags: c_int) -> isize;
    rpoll => softhca_rs_poll(fds: Ptr, nfds: u64, timeout: c_int) -> c_int;
    rselect => softhca_rs_select(nfds: c_int, read: Ptr, write: Ptr, except: Ptr, timeout: Ptr) -> c_int;
    rgetpeername => softhca_rs_getpeername(socket: c_int, addr: Ptr, len: Ptr) -> c_int;
    rgetsockname => softhca_rs_getsockname(socket: c_int, addr: Ptr, len: Ptr) -> c_int;
    rsetsockopt => softhca_rs_setsockopt(socket: c_int, level: c_int, name: c_int, val: Ptr, len: u32) -> c_int;
    rgetsockopt => softhca_rs_getsockopt(socket: c_int, level: c_int, name: c_int, val: Ptr, len: Ptr) -> c_int;
    // Variadic in C (`int rfcntl(int socket, int cmd, ... )`): an int third argument, where
    // there is one, is passed where a third int parameter is (see `softhca_rs_fcntl`).
    rfcntl => softhca_rs_fcntl(socket: c_int, cmd: c_int, arg: c_int) -> c_int;
}

extern "C" {
    fn softhca_rs_recvv(socket: c_int, iov: Ptr, n: c_int, flags: c_int) -> isize;
    fn softhca_rs_sendv(socket: c_int, iov: Ptr, n: c_int, flags: c_int) -> isize;
}

/// `rread` is `rrecv` without flags, as in librdmacm.
#[no_mangle]
pub unsafe extern "C" fn rread(socket: c_int, buf: Ptr, count: usize) -> isize {
    // SAFETY: the same contract as rrecv's.
    unsafe { softhca_rs_recv(socket, buf, count, 0) }
}

/// `rreadv` fills the first iovec only, as librdmacm's does.
#[no_mangle]
pub unsafe extern "C" fn rreadv(socket: c_int, iov: Ptr, n: c_int) -> isize {
    // SAFETY: the same contract as librdmacm's.
    unsafe { softhca_rs_recvv(socket, iov, n, 0) }
}

#[no_mangle]
pub unsafe extern "C" fn rwrite(socket: c_int, buf: Ptr, count: usize) -> isize {
    // SAFETY: the same contract as rsend's.
    unsafe { softhca_rs_send(socket, buf, count, 0) }
}

#[no_mangle]
pub unsafe extern "C" fn rwritev(socket: c_int, iov: Ptr, n: c_int) -> isize {
    // SAFETY: the same contract as librdmacm's.
    unsafe { softhca_rs_sendv(socket, iov, n, 0) }
}

extern "C" {
    fn softhca_rs_iomap(socket: c_int, buf: Ptr, len: usize, prot: c_int, flags: c_int, offset: i64) -> i64;
    fn softhca_rs_iounmap(socket: c_int, buf: Ptr, len: usize) -> c_int;
    fn softhca_rs_iowrite(socket: c_int, buf: Ptr, count: usize, offset: i64, flags: c_int) -> usize;
}

#[no_mangle]
pub unsafe extern "C" fn riomap(socket: c_int, buf: Ptr, len: usize, prot: c_int, flags: c_int, offset: i64) -> i64 {
    // SAFETY: the same contract as librdmacm's.
    unsafe { softhca_rs_iomap(socket, buf, len, prot, flags, offset) }
}

#[no_mangle]
pub unsafe extern "C" fn riounmap(socket: c_int, buf: Ptr, len: usize) -> c_int {
    // SAFETY: the same contract as librdmacm's.
    unsafe { softhca_rs_iounmap(socket, buf, len) }
}

/// Returns a `size_t`: librdmacm's failures are (size_t) -1 too.
#[no_mangle]
pub unsafe extern "C" fn riowrite(socket: c_int, buf: Ptr, count: usize, offset: i64, flags: c_int) -> usize {
    // SAFETY: the same contract as librdmacm's.
    unsafe { softhca_rs_iowrite(socket, buf, count, offset, flags) }
}
