//! The answers of the vendor functions, called directly (through the rlib) with NULL,
//! foreign and made-up arguments: the return values and errno rdma-core 44's functions give
//! for a device, context or object that is not an mlx5 (EFA) one, and the software-steering
//! objects that exist even then. `tests/against_rdma_core.rs` compares the same calls with
//! the real libraries where they are installed; these expectations hold everywhere.

mod common;

use std::ffi::{c_int, c_void, CString};
use std::mem::offset_of;
use std::process::Command;
use std::ptr::{null, null_mut};

use common::fake::*;
use common::*;
use libc::{EBUSY, EINVAL, ENOENT, EOPNOTSUPP};
use softhca_vendor::dr::{self, ActionKind, DestAttr, DestReformat, FlowSamplerAttr};
use softhca_vendor::vfio::VfioContextAttr;
use softhca_vendor::{abi, efa, mlx5, vfio};

/// A call to check, with its name.
type Named<'a, T> = (&'a str, Box<dyn Fn() -> T + 'a>);

/// Runs `f` with errno preset to [`UNTOUCHED`]; returns its result and errno after it.
fn call<T>(f: impl FnOnce() -> T) -> (T, c_int) {
    set_errno(UNTOUCHED);
    let r = f();
    (r, errno())
}

/// A pointer-returning call: NULL, with errno `e`.
fn fails_with<T>(e: c_int, what: &str, f: impl FnOnce() -> *mut T) {
    let (p, err) = call(f);
    assert!(p.is_null(), "{what} returned an object");
    assert_eq!(err, e, "{what}: errno");
}

/// An int-returning call: returns `r` and leaves errno at `e`.
fn returns(r: c_int, e: c_int, what: &str, f: impl FnOnce() -> c_int) {
    assert_eq!(call(f), (r, e), "{what}: (return, errno)");
}

#[test]
fn the_layouts_abi_rs_hardcodes_are_the_system_headers() {
    let headers = ["/usr/include/infiniband/verbs.h", "/usr/include/infiniband/mlx5dv.h"];
    if !(tool("cc") && have(headers.iter().all(|h| std::path::Path::new(h).exists()), "verbs.h, mlx5dv.h")) {
        return;
    }
    let exe = std::env::temp_dir().join(format!("softhca-vendor-layout-{}", std::process::id()));
    let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/c/layout.c");
    let out = Command::new("cc").arg("-o").arg(&exe).arg(&src).output().unwrap();
    assert!(out.status.success(), "compiling layout.c: {}", String::from_utf8_lossy(&out.stderr));
    let c = String::from_utf8(Command::new(&exe).output().unwrap().stdout).unwrap();
    let _ = std::fs::remove_file(&exe);
    let mut rust = abi::layout_report();
    for (name, value) in [
        ("flow_sampler_attr.sample_ratio", offset_of!(FlowSamplerAttr, sample_ratio)),
        ("flow_sampler_attr.default_next_table", offset_of!(FlowSamplerAttr, default_next_table)),
        ("flow_sampler_attr.num_sample_actions", offset_of!(FlowSamplerAttr, num_sample_actions)),
        ("flow_sampler_attr.sample_actions", offset_of!(FlowSamplerAttr, sample_actions)),
        ("sizeof(flow_sampler_attr)", size_of::<FlowSamplerAttr>()),
        ("flow_meter_attr.next_table", 0),
        ("dest_attr.type", offset_of!(DestAttr, kind)),
        ("dest_attr.dest", offset_of!(DestAttr, dest)),
        ("dest_attr.dest_reformat", offset_of!(DestAttr, dest)),
        ("dest_reformat.reformat", offset_of!(DestReformat, reformat)),
        ("dest_reformat.dest", offset_of!(DestReformat, dest)),
        ("vfio_context_attr.pci_name", offset_of!(VfioContextAttr, pci_name)),
        ("vfio_context_attr.flags", offset_of!(VfioContextAttr, flags)),
        ("vfio_context_attr.comp_mask", offset_of!(VfioContextAttr, comp_mask)),
        ("MLX5DV_DR_DOMAIN_TYPE_FDB", dr::DOMAIN_TYPE_FDB as usize),
        ("MLX5DV_DR_ACTION_FLAGS_ROOT_LEVEL", dr::ACTION_FLAGS_ROOT_LEVEL as usize),
        ("MLX5DV_DR_ACTION_DEST_REFORMAT", dr::DEST_REFORMAT as usize),
        ("MLX5DV_OBJ_QP|CQ|SRQ|RWQ|DM|AH|PD", mlx5::MLX5DV_OBJ_ALL as usize),
        ("MLX5DV_VFIO_CTX_FLAGS_INIT_LINK_DOWN", vfio::VFIO_FLAGS_ALL as usize),
    ] {
        rust += &format!("{name} {value}\n");
    }
    assert_eq!(c, rust);
}

