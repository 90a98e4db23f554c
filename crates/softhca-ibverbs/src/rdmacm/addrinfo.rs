//! `rdma_getaddrinfo` / `rdma_freeaddrinfo`, as librdmacm 44's addrinfo.c.

use std::ffi::{c_char, c_int};
use std::ptr::null_mut;

use super::abi::*;
use super::*;
use crate::abi::*;

/// A heap copy of a C socket address of `len` bytes (librdmacm's `ucma_copy_addr`).
///
/// # Safety
/// `sa` points to `len` readable bytes.
pub(super) unsafe fn copy_sa(
    sa: *const libc::sockaddr,
    len: libc::socklen_t,
) -> (*mut libc::sockaddr, libc::socklen_t) {
    let n = (len as usize).min(size_of::<libc::sockaddr_storage>());
    // SAFETY: an all-zero sockaddr_storage is valid.
    let mut s: Box<libc::sockaddr_storage> = Box::new(unsafe { std::mem::zeroed() });
    // SAFETY: `n` bytes from the caller's address into a 128-byte storage.
    unsafe { std::ptr::copy_nonoverlapping(sa.cast::<u8>(), (&mut *s as *mut libc::sockaddr_storage).cast::<u8>(), n) };
    (Box::into_raw(s).cast(), n as libc::socklen_t)
}

/// librdmacm 44's `rdma_getaddrinfo` (addrinfo.c): `getaddrinfo` with the hints converted
/// (RAI_PASSIVE, RAI_NUMERICHOST, the family, the socket type and protocol of the QP type and
/// port space), the first answer converted back: its QP type and port space from the hints
/// or from its socket type and protocol, RAI_PASSIVE, the address as source (passive) or
/// destination; a source address from the hints when there is none. A `getaddrinfo` error is
/// returned as its EAI code, as librdmacm returns it. (AF_IB addresses are not built.)
#[no_mangle]
pub unsafe extern "C" fn softhca_rdma_getaddrinfo(
    node: *const c_char,
    service: *const c_char,
    hints: *const rdma_addrinfo,
    res: *mut *mut rdma_addrinfo,
) -> c_int {
    if res.is_null() || (node.is_null() && service.is_null() && hints.is_null()) {
        return err(libc::EINVAL);
    }
    // SAFETY: the program's hints, if any.
    let h = unsafe { hints.as_ref() };
    // SAFETY: an all-zero rdma_addrinfo is valid.
    let mut ai: Box<rdma_addrinfo> = Box::new(unsafe { std::mem::zeroed() });
    if !node.is_null() || !service.is_null() {
        // SAFETY: an all-zero addrinfo is valid hints.
        let mut ah: libc::addrinfo = unsafe { std::mem::zeroed() };
        if let Some(h) = h {
            if h.ai_flags & RAI_PASSIVE != 0 {
                ah.ai_flags = libc::AI_PASSIVE;
            }
            if h.ai_flags & RAI_NUMERICHOST != 0 {
                ah.ai_flags |= libc::AI_NUMERICHOST;
            }
            ah.ai_family = h.ai_family;
            ah.ai_socktype = match h.ai_qp_type {
                IBV_QPT_RC | IBV_QPT_UC | IBV_QPT_XRC_SEND | IBV_QPT_XRC_RECV => libc::SOCK_STREAM,
                IBV_QPT_UD => libc::SOCK_DGRAM,
                _ => 0,
            };
            ah.ai_protocol = match h.ai_port_space {
                RDMA_PS_TCP => libc::IPPROTO_TCP,
                RDMA_PS_UDP | RDMA_PS_IPOIB => libc::IPPROTO_UDP,
                RDMA_PS_IB if ah.ai_socktype == libc::SOCK_STREAM => libc::IPPROTO_TCP,
                RDMA_PS_IB if ah.ai_socktype == libc::SOCK_DGRAM => libc::IPPROTO_UDP,
                _ => 0,
            };
        }
        let mut found: *mut libc::addrinfo = null_mut();
        let hp = if h.is_some() { &ah as *const libc::addrinfo } else { std::ptr::null() };
        // SAFETY: the program's NUL-terminated strings (or NULL); local hints and out pointer.
        let rc = unsafe { libc::getaddrinfo(node, service, hp, &mut found) };
        if rc != 0 {
            return rc;
        }
        // SAFETY: getaddrinfo succeeded: a list of at least one entry.
        let first = unsafe { &*found };
        ai.ai_qp_type = match (h.map_or(0, |h| h.ai_qp_type), first.ai_socktype) {
            (0, libc::SOCK_STREAM) => IBV_QPT_RC,
            (0, libc::SOCK_DGRAM) => IBV_QPT_UD,
            (t, _) => t,
        };
        ai.ai_port_space = match (h.map_or(0, |h| h.ai_port_space), first.ai_protocol) {
            (0, libc::IPPROTO_TCP) => RDMA_PS_TCP,
            (0, libc::IPPROTO_UDP) => RDMA_PS_UDP,
            (ps, _) => ps,
        };
        ai.ai_family = first.ai_family;
        // SAFETY: getaddrinfo's address of its length; its canonical name is NULL or a
        // NUL-terminated string.
        unsafe {
            let canon = if first.ai_canonname.is_null() { null_mut() } else { libc::strdup(first.ai_canonname) };
            if first.ai_flags & libc::AI_PASSIVE != 0 {
                ai.ai_flags = RAI_PASSIVE;
                ai.ai_src_canonname = canon;
                (ai.ai_src_addr, ai.ai_src_len) = copy_sa(first.ai_addr, first.ai_addrlen);
            } else {
                ai.ai_dst_canonname = canon;
                (ai.ai_dst_addr, ai.ai_dst_len) = copy_sa(first.ai_addr, first.ai_addrlen);
            }
            libc::freeaddrinfo(found);
        }
    } else if let Some(h) = h {
        ai.ai_flags = h.ai_flags;
        ai.ai_family = h.ai_family;
        ai.ai_qp_type = h.ai_qp_type;
        ai.ai_port_space = h.ai_port_space;
        if h.ai_dst_len != 0 && !h.ai_dst_addr.is_null() {
            // SAFETY: the hints' destination of its length.
            (ai.ai_dst_addr, ai.ai_dst_len) = unsafe { copy_sa(h.ai_dst_addr, h.ai_dst_len) };
        }
    }
    if let Some(h) = h.filter(|h| ai.ai_src_len == 0 && h.ai_src_len != 0 && !h.ai_src_addr.is_null()) {
        // SAFETY: the hints' source of its length.
        (ai.ai_src_addr, ai.ai_src_len) = unsafe { copy_sa(h.ai_src_addr, h.ai_src_len) };
    }
    // SAFETY: the program's out pointer.
    unsafe { *res = Box::into_raw(ai) };
    0
}

#[no_mangle]
pub unsafe extern "C" fn softhca_rdma_freeaddrinfo(res: *mut rdma_addrinfo) {
    let mut p = res;
    while !p.is_null() {
        // SAFETY: an rdma_addrinfo this library made, with its parts.
        let ai = unsafe { Box::from_raw(p) };
        for sa in [ai.ai_src_addr, ai.ai_dst_addr] {
            if !sa.is_null() {
                // SAFETY: a sockaddr_storage box of `boxed_sa`.
                drop(unsafe { Box::from_raw(sa as *mut libc::sockaddr_storage) });
            }
        }
        // SAFETY: strdup'ed names or NULL.
        unsafe {
            libc::free(ai.ai_src_canonname.cast());
            libc::free(ai.ai_dst_canonname.cast());
        }
        p = ai.ai_next;
    }
}
