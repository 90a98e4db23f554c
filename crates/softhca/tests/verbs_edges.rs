//! Verbs-layer edge cases from a review: Error → Error changes nothing, a flush that overflows
//! the CQ on entry to SQE moves the QP to Error, one overflow is one CQ Error, a huge CQ is
//! refused rather than panicking, and a channel's descriptor is readable exactly while events
//! wait.

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::pair::*;
use common::*;
use softhca::*;

fn count(ctx: &Context, t: AsyncEventType) -> usize {
    std::iter::from_fn(|| ctx.get_async_event()).filter(|e| e.event_type == t).count()
}

/// Error→Error "is accepted and changes nothing", and Last WQE Reached is generated exactly
/// once per entry to Error: a second Modify QP to Error does not raise it again.
/// Rule EVT-LWR-1, QPT-SW-9
#[test]
fn last_wqe_reached_is_not_raised_again_by_error_to_error() {
    let f = fixture();
    let srq = f.pd.create_srq(&SrqInitAttr::default()).unwrap();
    let qp = f.pd.create_qp(&QpInitAttr::rc(&f.cq, &f.cq).max_recv_wr(0).srq(&srq)).unwrap();
    drive(&qp, QpState::Init);
    qp.modify(&QpAttr::to_error()).unwrap();
    assert_eq!(count(&f.ctx, AsyncEventType::QpLastWqeReached), 1);
    qp.modify(&QpAttr::to_error()).unwrap();
    assert_eq!(count(&f.ctx, AsyncEventType::QpLastWqeReached), 0, "a second Last WQE Reached for the same entry");
}

/// A UD QP whose SQ WQE fails moves to SQE and flushes the WQEs behind it. When those flush
/// CQEs overflow the CQ, the CQ Error is raised and the QP moves to Error, not SQE.
/// Rule CQ-OVF-2, QPT-AUTO-6
#[test]
fn flush_on_entry_to_sqe_that_overflows_the_cq_moves_the_qp_to_error() {
    let mut p = Pair::with(QpType::Ud, Mtu::Mtu1024, Opts { cq_size: 2, ..Opts::default() });
    let ah = p.a.pd.create_ah(&AhAttr::roce(p.b.gid, 0)).unwrap();
    let src = p.a.pd.alloc_mr(8192, Access::LOCAL_WRITE).unwrap();
    let bq = p.b.qp.qp_num();
    let (big, small) = ([src.sge(0..4097)], [src.sge(0..8)]);
    p.a.qp
        .post_send(&[
            SendWr::send(1, &big).ud(&ah, bq, 0x1111).signaled(), // Local Length Error → SQE
            SendWr::send(2, &small).ud(&ah, bq, 0x1111).signaled(), // flushed, fills the CQ
            SendWr::send(3, &small).ud(&ah, bq, 0x1111).signaled(), // flush CQE lost
            SendWr::send(4, &small).ud(&ah, bq, 0x1111).signaled(), // flush CQE lost
        ])
        .unwrap();
    p.run(10_000_000_000);
    assert!(p.a.cq.overflowed().unwrap());
    assert!(count(&p.a.ctx, AsyncEventType::CqErr) >= 1);
    assert_eq!(p.a.qp.state().unwrap(), QpState::Error, "the QP whose CQE could not be written stays in SQE");
}

/// One overflow of one CQ is one CQ Error, however many CQEs it refuses; once a CQE fits
/// again, the next refusal is a new overflow with its own CQ Error.
/// Rule CQ-OVF-2, EVT-AE-1
#[test]
fn one_overflow_raises_one_cq_error() {
    let f = fixture();
    let cq = f.ctx.create_cq(2).unwrap();
    let qp = f.pd.create_qp(&QpInitAttr::rc(&cq, &cq)).unwrap();
    drive(&qp, QpState::Init);
    let wrs: Vec<RecvWr> = (0..6).map(|i| RecvWr::new(i, &[])).collect();
    qp.post_recv(&wrs).unwrap();
    qp.modify(&QpAttr::to_error()).unwrap(); // 2 flushed CQEs fit, 4 are refused
    assert_eq!(count(&f.ctx, AsyncEventType::CqErr), 1);
    // Polled empty, the CQ takes CQEs again: a later overflow is another, and is reported.
    while !poll_all(&cq).is_empty() {}
    let qp2 = f.pd.create_qp(&QpInitAttr::rc(&cq, &cq)).unwrap();
    drive(&qp2, QpState::Init);
    qp2.post_recv(&wrs).unwrap();
    qp2.modify(&QpAttr::to_error()).unwrap();
    assert_eq!(count(&f.ctx, AsyncEventType::CqErr), 1, "the second overflow's");
}