/// The dispatchers on a foreign context or verbs object, as rdma-core's fail when the
/// context has no mlx5 operations table.
#[test]
fn mlx5_dispatchers_answer_eopnotsupp_for_a_foreign_context() {
    let f = Fake::new(Port::Ethernet, 2);
    let (ctx, obj) = (f.ctx(), f.object());
    // SAFETY (all calls below): the arguments are a live fake context and object, or NULL
    // where the answer does not depend on them.
    unsafe {
        assert!(!mlx5::mlx5dv_is_supported(f.device()));
        fails_with(EOPNOTSUPP, "open_device", || mlx5::mlx5dv_open_device(f.device(), null_mut()));
        let ints: Vec<Named<'_, c_int>> = vec![
            ("query_device", Box::new(|| mlx5::mlx5dv_query_device(ctx, null_mut()))),
            ("_query_port", Box::new(|| mlx5::_mlx5dv_query_port(ctx, 1, null_mut(), 0))),
            ("set_context_attr", Box::new(|| mlx5::mlx5dv_set_context_attr(ctx, 0, null_mut()))),
            ("get_clock_info", Box::new(|| mlx5::mlx5dv_get_clock_info(ctx, null_mut()))),
            ("devx_general_cmd", Box::new(|| mlx5::mlx5dv_devx_general_cmd(ctx, null(), 0, null_mut(), 0))),
            ("devx_query_eqn", Box::new(|| mlx5::mlx5dv_devx_query_eqn(ctx, 0, null_mut()))),
            ("devx_qp_modify", Box::new(|| mlx5::mlx5dv_devx_qp_modify(obj, null(), 0, null_mut(), 0))),
            ("devx_cq_query", Box::new(|| mlx5::mlx5dv_devx_cq_query(obj, null(), 0, null_mut(), 0))),
            ("modify_qp_lag_port", Box::new(|| mlx5::mlx5dv_modify_qp_lag_port(obj, 1))),
            ("modify_qp_udp_sport", Box::new(|| mlx5::mlx5dv_modify_qp_udp_sport(obj, 4791))),
            ("map_ah_to_qp", Box::new(|| mlx5::mlx5dv_map_ah_to_qp(obj, 1))),
            ("dci_stream_id_reset", Box::new(|| mlx5::mlx5dv_dci_stream_id_reset(obj, 0))),
            ("reserved_qpn_alloc", Box::new(|| mlx5::mlx5dv_reserved_qpn_alloc(ctx, null_mut()))),
            ("crypto_login", Box::new(|| mlx5::mlx5dv_crypto_login(ctx, null_mut()))),
            ("devx_obj_destroy", Box::new(|| mlx5::mlx5dv_devx_obj_destroy(null_mut()))),
            ("destroy_mkey", Box::new(|| mlx5::mlx5dv_destroy_mkey(null_mut()))),
            ("sched_node_destroy", Box::new(|| mlx5::mlx5dv_sched_node_destroy(null_mut()))),
            ("vfio_process_events", Box::new(|| vfio::mlx5dv_vfio_process_events(ctx))),
        ];
        for (what, f) in ints {
            returns(EOPNOTSUPP, UNTOUCHED, what, f);
        }
        let ptrs: Vec<Named<'_, *mut c_void>> = vec![
            ("create_cq", Box::new(|| mlx5::mlx5dv_create_cq(ctx, null_mut(), null_mut()))),
            ("create_qp", Box::new(|| mlx5::mlx5dv_create_qp(ctx, null_mut(), null_mut()))),
            ("create_wq", Box::new(|| mlx5::mlx5dv_create_wq(ctx, null_mut(), null_mut()))),
            ("alloc_dm", Box::new(|| mlx5::mlx5dv_alloc_dm(ctx, null_mut(), null_mut()))),
            ("dm_map_op_addr", Box::new(|| mlx5::mlx5dv_dm_map_op_addr(obj, 0))),
            ("create_flow_matcher", Box::new(|| mlx5::mlx5dv_create_flow_matcher(ctx, null_mut()))),
            ("devx_obj_create", Box::new(|| mlx5::mlx5dv_devx_obj_create(ctx, null(), 0, null_mut(), 0))),
            ("devx_alloc_uar", Box::new(|| mlx5::mlx5dv_devx_alloc_uar(ctx, 0))),
            ("devx_umem_reg", Box::new(|| mlx5::mlx5dv_devx_umem_reg(ctx, null_mut(), 0, 0))),
            ("devx_create_event_channel", Box::new(|| mlx5::mlx5dv_devx_create_event_channel(ctx, 0))),
            ("create_mkey", Box::new(|| mlx5::mlx5dv_create_mkey(f.mkey_attr()))),
            ("alloc_var", Box::new(|| mlx5::mlx5dv_alloc_var(ctx, 0))),
            ("pp_alloc", Box::new(|| mlx5::mlx5dv_pp_alloc(ctx, 0, null(), 0))),
            ("sched_leaf_create", Box::new(|| mlx5::mlx5dv_sched_leaf_create(ctx, null()))),
            ("dek_create", Box::new(|| mlx5::mlx5dv_dek_create(ctx, null_mut()))),
            ("crypto_login_create", Box::new(|| mlx5::mlx5dv_crypto_login_create(ctx, null_mut()))),
            ("create_steering_anchor", Box::new(|| mlx5::mlx5dv_create_steering_anchor(ctx, null_mut()))),
        ];
        for (what, f) in ptrs {
            fails_with(EOPNOTSUPP, what, f);
        }
        // The void ones do nothing, errno included.
        assert_eq!(call(|| mlx5::mlx5dv_devx_free_uar(null_mut())).1, UNTOUCHED);
        assert_eq!(call(|| mlx5::mlx5dv_free_var(null_mut())).1, UNTOUCHED);
        assert_eq!(call(|| mlx5::mlx5dv_devx_destroy_cmd_comp(null_mut())).1, UNTOUCHED);
    }
}

