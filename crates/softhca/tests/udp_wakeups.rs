//! The UDP link's engine: work a doorbell or an inline turn leaves behind wakes the sleeping
//! engine thread (from a review).

mod udp_common;

use softhca::link::udp::UdpConfig;
use softhca::*;
use std::time::Instant;
use udp_common::*;

/// Blocking mode: a post whose message is more than one flush sends (256 datagrams), rung
/// while the engine thread sleeps in ppoll: the doorbell sends what it can and wakes the
/// engine for the rest, rather than leaving it for the 50 ms idle wake.
#[test]
fn doorbell_leaves_tx_beyond_four_batches_until_idle_wake() {
    let a = uc_end(UdpConfig::default());
    let b = uc_end(UdpConfig::default());
    uc_connect(&a.qp, b.dev.gid(), b.qp.qp_num());
    uc_connect(&b.qp, a.dev.gid(), a.qp.qp_num());
    let n = 1 << 20; // 1024 datagrams at MTU 1024
    let src = a.pd.alloc_mr(n, Access::LOCAL_WRITE).unwrap();
    let dst = b.pd.alloc_mr(n, Access::LOCAL_WRITE).unwrap();
    b.qp.post_recv(&[RecvWr::new(1, &[dst.sge(0..n)])]).unwrap();
    // Wait (a condition, not a sleep) until A's engine has just gone to sleep in ppoll.
    let s0 = a.dev.counters().sleeps;
    let deadline = Instant::now() + std::time::Duration::from_secs(10);
    while a.dev.counters().sleeps == s0 {
        assert!(Instant::now() < deadline, "the engine never slept");
        std::thread::yield_now();
    }
    let seen = Instant::now();
    let before = a.dev.counters();
    a.qp.post_send(&[SendWr::send(1, &[src.sge(0..n)]).signaled()]).unwrap();
    let after = a.dev.counters();
    // A test thread held off its core for half the engine's idle wake-up (50 ms) anywhere
    // from seeing the engine asleep to the end of its post may have posted to an engine that
    // woke meanwhile, which needs no doorbell: the post then tells nothing.
    let held = seen.elapsed() > std::time::Duration::from_millis(25);
    let sent = after.tx_datagrams - before.tx_datagrams;
    let woke = after.doorbells - before.doorbells;
    if held {
        eprintln!("the test thread was held back before its post: nothing to tell ({after:?})");
    } else {
        assert!(
            sent == 1024 || woke > 0,
            "post left {} of 1024 datagrams queued with the engine asleep and no wake-up ({after:?})",
            1024 - sent
        );
    }
    assert_eq!(wait(&b.cq, 1, 10)[0].status, WcStatus::Success);
}

