//! The kernel-ABI conversions libibverbs exports for librdmacm and the providers
//! (`ibv_copy_*_from_kern`, `ibv_copy_path_rec_to_kern`): the structures of
//! `rdma/ib_user_verbs.h` and `rdma/ib_user_sa.h` to and from the verbs ones. softhca has no
//! kernel, but librdmacm imports these (it is linked BIND_NOW, so it does not load without
//! them) and uses them on the path records and attributes its kernel hands back. They copy
//! field by field, as rdma-core does: the two layouts differ in order, widths and padding.

use std::ffi::c_int;

use crate::abi::{ibv_ah_attr, ibv_qp_attr, ibv_sa_path_rec};

/// `struct ib_uverbs_global_route`.
#[repr(C)]
pub struct ib_uverbs_global_route {
    pub dgid: [u8; 16],
    pub flow_label: u32,
    pub sgid_index: u8,
    pub hop_limit: u8,
    pub traffic_class: u8,
    pub reserved: u8,
}

/// `struct ib_uverbs_ah_attr`.
#[repr(C)]
pub struct ib_uverbs_ah_attr {
    pub grh: ib_uverbs_global_route,
    pub dlid: u16,
    pub sl: u8,
    pub src_path_bits: u8,
    pub static_rate: u8,
    pub is_global: u8,
    pub port_num: u8,
    pub reserved: u8,
}

/// `struct ib_uverbs_qp_attr`.
#[repr(C)]
pub struct ib_uverbs_qp_attr {
    pub qp_attr_mask: u32,
    pub qp_state: u32,
    pub cur_qp_state: u32,
    pub path_mtu: u32,
    pub path_mig_state: u32,
    pub qkey: u32,
    pub rq_psn: u32,
    pub sq_psn: u32,
    pub dest_qp_num: u32,
    pub qp_access_flags: u32,
    pub ah_attr: ib_uverbs_ah_attr,
    pub alt_ah_attr: ib_uverbs_ah_attr,
    pub max_send_wr: u32,
    pub max_recv_wr: u32,
    pub max_send_sge: u32,
    pub max_recv_sge: u32,
    pub max_inline_data: u32,
    pub pkey_index: u16,
    pub alt_pkey_index: u16,
    pub en_sqd_async_notify: u8,
    pub sq_draining: u8,
    pub max_rd_atomic: u8,
    pub max_dest_rd_atomic: u8,
    pub min_rnr_timer: u8,
    pub port_num: u8,
    pub timeout: u8,
    pub retry_cnt: u8,
    pub rnr_retry: u8,
    pub alt_port_num: u8,
    pub alt_timeout: u8,
    pub reserved: [u8; 5],
}

/// `struct ib_user_path_rec` (the kernel's path record; big-endian fields stay big-endian).
#[repr(C)]
pub struct ib_user_path_rec {
    pub dgid: [u8; 16],
    pub sgid: [u8; 16],
    pub dlid: u16,
    pub slid: u16,
    pub raw_traffic: u32,
    pub flow_label: u32,
    pub reversible: u32,
    pub mtu: u32,
    pub pkey: u16,
    pub hop_limit: u8,
    pub traffic_class: u8,
    pub numb_path: u8,
    pub sl: u8,
    pub mtu_selector: u8,
    pub rate_selector: u8,
    pub rate: u8,
    pub packet_life_time_selector: u8,
    pub packet_life_time: u8,
    pub preference: u8,
}

fn ah_attr_from_kern(dst: &mut ibv_ah_attr, src: &ib_uverbs_ah_attr) {
    dst.grh.dgid.raw = src.grh.dgid;
    dst.grh.flow_label = src.grh.flow_label;
    dst.grh.sgid_index = src.grh.sgid_index;
    dst.grh.hop_limit = src.grh.hop_limit;
    dst.grh.traffic_class = src.grh.traffic_class;
    dst.dlid = src.dlid;
    dst.sl = src.sl;
    dst.src_path_bits = src.src_path_bits;
    dst.static_rate = src.static_rate;
    dst.is_global = src.is_global;
    dst.port_num = src.port_num;
}