/// The functions rdma-core does not guard with a context check, each with its own answer.
#[test]
fn mlx5_unguarded_functions_answer_without_touching_their_arguments() {
    let f = Fake::new(Port::Ethernet, 2);
    // SAFETY: as above; none of these reads its pointer arguments.
    unsafe {
        // init_obj: no known type is EINVAL (no context to look at), any known one EOPNOTSUPP.
        returns(EINVAL, UNTOUCHED, "init_obj(0)", || mlx5::mlx5dv_init_obj(f.dv_obj(), 0));
        returns(EINVAL, UNTOUCHED, "init_obj(1<<7)", || mlx5::mlx5dv_init_obj(f.dv_obj(), 1 << 7));
        for t in 0..7 {
            returns(EOPNOTSUPP, UNTOUCHED, "init_obj", || mlx5::mlx5dv_init_obj(f.dv_obj(), 1 << t));
            returns(EOPNOTSUPP, UNTOUCHED, "init_obj 1.0", || {
                mlx5::softhca_vendor_mlx5dv_init_obj_1_0(f.dv_obj(), 1 << t)
            });
        }
        // Pure pointer arithmetic in rdma-core: NULL here, errno untouched.
        assert_eq!(call(|| mlx5::mlx5dv_qp_ex_from_ibv_qp_ex(f.object())), (null_mut(), UNTOUCHED));
        assert_eq!(call(|| efa::efadv_cq_from_ibv_cq_ex(f.object())), (null_mut(), UNTOUCHED));
        // Negated, as its successes are counts.
        returns(-EOPNOTSUPP, UNTOUCHED, "qp_cancel_posted_send_wrs", || {
            mlx5::mlx5dv_qp_cancel_posted_send_wrs(null_mut(), 1)
        });
        returns(EINVAL, UNTOUCHED, "_mkey_check", || mlx5::_mlx5dv_mkey_check(null_mut(), null_mut(), 0));
        returns(EOPNOTSUPP, UNTOUCHED, "devx_get_async_cmd_comp", || {
            mlx5::mlx5dv_devx_get_async_cmd_comp(null_mut(), null_mut(), 0)
        });
        assert_eq!(call(|| mlx5::mlx5dv_devx_get_event(null_mut(), null_mut(), 64)), (-1, EOPNOTSUPP));
        assert_eq!(call(|| vfio::mlx5dv_vfio_get_events_fd(f.ctx())), (-1, EOPNOTSUPP));
    }
}

