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
//! The rsocket API (`rsocket`, `rsend`, …: sockets emulated over RDMA) is exported, as
//! programs link against it, and every call fails with ENOSYS: it is not built.

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

/// -1 with errno ENOSYS: the rsocket API is not built.
fn no_rsockets() -> c_int {
    // SAFETY: the calling thread's errno slot.
    unsafe { *libc::__errno_location() = libc::ENOSYS };
    -1
}

/// Defines rsocket functions that fail with ENOSYS (their arguments as `<rdma/rsocket.h>`
/// declares them, unread).
macro_rules! unsupported {
    ($($name:ident($($ty:ty),*) -> $ret:ty;)*) => {
        $(
            #[no_mangle]
            pub extern "C" fn $name($(_: $ty),*) -> $ret {
                no_rsockets() as $ret
            }
        )*
    };
}

unsupported! {
    rsocket(c_int, c_int, c_int) -> c_int;
    rbind(c_int, Ptr, u32) -> c_int;
    rlisten(c_int, c_int) -> c_int;
    raccept(c_int, Ptr, Ptr) -> c_int;
    rconnect(c_int, Ptr, u32) -> c_int;
    rshutdown(c_int, c_int) -> c_int;
    rclose(c_int) -> c_int;
    rrecv(c_int, Ptr, usize, c_int) -> isize;
    rrecvfrom(c_int, Ptr, usize, c_int, Ptr, Ptr) -> isize;
    rrecvmsg(c_int, Ptr, c_int) -> isize;
    rsend(c_int, Ptr, usize, c_int) -> isize;
    rsendto(c_int, Ptr, usize, c_int, Ptr, u32) -> isize;
    rsendmsg(c_int, Ptr, c_int) -> isize;
    rread(c_int, Ptr, usize) -> isize;
    rreadv(c_int, Ptr, c_int) -> isize;
    rwrite(c_int, Ptr, usize) -> isize;
    rwritev(c_int, Ptr, c_int) -> isize;
    rpoll(Ptr, u64, c_int) -> c_int;
    rselect(c_int, Ptr, Ptr, Ptr, Ptr) -> c_int;
    rgetpeername(c_int, Ptr, Ptr) -> c_int;
    rgetsockname(c_int, Ptr, Ptr) -> c_int;
    rsetsockopt(c_int, c_int, c_int, Ptr, u32) -> c_int;
    rgetsockopt(c_int, c_int, c_int, Ptr, Ptr) -> c_int;
    // Variadic in C (`int rfcntl(int socket, int cmd, ... )`): the extra argument is unread.
    rfcntl(c_int, c_int) -> c_int;
    riomap(c_int, Ptr, usize, c_int, c_int, i64) -> i64;
    riounmap(c_int, Ptr, usize) -> c_int;
    riowrite(c_int, Ptr, usize, i64, c_int) -> usize;
}