#[no_mangle]
pub unsafe extern "C" fn ibv_copy_ah_attr_from_kern(dst: *mut ibv_ah_attr, src: *const ib_uverbs_ah_attr) {
    // SAFETY: libibverbs' contract: both point to structures of these types.
    unsafe { ah_attr_from_kern(&mut *dst, &*src) }
}

/// Copies every attribute but `qp_state`, which rdma-core leaves alone too (the kernel's
/// answer carries it in `qp_attr_mask`'s caller).
#[no_mangle]
pub unsafe extern "C" fn ibv_copy_qp_attr_from_kern(dst: *mut ibv_qp_attr, src: *const ib_uverbs_qp_attr) {
    // SAFETY: libibverbs' contract: both point to structures of these types.
    let (d, s) = unsafe { (&mut *dst, &*src) };
    d.cur_qp_state = s.cur_qp_state as c_int;
    d.path_mtu = s.path_mtu as c_int;
    d.path_mig_state = s.path_mig_state as c_int;
    d.qkey = s.qkey;
    d.rq_psn = s.rq_psn;
    d.sq_psn = s.sq_psn;
    d.dest_qp_num = s.dest_qp_num;
    d.qp_access_flags = s.qp_access_flags;
    d.cap.max_send_wr = s.max_send_wr;
    d.cap.max_recv_wr = s.max_recv_wr;
    d.cap.max_send_sge = s.max_send_sge;
    d.cap.max_recv_sge = s.max_recv_sge;
    d.cap.max_inline_data = s.max_inline_data;
    ah_attr_from_kern(&mut d.ah_attr, &s.ah_attr);
    ah_attr_from_kern(&mut d.alt_ah_attr, &s.alt_ah_attr);
    d.pkey_index = s.pkey_index;
    d.alt_pkey_index = s.alt_pkey_index;
    d.en_sqd_async_notify = s.en_sqd_async_notify;
    d.sq_draining = s.sq_draining;
    d.max_rd_atomic = s.max_rd_atomic;
    d.max_dest_rd_atomic = s.max_dest_rd_atomic;
    d.min_rnr_timer = s.min_rnr_timer;
    d.port_num = s.port_num;
    d.timeout = s.timeout;
    d.retry_cnt = s.retry_cnt;
    d.rnr_retry = s.rnr_retry;
    d.alt_port_num = s.alt_port_num;
    d.alt_timeout = s.alt_timeout;
}

/// The fields a path record has in both forms, copied in the direction `$dst` ← `$src`
/// (the widths differ: the casts are the C assignments' conversions).
macro_rules! copy_path_rec {
    ($d:ident, $s:ident) => {
        $d.dlid = $s.dlid;
        $d.slid = $s.slid;
        $d.raw_traffic = $s.raw_traffic as _;
        $d.flow_label = $s.flow_label;
        $d.hop_limit = $s.hop_limit;
        $d.traffic_class = $s.traffic_class;
        $d.reversible = $s.reversible as _;
        $d.numb_path = $s.numb_path;
        $d.pkey = $s.pkey;
        $d.sl = $s.sl;
        $d.mtu_selector = $s.mtu_selector;
        $d.mtu = $s.mtu as _;
        $d.rate_selector = $s.rate_selector;
        $d.rate = $s.rate;
        $d.packet_life_time = $s.packet_life_time;
        $d.preference = $s.preference;
        $d.packet_life_time_selector = $s.packet_life_time_selector;
    };
}

#[no_mangle]
pub unsafe extern "C" fn ibv_copy_path_rec_from_kern(dst: *mut ibv_sa_path_rec, src: *const ib_user_path_rec) {
    // SAFETY: libibverbs' contract: both point to structures of these types.
    let (d, s) = unsafe { (&mut *dst, &*src) };
    d.dgid.raw = s.dgid;
    d.sgid.raw = s.sgid;
    copy_path_rec!(d, s);
}

#[no_mangle]
pub unsafe extern "C" fn ibv_copy_path_rec_to_kern(dst: *mut ib_user_path_rec, src: *const ibv_sa_path_rec) {
    // SAFETY: libibverbs' contract: both point to structures of these types.
    let (d, s) = unsafe { (&mut *dst, &*src) };
    d.dgid = s.dgid.raw;
    d.sgid = s.sgid.raw;
    copy_path_rec!(d, s);
}