#[test]
fn efa_functions_refuse_a_foreign_device() {
    let f = Fake::new(Port::Ethernet, 2);
    let mut attr = [0xa5u8; 64];
    // SAFETY: a live fake context and object; attribute buffers large enough.
    unsafe {
        // Return codes, errno untouched, nothing written.
        returns(EOPNOTSUPP, UNTOUCHED, "query_device", || {
            efa::efadv_query_device(f.ctx(), attr.as_mut_ptr().cast(), 64)
        });
        returns(EOPNOTSUPP, UNTOUCHED, "query_ah", || efa::efadv_query_ah(f.object(), attr.as_mut_ptr().cast(), 64));
        assert!(attr.iter().all(|&b| b == 0xa5));
        fails_with(EOPNOTSUPP, "create_cq", || efa::efadv_create_cq(f.ctx(), null_mut(), null_mut(), 0));
        fails_with(EOPNOTSUPP, "create_qp_ex", || efa::efadv_create_qp_ex(f.ctx(), null_mut(), null_mut(), 0));
        fails_with(EOPNOTSUPP, "create_driver_qp", || efa::efadv_create_driver_qp(f.object(), null_mut(), 0));
    }
}

#[test]
fn the_vfio_device_list_fails_as_the_lookup_fails() {
    let list = |name: &str, flags: u32, comp_mask: u64| {
        let name = CString::new(name).unwrap();
        let mut attr = VfioContextAttr { pci_name: name.as_ptr(), flags, comp_mask };
        // SAFETY: a readable attribute with a NUL-terminated name.
        call(|| unsafe { vfio::mlx5dv_get_vfio_device_list(&mut attr) })
    };
    assert_eq!(list("0000:00:00.0", 0, 1), (null_mut(), EOPNOTSUPP));
    assert_eq!(list("0000:00:00.0", 2, 0), (null_mut(), EOPNOTSUPP));
    // A name that does not parse: NULL, and errno is whatever it was.
    assert_eq!(list("not-a-pci-name", 1, 0), (null_mut(), UNTOUCHED));
    // A function that does not exist: stat's ENOENT.
    assert_eq!(list("ffff:ff:1f.7", 0, 0), (null_mut(), ENOENT));
    // SAFETY: NULL is refused before anything is read.
    assert_eq!(call(|| unsafe { vfio::mlx5dv_get_vfio_device_list(null_mut()) }), (null_mut(), EINVAL));
}