/// Never panic on caller input (DESIGN rule 6): Create CQ on a device configured with a huge
/// `max_cqe` rounds up without overflow and refuses what it cannot allocate.
/// Rule CRT-CQ-2, CRT-CQ-4
#[test]
fn create_cq_with_a_large_max_cqe_does_not_panic() {
    let mut cfg = DeviceConfig::default().seed(5);
    cfg.attr.max_cqe = u32::MAX;
    let f = fixture_with(cfg);
    let r = std::panic::catch_unwind(|| f.ctx.create_cq((1 << 31) + 1).map(|_| ()));
    assert!(r.is_ok(), "create_cq panicked");
}

fn readable(fd: std::os::fd::RawFd) -> bool {
    let mut p = libc::pollfd { fd, events: libc::POLLIN, revents: 0 };
    // SAFETY: one valid pollfd, zero timeout.
    let n = unsafe { libc::poll(&mut p, 1, 0) };
    n == 1 && p.revents & libc::POLLIN != 0
}

/// The channel's fd is readable exactly while events wait, with a producer and a consumer
/// racing: the descriptor's count moves with the queue, under its lock.
/// Rule CQ-NOTIFY-2 (ibv_comp_channel::fd semantics)
#[test]
fn channel_fd_is_not_left_readable_with_no_event_pending() {
    const N: u64 = 200_000;
    let f = fixture();
    let ch = f.ctx.create_comp_channel().unwrap();
    let cq = f.ctx.create_cq_with_channel(64, Some(&ch)).unwrap();
    let qp = f.pd.create_qp(&QpInitAttr::ud(&cq, &cq)).unwrap();
    drive(&qp, QpState::Error);
    let stop = Arc::new(AtomicBool::new(false));
    let (ch2, stop2) = (ch.clone(), stop.clone());
    let consumer = std::thread::spawn(move || {
        let mut got = 0u64;
        let deadline = Instant::now() + Duration::from_secs(60);
        while got < N && Instant::now() < deadline && !stop2.load(Ordering::Relaxed) {
            if ch2.try_get_cq_event().is_some() {
                got += 1;
            }
        }
        got
    });
    for i in 0..N {
        cq.req_notify(NotifyKind::NextCompletion).unwrap();
        qp.post_recv(&[RecvWr::new(i, &[])]).unwrap(); // flushed at once: one event
        cq.poll_one().unwrap();
    }
    let got = consumer.join().unwrap();
    stop.store(true, Ordering::Relaxed);
    assert_eq!(got, N, "every event delivered");
    assert!(ch.try_get_cq_event().is_none());
    assert!(!readable(ch.fd()), "fd readable with no event pending");
}

/// A link that its pollers drive (busy-poll) gets an engine turn from Poll for Completion,
/// but completions already waiting are returned first, without one: the turn would take in
/// what arrived behind the packet that completed them (an ACK) before the application can
/// answer it. Never twice in a row, so that a poller that always finds completions still
/// drives the device; an empty CQ always drives it.
/// Rule CQ-POLL-1, CQ-POLL-3
#[test]
fn a_poll_that_finds_completions_waiting_skips_one_engine_turn() {
    let f = fixture();
    let turns = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let t = turns.clone();
    f.ctx.set_progress(Some(Arc::new(move || {
        t.fetch_add(1, Ordering::Relaxed);
    })));
    let mut wc = [Wc::default()];
    assert_eq!(f.cq.poll(&mut wc).unwrap(), 0);
    assert_eq!(turns.load(Ordering::Relaxed), 1, "an empty CQ drives the device");
    // Three flushed receives wait in the CQ.
    let qp = f.pd.create_qp(&QpInitAttr::rc(&f.cq, &f.cq)).unwrap();
    drive(&qp, QpState::Init);
    let mr = f.pd.alloc_mr(64, Access::LOCAL_WRITE).unwrap();
    let sge = [mr.sge(0..8)];
    qp.post_recv(&(0..3).map(|i| RecvWr::new(i, &sge)).collect::<Vec<_>>()).unwrap();
    qp.modify(&QpAttr::to_error()).unwrap();
    let seen: Vec<(usize, usize)> = (0..4)
        .map(|_| {
            let n = f.cq.poll(&mut wc).unwrap();
            (n, turns.load(Ordering::Relaxed))
        })
        .collect();
    assert_eq!(seen, [(1, 1), (1, 2), (1, 2), (0, 3)], "(CQEs returned, turns so far) per poll");
    // Polling with no room for a CQE is a plain progress call.
    f.cq.poll(&mut []).unwrap();
    assert_eq!(turns.load(Ordering::Relaxed), 4);
    f.ctx.set_progress(None);
}