/// The last handle of a device dropped by a completion handler, which the engine thread runs:
/// the engine thread is told to stop and ends on its own instead of joining itself (which
/// panicked the engine thread, and the handler's caller with it).
/// Rule CQ-HANDLER-2
#[test]
fn dropping_a_device_from_a_handler_on_its_engine_thread() {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::{Arc, Mutex};
    let a = end(UdpConfig::default().addr(std::net::Ipv4Addr::new(127, 0, 3, 1)));
    let b = end(UdpConfig::default().addr(std::net::Ipv4Addr::new(127, 0, 3, 2)));
    connect(&a.qp, b.dev.gid(), b.qp.qp_num(), Mtu::Mtu4096);
    connect(&b.qp, a.dev.gid(), a.qp.qp_num(), Mtu::Mtu4096);
    let End { pd, cq, qp, dev } = a;
    let ctx = dev.context().clone();
    let slot = Arc::new(Mutex::new(Some(dev)));
    let dropped = Arc::new(AtomicBool::new(false));
    let (s, d) = (slot.clone(), dropped.clone());
    ctx.set_completion_handler(move |_| {
        let dev = s.lock().unwrap().take();
        drop(dev);
        d.store(true, Ordering::SeqCst);
    })
    .unwrap();
    cq.req_notify(NotifyKind::NextCompletion).unwrap();
    let mr = pd.alloc_mr(64, Access::LOCAL_WRITE).unwrap();
    let rmr = b.pd.alloc_mr(64, Access::LOCAL_WRITE).unwrap();
    b.qp.post_recv(&[RecvWr::new(1, &[rmr.sge(0..64)])]).unwrap();
    qp.post_send(&[SendWr::send(1, &[mr.sge(0..8)]).signaled()]).unwrap();
    let deadline = Instant::now() + std::time::Duration::from_secs(20);
    while !dropped.load(Ordering::SeqCst) {
        assert!(Instant::now() < deadline, "the handler never finished dropping the device");
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    assert!(slot.lock().unwrap().is_none());
    // The CQE is there; the context stays usable without its link.
    assert_eq!(cq.poll(&mut [Wc::default(); 2]).unwrap(), 1);
    drop(qp);
}

/// A busy-poll device leaves the ACK for what a poll completed to the next poll or post (so
/// that it rides with the answer); an application that instead destroys its QP and closes
/// the device right after the completion must not lose it: Destroy QP sends what the QP owes
/// first, as a hardware HCA would already have. The requester's Send completes with Success,
/// not with a retry error against a closed port.
/// Rule PKT-ACK-13
#[test]
fn destroy_qp_right_after_a_completion_still_acknowledges_it() {
    let a = end(UdpConfig::default().addr(std::net::Ipv4Addr::new(127, 0, 3, 3)));
    let b = end(UdpConfig::default().addr(std::net::Ipv4Addr::new(127, 0, 3, 4)).busy_poll(true));
    // A short ACK timeout and one retry: a lost ACK fails the Send within half a second.
    let _rmr = impatient_pair(&a, &b);
    let mr = a.pd.alloc_mr(64, Access::LOCAL_WRITE).unwrap();
    a.qp.post_send(&[SendWr::send(1, &[mr.sge(0..8)]).signaled()]).unwrap();
    // The busy-poll receiver's own poll takes the Send in and returns its completion.
    assert_eq!(wait(&b.cq, 1, 10)[0].status, WcStatus::Success);
    let End { pd, cq, qp, dev } = b;
    qp.destroy().unwrap();
    drop((qp, cq, pd, dev));
    let w = wait(&a.cq, 1, 10);
    assert_eq!(w[0].status, WcStatus::Success, "{w:?}");
}

/// Blocking mode: an application that spins on its CQ drives the engine with its polls (the
/// spinner does the engine's work instead of competing with the engine thread for a core),
/// and a Send still completes; one that polls with gaps longer than `SPIN_GAP` (200 µs)
/// never does, nor one that arms its CQ between polls, however close they come (an
/// event-driven program: rping).
#[test]
fn a_spinning_poller_drives_a_blocking_device() {
    let a = end(UdpConfig::default());
    let b = end(UdpConfig::default());
    assert!(!a.dev.busy_poll());
    connect(&a.qp, b.dev.gid(), b.qp.qp_num(), Mtu::Mtu4096);
    connect(&b.qp, a.dev.gid(), a.qp.qp_num(), Mtu::Mtu4096);
    let mut wcs = [Wc::default(); 4];
    // Polls 500 µs apart (a wait on a condition of the clock, not a sleep): not spinning.
    for _ in 0..100 {
        let t = Instant::now();
        assert_eq!(a.cq.poll(&mut wcs).unwrap(), 0);
        while t.elapsed() < std::time::Duration::from_micros(500) {
            std::hint::spin_loop();
        }
    }
    assert_eq!(a.dev.counters().poller_turns, 0, "{:?}", a.dev.counters());
    // Back to back, but each after arming the CQ: waiting for events, not spinning.
    for _ in 0..1000 {
        a.cq.req_notify(NotifyKind::NextCompletion).unwrap();
        a.cq.poll(&mut wcs).unwrap();
    }
    assert_eq!(a.dev.counters().poller_turns, 0, "{:?}", a.dev.counters());
    // Back to back: after 64 of them the polls run turns.
    for _ in 0..1000 {
        a.cq.poll(&mut wcs).unwrap();
    }
    assert!(a.dev.counters().poller_turns > 0, "{:?}", a.dev.counters());
    let mr = a.pd.alloc_mr(64, Access::LOCAL_WRITE).unwrap();
    let rmr = b.pd.alloc_mr(64, Access::LOCAL_WRITE).unwrap();
    b.qp.post_recv(&[RecvWr::new(7, &[rmr.sge(0..64)])]).unwrap();
    a.qp.post_send(&[SendWr::send(1, &[mr.sge(0..64)]).signaled()]).unwrap();
    assert_eq!(wait(&a.cq, 1, 10)[0].status, WcStatus::Success);
    assert_eq!(wait(&b.cq, 1, 10)[0].wr_id, 7);
}

/// Busy-poll, a Write ping-pong of 64 KiB whose programs wait for the peer's Write by
/// spinning on its last bytes once their own Write has completed (perftest's
/// `ib_write_lat`): the peer's Write lands behind the ACK the program took, while nobody
/// polls. The engine thread, at its nap's end or woken by the datagrams, sees the program's
/// last act was taking a completion and nothing since, and stands in (a nap cut short).
/// Before, it stood in only once the program had been quiet for 100 µs, and each round
/// waited for a blind nap's end: 0.5-2 ms. Rounds run until a take-over was seen on either
/// device, for at most 20 s. (With a poll loop that yielded when the CQ was empty, beside
/// two busy loops, three runs of ten saw none in 2,000 rounds: yielding to them, the
/// programs polled too seldom to count as spinning, and no engine thread napped.)
#[test]
fn a_write_pingpong_that_spins_on_memory_is_taken_in_by_the_engine_thread() {
    use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
    let cfg = |last| UdpConfig::default().addr(std::net::Ipv4Addr::new(127, 0, 3, last)).busy_poll(true);
    let (a, b) = (end(cfg(5)), end(cfg(6)));
    connect(&a.qp, b.dev.gid(), b.qp.qp_num(), Mtu::Mtu4096);
    connect(&b.qp, a.dev.gid(), a.qp.qp_num(), Mtu::Mtu4096);
    const N: usize = 64 << 10;
    let all = Access::LOCAL_WRITE | Access::REMOTE_WRITE;
    let landing = |e: &End| e.pd.alloc_mr(N, all).unwrap();
    let (a_land, b_land) = (landing(&a), landing(&b));
    let (a_src, b_src) = (landing(&a), landing(&b));
    let seen = || a.dev.counters().naps_cut + b.dev.counters().naps_cut > 0;
    let done = AtomicBool::new(false);
    let until = Instant::now() + std::time::Duration::from_secs(20);
    // One side of the ping-pong: wait for round r's Write (unless it opens), answer with one.
    let side = |me: &End, land: &Mr, src: &Mr, peer: &Mr, opens: bool| {
        for r in 1.. {
            if !(opens && r == 1) {
                let deadline = Instant::now() + std::time::Duration::from_secs(20);
                let mut tail = [0u8; 8];
                loop {
                    land.read(N - 8, &mut tail).unwrap();
                    if u64::from_le_bytes(tail) == r || done.load(SeqCst) {
                        break;
                    }
                    assert!(Instant::now() < deadline, "round {r}'s Write never landed");
                    std::hint::spin_loop();
                }
            }
            if done.load(SeqCst) {
                return;
            }
            let r = if opens { r } else { r + 1 };
            src.write(N - 8, &r.to_le_bytes()).unwrap();
            me.qp.post_send(&[SendWr::rdma_write(r, &[src.sge(0..N)], peer.addr(), peer.rkey()).signaled()]).unwrap();
            // Spins on the CQ without yielding, as perftest does (a poller that yields to a
            // busy machine polls too seldom to count as spinning, and its engine thread
            // never naps).
            let mut wc = [Wc::default()];
            let deadline = Instant::now() + std::time::Duration::from_secs(20);
            while me.cq.poll(&mut wc).unwrap() == 0 {
                assert!(Instant::now() < deadline, "round {r}'s Write never completed");
            }
            assert_eq!(wc[0].status, WcStatus::Success);
            if seen() || Instant::now() > until {
                done.store(true, SeqCst);
                return;
            }
        }
    };
    std::thread::scope(|s| {
        s.spawn(|| side(&b, &b_land, &b_src, &a_land, false));
        side(&a, &a_land, &a_src, &b_land, true);
    });
    assert!(seen(), "no nap was cut short: {:?} {:?}", a.dev.counters(), b.dev.counters());
}