/// The software-steering objects rdma-core creates on a foreign Ethernet device, and what
/// fails around them.
#[test]
fn a_root_level_domain_exists_on_a_foreign_ethernet_device() {
    let f = Fake::new(Port::Ethernet, 2);
    let raw = Fake::new(Port::Ethernet, abi::QPT_RAW_PACKET);
    // SAFETY: live fake contexts and QPs; the DR objects are this library's own.
    unsafe {
        fails_with(EINVAL, "domain type 3", || dr::mlx5dv_dr_domain_create(f.ctx(), 3));
        fails_with(EINVAL, "domain on NULL", || dr::mlx5dv_dr_domain_create(null_mut(), 0));
        let ib = Fake::new(Port::InfiniBand, 2);
        fails_with(EOPNOTSUPP, "domain on InfiniBand", || dr::mlx5dv_dr_domain_create(ib.ctx(), 0));
        let broken = Fake::new(Port::Fails, 2);
        fails_with(libc::ENODEV, "domain, query_port failing", || dr::mlx5dv_dr_domain_create(broken.ctx(), 0));

        let (dmn, err) = call(|| dr::mlx5dv_dr_domain_create(f.ctx(), dr::DOMAIN_TYPE_NIC_RX));
        assert!(!dmn.is_null());
        assert_eq!(err, UNTOUCHED);
        returns(EOPNOTSUPP, EOPNOTSUPP, "domain_sync", || dr::mlx5dv_dr_domain_sync(dmn, 1));
        fails_with(EOPNOTSUPP, "table level 1", || dr::mlx5dv_dr_table_create(dmn, 1));
        let tbl = dr::mlx5dv_dr_table_create(dmn, 0);
        assert!(!tbl.is_null());
        returns(EBUSY, UNTOUCHED, "domain_destroy with a table", || dr::mlx5dv_dr_domain_destroy(dmn));
        fails_with(EOPNOTSUPP, "matcher on a root table", || dr::mlx5dv_dr_matcher_create(tbl, 0, 0, null_mut()));
        fails_with(EINVAL, "dest_table(root)", || dr::mlx5dv_dr_action_create_dest_table(tbl));
        fails_with(EOPNOTSUPP, "dest_root_table", || dr::mlx5dv_dr_action_create_dest_root_table(tbl, 0));
        fails_with(EOPNOTSUPP, "dest_vport", || dr::mlx5dv_dr_action_create_dest_vport(dmn, 1));
        fails_with(EOPNOTSUPP, "aso", || dr::mlx5dv_dr_action_create_aso(dmn, null_mut(), 0, 0, 0));
        let mut meter = [tbl, null_mut(), null_mut(), null_mut()];
        fails_with(EOPNOTSUPP, "flow_meter", || dr::mlx5dv_dr_action_create_flow_meter(meter.as_mut_ptr().cast()));

        // Device-independent actions.
        let drop = dr::mlx5dv_dr_action_create_drop();
        let tag = dr::mlx5dv_dr_action_create_tag(0x1234_5678);
        let miss = dr::mlx5dv_dr_action_create_default_miss();
        let pop = dr::mlx5dv_dr_action_create_pop_vlan();
        let push = dr::mlx5dv_dr_action_create_push_vlan(null_mut(), 0x8100_0005u32.to_be());
        assert_eq!(dr::action_kind(drop), Some(ActionKind::Drop));
        assert_eq!(dr::action_kind(tag), Some(ActionKind::Tag(0x34_5678)));
        assert_eq!(dr::action_kind(miss), Some(ActionKind::DefaultMiss));
        assert_eq!(dr::action_kind(pop), Some(ActionKind::PopVlan));
        assert_eq!(dr::action_kind(push), Some(ActionKind::PushVlan(0x8100_0005)));
        fails_with(EINVAL, "push_vlan 0x0800", || dr::mlx5dv_dr_action_create_push_vlan(dmn, 0x0800_0005u32.to_be()));
        fails_with(EINVAL, "dest_ibv_qp(RC)", || dr::mlx5dv_dr_action_create_dest_ibv_qp(f.object()));
        let qp = dr::mlx5dv_dr_action_create_dest_ibv_qp(raw.object());
        assert_eq!(dr::action_kind(qp), Some(ActionKind::DestQp(raw.object() as usize)));
        returns(EINVAL, EINVAL, "modify_aso", || dr::mlx5dv_dr_action_modify_aso(drop, 0, 0, 0));
        returns(EINVAL, EINVAL, "modify_flow_meter", || dr::mlx5dv_dr_action_modify_flow_meter(drop, null_mut(), 0));

        // Root-level modify-header and reformat actions would be mlx5 flow actions.
        let mh = |flags, sz| dr::mlx5dv_dr_action_create_modify_header(dmn, flags, sz, null_mut());
        fails_with(EINVAL, "modify_header flags", || mh(2, 8));
        fails_with(EINVAL, "modify_header size", || mh(1, 12));
        fails_with(EOPNOTSUPP, "modify_header non-root", || mh(0, 8));
        fails_with(EOPNOTSUPP, "modify_header root", || mh(1, 8));
        let mut data = [0u8; 16];
        let d = data.as_mut_ptr().cast::<c_void>();
        let pr = |flags, ty, sz, data| dr::mlx5dv_dr_action_create_packet_reformat(dmn, flags, ty, sz, data);
        fails_with(EINVAL, "reformat flags", || pr(3, 0, 16, d));
        fails_with(EOPNOTSUPP, "reformat non-root", || pr(0, 0, 16, d));
        fails_with(EINVAL, "reformat data without size", || pr(1, 0, 0, d));
        fails_with(EINVAL, "reformat type 4", || pr(1, 4, 16, d));
        fails_with(EINVAL, "reformat encap on RX", || pr(1, 1, 16, d));
        fails_with(EOPNOTSUPP, "reformat decap on RX", || pr(1, 0, 16, d));

        // Destination arrays and samplers would be DevX flow tables.
        let mut a = DestAttr { kind: dr::DEST, dest: miss };
        let mut b = DestAttr { kind: dr::DEST, dest: qp };
        let mut bad = DestAttr { kind: 7, dest: qp };
        let mut r = DestReformat { reformat: drop, dest: qp };
        let mut c = DestAttr { kind: dr::DEST_REFORMAT, dest: (&raw mut r).cast() };
        let mut e = DestAttr { kind: dr::DEST, dest: drop };
        let arr = |list: &mut [*mut DestAttr]| {
            let n = list.len();
            call(|| dr::mlx5dv_dr_action_create_dest_array(dmn, n, list.as_mut_ptr()))
        };
        assert_eq!(arr(&mut [&raw mut b]), (null_mut(), EINVAL), "one destination");
        assert_eq!(arr(&mut [&raw mut b, &raw mut bad]), (null_mut(), EINVAL), "bad type");
        assert_eq!(arr(&mut [&raw mut a, &raw mut bad]), (null_mut(), EOPNOTSUPP), "miss outside FDB");
        assert_eq!(arr(&mut [&raw mut b, &raw mut e]), (null_mut(), EOPNOTSUPP), "drop destination");
        assert_eq!(arr(&mut [&raw mut b, &raw mut c]), (null_mut(), EOPNOTSUPP), "with a reformat");
        assert_eq!(arr(&mut [&raw mut b, &raw mut b]), (null_mut(), EOPNOTSUPP), "two QPs");
        // A count no allocation holds is ENOMEM before the array is read (rdma-core allocates
        // a record per destination first); it read past the two-entry array before.
        let mut two = [&raw mut b, &raw mut b];
        let huge = || dr::mlx5dv_dr_action_create_dest_array(dmn, usize::MAX, two.as_mut_ptr());
        assert_eq!(call(huge), (null_mut(), libc::ENOMEM), "a count past any allocation");
        let mut acts = [drop];
        let mut s = FlowSamplerAttr {
            sample_ratio: 1,
            default_next_table: tbl,
            num_sample_actions: 1,
            sample_actions: acts.as_mut_ptr(),
            action: 0,
        };
        fails_with(EOPNOTSUPP, "sampler", || dr::mlx5dv_dr_action_create_flow_sampler(&mut s));
        s.sample_ratio = 0;
        fails_with(EINVAL, "sampler ratio 0", || dr::mlx5dv_dr_action_create_flow_sampler(&mut s));

        for act in [drop, tag, miss, pop, push, qp] {
            returns(0, UNTOUCHED, "action_destroy", || dr::mlx5dv_dr_action_destroy(act));
        }
        returns(EINVAL, UNTOUCHED, "action_destroy twice", || dr::mlx5dv_dr_action_destroy(drop));
        returns(0, UNTOUCHED, "table_destroy", || dr::mlx5dv_dr_table_destroy(tbl));
        returns(0, UNTOUCHED, "domain_destroy", || dr::mlx5dv_dr_domain_destroy(dmn));
        returns(EINVAL, UNTOUCHED, "domain_destroy twice", || dr::mlx5dv_dr_domain_destroy(dmn));
    }
}

