//! The ACKs a QP owes survive its destruction, whoever holds the engine meanwhile. A review
//! found that the first fix (a flush hook Destroy QP called, which only try-locked the
//! engine and trusted "that turn sends it") lost them: the turn's closing flush ran
//! `transmit`, which skips a destroyed QP. Destroy QP now builds the ACKs the QP owes and
//! hands them to the device, whose next `transmit` sends them first. Both tests failed
//! before (the requester's Send ended in a retry error instead of Success). Waits are hang
//! guards only; nothing here measures time.

mod udp_common;

use std::net::Ipv4Addr;
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use softhca::link::udp::UdpConfig;
use softhca::*;
use udp_common::*;

/// A (requester, impatient: a lost ACK fails its Send within half a second) and B (responder, blocking
/// engine) on the given addresses, one Receive posted on B.
fn pair(a_addr: Ipv4Addr, b_addr: Ipv4Addr) -> (End, End, Mr) {
    let a = end(UdpConfig::default().addr(a_addr));
    let b = end(UdpConfig::default().addr(b_addr));
    let rmr = impatient_pair(&a, &b);
    (a, b, rmr)
}

/// Destroy QP from the completion handler of the Receive it just completed. The handler runs
/// on B's engine thread, inside its turn (CQ-HANDLER-1: "a handler may call any verb"): the
/// ACK for a Send whose completion the application has seen must still leave, and A's Send
/// complete with Success.
/// Rules PKT-ACK-3, PKT-ACK-13
#[test]
fn destroy_qp_from_its_completion_handler_still_acknowledges() {
    let (a, b, _rmr) = pair(Ipv4Addr::new(127, 0, 4, 1), Ipv4Addr::new(127, 0, 4, 2));
    let slot = Arc::new(Mutex::new(Some(b.qp.clone())));
    let (done_tx, done_rx) = mpsc::channel::<Result<()>>();
    let done_tx = Mutex::new(done_tx);
    let s = slot.clone();
    b.dev
        .context()
        .set_completion_handler(move |_| {
            if let Some(qp) = s.lock().unwrap().take() {
                let r = qp.destroy();
                let _ = done_tx.lock().unwrap().send(r);
            }
        })
        .unwrap();
    b.cq.req_notify(NotifyKind::NextCompletion).unwrap();
    let mr = a.pd.alloc_mr(64, Access::LOCAL_WRITE).unwrap();
    a.qp.post_send(&[SendWr::send(1, &[mr.sge(0..8)]).signaled()]).unwrap();
    let destroyed = done_rx.recv_timeout(Duration::from_secs(20)).expect("the handler never ran (hang guard)");
    destroyed.unwrap();
    // B's application saw the Receive complete.
    assert_eq!(wait(&b.cq, 1, 10)[0].status, WcStatus::Success);
    let w = wait(&a.cq, 1, 20);
    assert_eq!(w[0].status, WcStatus::Success, "the ACK B owed was lost at Destroy QP: {w:?}");
}

/// The multi-threaded form of the same window: the application thread polls the Receive's
/// completion and destroys the QP while B's engine thread is still inside the turn that
/// completed it (held here, deterministically, by a handler that waits for the destroy;
/// without the handler the window is the rest of the receive batch plus the closing flush).
/// The ACK still leaves.
/// Rules PKT-ACK-3, PKT-ACK-13
#[test]
fn destroy_qp_on_another_thread_during_the_engine_turn_still_acknowledges() {
    let (a, b, _rmr) = pair(Ipv4Addr::new(127, 0, 4, 3), Ipv4Addr::new(127, 0, 4, 4));
    let (in_turn_tx, in_turn_rx) = mpsc::channel::<()>();
    let (go_tx, go_rx) = mpsc::channel::<()>();
    let (in_turn_tx, go_rx) = (Mutex::new(in_turn_tx), Mutex::new(go_rx));
    let once = std::sync::atomic::AtomicBool::new(false);
    b.dev
        .context()
        .set_completion_handler(move |_| {
            if !once.swap(true, std::sync::atomic::Ordering::SeqCst) {
                let _ = in_turn_tx.lock().unwrap().send(());
                // Hang guard: the test thread answers as soon as its destroy returned.
                let _ = go_rx.lock().unwrap().recv_timeout(Duration::from_secs(20));
            }
        })
        .unwrap();
    b.cq.req_notify(NotifyKind::NextCompletion).unwrap();
    let mr = a.pd.alloc_mr(64, Access::LOCAL_WRITE).unwrap();
    a.qp.post_send(&[SendWr::send(1, &[mr.sge(0..8)]).signaled()]).unwrap();
    in_turn_rx.recv_timeout(Duration::from_secs(20)).expect("the handler never ran (hang guard)");
    // The application has its completion, and destroys the QP.
    assert_eq!(wait(&b.cq, 1, 10)[0].status, WcStatus::Success);
    b.qp.destroy().unwrap();
    go_tx.send(()).unwrap();
    let w = wait(&a.cq, 1, 20);
    assert_eq!(w[0].status, WcStatus::Success, "the ACK B owed was lost at Destroy QP: {w:?}");
}
