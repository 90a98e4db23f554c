//! The vendor functions against the real ones: rdma-core 44's `libmlx5.so.1` and
//! `libefa.so.1` (Debian's ibverbs-providers) are loaded into the test process (with the
//! system libibverbs they need) and each function of both is called with the same foreign
//! device, context and objects (`common::fake`, laid out as `verbs.h` lays them out); the
//! return values, errno and, for the domain dump, the text written must be the same.
//!
//! Only calls whose real implementation stays within the fakes are made (where it computes
//! an mlx5 structure around a foreign object by `container_of` and reads from it, it reads
//! the fakes' zeroed arena); the functions that would read a descriptor out of a vendor
//! object, free it, or follow pointers only an mlx5 device fills in are left to
//! `tests/answers.rs`. Without the real libraries each test says so and passes, except under
//! CI (`CI` set), where they are required.

mod common;

use std::ffi::{c_int, c_void, CStr, CString};
use std::ptr::{null, null_mut};
use std::sync::OnceLock;

use common::fake::*;
use common::*;
use softhca_vendor::dr::{self, DestAttr, DestReformat, FlowSamplerAttr};
use softhca_vendor::vfio::VfioContextAttr;
use softhca_vendor::{abi, efa, mlx5, vfio};

type P = *mut c_void;

struct Libs {
    mlx5: usize,
    efa: usize,
}