/// What is not a live object of this library is refused, never read; matchers and rules,
/// which cannot be created here, never are.
#[test]
fn dr_functions_refuse_what_they_did_not_create() {
    let mut junk = [0xffu8; 256];
    let j = junk.as_mut_ptr().cast::<c_void>();
    // SAFETY: none of these reads a pointer that is not a live object of the library.
    unsafe {
        for p in [null_mut(), j] {
            fails_with(EINVAL, "table_create", || dr::mlx5dv_dr_table_create(p, 0));
            fails_with(EINVAL, "matcher_create", || dr::mlx5dv_dr_matcher_create(p, 0, 0, null_mut()));
            fails_with(EINVAL, "rule_create", || dr::mlx5dv_dr_rule_create(p, null_mut(), 0, null_mut()));
            fails_with(EINVAL, "dest_devx_tir", || dr::mlx5dv_dr_action_create_dest_devx_tir(p));
            fails_with(EINVAL, "flow_counter", || dr::mlx5dv_dr_action_create_flow_counter(p, 0));
            returns(EINVAL, UNTOUCHED, "domain_destroy", || dr::mlx5dv_dr_domain_destroy(p));
            returns(EINVAL, UNTOUCHED, "table_destroy", || dr::mlx5dv_dr_table_destroy(p));
            returns(EINVAL, UNTOUCHED, "action_destroy", || dr::mlx5dv_dr_action_destroy(p));
            returns(EINVAL, UNTOUCHED, "matcher_destroy", || dr::mlx5dv_dr_matcher_destroy(p));
            returns(EINVAL, UNTOUCHED, "rule_destroy", || dr::mlx5dv_dr_rule_destroy(p));
            returns(EINVAL, EINVAL, "domain_sync", || dr::mlx5dv_dr_domain_sync(p, 0));
            returns(EINVAL, EINVAL, "matcher_set_layout", || dr::mlx5dv_dr_matcher_set_layout(p, null_mut()));
            returns(EOPNOTSUPP, EOPNOTSUPP, "aso link", || dr::mlx5dv_dr_aso_other_domain_link(p, p, p, 0, 0));
            returns(EOPNOTSUPP, EOPNOTSUPP, "aso unlink", || dr::mlx5dv_dr_aso_other_domain_unlink(p, p));
            returns(-EINVAL, UNTOUCHED, "dump_dr_domain", || dr::mlx5dv_dump_dr_domain(null_mut(), p));
            returns(-EINVAL, UNTOUCHED, "dump_dr_rule", || dr::mlx5dv_dump_dr_rule(null_mut(), p));
            dr::mlx5dv_dr_domain_allow_duplicate_rules(p, false);
        }
        fails_with(EINVAL, "dest_ibv_qp(NULL)", || dr::mlx5dv_dr_action_create_dest_ibv_qp(null_mut()));
        fails_with(EINVAL, "flow_sampler(NULL)", || dr::mlx5dv_dr_action_create_flow_sampler(null_mut()));
    }
    assert!(junk.iter().all(|&b| b == 0xff));
}

