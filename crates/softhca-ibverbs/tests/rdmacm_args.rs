//! Event channels destroyed under the ids that use them, through the drop-in's rdma_cm C ABI
//! (`softhca_rdma_*`, what `librdmacm.so.1` forwards to), in process: each case freed memory
//! twice or read through a null pointer before. librdmacm 44 misbehaves the same way here
//! (a double free, a read of freed memory); the drop-in answers instead.

use std::ffi::{c_int, c_void};
use std::ptr::null_mut;

use softhca_ibverbs::rdmacm::abi::*;

extern "C" {
    fn softhca_rdma_create_event_channel() -> *mut rdma_event_channel;
    fn softhca_rdma_destroy_event_channel(channel: *mut rdma_event_channel);
    fn softhca_rdma_create_id(
        channel: *mut rdma_event_channel,
        id: *mut *mut rdma_cm_id,
        context: *mut c_void,
        ps: c_int,
    ) -> c_int;
    fn softhca_rdma_destroy_id(id: *mut rdma_cm_id) -> c_int;
    fn softhca_rdma_migrate_id(id: *mut rdma_cm_id, channel: *mut rdma_event_channel) -> c_int;
}

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