/// The real libraries, loaded once (None, after saying so, if they are not installed).
fn libs() -> Option<&'static Libs> {
    static LIBS: OnceLock<Option<Libs>> = OnceLock::new();
    let libs = LIBS.get_or_init(|| {
        let open = |name: &CStr| {
            // SAFETY: dlopen of a system library by path; its constructors only register
            // the provider with the system libibverbs it loads.
            let h = unsafe { libc::dlopen(name.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
            (!h.is_null()).then_some(h as usize)
        };
        Some(Libs {
            mlx5: open(c"/usr/lib/x86_64-linux-gnu/libmlx5.so.1")?,
            efa: open(c"/usr/lib/x86_64-linux-gnu/libefa.so.1")?,
        })
    });
    have(libs.is_some(), "rdma-core 44's libmlx5.so.1 and libefa.so.1 (ibverbs-providers)")
        .then(|| libs.as_ref().unwrap())
}

/// The real function `name` (its default version, or `version`) as a function pointer `F`.
///
/// # Safety
/// `F` is the function's prototype.
unsafe fn real<F: Copy>(lib: usize, name: &str, version: Option<&str>) -> F {
    assert_eq!(size_of::<F>(), size_of::<P>());
    let n = CString::new(name).unwrap();
    let p = match version {
        // SAFETY: lookups in a loaded library.
        None => unsafe { libc::dlsym(lib as P, n.as_ptr()) },
        Some(v) => unsafe { libc::dlvsym(lib as P, n.as_ptr(), CString::new(v).unwrap().as_ptr()) },
    };
    assert!(!p.is_null(), "the real library has no {name}");
    // SAFETY: a function pointer is a pointer (size checked above); the prototype is the
    // caller's promise.
    unsafe { std::mem::transmute_copy::<P, F>(&p) }
}

/// What a call answered, comparable across the two libraries: the return value (for a
/// pointer, whether it is NULL) and errno after it.
trait Outcome {
    fn outcome(&self) -> i64;
}
impl Outcome for c_int {
    fn outcome(&self) -> i64 {
        i64::from(*self)
    }
}
impl Outcome for bool {
    fn outcome(&self) -> i64 {
        i64::from(*self)
    }
}
impl<T> Outcome for *mut T {
    fn outcome(&self) -> i64 {
        i64::from(!self.is_null())
    }
}

fn call<T: Outcome>(f: impl FnOnce() -> T) -> (i64, c_int) {
    set_errno(UNTOUCHED);
    let r = f();
    (r.outcome(), errno())
}

/// Calls the real `$name` and ours with the same arguments; both must answer the same.
macro_rules! same {
    ($lib:expr, $m:ident :: $name:ident, ($($t:ty),*) -> $r:ty, ($($a:expr),*)) => {{
        // SAFETY: the prototype is the one mlx5dv.h / efadv.h declare.
        let theirs: unsafe extern "C" fn($($t),*) -> $r = unsafe { real($lib, stringify!($name), None) };
        // SAFETY: the arguments are live fakes or NULL where rdma-core does not read them.
        let r = call(|| unsafe { theirs($($a),*) });
        // SAFETY: as above.
        let o = call(|| unsafe { $m::$name($($a),*) });
        assert_eq!(o, r, "{}: ours (return, errno) vs rdma-core's", stringify!($name));
    }};
}

#[test]
fn mlx5_entry_points_answer_as_rdma_cores_for_a_foreign_context() {
    let Some(l) = libs() else { return };
    let f = Fake::new(Port::Ethernet, 2);
    let (m, ctx, obj, vobj, dev) = (l.mlx5, f.ctx(), f.object(), f.vendor_obj(), f.device());
    let mut buf = [0u8; 4096];
    let b = buf.as_mut_ptr().cast::<c_void>();
    let bc = b.cast_const();
    same!(m, mlx5::mlx5dv_is_supported, (P) -> bool, (dev));
    same!(m, mlx5::mlx5dv_open_device, (P, P) -> P, (dev, null_mut()));
    same!(m, mlx5::mlx5dv_query_device, (P, P) -> c_int, (ctx, b));
    same!(m, mlx5::_mlx5dv_query_port, (P, u32, P, usize) -> c_int, (ctx, 1, b, 64));
    same!(m, mlx5::mlx5dv_set_context_attr, (P, u32, P) -> c_int, (ctx, 1, b));
    same!(m, mlx5::mlx5dv_get_clock_info, (P, P) -> c_int, (ctx, b));
    same!(m, mlx5::mlx5dv_create_cq, (P, P, P) -> P, (ctx, b, b));
    same!(m, mlx5::mlx5dv_create_qp, (P, P, P) -> P, (ctx, b, b));
    same!(m, mlx5::mlx5dv_create_wq, (P, P, P) -> P, (ctx, b, b));
    same!(m, mlx5::mlx5dv_alloc_dm, (P, P, P) -> P, (ctx, b, b));
    same!(m, mlx5::mlx5dv_dm_map_op_addr, (P, u8) -> P, (obj, 0));
    same!(m, mlx5::mlx5dv_create_flow_action_esp, (P, P, P) -> P, (ctx, b, b));
    same!(m, mlx5::mlx5dv_create_flow_matcher, (P, P) -> P, (ctx, b));
    same!(m, mlx5::mlx5dv_destroy_flow_matcher, (P) -> c_int, (obj));
    same!(m, mlx5::mlx5dv_create_flow, (P, P, usize, P) -> P, (obj, b, 0, b));
    same!(m, mlx5::mlx5dv_create_flow_action_modify_header, (P, usize, *mut u64, u32) -> P, (ctx, 8, b.cast(), 0));
    same!(m, mlx5::mlx5dv_create_flow_action_packet_reformat, (P, usize, P, u32, u32) -> P, (ctx, 16, b, 0, 0));
    same!(m, mlx5::mlx5dv_create_steering_anchor, (P, P) -> P, (ctx, b));
    same!(m, mlx5::mlx5dv_devx_alloc_uar, (P, u32) -> P, (ctx, 0));
    same!(m, mlx5::mlx5dv_devx_general_cmd, (P, *const c_void, usize, P, usize) -> c_int, (ctx, bc, 16, b, 16));
    same!(m, mlx5::mlx5dv_devx_obj_create, (P, *const c_void, usize, P, usize) -> P, (ctx, bc, 16, b, 16));
    same!(m, mlx5::mlx5dv_devx_obj_query, (P, *const c_void, usize, P, usize) -> c_int, (obj, bc, 16, b, 16));
    same!(m, mlx5::mlx5dv_devx_obj_modify, (P, *const c_void, usize, P, usize) -> c_int, (obj, bc, 16, b, 16));
    same!(m, mlx5::mlx5dv_devx_obj_query_async, (P, *const c_void, usize, usize, u64, P) -> c_int, (obj, bc, 16, 16, 1, b));
    same!(m, mlx5::mlx5dv_devx_obj_destroy, (P) -> c_int, (obj));
    same!(m, mlx5::mlx5dv_devx_query_eqn, (P, u32, *mut u32) -> c_int, (ctx, 0, b.cast()));
    same!(m, mlx5::mlx5dv_devx_umem_reg, (P, P, usize, u32) -> P, (ctx, b, 4096, 0));
    same!(m, mlx5::mlx5dv_devx_umem_reg_ex, (P, P) -> P, (ctx, b));
    for (q, md) in [
        (
            mlx5::mlx5dv_devx_cq_query as unsafe extern "C" fn(P, *const c_void, usize, P, usize) -> c_int,
            "mlx5dv_devx_cq_query",
        ),
        (mlx5::mlx5dv_devx_cq_modify, "mlx5dv_devx_cq_modify"),
        (mlx5::mlx5dv_devx_qp_query, "mlx5dv_devx_qp_query"),
        (mlx5::mlx5dv_devx_qp_modify, "mlx5dv_devx_qp_modify"),
        (mlx5::mlx5dv_devx_srq_query, "mlx5dv_devx_srq_query"),
        (mlx5::mlx5dv_devx_srq_modify, "mlx5dv_devx_srq_modify"),
        (mlx5::mlx5dv_devx_wq_query, "mlx5dv_devx_wq_query"),
        (mlx5::mlx5dv_devx_wq_modify, "mlx5dv_devx_wq_modify"),
        (mlx5::mlx5dv_devx_ind_tbl_query, "mlx5dv_devx_ind_tbl_query"),
        (mlx5::mlx5dv_devx_ind_tbl_modify, "mlx5dv_devx_ind_tbl_modify"),
    ] {
        // SAFETY: the prototype of all ten.
        let theirs: unsafe extern "C" fn(P, *const c_void, usize, P, usize) -> c_int = unsafe { real(m, md, None) };
        // SAFETY: a live fake verbs object and buffers.
        let r = call(|| unsafe { theirs(obj, bc, 16, b, 16) });
        // SAFETY: as above.
        let o = call(|| unsafe { q(obj, bc, 16, b, 16) });
        assert_eq!(o, r, "{md}");
    }
    same!(m, mlx5::mlx5dv_devx_create_cmd_comp, (P) -> P, (ctx));
    same!(m, mlx5::mlx5dv_devx_create_event_channel, (P, u32) -> P, (ctx, 0));
    same!(m, mlx5::mlx5dv_devx_alloc_msi_vector, (P) -> P, (ctx));
    same!(m, mlx5::mlx5dv_devx_create_eq, (P, *const c_void, usize, P, usize) -> P, (ctx, bc, 16, b, 16));
    same!(m, mlx5::mlx5dv_create_mkey, (P) -> P, (f.mkey_attr()));
    same!(m, mlx5::mlx5dv_destroy_mkey, (P) -> c_int, (vobj));
    same!(m, mlx5::mlx5dv_alloc_var, (P, u32) -> P, (ctx, 0));
    same!(m, mlx5::mlx5dv_pp_alloc, (P, usize, *const c_void, u32) -> P, (ctx, 16, bc, 0));
    same!(m, mlx5::mlx5dv_modify_qp_lag_port, (P, u8) -> c_int, (obj, 1));
    same!(m, mlx5::mlx5dv_query_qp_lag_port, (P, *mut u8, *mut u8) -> c_int, (obj, b.cast(), b.cast()));
    same!(m, mlx5::mlx5dv_modify_qp_udp_sport, (P, u16) -> c_int, (obj, 4791));
    same!(m, mlx5::mlx5dv_modify_qp_sched_elem, (P, *const c_void, *const c_void) -> c_int, (obj, null(), null()));
    same!(m, mlx5::mlx5dv_sched_node_create, (P, *const c_void) -> P, (ctx, bc));
    same!(m, mlx5::mlx5dv_sched_leaf_create, (P, *const c_void) -> P, (ctx, bc));
    same!(m, mlx5::mlx5dv_sched_node_modify, (P, *const c_void) -> c_int, (vobj, bc));
    same!(m, mlx5::mlx5dv_sched_leaf_modify, (P, *const c_void) -> c_int, (vobj, bc));
    same!(m, mlx5::mlx5dv_sched_node_destroy, (P) -> c_int, (vobj));
    same!(m, mlx5::mlx5dv_sched_leaf_destroy, (P) -> c_int, (vobj));
    same!(m, mlx5::mlx5dv_reserved_qpn_alloc, (P, *mut u32) -> c_int, (ctx, b.cast()));
    same!(m, mlx5::mlx5dv_reserved_qpn_dealloc, (P, u32) -> c_int, (ctx, 1));
    same!(m, mlx5::mlx5dv_map_ah_to_qp, (P, u32) -> c_int, (obj, 1));
    same!(m, mlx5::mlx5dv_dci_stream_id_reset, (P, u16) -> c_int, (obj, 0));
    same!(m, mlx5::mlx5dv_crypto_login, (P, P) -> c_int, (ctx, b));
    same!(m, mlx5::mlx5dv_crypto_login_query_state, (P, *mut u32) -> c_int, (ctx, b.cast()));
    same!(m, mlx5::mlx5dv_crypto_logout, (P) -> c_int, (ctx));
    same!(m, mlx5::mlx5dv_crypto_login_create, (P, P) -> P, (ctx, b));
    same!(m, mlx5::mlx5dv_crypto_login_query, (P, P) -> c_int, (vobj, b));
    same!(m, mlx5::mlx5dv_crypto_login_destroy, (P) -> c_int, (vobj));
    same!(m, mlx5::mlx5dv_dek_create, (P, P) -> P, (ctx, b));
    same!(m, mlx5::mlx5dv_dek_query, (P, P) -> c_int, (vobj, b));
    same!(m, mlx5::mlx5dv_dek_destroy, (P) -> c_int, (vobj));
    assert!(buf.iter().all(|&x| x == 0), "something wrote the output buffer");
}

#[test]
fn init_obj_answers_as_rdma_cores_in_both_versions() {
    let Some(l) = libs() else { return };
    let f = Fake::new(Port::Ethernet, 2);
    type InitObj = unsafe extern "C" fn(P, u64) -> c_int;
    // SAFETY: mlx5dv_init_obj's prototype, in both versions.
    let (v12, v10): (InitObj, InitObj) = unsafe {
        (real(l.mlx5, "mlx5dv_init_obj", Some("MLX5_1.2")), real(l.mlx5, "mlx5dv_init_obj", Some("MLX5_1.0")))
    };
    let types = (0..8).map(|i| 1u64 << i).chain([0, 0x7f, 0x60, 1 << 40]);
    for t in types {
        // SAFETY: a struct mlx5dv_obj whose every `in` is a live foreign object.
        unsafe {
            assert_eq!(call(|| mlx5::mlx5dv_init_obj(f.dv_obj(), t)), call(|| v12(f.dv_obj(), t)), "1.2, type {t:#x}");
            assert_eq!(
                call(|| mlx5::softhca_vendor_mlx5dv_init_obj_1_0(f.dv_obj(), t)),
                call(|| v10(f.dv_obj(), t)),
                "1.0, type {t:#x}"
            );
        }
    }
}

#[test]
fn efa_entry_points_answer_as_rdma_cores_for_a_foreign_device() {
    let Some(l) = libs() else { return };
    let f = Fake::new(Port::Ethernet, 2);
    let (e, ctx, obj) = (l.efa, f.ctx(), f.object());
    let mut buf = [0u8; 256];
    let b = buf.as_mut_ptr().cast::<c_void>();
    for inlen in [0, 8, 32, 64, 256] {
        same!(e, efa::efadv_query_device, (P, P, u32) -> c_int, (ctx, b, inlen));
        same!(e, efa::efadv_query_ah, (P, P, u32) -> c_int, (obj, b, inlen));
        same!(e, efa::efadv_create_qp_ex, (P, P, P, u32) -> P, (ctx, b, b, inlen));
        same!(e, efa::efadv_create_cq, (P, P, P, u32) -> P, (ctx, b, b, inlen));
    }
    same!(e, efa::efadv_create_driver_qp, (P, P, u32) -> P, (obj, b, 0));
    assert!(buf.iter().all(|&x| x == 0), "something wrote the output buffer");
}

#[test]
fn the_vfio_device_list_answers_as_rdma_cores() {
    let Some(l) = libs() else { return };
    // An existing PCI function of this machine, if it has one that is not Mellanox's (the
    // real library would open an mlx5 function bound to VFIO).
    let existing = std::fs::read_dir("/sys/bus/pci/devices").ok().and_then(|d| {
        d.filter_map(|e| e.ok())
            .find(|e| std::fs::read_to_string(e.path().join("vendor")).is_ok_and(|v| v.trim() != "0x15b3"))
            .map(|e| e.file_name().to_string_lossy().to_string())
    });
    let mut names = vec!["0000:00:00.0".to_string(), "ffff:ff:1f.7".into(), "not-a-pci-name".into(), "1:2".into()];
    names.extend(existing);
    for name in names {
        for (flags, comp_mask) in [(0, 0), (1, 0), (2, 0), (0, 1)] {
            let n = CString::new(name.as_str()).unwrap();
            let mut attr = VfioContextAttr { pci_name: n.as_ptr(), flags, comp_mask };
            let a = &raw mut attr;
            same!(l.mlx5, vfio::mlx5dv_get_vfio_device_list, (*mut VfioContextAttr) -> *mut P, (a));
        }
    }
}

/// The software-steering functions, as function pointers of one implementation or the other.
struct Dr {
    domain_create: unsafe extern "C" fn(P, u32) -> P,
    domain_destroy: unsafe extern "C" fn(P) -> c_int,
    domain_sync: unsafe extern "C" fn(P, u32) -> c_int,
    allow_duplicate_rules: unsafe extern "C" fn(P, bool),
    set_reclaim_device_memory: unsafe extern "C" fn(P, bool),
    table_create: unsafe extern "C" fn(P, u32) -> P,
    table_destroy: unsafe extern "C" fn(P) -> c_int,
    matcher_create: unsafe extern "C" fn(P, u16, u8, P) -> P,
    drop: unsafe extern "C" fn() -> P,
    tag: unsafe extern "C" fn(u32) -> P,
    default_miss: unsafe extern "C" fn() -> P,
    pop_vlan: unsafe extern "C" fn() -> P,
    push_vlan: unsafe extern "C" fn(P, u32) -> P,
    dest_ibv_qp: unsafe extern "C" fn(P) -> P,
    dest_table: unsafe extern "C" fn(P) -> P,
    dest_root_table: unsafe extern "C" fn(P, u16) -> P,
    dest_vport: unsafe extern "C" fn(P, u32) -> P,
    dest_ib_port: unsafe extern "C" fn(P, u32) -> P,
    dest_devx_tir: unsafe extern "C" fn(P) -> P,
    flow_counter: unsafe extern "C" fn(P, u32) -> P,
    aso: unsafe extern "C" fn(P, P, u32, u32, u8) -> P,
    flow_meter: unsafe extern "C" fn(P) -> P,
    flow_sampler: unsafe extern "C" fn(*mut FlowSamplerAttr) -> P,
    modify_header: unsafe extern "C" fn(P, u32, usize, *mut u64) -> P,
    packet_reformat: unsafe extern "C" fn(P, u32, u32, usize, P) -> P,
    dest_array: unsafe extern "C" fn(P, usize, *mut *mut DestAttr) -> P,
    action_destroy: unsafe extern "C" fn(P) -> c_int,
    modify_aso: unsafe extern "C" fn(P, u32, u32, u8) -> c_int,
    modify_flow_meter: unsafe extern "C" fn(P, P, u64) -> c_int,
    aso_other_domain_link: unsafe extern "C" fn(P, P, P, u32, u8) -> c_int,
    dump_domain: unsafe extern "C" fn(*mut libc::FILE, P) -> c_int,
    dump_table: unsafe extern "C" fn(*mut libc::FILE, P) -> c_int,
}

impl Dr {
    fn ours() -> Dr {
        Dr {
            domain_create: dr::mlx5dv_dr_domain_create,
            domain_destroy: dr::mlx5dv_dr_domain_destroy,
            domain_sync: dr::mlx5dv_dr_domain_sync,
            allow_duplicate_rules: dr::mlx5dv_dr_domain_allow_duplicate_rules,
            set_reclaim_device_memory: dr::mlx5dv_dr_domain_set_reclaim_device_memory,
            table_create: dr::mlx5dv_dr_table_create,
            table_destroy: dr::mlx5dv_dr_table_destroy,
            matcher_create: dr::mlx5dv_dr_matcher_create,
            drop: dr::mlx5dv_dr_action_create_drop,
            tag: dr::mlx5dv_dr_action_create_tag,
            default_miss: dr::mlx5dv_dr_action_create_default_miss,
            pop_vlan: dr::mlx5dv_dr_action_create_pop_vlan,
            push_vlan: dr::mlx5dv_dr_action_create_push_vlan,
            dest_ibv_qp: dr::mlx5dv_dr_action_create_dest_ibv_qp,
            dest_table: dr::mlx5dv_dr_action_create_dest_table,
            dest_root_table: dr::mlx5dv_dr_action_create_dest_root_table,
            dest_vport: dr::mlx5dv_dr_action_create_dest_vport,
            dest_ib_port: dr::mlx5dv_dr_action_create_dest_ib_port,
            dest_devx_tir: dr::mlx5dv_dr_action_create_dest_devx_tir,
            flow_counter: dr::mlx5dv_dr_action_create_flow_counter,
            aso: dr::mlx5dv_dr_action_create_aso,
            flow_meter: dr::mlx5dv_dr_action_create_flow_meter,
            flow_sampler: dr::mlx5dv_dr_action_create_flow_sampler,
            modify_header: dr::mlx5dv_dr_action_create_modify_header,
            packet_reformat: dr::mlx5dv_dr_action_create_packet_reformat,
            dest_array: dr::mlx5dv_dr_action_create_dest_array,
            action_destroy: dr::mlx5dv_dr_action_destroy,
            modify_aso: dr::mlx5dv_dr_action_modify_aso,
            modify_flow_meter: dr::mlx5dv_dr_action_modify_flow_meter,
            aso_other_domain_link: dr::mlx5dv_dr_aso_other_domain_link,
            dump_domain: dr::mlx5dv_dump_dr_domain,
            dump_table: dr::mlx5dv_dump_dr_table,
        }
    }

    /// rdma-core's, from the loaded library.
    ///
    /// # Safety
    /// `lib` is the real libmlx5, whose functions have these prototypes.
    unsafe fn real(lib: usize) -> Dr {
        macro_rules! r {
            ($name:literal) => {
                // SAFETY: the caller's promise.
                unsafe { real(lib, $name, None) }
            };
        }
        Dr {
            domain_create: r!("mlx5dv_dr_domain_create"),
            domain_destroy: r!("mlx5dv_dr_domain_destroy"),
            domain_sync: r!("mlx5dv_dr_domain_sync"),
            allow_duplicate_rules: r!("mlx5dv_dr_domain_allow_duplicate_rules"),
            set_reclaim_device_memory: r!("mlx5dv_dr_domain_set_reclaim_device_memory"),
            table_create: r!("mlx5dv_dr_table_create"),
            table_destroy: r!("mlx5dv_dr_table_destroy"),
            matcher_create: r!("mlx5dv_dr_matcher_create"),
            drop: r!("mlx5dv_dr_action_create_drop"),
            tag: r!("mlx5dv_dr_action_create_tag"),
            default_miss: r!("mlx5dv_dr_action_create_default_miss"),
            pop_vlan: r!("mlx5dv_dr_action_create_pop_vlan"),
            push_vlan: r!("mlx5dv_dr_action_create_push_vlan"),
            dest_ibv_qp: r!("mlx5dv_dr_action_create_dest_ibv_qp"),
            dest_table: r!("mlx5dv_dr_action_create_dest_table"),
            dest_root_table: r!("mlx5dv_dr_action_create_dest_root_table"),
            dest_vport: r!("mlx5dv_dr_action_create_dest_vport"),
            dest_ib_port: r!("mlx5dv_dr_action_create_dest_ib_port"),
            dest_devx_tir: r!("mlx5dv_dr_action_create_dest_devx_tir"),
            flow_counter: r!("mlx5dv_dr_action_create_flow_counter"),
            aso: r!("mlx5dv_dr_action_create_aso"),
            flow_meter: r!("mlx5dv_dr_action_create_flow_meter"),
            flow_sampler: r!("mlx5dv_dr_action_create_flow_sampler"),
            modify_header: r!("mlx5dv_dr_action_create_modify_header"),
            packet_reformat: r!("mlx5dv_dr_action_create_packet_reformat"),
            dest_array: r!("mlx5dv_dr_action_create_dest_array"),
            action_destroy: r!("mlx5dv_dr_action_destroy"),
            modify_aso: r!("mlx5dv_dr_action_modify_aso"),
            modify_flow_meter: r!("mlx5dv_dr_action_modify_flow_meter"),
            aso_other_domain_link: r!("mlx5dv_dr_aso_other_domain_link"),
            dump_domain: r!("mlx5dv_dump_dr_domain"),
            dump_table: r!("mlx5dv_dump_dr_table"),
        }
    }
}

/// Runs one scenario through `d` and returns its transcript: every call with its
/// [`Outcome`] and errno, and the dumps' text with the table addresses blanked.
///
/// # Safety
/// `d` is an implementation of the functions; `fakes` live.
unsafe fn scenario(d: &Dr, tag: &str) -> Vec<String> {
    let eth = Fake::new(Port::Ethernet, 2);
    let ib = Fake::new(Port::InfiniBand, 2);
    let broken = Fake::new(Port::Fails, 2);
    let raw = Fake::new(Port::Ethernet, abi::QPT_RAW_PACKET);
    let devx = eth.object();
    let mut log = Vec::new();
    macro_rules! note {
        ($what:expr, $outcome:expr $(,)?) => {{
            let (r, e): (i64, c_int) = $outcome;
            log.push(format!("{}: {r} errno {e}", $what));
        }};
    }
    // SAFETY (the whole body): every argument is a live fake, an object this
    // implementation created and has not destroyed, or a buffer of the size declared.
    unsafe {
        for (name, f) in [("eth", &eth), ("ib", &ib), ("broken", &broken)] {
            for t in 0..4 {
                let mut dmn = null_mut();
                note!(
                    format!("domain_create({name}, {t})"),
                    call(|| {
                        dmn = (d.domain_create)(f.ctx(), t);
                        dmn
                    })
                );
                if !dmn.is_null() {
                    note!(format!("domain_destroy({name}, {t})"), call(|| (d.domain_destroy)(dmn)));
                }
            }
        }
        for t in 0..3 {
            let dmn = (d.domain_create)(eth.ctx(), t);
            for flags in [0, 1, 7, 8] {
                note!(format!("{t} sync({flags})"), call(|| (d.domain_sync)(dmn, flags)));
            }
            note!(format!("{t} table_create(1)"), call(|| (d.table_create)(dmn, 1)));
            let tbl = (d.table_create)(dmn, 0);
            let tbl2 = (d.table_create)(dmn, 0);
            note!(format!("{t} table_create(0)"), call(|| tbl));
            note!(format!("{t} matcher_create"), call(|| (d.matcher_create)(tbl, 0, 0, null_mut())));
            note!(format!("{t} dest_table"), call(|| (d.dest_table)(tbl)));
            note!(format!("{t} dest_root_table"), call(|| (d.dest_root_table)(tbl, 1)));
            note!(format!("{t} dest_vport"), call(|| (d.dest_vport)(dmn, 1)));
            note!(format!("{t} dest_ib_port"), call(|| (d.dest_ib_port)(dmn, 1)));
            note!(format!("{t} dest_devx_tir"), call(|| (d.dest_devx_tir)(devx)));
            note!(format!("{t} flow_counter"), call(|| (d.flow_counter)(devx, 0)));
            note!(format!("{t} aso"), call(|| (d.aso)(dmn, devx, 0, 0, 0)));
            note!(format!("{t} aso_link"), call(|| (d.aso_other_domain_link)(devx, dmn, dmn, 0, 0)));
            let mut meter = [tbl, null_mut(), null_mut(), null_mut()];
            note!(format!("{t} flow_meter"), call(|| (d.flow_meter)(meter.as_mut_ptr().cast())));
            for flags in 0..4 {
                for sz in [0, 8, 12, 16] {
                    note!(
                        format!("{t} modify_header({flags}, {sz})"),
                        call(|| (d.modify_header)(dmn, flags, sz, null_mut()))
                    );
                }
            }
            let mut data = [0u8; 16];
            let dp = data.as_mut_ptr().cast::<c_void>();
            for flags in 0..4 {
                for ty in 0..6 {
                    for (sz, p) in [(0, null_mut()), (16, null_mut()), (0, dp), (16, dp)] {
                        note!(
                            format!("{t} packet_reformat({flags}, {ty}, {sz}, {})", !p.is_null()),
                            call(|| (d.packet_reformat)(dmn, flags, ty, sz, p)),
                        );
                    }
                }
            }
            let drop = (d.drop)();
            let tag_a = (d.tag)(0x1234_5678);
            let miss = (d.default_miss)();
            let pop = (d.pop_vlan)();
            let mut actions = vec![drop, tag_a, miss, pop];
            for hdr in [0x8100_0005u32, 0x88a8_0000, 0x0800_0001, 0, 0x8100] {
                let mut a = null_mut();
                note!(
                    format!("{t} push_vlan({hdr:#x})"),
                    call(|| {
                        a = (d.push_vlan)(dmn, hdr.to_be());
                        a
                    })
                );
                actions.push(a);
            }
            note!(format!("{t} dest_ibv_qp(rc)"), call(|| (d.dest_ibv_qp)(eth.object())));
            let qp = (d.dest_ibv_qp)(raw.object());
            note!(format!("{t} dest_ibv_qp(raw)"), call(|| qp));
            actions.push(qp);
            note!(format!("{t} modify_aso"), call(|| (d.modify_aso)(drop, 0, 0, 0)));
            note!(format!("{t} modify_flow_meter"), call(|| (d.modify_flow_meter)(drop, meter.as_mut_ptr().cast(), 0)));

            let mut dq = DestAttr { kind: dr::DEST, dest: qp };
            let mut dm = DestAttr { kind: dr::DEST, dest: miss };
            let mut dd = DestAttr { kind: dr::DEST, dest: drop };
            let mut dt = DestAttr { kind: dr::DEST, dest: tag_a };
            let mut bad = DestAttr { kind: 5, dest: qp };
            let mut r1 = DestReformat { reformat: drop, dest: qp };
            let mut r2 = DestReformat { reformat: null_mut(), dest: miss };
            let mut dr1 = DestAttr { kind: dr::DEST_REFORMAT, dest: (&raw mut r1).cast() };
            let mut dr2 = DestAttr { kind: dr::DEST_REFORMAT, dest: (&raw mut r2).cast() };
            let (q, m, dd, dt, bad, dr1, dr2) =
                (&raw mut dq, &raw mut dm, &raw mut dd, &raw mut dt, &raw mut bad, &raw mut dr1, &raw mut dr2);
            let lists: Vec<(&str, Vec<*mut DestAttr>)> = vec![
                ("q", vec![q]),
                ("q bad", vec![q, bad]),
                ("bad q", vec![bad, q]),
                ("m bad", vec![m, bad]),
                ("q m", vec![q, m]),
                ("m q", vec![m, q]),
                ("q drop", vec![q, dd]),
                ("q tag", vec![q, dt]),
                ("q reformat", vec![q, dr1]),
                ("q reformat-null", vec![q, dr2]),
                ("q q", vec![q, q]),
                ("q q q", vec![q, q, q]),
            ];
            for (what, mut list) in lists {
                let n = list.len();
                note!(format!("{t} dest_array({what})"), call(|| (d.dest_array)(dmn, n, list.as_mut_ptr())));
            }
            for (what, act) in [("drop", drop), ("tag", tag_a), ("miss", miss), ("qp", qp)] {
                for (ratio, num) in [(1, 1), (0, 1), (1, 0)] {
                    let mut acts = [act];
                    let mut s = FlowSamplerAttr {
                        sample_ratio: ratio,
                        default_next_table: tbl,
                        num_sample_actions: num,
                        sample_actions: acts.as_mut_ptr(),
                        action: 0,
                    };
                    note!(format!("{t} sampler({what}, {ratio}, {num})"), call(|| (d.flow_sampler)(&mut s)));
                }
            }

            (d.allow_duplicate_rules)(dmn, false);
            (d.set_reclaim_device_memory)(dmn, true);
            log.push(dump(|f| (d.dump_domain)(f, dmn), &format!("{tag}-{t}-domain")));
            (d.allow_duplicate_rules)(dmn, true);
            log.push(dump(|f| (d.dump_table)(f, tbl2), &format!("{tag}-{t}-table")));
            note!(format!("{t} dump_domain(NULL)"), call(|| (d.dump_domain)(null_mut(), dmn)));

            note!(format!("{t} domain_destroy(busy)"), call(|| (d.domain_destroy)(dmn)));
            for (i, a) in actions.into_iter().enumerate() {
                if !a.is_null() {
                    note!(format!("{t} action_destroy({i})"), call(|| (d.action_destroy)(a)));
                }
            }
            note!(format!("{t} table_destroy"), call(|| (d.table_destroy)(tbl)));
            note!(format!("{t} table_destroy"), call(|| (d.table_destroy)(tbl2)));
            note!(format!("{t} domain_destroy"), call(|| (d.domain_destroy)(dmn)));
        }
    }
    log
}

/// What `f` writes to a file, with the table addresses (the second field of a 3100 record)
/// blanked, and its result.
fn dump(f: impl FnOnce(*mut libc::FILE) -> c_int, name: &str) -> String {
    let path = std::env::temp_dir().join(format!("softhca-vendor-{}-{name}", std::process::id()));
    let c = CString::new(path.to_str().unwrap()).unwrap();
    // SAFETY: fopen/fclose of a file of our own.
    let ret = unsafe {
        let file = libc::fopen(c.as_ptr(), c"w".as_ptr());
        assert!(!file.is_null());
        let ret = f(file);
        libc::fclose(file);
        ret
    };
    let text = std::fs::read_to_string(&path).unwrap();
    let _ = std::fs::remove_file(&path);
    let text: Vec<String> = text
        .lines()
        .map(|l| match l.strip_prefix("3100,") {
            Some(rest) => format!("3100,TABLE,{}", rest.split_once(',').map_or("", |(_, r)| r)),
            None => l.to_string(),
        })
        .collect();
    format!("dump returned {ret}:\n{}", text.join("\n"))
}

/// The whole software-steering scenario through both implementations; the transcripts must
/// be the same line for line (`SOFTHCA_VENDOR_TRANSCRIPT=1` prints rdma-core's).
#[test]
fn software_steering_answers_and_dumps_as_rdma_cores_on_a_foreign_device() {
    let Some(l) = libs() else { return };
    // SAFETY: the real library's functions have the prototypes Dr declares.
    let (theirs, ours) = unsafe { (scenario(&Dr::real(l.mlx5), "real"), scenario(&Dr::ours(), "ours")) };
    if std::env::var_os("SOFTHCA_VENDOR_TRANSCRIPT").is_some() {
        eprintln!("{}", theirs.join("\n"));
    }
    assert_eq!(theirs.len(), ours.len());
    for (t, o) in theirs.iter().zip(&ours) {
        assert_eq!(o, t, "ours vs rdma-core's");
    }
}