/// The dump records, in rdma-core's format: the domain with its flags, then its root tables.
#[test]
fn the_domain_dump_is_rdma_cores_format() {
    let f = Fake::new(Port::Ethernet, 2);
    let path = std::env::temp_dir().join(format!("softhca-vendor-dump-{}", std::process::id()));
    let cpath = CString::new(path.to_str().unwrap()).unwrap();
    // SAFETY: a live fake context; fopen/fclose on a path of our own.
    let (text, tbl, id) = unsafe {
        let dmn = dr::mlx5dv_dr_domain_create(f.ctx(), dr::DOMAIN_TYPE_FDB);
        let tbl = dr::mlx5dv_dr_table_create(dmn, 0);
        dr::mlx5dv_dr_domain_allow_duplicate_rules(dmn, false);
        dr::mlx5dv_dr_domain_set_reclaim_device_memory(dmn, true);
        dr::mlx5dv_dr_domain_allow_duplicate_rules(dmn, true);
        let out = libc::fopen(cpath.as_ptr(), c"w".as_ptr());
        assert!(!out.is_null());
        assert_eq!(dr::mlx5dv_dump_dr_domain(out, dmn), 0);
        assert_eq!(dr::mlx5dv_dump_dr_table(out, tbl), 0);
        libc::fclose(out);
        assert_eq!(dr::mlx5dv_dr_table_destroy(tbl), 0);
        assert_eq!(dr::mlx5dv_dr_domain_destroy(dmn), 0);
        let id = (std::process::id() << 8) | dr::DOMAIN_TYPE_FDB;
        (std::fs::read_to_string(&path).unwrap(), tbl as usize, id)
    };
    let _ = std::fs::remove_file(&path);
    let domain = format!(
        "3000,0x{id:x},2,00,0,44.0,{DEV_NAME},1,0,0,0\n\
         3002,0x{id:x},0,{FW_VER},0\n\
         3004,0x{id:x},0x0,0x0,0x0,0x0,0,0\n\
         3001,0x{id:x},icmp_dw0,0x0\n\
         3001,0x{id:x},icmp_dw1,0x0\n\
         3001,0x{id:x},icmpv6_dw0,0x0\n\
         3001,0x{id:x},icmpv6_dw1,0x0\n"
    );
    let table = format!("3100,0x{tbl:x},0x{id:x},0,0\n");
    assert_eq!(text, format!("{domain}{table}{domain}{table}"));
}

/// A context that is not extended makes the queries fall back to libibverbs' exported
/// functions; a test process has no libibverbs, so the domain fails, errno untouched.
#[test]
fn a_legacy_context_queries_through_the_exported_functions() {
    let f = Fake::legacy();
    // SAFETY: a live fake context.
    let (p, err) = call(|| unsafe { dr::mlx5dv_dr_domain_create(f.ctx(), 0) });
    assert!(p.is_null());
    assert_eq!(err, UNTOUCHED);
}
