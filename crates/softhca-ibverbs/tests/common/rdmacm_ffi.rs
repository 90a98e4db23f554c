//! The drop-in's rdma_cm C ABI (`softhca_rdma_*`, what `librdmacm.so.1` forwards to), declared
//! once for the test binaries that call it in process.
#![allow(dead_code)]

use std::ffi::{c_char, c_int, c_void};

use softhca_ibverbs::abi::*;
use softhca_ibverbs::rdmacm::abi::*;

extern "C" {
    pub fn softhca_rdma_create_event_channel() -> *mut rdma_event_channel;
    pub fn softhca_rdma_destroy_event_channel(channel: *mut rdma_event_channel);
    pub fn softhca_rdma_create_id(
        ch: *mut rdma_event_channel,
        id: *mut *mut rdma_cm_id,
        ctx: *mut c_void,
        ps: c_int,
    ) -> c_int;
    pub fn softhca_rdma_destroy_id(id: *mut rdma_cm_id) -> c_int;
    pub fn softhca_rdma_bind_addr(id: *mut rdma_cm_id, addr: *mut libc::sockaddr) -> c_int;
    pub fn softhca_rdma_resolve_addr(
        id: *mut rdma_cm_id,
        src: *mut libc::sockaddr,
        dst: *mut libc::sockaddr,
        ms: c_int,
    ) -> c_int;
    pub fn softhca_rdma_resolve_route(id: *mut rdma_cm_id, ms: c_int) -> c_int;
    pub fn softhca_rdma_listen(id: *mut rdma_cm_id, backlog: c_int) -> c_int;
    pub fn softhca_rdma_connect(id: *mut rdma_cm_id, p: *mut rdma_conn_param) -> c_int;
    pub fn softhca_rdma_accept(id: *mut rdma_cm_id, p: *mut rdma_conn_param) -> c_int;
    pub fn softhca_rdma_reject(id: *mut rdma_cm_id, data: *const c_void, len: u8) -> c_int;
    pub fn softhca_rdma_disconnect(id: *mut rdma_cm_id) -> c_int;
    pub fn softhca_rdma_establish(id: *mut rdma_cm_id) -> c_int;
    pub fn softhca_rdma_notify(id: *mut rdma_cm_id, event: c_int) -> c_int;
    pub fn softhca_rdma_init_qp_attr(id: *mut rdma_cm_id, attr: *mut ibv_qp_attr, mask: *mut c_int) -> c_int;
    pub fn softhca_rdma_get_cm_event(ch: *mut rdma_event_channel, event: *mut *mut rdma_cm_event) -> c_int;
    pub fn softhca_rdma_ack_cm_event(event: *mut rdma_cm_event) -> c_int;
    pub fn softhca_rdma_create_qp(id: *mut rdma_cm_id, pd: *mut ibv_pd, attr: *mut ibv_qp_init_attr) -> c_int;
    pub fn softhca_rdma_destroy_qp(id: *mut rdma_cm_id);
    pub fn softhca_rdma_migrate_id(id: *mut rdma_cm_id, ch: *mut rdma_event_channel) -> c_int;
    pub fn softhca_rdma_set_option(
        id: *mut rdma_cm_id,
        level: c_int,
        name: c_int,
        val: *mut c_void,
        len: usize,
    ) -> c_int;
    pub fn softhca_rdma_get_src_port(id: *mut rdma_cm_id) -> u16;
    pub fn softhca_rdma_join_multicast(id: *mut rdma_cm_id, addr: *mut libc::sockaddr, ctx: *mut c_void) -> c_int;
    pub fn softhca_rdma_leave_multicast(id: *mut rdma_cm_id, addr: *mut libc::sockaddr) -> c_int;
    pub fn softhca_rdma_getaddrinfo(
        node: *const c_char,
        service: *const c_char,
        hints: *const rdma_addrinfo,
        res: *mut *mut rdma_addrinfo,
    ) -> c_int;
    pub fn softhca_rdma_freeaddrinfo(res: *mut rdma_addrinfo);
    pub fn softhca_rdma_create_ep(
        id: *mut *mut rdma_cm_id,
        res: *mut rdma_addrinfo,
        pd: *mut ibv_pd,
        attr: *mut ibv_qp_init_attr,
    ) -> c_int;
    pub fn softhca_rdma_destroy_ep(id: *mut rdma_cm_id);
    pub fn softhca_rdma_get_request(listen: *mut rdma_cm_id, id: *mut *mut rdma_cm_id) -> c_int;
}

/// An IPv4 socket address.
pub fn sin(ip: [u8; 4], port: u16) -> libc::sockaddr_in {
    // SAFETY: an all-zero sockaddr_in is valid.
    let mut a: libc::sockaddr_in = unsafe { std::mem::zeroed() };
    a.sin_family = libc::AF_INET as libc::sa_family_t;
    a.sin_port = port.to_be();
    a.sin_addr.s_addr = u32::from_be_bytes(ip).to_be();
    a
}

/// An RC QP's init attributes with room for a few WRs (CQs made by rdma_create_qp).
pub fn rc_init() -> ibv_qp_init_attr {
    // SAFETY: an all-zero ibv_qp_init_attr is valid.
    let mut attr: ibv_qp_init_attr = unsafe { std::mem::zeroed() };
    attr.qp_type = IBV_QPT_RC;
    attr.cap.max_send_wr = 4;
    attr.cap.max_recv_wr = 4;
    attr.cap.max_send_sge = 1;
    attr.cap.max_recv_sge = 1;
    attr
}

/// Takes `ch`'s next event, which must be `want`, and acknowledges it.
///
/// # Safety
/// `ch` is a live channel.
pub unsafe fn expect(ch: *mut rdma_event_channel, want: c_int) {
    let mut ev = std::ptr::null_mut();
    // SAFETY: the caller's channel; the event is the library's until acknowledged.
    unsafe {
        assert_eq!(softhca_rdma_get_cm_event(ch, &mut ev), 0);
        assert_eq!(((*ev).event, (*ev).status), (want, 0));
        assert_eq!(softhca_rdma_ack_cm_event(ev), 0);
    }
}
