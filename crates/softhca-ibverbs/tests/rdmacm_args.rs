//! Event channels destroyed under the ids that use them, and events acknowledged twice,
//! through the drop-in's rdma_cm C ABI (`softhca_rdma_*`, what `librdmacm.so.1` forwards to),
//! in process: each case freed memory twice or read through a null pointer before. librdmacm
//! 44 misbehaves the same way here (a double free, a read of freed memory); the drop-in
//! answers instead.

use std::ffi::c_int;
use std::ptr::null_mut;

use softhca_ibverbs::abi::*;
use softhca_ibverbs::rdmacm::abi::*;

#[path = "common/fuzz.rs"]
#[allow(dead_code)]
mod fuzz;
use fuzz::Watchdog;

extern "C" {
    fn ibv_query_qp(qp: *mut ibv_qp, attr: *mut ibv_qp_attr, mask: c_int, init: *mut ibv_qp_init_attr) -> c_int;
    fn ibv_alloc_pd(context: *mut ibv_context) -> *mut ibv_pd;
    fn ibv_dealloc_pd(pd: *mut ibv_pd) -> c_int;
    fn ibv_create_cq(
        context: *mut ibv_context,
        cqe: c_int,
        cq_context: *mut std::ffi::c_void,
        channel: *mut std::ffi::c_void,
        comp_vector: c_int,
    ) -> *mut ibv_cq;
    fn ibv_destroy_cq(cq: *mut ibv_cq) -> c_int;
    fn ibv_create_comp_channel(context: *mut ibv_context) -> *mut std::ffi::c_void;
    fn ibv_destroy_comp_channel(channel: *mut std::ffi::c_void) -> c_int;
}

/// `ibv_qp_state`'s IBV_QPS_ERR.
const IBV_QPS_ERR: c_int = 6;

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

/// Destroying a channel that ids are still on ends them as the kernel's `ucma_close` ends its
/// contexts: a listener's port is free at once for another id, and the ids can still be
/// destroyed. Before, the ids kept their ports, and a listener took requests nobody saw.
#[test]
fn destroying_a_channel_ends_the_ids_on_it() {
    // SAFETY: the library's own objects, each destroyed once by the program; local sockaddrs.
    unsafe {
        let (ch, ch2) = (softhca_rdma_create_event_channel(), softhca_rdma_create_event_channel());
        let (mut l, mut l2) = (null_mut(), null_mut());
        assert_eq!(softhca_rdma_create_id(ch, &mut l, null_mut(), RDMA_PS_TCP), 0);
        assert_eq!(softhca_rdma_create_id(ch2, &mut l2, null_mut(), RDMA_PS_TCP), 0);
        let mut a = sin([127, 0, 0, 178], 7395);
        assert_eq!(softhca_rdma_bind_addr(l, (&raw mut a).cast()), 0, "bind: {}", errno());
        assert_eq!(softhca_rdma_listen(l, 4), 0);
        assert_eq!((softhca_rdma_bind_addr(l2, (&raw mut a).cast()), errno()), (-1, libc::EADDRINUSE));
        softhca_rdma_destroy_event_channel(ch);
        assert_eq!(softhca_rdma_bind_addr(l2, (&raw mut a).cast()), 0, "the port is free: {}", errno());
        assert_eq!(softhca_rdma_listen(l2, 4), 0);
        assert_eq!(softhca_rdma_destroy_id(l), 0);
        assert_eq!(softhca_rdma_destroy_id(l2), 0);
        softhca_rdma_destroy_event_channel(ch2);
    }
}