/// Dropping the last handle of a QP, a memory window or an EEC that was never destroyed
/// destroys it, as closing a context destroys what it still has: the device's tables hold
/// these objects and the objects hold the device, so before, each one kept itself and the
/// whole device (its rings, buffers and tables) for the life of the process. A clone of a
/// handle keeps the object; the device leaves the device list once the last handle of
/// anything on it is gone. (Found by the `receive` fuzz target, which ran out of memory.)
/// Rule QPT-SW-12
#[test]
fn the_last_handle_dropped_destroys_what_the_program_did_not() {
    let mut cfg = DeviceConfig::default().name("dropped-handles");
    cfg.attr.max_qp = 2;
    cfg.attr.max_mw = 1;
    cfg.attr.max_ee = 1;
    {
        let ctx = Context::create(cfg).unwrap();
        let pd = ctx.alloc_pd().unwrap();
        let cq = ctx.create_cq(16).unwrap();
        let rc = || pd.create_qp(&QpInitAttr::rc(&cq, &cq));
        let first = rc().unwrap();
        let second = rc().unwrap();
        assert!(rc().is_err(), "max_qp is 2");
        let kept = first.clone();
        drop(first);
        assert!(rc().is_err(), "a clone keeps the QP");
        kept.query().unwrap();
        drop(kept);
        let third = rc().unwrap();
        drive(&third, QpState::Rts);
        drop(third);
        rc().unwrap();
        second.destroy().unwrap();
        drop(second); // destroyed already: nothing more happens

        let mw = pd.alloc_mw().unwrap();
        assert!(pd.alloc_mw().is_err(), "max_mw is 1");
        drop(mw);
        let _mw = pd.alloc_mw().unwrap();

        let rdd = ctx.alloc_rdd().unwrap();
        let eec = ctx.create_eec(&rdd).unwrap();
        assert!(ctx.create_eec(&rdd).is_err(), "max_ee is 1");
        drop(eec);
        let _eec = ctx.create_eec(&rdd).unwrap();
        let _rd = pd.create_qp(&QpInitAttr::rd(&cq, &cq, &rdd));
        assert!(device_list().iter().any(|d| d.name == "dropped-handles"));
    }
    assert!(!device_list().iter().any(|d| d.name == "dropped-handles"), "the device outlived every handle");
}

/// A last handle dropped by a thread-local's destructor, as a thread ends, destroys its QP
/// too: the deferred-callback queue is itself a thread-local and may be gone by then, and the
/// drop must not touch it (a panic in a thread-local destructor aborts the process).
/// Rule QPT-SW-12
#[test]
fn a_handle_dropped_as_its_thread_ends_destroys_the_qp() {
    use std::cell::RefCell;
    thread_local! {
        static HELD: RefCell<Option<Qp>> = const { RefCell::new(None) };
    }
    let mut cfg = DeviceConfig::default().name("thread-local-handle");
    cfg.attr.max_qp = 1;
    let ctx = Context::create(cfg).unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(16).unwrap();
    let qp = pd.create_qp(&QpInitAttr::rc(&cq, &cq)).unwrap();
    std::thread::spawn(move || {
        HELD.with(|h| *h.borrow_mut() = Some(qp));
        // A verb after it: softhca's own thread-locals are set up later, and torn down first.
        HELD.with(|h| {
            h.borrow()
                .as_ref()
                .unwrap()
                .modify(&QpAttr::to_init().port(1).pkey_index(0).access(Access::REMOTE_WRITE))
                .unwrap()
        });
    })
    .join()
    .unwrap();
    pd.create_qp(&QpInitAttr::rc(&cq, &cq)).expect("the thread's QP was destroyed with it");
}
