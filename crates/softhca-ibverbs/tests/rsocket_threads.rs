//! The drop-in's rsocket service threads (`rsocket/svc.rs`): a listener's accept waits for
//! its connection to be established, as librdmacm's `listen_svc` does, and nothing else
//! waits for it: closing a connected socket, whose events another thread serves, returns
//! while that accept is still pending.

use std::ffi::c_int;
use std::ptr::null_mut;

use softhca_ibverbs::rdmacm::abi::*;

#[path = "common/rdmacm_ffi.rs"]
mod rdmacm_ffi;
use rdmacm_ffi::*;

#[path = "common/rsocket_ffi.rs"]
mod rsocket_ffi;
use rsocket_ffi::*;

fn errno() -> c_int {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

/// A request whose requester never sends its RTU (an rdma_cm id with rsocket's connection
/// data and no QP, which never calls `rdma_establish`) keeps the listener's accept waiting;
/// meanwhile a connected pair made through the same listener closes at both ends. Before, one
/// service thread served every socket with its entry list locked, and `rclose` waited for the
/// accept to give up (the CM's REP retries, about a minute).
#[test]
fn an_accept_waiting_for_its_peer_holds_up_no_other_socket() {
    // A hang guard: the failure this test looks for is a wait.
    std::thread::spawn(|| {
        std::thread::sleep(std::time::Duration::from_secs(45));
        eprintln!("an_accept_waiting_for_its_peer_holds_up_no_other_socket: hung");
        std::process::abort();
    });
    let len = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
    let a = localhost(7798);
    // SAFETY: socket and rdma_cm calls on live locals and the library's own objects, each
    // destroyed once.
    unsafe {
        let l = softhca_rs_socket(libc::AF_INET, libc::SOCK_STREAM, 0);
        assert!(l >= 0, "rsocket: {}", errno());
        assert_eq!(softhca_rs_bind(l, (&a as *const libc::sockaddr_in).cast(), len), 0, "{}", errno());
        assert_eq!(softhca_rs_listen(l, 4), 0);
        let c = softhca_rs_socket(libc::AF_INET, libc::SOCK_STREAM, 0);
        assert_eq!(softhca_rs_connect(c, (&a as *const libc::sockaddr_in).cast(), len), 0, "{}", errno());
        let s = softhca_rs_accept(l, null_mut(), null_mut());
        assert!(s >= 0, "raccept: {}", errno());

        let ch = softhca_rdma_create_event_channel();
        let mut id = null_mut();
        assert_eq!(softhca_rdma_create_id(ch, &mut id, null_mut(), RDMA_PS_TCP), 0);
        let mut dst = a;
        assert_eq!(softhca_rdma_resolve_addr(id, null_mut(), (&raw mut dst).cast(), 2000), 0);
        assert_eq!(next_event(ch), RDMA_CM_EVENT_ADDR_RESOLVED);
        assert_eq!(softhca_rdma_resolve_route(id, 2000), 0);
        assert_eq!(next_event(ch), RDMA_CM_EVENT_ROUTE_RESOLVED);
        let mut data = [0u8; 40]; // rsocket's connection data, version 1
        data[0] = 1;
        let mut p: rdma_conn_param = std::mem::zeroed();
        p.private_data = data.as_ptr().cast();
        p.private_data_len = data.len() as u8;
        p.responder_resources = 1;
        p.initiator_depth = 1;
        p.qp_num = 0x1234;
        assert_eq!(softhca_rdma_connect(id, &mut p), 0, "{}", errno());
        // The REP: the listener's accept now waits for the RTU.
        assert_eq!(next_event(ch), RDMA_CM_EVENT_CONNECT_RESPONSE);

        assert_eq!(softhca_rs_close(s), 0);
        assert_eq!(softhca_rs_close(c), 0);
        // Nothing came of that request meanwhile: its accept was still waiting.
        let fl = libc::fcntl((*ch).fd, libc::F_GETFL);
        libc::fcntl((*ch).fd, libc::F_SETFL, fl | libc::O_NONBLOCK);
        let mut ev = null_mut();
        assert_eq!((softhca_rdma_get_cm_event(ch, &mut ev), errno()), (-1, libc::EAGAIN), "the request moved on");

        assert_eq!(softhca_rdma_destroy_id(id), 0);
        softhca_rdma_destroy_event_channel(ch);
        assert_eq!(softhca_rs_close(l), 0);
    }
}

/// Takes the channel's next event and acknowledges it; its type.
///
/// # Safety
/// `ch` is a live, blocking channel.
unsafe fn next_event(ch: *mut rdma_event_channel) -> c_int {
    let mut ev = null_mut();
    // SAFETY: the caller's channel; the event is the library's until acknowledged.
    unsafe {
        assert_eq!(softhca_rdma_get_cm_event(ch, &mut ev), 0, "{}", errno());
        let (t, status) = ((*ev).event, (*ev).status);
        assert_eq!(softhca_rdma_ack_cm_event(ev), 0);
        assert_eq!(status, 0, "event {t}");
        t
    }
}