/// An event is acknowledged once: a second `rdma_ack_cm_event`, or one of a pointer the
/// library never handed out, is -1 with EINVAL. Before, the second freed the event again.
#[test]
fn an_event_is_acknowledged_once() {
    device_on_178();
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

/// An address of a family librdmacm does not know is EINVAL (`ucma_addrlen` is 0), for
/// `rdma_bind_addr` and for `rdma_resolve_addr`'s source alike. Before, bind gave EAFNOSUPPORT
/// and resolve took the address for NULL.
#[test]
fn an_unknown_family_is_einval() {
    // SAFETY: the library's own objects, each destroyed once by the program; local sockaddrs.
    unsafe {
        let ch = softhca_rdma_create_event_channel();
        let mut id = null_mut();
        assert_eq!(softhca_rdma_create_id(ch, &mut id, null_mut(), RDMA_PS_TCP), 0);
        let mut odd = sin([127, 0, 0, 1], 7471);
        odd.sin_family = 77;
        assert_eq!((softhca_rdma_bind_addr(id, (&raw mut odd).cast()), errno()), (-1, libc::EINVAL), "bind");
        let mut dst = sin([127, 0, 0, 1], 7471);
        let r = softhca_rdma_resolve_addr(id, (&raw mut odd).cast(), (&raw mut dst).cast(), 2000);
        assert_eq!((r, errno()), (-1, libc::EINVAL), "resolve_addr with an unknown source family");
        assert_eq!(softhca_rdma_destroy_id(id), 0);
        softhca_rdma_destroy_event_channel(ch);
    }
}

/// `rdma_accept` whose private data is longer than a REP carries fails with EINVAL and, as
/// librdmacm's does when the kernel refuses the accept after it readied the QP, leaves the QP
/// in Error (`ucma_modify_qp_err`). Before, the QP stayed in RTS, connected to no one.
#[test]
fn a_refused_accept_leaves_its_qp_in_error() {
    let _dog = Watchdog::start("a_refused_accept_leaves_its_qp_in_error", 0);
    // SAFETY: the library's own objects, each destroyed once by the program; local parameters.
    unsafe {
        let e = Link::resolved(7391);
        e.client_qp();
        assert_eq!(softhca_rdma_connect(e.c, null_mut()), 0);
        let s = e.request();
        let mut attr = rc_init();
        assert_eq!(softhca_rdma_create_qp(s, null_mut(), &mut attr), 0);
        let data = [7u8; 255];
        let mut p: rdma_conn_param = std::mem::zeroed();
        p.private_data = data.as_ptr().cast();
        p.private_data_len = 255;
        p.responder_resources = RDMA_MAX_RESP_RES;
        p.initiator_depth = RDMA_MAX_INIT_DEPTH;
        assert_eq!((softhca_rdma_accept(s, &mut p), errno()), (-1, libc::EINVAL), "accept with 255 B");
        assert_eq!(qp_state((*s).qp), IBV_QPS_ERR, "the QP readied for the accept");
        e.end(s);
    }
}

/// The REQ's SRQ bit says whether the connecting QP has an SRQ, whatever `conn_param.srq`
/// says, as librdmacm's `rdma_connect` sets it (`id->qp ? !!id->qp->srq : conn_param->srq`).
/// Before, a parameter of 1 on a QP without an SRQ told the listener it had one.
#[test]
fn the_srq_bit_follows_the_qp() {
    let _dog = Watchdog::start("the_srq_bit_follows_the_qp", 0);
    // SAFETY: the library's own objects, each destroyed once by the program; local parameters.
    unsafe {
        let e = Link::resolved(7392);
        e.client_qp();
        let mut p = conn_param();
        p.srq = 1;
        assert_eq!(softhca_rdma_connect(e.c, &mut p), 0);
        let mut ev = null_mut();
        assert_eq!(softhca_rdma_get_cm_event(e.lch, &mut ev), 0);
        assert_eq!(((*ev).event, (*ev).param.conn.srq), (RDMA_CM_EVENT_CONNECT_REQUEST, 0));
        let s = (*ev).id;
        assert_eq!(softhca_rdma_ack_cm_event(ev), 0);
        e.end(s);
    }
}

/// `rdma_notify(IBV_EVENT_COMM_EST)` on a passive id whose REP went out and whose RTU has not
/// come (the active side never sends it here) establishes the connection at once, with its
/// ESTABLISHED event, as Linux's `cm_establish`; a second is EISCONN, and on an id with no
/// connection it is EINVAL. Before, it was a no-op returning 0 and the connection waited for
/// the RTU.
#[test]
fn notify_comm_est_establishes_a_connection_waiting_for_its_rtu() {
    const COMM_EST: c_int = 4;
    const PATH_MIG: c_int = 6;
    let _dog = Watchdog::start("notify_comm_est_establishes_a_connection_waiting_for_its_rtu", 0);
    // SAFETY: the library's own objects, each destroyed once by the program; local parameters.
    unsafe {
        let e = Link::resolved(7393);
        assert_eq!((softhca_rdma_notify(e.l, COMM_EST), errno()), (-1, libc::EINVAL), "a listener");
        let mut p = conn_param();
        p.qp_num = 0x1234; // no QP: the program sends the RTU itself, and never does here
        assert_eq!(softhca_rdma_connect(e.c, &mut p), 0);
        let s = e.request();
        p.qp_num = 0x5678;
        assert_eq!(softhca_rdma_accept(s, &mut p), 0, "{}", errno());
        expect(e.cch, RDMA_CM_EVENT_CONNECT_RESPONSE);
        assert_eq!((softhca_rdma_notify(s, PATH_MIG), errno()), (-1, libc::EINVAL), "not established yet");
        assert_eq!(softhca_rdma_notify(s, COMM_EST), 0, "{}", errno());
        expect(e.lch, RDMA_CM_EVENT_ESTABLISHED);
        assert_eq!((softhca_rdma_notify(s, COMM_EST), errno()), (-1, libc::EISCONN));
        assert_eq!(softhca_rdma_notify(s, PATH_MIG), 0, "established, no alternate path");
        e.end(s);
    }
}

/// `rdma_disconnect` of an active id whose REQ is out sends nothing, as on Linux (its CM
/// refuses the DREQ and the DREP before the connection is established): the QP goes to
/// Error and the handshake goes on. The listener still accepts; the REP then finds a QP that
/// cannot be readied, so the client rejects it (Consumer Reject) and reports CONNECT_ERROR,
/// as librdmacm's `ucma_process_conn_resp`. Before, a REJ went at once and the client's id
/// never heard of the connection again.
#[test]
fn an_early_disconnect_sends_nothing_and_the_rep_is_rejected() {
    let _dog = Watchdog::start("an_early_disconnect_sends_nothing_and_the_rep_is_rejected", 0);
    // SAFETY: the library's own objects, each destroyed once by the program; local parameters.
    unsafe {
        let e = Link::resolved(7396);
        e.client_qp();
        assert_eq!(softhca_rdma_connect(e.c, &mut conn_param()), 0);
        assert_eq!(softhca_rdma_disconnect(e.c), 0, "{}", errno());
        assert_eq!(qp_state((*e.c).qp), IBV_QPS_ERR);
        let s = e.request();
        let mut attr = rc_init();
        assert_eq!(softhca_rdma_create_qp(s, null_mut(), &mut attr), 0);
        assert_eq!(softhca_rdma_accept(s, &mut conn_param()), 0, "{}", errno());
        let mut ev = null_mut();
        assert_eq!(softhca_rdma_get_cm_event(e.cch, &mut ev), 0);
        assert_eq!(((*ev).event, (*ev).status), (RDMA_CM_EVENT_CONNECT_ERROR, -1));
        assert_eq!(softhca_rdma_ack_cm_event(ev), 0);
        assert_eq!(softhca_rdma_get_cm_event(e.lch, &mut ev), 0);
        assert_eq!(((*ev).event, (*ev).status), (RDMA_CM_EVENT_REJECTED, 28), "Consumer Reject");
        assert_eq!(softhca_rdma_ack_cm_event(ev), 0);
        e.end(s);
    }
}

/// The same on the passive side: `rdma_disconnect` of a request's id not yet accepted sends
/// nothing and leaves the request to be answered; an accept is then refused (its QP, in
/// Error, cannot be readied: EINVAL, as the kernel's Modify QP from Error to Init), and a
/// reject still reaches the client. Before, the disconnect rejected the request (Consumer
/// Reject) and forgot it.
#[test]
fn an_early_disconnect_of_a_request_leaves_it_to_be_answered() {
    let _dog = Watchdog::start("an_early_disconnect_of_a_request_leaves_it_to_be_answered", 0);
    // SAFETY: the library's own objects, each destroyed once by the program; local parameters.
    unsafe {
        let e = Link::resolved(7397);
        e.client_qp();
        assert_eq!(softhca_rdma_connect(e.c, &mut conn_param()), 0);
        let s = e.request();
        let mut attr = rc_init();
        assert_eq!(softhca_rdma_create_qp(s, null_mut(), &mut attr), 0);
        assert_eq!(softhca_rdma_disconnect(s), 0, "{}", errno());
        assert_eq!(qp_state((*s).qp), IBV_QPS_ERR);
        assert_eq!((softhca_rdma_accept(s, &mut conn_param()), errno()), (-1, libc::EINVAL));
        let data = [9u8; 3];
        assert_eq!(softhca_rdma_reject(s, data.as_ptr().cast(), 3), 0, "{}", errno());
        let mut ev = null_mut();
        assert_eq!(softhca_rdma_get_cm_event(e.cch, &mut ev), 0);
        assert_eq!(((*ev).event, (*ev).status), (RDMA_CM_EVENT_REJECTED, 28), "Consumer Reject");
        assert!(!(*ev).param.conn.private_data.is_null());
        assert_eq!(*(*ev).param.conn.private_data.cast::<[u8; 3]>(), data, "the reject's own data");
        assert_eq!(softhca_rdma_ack_cm_event(ev), 0);
        e.end(s);
    }
}

/// A request goes only to a listener of its QP type (Linux's `cma_ib_check_req_qp_type`), the
/// type of the ids' kernel ids (`ucma_get_qp_type`): in the IB port space a UC endpoint's REQ
/// to an RC listener is rejected (Consumer Reject: the synchronous connect fails with
/// ECONNREFUSED); in the TCP port space every id is RC to the kernel, so the same endpoint's
/// REQ is RC's and reaches an RC listener. Before, the listener took the UC request in either.
#[test]
fn a_request_goes_only_to_a_listener_of_its_qp_type() {
    let _dog = Watchdog::start("a_request_goes_only_to_a_listener_of_its_qp_type", 0);
    // SAFETY: the library's own objects, each destroyed once by the program; local addresses,
    // hints and attributes.
    unsafe {
        device_on_178();
        let uc_endpoint = |ps: c_int, port: u16| {
            let mut dst = sin([127, 0, 0, 178], port);
            let mut res: rdma_addrinfo = std::mem::zeroed();
            res.ai_family = libc::AF_INET;
            res.ai_qp_type = IBV_QPT_UC;
            res.ai_port_space = ps;
            res.ai_dst_addr = (&raw mut dst).cast();
            res.ai_dst_len = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
            let mut attr = rc_init();
            attr.qp_type = IBV_QPT_UC;
            let mut uc = null_mut();
            assert_eq!(softhca_rdma_create_ep(&mut uc, &mut res, null_mut(), &mut attr), 0, "{}", errno());
            uc
        };
        // The IB port space: an RC listener refuses a UC request.
        let lch = softhca_rdma_create_event_channel();
        let mut l = null_mut();
        assert_eq!(softhca_rdma_create_id(lch, &mut l, null_mut(), RDMA_PS_IB), 0);
        let mut a = sin([127, 0, 0, 178], 7398);
        assert_eq!(softhca_rdma_bind_addr(l, (&raw mut a).cast()), 0, "bind: {}", errno());
        assert_eq!(softhca_rdma_listen(l, 4), 0);
        let uc = uc_endpoint(RDMA_PS_IB, 7398);
        assert_eq!((softhca_rdma_connect(uc, &mut conn_param()), errno()), (-1, libc::ECONNREFUSED));
        let ev = (*uc).event;
        assert!(!ev.is_null());
        assert_eq!(((*ev).event, (*ev).status), (RDMA_CM_EVENT_REJECTED, 28), "Consumer Reject");
        softhca_rdma_destroy_ep(uc);
        assert_eq!(softhca_rdma_destroy_id(l), 0);
        softhca_rdma_destroy_event_channel(lch);
        // The TCP port space: the request is RC's and the RC listener gets it.
        let e = Link::listening(7399);
        let uc = uc_endpoint(RDMA_PS_TCP, 7399);
        // A synchronous connect would wait for the answer: the endpoint's REQ is seen through
        // the listener, which then rejects it.
        std::thread::scope(|t| {
            let uc = uc as usize;
            let connect = t.spawn(move || {
                let r = softhca_rdma_connect(uc as *mut rdma_cm_id, &mut conn_param());
                (r, errno())
            });
            let s = e.request();
            assert_eq!(softhca_rdma_reject(s, null_mut(), 0), 0);
            assert_eq!(connect.join().unwrap(), (-1, libc::ECONNREFUSED));
            assert_eq!(softhca_rdma_destroy_id(s), 0);
        });
        softhca_rdma_destroy_ep(uc);
        for id in [e.c, e.l] {
            assert_eq!(softhca_rdma_destroy_id(id), 0);
        }
        softhca_rdma_destroy_event_channel(e.lch);
        softhca_rdma_destroy_event_channel(e.cch);
    }
}

/// `RDMA_OPTION_ID_ACK_TIMEOUT` as Linux's `rdma_set_ack_timeout` has it: EINVAL on a UD id;
/// set before the route is resolved, the route's packet lifetime is one less (14: 13), and
/// the REQ's Local ACK Timeout follows from it and the CA's ACK delay (15: 16), which the
/// passive side's QP takes; the active side's QP takes the value set. Before, the option was
/// taken on any id and changed only the active side's QP (the passive side's was 19).
#[test]
fn the_ack_timeout_option_reaches_the_route_and_the_peer() {
    let _dog = Watchdog::start("the_ack_timeout_option_reaches_the_route_and_the_peer", 0);
    // SAFETY: the library's own objects, each destroyed once by the program; local options,
    // parameters and attributes.
    unsafe {
        let mut t: u8 = 14;
        let mut opt =
            |id| softhca_rdma_set_option(id, RDMA_OPTION_ID, RDMA_OPTION_ID_ACK_TIMEOUT, (&raw mut t).cast(), 1);
        let ch = softhca_rdma_create_event_channel();
        let mut ud = null_mut();
        assert_eq!(softhca_rdma_create_id(ch, &mut ud, null_mut(), RDMA_PS_UDP), 0);
        assert_eq!((opt(ud), errno()), (-1, libc::EINVAL), "a UD id");
        assert_eq!(softhca_rdma_destroy_id(ud), 0);
        softhca_rdma_destroy_event_channel(ch);
        let e = Link::listening(7394);
        assert_eq!(opt(e.c), 0);
        e.resolve();
        assert_eq!((*(*e.c).route.path_rec).packet_life_time, 13);
        e.client_qp();
        let mut p = conn_param();
        assert_eq!(softhca_rdma_connect(e.c, &mut p), 0);
        let s = e.request();
        let mut attr = rc_init();
        assert_eq!(softhca_rdma_create_qp(s, null_mut(), &mut attr), 0);
        assert_eq!(softhca_rdma_accept(s, &mut p), 0, "{}", errno());
        expect(e.cch, RDMA_CM_EVENT_ESTABLISHED);
        expect(e.lch, RDMA_CM_EVENT_ESTABLISHED);
        let timeout = |id: *mut rdma_cm_id| {
            let mut qa: ibv_qp_attr = std::mem::zeroed();
            let mut qi: ibv_qp_init_attr = std::mem::zeroed();
            assert_eq!(ibv_query_qp((*id).qp, &mut qa, IBV_QP_STATE, &mut qi), 0);
            qa.timeout
        };
        assert_eq!((timeout(e.c), timeout(s)), (14, 16), "active, passive");
        e.end(s);
    }
}

/// Ports as Linux's rdma_cm shares them (`cma_check_port`): ids on different addresses share a
/// port, a second id on the same address is EADDRINUSE, one on the any address beside one on
/// an address EADDRNOTAVAIL; ids that both set REUSEADDR share it until one listens (its
/// listen checks without reuse: EADDRINUSE while the other is there); REUSEADDR cannot be
/// cleared once bound, and AFONLY cannot be set once resolved (EINVAL). Of two listeners on
/// one port, the one on the address a REQ names takes it. Before, a port had one owner:
/// every second bind was EADDRINUSE.
#[test]
fn ports_are_shared_by_address_as_linuxs() {
    device_on_178();
    let _dog = Watchdog::start("ports_are_shared_by_address_as_linuxs", 0);
    // SAFETY: the library's own objects, each destroyed once by the program; local sockaddrs
    // and option values.
    unsafe {
        let ch = softhca_rdma_create_event_channel();
        let id = || {
            let mut id = null_mut();
            assert_eq!(softhca_rdma_create_id(ch, &mut id, null_mut(), RDMA_PS_TCP), 0);
            id
        };
        let bind = |id, ip: [u8; 4], port| {
            let mut a = sin(ip, port);
            (softhca_rdma_bind_addr(id, (&raw mut a).cast()), errno())
        };
        let mut on: c_int = 1;
        let reuse = |id, v: &mut c_int| {
            let r = softhca_rdma_set_option(id, RDMA_OPTION_ID, RDMA_OPTION_ID_REUSEADDR, (v as *mut c_int).cast(), 4);
            (r, errno())
        };
        let (a, b, c, d) = (id(), id(), id(), id());
        assert_eq!(bind(a, [127, 0, 0, 178], 7400).0, 0);
        assert_eq!(bind(b, [127, 0, 0, 179], 7400).0, 0, "another address, the same port");
        assert_eq!(bind(c, [0, 0, 0, 0], 7400), (-1, libc::EADDRNOTAVAIL), "the any address beside them");
        assert_eq!(bind(d, [127, 0, 0, 178], 7400), (-1, libc::EADDRINUSE), "the same address");

        // REUSEADDR on both: shared; the first to listen is refused while the other holds it.
        let (e, f) = (id(), id());
        assert_eq!(reuse(e, &mut on).0, 0);
        assert_eq!(reuse(f, &mut on).0, 0);
        assert_eq!(bind(e, [127, 0, 0, 180], 7401).0, 0);
        assert_eq!(bind(f, [127, 0, 0, 180], 7401).0, 0, "both reuse");
        let mut off: c_int = 0;
        assert_eq!(reuse(f, &mut off), (-1, libc::EINVAL), "cleared after the bind");
        assert_eq!((softhca_rdma_listen(e, 4), errno()), (-1, libc::EADDRINUSE), "a listen shares nothing");
        assert_eq!(softhca_rdma_destroy_id(f), 0);
        assert_eq!(softhca_rdma_listen(e, 4), 0, "alone on the port");
        assert_eq!(reuse(e, &mut on), (-1, libc::EINVAL), "set on a listener");

        // Two listeners on port 7400: the REQ to 127.0.0.178 goes to the one bound there.
        assert_eq!(softhca_rdma_listen(b, 4), 0);
        assert_eq!(softhca_rdma_listen(a, 4), 0);
        assert_eq!(listener_of_a_request(ch, 7400), a, "the listener on .178");
        for x in [a, b, c, d, e] {
            assert_eq!(softhca_rdma_destroy_id(x), 0);
        }
        softhca_rdma_destroy_event_channel(ch);
    }
}

/// A REQ goes to a listener of its address family (Linux's `cma_match_private_data`): on one
/// port an IPv6 listener on `::` that set AFONLY (so that it shares the port with an IPv4 one
/// on 0.0.0.0; without it, EADDRNOTAVAIL) and that IPv4 listener, an IPv4 REQ reaches the
/// IPv4 listener though the IPv6 one listened first. Before, a listener on an any address took
/// every REQ. (The rule's other cases: `rdmacm::tests`.)
#[test]
fn a_request_goes_to_a_listener_of_its_family() {
    device_on_178();
    let _dog = Watchdog::start("a_request_goes_to_a_listener_of_its_family", 0);
    // SAFETY: the library's own objects, each destroyed once by the program; local sockaddrs
    // and option values.
    unsafe {
        let ch = softhca_rdma_create_event_channel();
        let (mut v4, mut v6) = (null_mut(), null_mut());
        assert_eq!(softhca_rdma_create_id(ch, &mut v4, null_mut(), RDMA_PS_TCP), 0);
        assert_eq!(softhca_rdma_create_id(ch, &mut v6, null_mut(), RDMA_PS_TCP), 0);
        let mut a = sin([0, 0, 0, 0], 7402);
        assert_eq!(softhca_rdma_bind_addr(v4, (&raw mut a).cast()), 0);
        let mut any6: libc::sockaddr_in6 = std::mem::zeroed();
        any6.sin6_family = libc::AF_INET6 as libc::sa_family_t;
        any6.sin6_port = 7402u16.to_be();
        assert_eq!((softhca_rdma_bind_addr(v6, (&raw mut any6).cast()), errno()), (-1, libc::EADDRNOTAVAIL));
        let mut on: c_int = 1;
        assert_eq!(softhca_rdma_set_option(v6, RDMA_OPTION_ID, RDMA_OPTION_ID_AFONLY, (&raw mut on).cast(), 4), 0);
        assert_eq!(softhca_rdma_bind_addr(v6, (&raw mut any6).cast()), 0, "AFONLY: {}", errno());
        assert_eq!(softhca_rdma_listen(v6, 4), 0);
        assert_eq!(softhca_rdma_listen(v4, 4), 0);
        assert_eq!(listener_of_a_request(ch, 7402), v4, "the IPv4 listener");
        for x in [v4, v6] {
            assert_eq!(softhca_rdma_destroy_id(x), 0);
        }
        softhca_rdma_destroy_event_channel(ch);
    }
}

/// A refused bind leaves the id as it was, its AFONLY default included: an IPv4 id refused
/// (EADDRINUSE) then bound to `::` beside an IPv4 any-address holder is EADDRNOTAVAIL, as on
/// Linux, which decides the default at each bind. Before, the refused bind had kept AFONLY set.
#[test]
fn a_refused_bind_leaves_afonly_as_it_was() {
    device_on_178();
    // SAFETY: the library's own objects, each destroyed once by the program; local sockaddrs.
    unsafe {
        let ch = softhca_rdma_create_event_channel();
        let (mut holder, mut id) = (null_mut(), null_mut());
        assert_eq!(softhca_rdma_create_id(ch, &mut holder, null_mut(), RDMA_PS_TCP), 0);
        assert_eq!(softhca_rdma_create_id(ch, &mut id, null_mut(), RDMA_PS_TCP), 0);
        let mut any = sin([0, 0, 0, 0], 7403);
        assert_eq!(softhca_rdma_bind_addr(holder, (&raw mut any).cast()), 0);
        let mut lo = sin([127, 0, 0, 178], 7403);
        assert_eq!((softhca_rdma_bind_addr(id, (&raw mut lo).cast()), errno()), (-1, libc::EADDRNOTAVAIL));
        let mut any6: libc::sockaddr_in6 = std::mem::zeroed();
        any6.sin6_family = libc::AF_INET6 as libc::sa_family_t;
        any6.sin6_port = 7403u16.to_be();
        assert_eq!((softhca_rdma_bind_addr(id, (&raw mut any6).cast()), errno()), (-1, libc::EADDRNOTAVAIL));
        for x in [holder, id] {
            assert_eq!(softhca_rdma_destroy_id(x), 0);
        }
        softhca_rdma_destroy_event_channel(ch);
    }
}

/// The id a request makes carries the device's default PD, whatever PD its listener was given
/// (`rdma_create_ep` with a PD and no QP attributes), as librdmacm's `ucma_get_device` gives
/// it; a QP made on it afterwards puts its own PD there (`rdma_create_qp_ex`: `id->pd =
/// qp->pd`). Before, the id carried the listener's PD.
#[test]
fn a_requests_id_has_the_device_pd_until_its_qp() {
    device_on_178();
    let _dog = Watchdog::start("a_requests_id_has_the_device_pd_until_its_qp", 0);
    // SAFETY: the library's own objects, each destroyed once by the program; local strings,
    // hints, sockaddrs and attributes.
    unsafe {
        let mut probe = null_mut();
        assert_eq!(softhca_rdma_create_id(null_mut(), &mut probe, null_mut(), RDMA_PS_TCP), 0);
        let mut a = sin([127, 0, 0, 178], 0);
        assert_eq!(softhca_rdma_bind_addr(probe, (&raw mut a).cast()), 0);
        let (ctx, dev_pd) = ((*probe).verbs, (*probe).pd);
        let pd = ibv_alloc_pd(ctx);
        assert!(!pd.is_null() && pd != dev_pd);
        let mut hints: rdma_addrinfo = std::mem::zeroed();
        hints.ai_flags = RAI_PASSIVE;
        hints.ai_port_space = RDMA_PS_TCP;
        let mut res = null_mut();
        let r = softhca_rdma_getaddrinfo(c"127.0.0.178".as_ptr(), c"7404".as_ptr(), &hints, &mut res);
        assert_eq!(r, 0, "{}", errno());
        let mut l = null_mut();
        assert_eq!(softhca_rdma_create_ep(&mut l, res, pd, null_mut()), 0, "{}", errno());
        assert_eq!((*l).pd, pd, "the listener's, as given");
        assert_eq!(softhca_rdma_listen(l, 1), 0);
        let (cch, cl) = connecting_client(7404);
        let mut s = null_mut();
        assert_eq!(softhca_rdma_get_request(l, &mut s), 0, "{}", errno());
        assert_eq!(((*s).pd, (*s).qp), (dev_pd, null_mut()), "the device's PD, no QP");
        let mut attr = rc_init();
        assert_eq!(softhca_rdma_create_qp(s, pd, &mut attr), 0);
        assert_eq!(((*s).pd, (*(*s).qp).pd), (pd, pd), "the QP's PD, as librdmacm sets it");
        assert_eq!(softhca_rdma_reject(s, null_mut(), 0), 0);
        let mut ev = null_mut();
        assert_eq!(softhca_rdma_get_cm_event(cch, &mut ev), 0);
        assert_eq!((*ev).event, RDMA_CM_EVENT_REJECTED);
        assert_eq!(softhca_rdma_ack_cm_event(ev), 0);
        softhca_rdma_destroy_ep(s);
        softhca_rdma_destroy_qp(cl);
        assert_eq!(softhca_rdma_destroy_id(cl), 0);
        softhca_rdma_destroy_event_channel(cch);
        softhca_rdma_destroy_ep(l);
        softhca_rdma_freeaddrinfo(res);
        assert_eq!(ibv_dealloc_pd(pd), 0, "nothing left on the program's PD");
        assert_eq!(softhca_rdma_destroy_id(probe), 0);
    }
}

/// A CQ the id already has is its QP's: `rdma_create_qp` with another is EINVAL, and without
/// one takes the id's, as librdmacm's `rdma_create_qp_ex`. Before, the program's other CQ was
/// taken and the id's left unused.
#[test]
fn a_qp_takes_the_ids_own_cqs_and_no_other() {
    device_on_178();
    let _dog = Watchdog::start("a_qp_takes_the_ids_own_cqs_and_no_other", 0);
    // SAFETY: the library's own objects, each destroyed once; local sockaddrs and attributes.
    unsafe {
        let mut id = null_mut();
        assert_eq!(softhca_rdma_create_id(null_mut(), &mut id, null_mut(), RDMA_PS_TCP), 0);
        let mut a = sin([127, 0, 0, 178], 0);
        assert_eq!(softhca_rdma_bind_addr(id, (&raw mut a).cast()), 0);
        let ctx = (*id).verbs;
        let (mine, other) =
            (ibv_create_cq(ctx, 8, null_mut(), null_mut(), 0), ibv_create_cq(ctx, 8, null_mut(), null_mut(), 0));
        assert!(!mine.is_null() && !other.is_null());
        for field in [&raw mut (*id).recv_cq, &raw mut (*id).send_cq] {
            *field = mine;
            let mut attr = rc_init();
            (attr.send_cq, attr.recv_cq) = (other, other);
            assert_eq!(softhca_rdma_create_qp(id, null_mut(), &mut attr), -1);
            assert_eq!(errno(), libc::EINVAL, "another CQ than the id's");
            assert!((*id).qp.is_null());
            *field = null_mut();
        }
        (*id).recv_cq = mine;
        let mut attr = rc_init();
        attr.send_cq = other;
        assert_eq!(softhca_rdma_create_qp(id, null_mut(), &mut attr), 0, "{}", errno());
        assert_eq!(((*(*id).qp).recv_cq, (*(*id).qp).send_cq), (mine, other));
        // The id's CQs go with its QP (librdmacm's `ucma_destroy_cqs`), the program's stays.
        softhca_rdma_destroy_qp(id);
        assert!((*id).recv_cq.is_null());
        assert_eq!(ibv_destroy_cq(other), 0);
        assert_eq!(softhca_rdma_destroy_id(id), 0);
    }
}

/// A CQ or completion channel an id names that the program destroys itself leaves the id, as
/// a destroyed QP does: a QP made after takes a new CQ, and `rdma_destroy_qp` destroys nothing
/// twice. Before, the id kept the freed CQ, and the QP was made on it.
#[test]
fn a_cq_the_program_destroys_leaves_its_id() {
    device_on_178();
    let _dog = Watchdog::start("a_cq_the_program_destroys_leaves_its_id", 0);
    // SAFETY: the library's own objects, each destroyed once; local sockaddrs and attributes.
    unsafe {
        let mut id = null_mut();
        assert_eq!(softhca_rdma_create_id(null_mut(), &mut id, null_mut(), RDMA_PS_TCP), 0);
        let mut a = sin([127, 0, 0, 178], 0);
        assert_eq!(softhca_rdma_bind_addr(id, (&raw mut a).cast()), 0);
        let ctx = (*id).verbs;
        let ch = ibv_create_comp_channel(ctx);
        let cq = ibv_create_cq(ctx, 8, null_mut(), ch, 0);
        assert!(!ch.is_null() && !cq.is_null());
        ((*id).recv_cq, (*id).send_cq, (*id).recv_cq_channel) = (cq, cq, ch.cast());
        assert_eq!(ibv_destroy_cq(cq), 0);
        assert_eq!(ibv_destroy_comp_channel(ch), 0);
        assert_eq!(((*id).recv_cq, (*id).send_cq), (null_mut(), null_mut()));
        assert!((*id).recv_cq_channel.is_null());
        let mut attr = rc_init();
        assert_eq!(softhca_rdma_create_qp(id, null_mut(), &mut attr), 0, "{}", errno());
        assert!(!(*id).recv_cq.is_null(), "a CQ made for the QP");
        assert_eq!((*(*id).qp).recv_cq, (*id).recv_cq);
        softhca_rdma_destroy_qp(id);
        assert_eq!(softhca_rdma_destroy_id(id), 0);
    }
}

/// A port below 1024 needs CAP_NET_BIND_SERVICE, as Linux's `cma_use_port` asks: EACCES for a
/// thread without it (this test drops it from its own thread's effective set; capabilities are
/// per thread), while a port the library picks is bound. Before, any port was bound.
#[test]
fn a_port_below_1024_needs_cap_net_bind_service() {
    #[repr(C)]
    struct CapHeader {
        version: u32,
        pid: c_int,
    }
    #[repr(C)]
    #[derive(Clone, Copy, Default)]
    struct CapData {
        effective: u32,
        permitted: u32,
        inheritable: u32,
    }
    device_on_178();
    std::thread::spawn(|| {
        // SAFETY: capget/capset of the calling thread (pid 0) with a version 3 header and its
        // two data words; the library's own objects, each destroyed once; local sockaddrs.
        unsafe {
            let mut h = CapHeader { version: 0x2008_0522, pid: 0 };
            let mut d = [CapData::default(); 2];
            assert_eq!(libc::syscall(libc::SYS_capget, &raw mut h, d.as_mut_ptr()), 0);
            d[0].effective &= !(1 << 10);
            assert_eq!(libc::syscall(libc::SYS_capset, &raw mut h, d.as_mut_ptr()), 0);
            let mut id = null_mut();
            assert_eq!(softhca_rdma_create_id(null_mut(), &mut id, null_mut(), RDMA_PS_TCP), 0);
            let mut a = sin([127, 0, 0, 178], 999);
            assert_eq!((softhca_rdma_bind_addr(id, (&raw mut a).cast()), errno()), (-1, libc::EACCES));
            let mut any = sin([127, 0, 0, 178], 0);
            assert_eq!(softhca_rdma_bind_addr(id, (&raw mut any).cast()), 0, "a port the library picks");
            assert_eq!(softhca_rdma_destroy_id(id), 0);
        }
    })
    .join()
    .unwrap();
}

/// A listener on 127.0.0.178 and a client id, each on a channel of its own: what the
/// connection tests above start from.
struct Link {
    lch: *mut rdma_event_channel,
    cch: *mut rdma_event_channel,
    l: *mut rdma_cm_id,
    c: *mut rdma_cm_id,
    a: libc::sockaddr_in,
}

impl Link {
    /// The listener listening on `port`; the client made, not resolved.
    ///
    /// # Safety
    /// Calls the library's C ABI; the ids are the caller's to end with [`Link::end`].
    unsafe fn listening(port: u16) -> Link {
        device_on_178();
        // SAFETY: the library's calls on local out pointers and addresses.
        unsafe {
            let (lch, cch) = (softhca_rdma_create_event_channel(), softhca_rdma_create_event_channel());
            let (mut l, mut c) = (null_mut(), null_mut());
            assert_eq!(softhca_rdma_create_id(lch, &mut l, null_mut(), RDMA_PS_TCP), 0);
            assert_eq!(softhca_rdma_create_id(cch, &mut c, null_mut(), RDMA_PS_TCP), 0);
            let mut a = sin([127, 0, 0, 178], port);
            assert_eq!(softhca_rdma_bind_addr(l, (&raw mut a).cast()), 0, "bind: {}", errno());
            assert_eq!(softhca_rdma_listen(l, 4), 0);
            Link { lch, cch, l, c, a }
        }
    }

    /// [`Link::listening`], the client's address and route resolved to the listener.
    ///
    /// # Safety
    /// As [`Link::listening`].
    unsafe fn resolved(port: u16) -> Link {
        // SAFETY: as the caller promises.
        unsafe {
            let e = Link::listening(port);
            e.resolve();
            e
        }
    }

    /// # Safety
    /// The ids are live.
    unsafe fn resolve(&self) {
        let mut a = self.a;
        // SAFETY: the live client id and channel; a local address.
        unsafe {
            assert_eq!(softhca_rdma_resolve_addr(self.c, null_mut(), (&raw mut a).cast(), 2000), 0);
            expect(self.cch, RDMA_CM_EVENT_ADDR_RESOLVED);
            assert_eq!(softhca_rdma_resolve_route(self.c, 2000), 0);
            expect(self.cch, RDMA_CM_EVENT_ROUTE_RESOLVED);
        }
    }

    /// Gives the client an RC QP (rdma_create_qp, its CQs made for it).
    ///
    /// # Safety
    /// The client id is live and resolved.
    unsafe fn client_qp(&self) {
        let mut attr = rc_init();
        // SAFETY: the live client id; local attributes.
        assert_eq!(unsafe { softhca_rdma_create_qp(self.c, null_mut(), &mut attr) }, 0);
    }

    /// The id the listener's next event, a connection request, hands out (acknowledged).
    ///
    /// # Safety
    /// The listener's channel is live.
    unsafe fn request(&self) -> *mut rdma_cm_id {
        let mut ev = null_mut();
        // SAFETY: the live channel; the event is the library's until acknowledged.
        unsafe {
            assert_eq!(softhca_rdma_get_cm_event(self.lch, &mut ev), 0);
            assert_eq!((*ev).event, RDMA_CM_EVENT_CONNECT_REQUEST);
            let s = (*ev).id;
            assert_eq!(softhca_rdma_ack_cm_event(ev), 0);
            s
        }
    }

    /// Destroys `s` (a request's id), the client and the listener, their QPs and channels.
    ///
    /// # Safety
    /// Every id is live; nothing else uses them after.
    unsafe fn end(self, s: *mut rdma_cm_id) {
        // SAFETY: as the caller promises: each destroyed once.
        unsafe {
            for id in [s, self.c] {
                if !(*id).qp.is_null() {
                    softhca_rdma_destroy_qp(id);
                }
            }
            for id in [s, self.c, self.l] {
                assert_eq!(softhca_rdma_destroy_id(id), 0);
            }
            softhca_rdma_destroy_event_channel(self.lch);
            softhca_rdma_destroy_event_channel(self.cch);
        }
    }
}

/// A new client, on a channel of its own, with an RC QP, whose connection request to
/// 127.0.0.178:`port` is on its way; on the way, AFONLY is refused on it once its address is
/// resolved (EINVAL). The client and channel are the caller's to end.
///
/// # Safety
/// Calls the library's C ABI.
unsafe fn connecting_client(port: u16) -> (*mut rdma_event_channel, *mut rdma_cm_id) {
    // SAFETY: the library's own objects; local sockaddrs, options and parameters.
    unsafe {
        let cch = softhca_rdma_create_event_channel();
        let mut cl = null_mut();
        assert_eq!(softhca_rdma_create_id(cch, &mut cl, null_mut(), RDMA_PS_TCP), 0);
        let mut dst = sin([127, 0, 0, 178], port);
        assert_eq!(softhca_rdma_resolve_addr(cl, null_mut(), (&raw mut dst).cast(), 2000), 0, "{}", errno());
        expect(cch, RDMA_CM_EVENT_ADDR_RESOLVED);
        let mut t: c_int = 1;
        let afonly = softhca_rdma_set_option(cl, RDMA_OPTION_ID, RDMA_OPTION_ID_AFONLY, (&raw mut t).cast(), 4);
        assert_eq!((afonly, errno()), (-1, libc::EINVAL), "AFONLY once resolved");
        assert_eq!(softhca_rdma_resolve_route(cl, 2000), 0);
        expect(cch, RDMA_CM_EVENT_ROUTE_RESOLVED);
        let mut attr = rc_init();
        assert_eq!(softhca_rdma_create_qp(cl, null_mut(), &mut attr), 0);
        let mut p = conn_param();
        assert_eq!(softhca_rdma_connect(cl, &mut p), 0);
        (cch, cl)
    }
}

/// The listener whose channel `ch` a connection request to 127.0.0.178:`port` from a new
/// client reaches (the request refused after, the client and the request's id destroyed).
///
/// # Safety
/// `ch` is the live channel of the listeners on `port`.
unsafe fn listener_of_a_request(ch: *mut rdma_event_channel, port: u16) -> *mut rdma_cm_id {
    // SAFETY: the library's own objects, each destroyed once here; local sockaddrs, options
    // and parameters; the caller's channel.
    unsafe {
        let (cch, cl) = connecting_client(port);
        let mut ev = null_mut();
        assert_eq!(softhca_rdma_get_cm_event(ch, &mut ev), 0);
        assert_eq!((*ev).event, RDMA_CM_EVENT_CONNECT_REQUEST);
        let (s, listener) = ((*ev).id, (*ev).listen_id);
        assert_eq!(softhca_rdma_ack_cm_event(ev), 0);
        assert_eq!(softhca_rdma_reject(s, null_mut(), 0), 0);
        assert_eq!(softhca_rdma_get_cm_event(cch, &mut ev), 0);
        assert_eq!(((*ev).event, (*ev).status), (RDMA_CM_EVENT_REJECTED, 28), "Consumer Reject");
        assert_eq!(softhca_rdma_ack_cm_event(ev), 0);
        softhca_rdma_destroy_qp(cl);
        assert_eq!(softhca_rdma_destroy_id(s), 0);
        assert_eq!(softhca_rdma_destroy_id(cl), 0);
        softhca_rdma_destroy_event_channel(cch);
        listener
    }
}

/// Opens the process's device on 127.0.0.178 (a bound loopback address places a device not
/// yet open), once, before any test can open it elsewhere: the tests here run in parallel in
/// one process, which has one device, and a device opened on the default address first (by
/// `rdma_resolve_addr` with no source) would leave the listeners on 127.0.0.178 with no
/// device, their REQs sent to a port nobody reads.
fn device_on_178() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        // SAFETY: the library's own objects, each destroyed once; a local sockaddr.
        unsafe {
            let mut id = null_mut();
            assert_eq!(softhca_rdma_create_id(null_mut(), &mut id, null_mut(), RDMA_PS_TCP), 0);
            let mut a = sin([127, 0, 0, 178], 0);
            assert_eq!(softhca_rdma_bind_addr(id, (&raw mut a).cast()), 0, "bind: {}", errno());
            assert!(!(*id).verbs.is_null(), "the device is on 127.0.0.178");
            assert_eq!(softhca_rdma_destroy_id(id), 0);
        }
    });
}

/// Connection parameters of one Read/Atomic each way.
fn conn_param() -> rdma_conn_param {
    // SAFETY: an all-zero rdma_conn_param is valid.
    let mut p: rdma_conn_param = unsafe { std::mem::zeroed() };
    p.responder_resources = 1;
    p.initiator_depth = 1;
    p
}

/// `qp`'s state, by `ibv_query_qp`.
///
/// # Safety
/// `qp` is live.
unsafe fn qp_state(qp: *mut ibv_qp) -> c_int {
    // SAFETY: the caller's live QP; local out structures, all-zero valid.
    unsafe {
        let mut qa: ibv_qp_attr = std::mem::zeroed();
        let mut qi: ibv_qp_init_attr = std::mem::zeroed();
        assert_eq!(ibv_query_qp(qp, &mut qa, IBV_QP_STATE, &mut qi), 0);
        qa.qp_state
    }
}

fn errno() -> c_int {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
}
