//! Event channels destroyed under the ids that use them, and events acknowledged twice,
//! through the drop-in's rdma_cm C ABI (`softhca_rdma_*`, what `librdmacm.so.1` forwards to),
//! in process: each case freed memory twice or read through a null pointer before. librdmacm
//! 44 misbehaves the same way here (a double free, a read of freed memory); the drop-in
//! answers instead.

use std::ffi::c_int;
use std::ptr::null_mut;

use softhca_ibverbs::rdmacm::abi::*;

#[path = "common/rdmacm_ffi.rs"]
mod rdmacm_ffi;
use rdmacm_ffi::*;

/// A synchronous id's own channel (made for an id created without one) goes with the id:
/// destroying it by hand is ignored, and the id is destroyed cleanly after. Before, the channel
/// was freed twice.
#[test]
fn a_synchronous_ids_own_channel_goes_with_the_id() {
    // SAFETY: the library's own objects, each destroyed once by the program.
    unsafe {
        let mut id = null_mut();
        assert_eq!(softhca_rdma_create_id(null_mut(), &mut id, null_mut(), RDMA_PS_TCP), 0);
        let own = (*id).channel;
        assert!(!own.is_null());
        softhca_rdma_destroy_event_channel(own);
        assert_eq!((*id).channel, own, "still the id's");
        assert_eq!(softhca_rdma_destroy_id(id), 0);
    }
}

/// An id whose channel the program destroyed can still be migrated to another (its events
/// went with the channel). Before, the migration read the old channel through a null pointer.
#[test]
fn an_id_whose_channel_is_gone_migrates() {
    // SAFETY: the library's own objects, each destroyed once by the program.
    unsafe {
        let (ch, ch2) = (softhca_rdma_create_event_channel(), softhca_rdma_create_event_channel());
        assert!(!ch.is_null() && !ch2.is_null());
        let mut id = null_mut();
        assert_eq!(softhca_rdma_create_id(ch, &mut id, null_mut(), RDMA_PS_TCP), 0);
        softhca_rdma_destroy_event_channel(ch);
        assert_eq!(softhca_rdma_migrate_id(id, ch2), 0);
        assert_eq!((*id).channel, ch2);
        assert_eq!(softhca_rdma_destroy_id(id), 0);
        softhca_rdma_destroy_event_channel(ch2);
    }
}

/// An event is acknowledged once: a second `rdma_ack_cm_event`, or one of a pointer the
/// library never handed out, is -1 with EINVAL. Before, the second freed the event again.
#[test]
fn an_event_is_acknowledged_once() {
    // SAFETY: the library's own objects, each destroyed once by the program; local sockaddrs.
    unsafe {
        let ch = softhca_rdma_create_event_channel();
        let mut id = null_mut();
        assert_eq!(softhca_rdma_create_id(ch, &mut id, null_mut(), RDMA_PS_TCP), 0);
        let mut dst: libc::sockaddr_in = std::mem::zeroed();
        dst.sin_family = libc::AF_INET as libc::sa_family_t;
        dst.sin_port = 7471u16.to_be();
        dst.sin_addr.s_addr = u32::from(std::net::Ipv4Addr::LOCALHOST).to_be();
        let r = softhca_rdma_resolve_addr(id, null_mut(), (&raw mut dst).cast(), 2000);
        assert_eq!(r, 0, "rdma_resolve_addr");
        let mut ev = null_mut();
        assert_eq!(softhca_rdma_get_cm_event(ch, &mut ev), 0);
        assert_eq!(softhca_rdma_ack_cm_event(ev), 0);
        assert_eq!((softhca_rdma_ack_cm_event(ev), errno()), (-1, libc::EINVAL), "a second ack");
        let mut stray: rdma_cm_event = std::mem::zeroed();
        assert_eq!((softhca_rdma_ack_cm_event(&mut stray), errno()), (-1, libc::EINVAL), "a stray event");
        assert_eq!(softhca_rdma_destroy_id(id), 0);
        softhca_rdma_destroy_event_channel(ch);
    }
}

fn errno() -> c_int {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
}
