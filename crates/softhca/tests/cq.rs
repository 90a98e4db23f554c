//! Completion Queue verbs (CRT-CQ, CQ) and completion notification (EVT-CN). CQEs are
//! produced here by flushing WQEs, which needs no traffic.

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::*;
use softhca::*;

/// Posts `n` receives with ids `base..base+n` to `qp` and flushes them by moving it to Error.
fn flush_recvs(qp: &Qp, base: u64, n: u64) {
    let sges = [];
    let wrs: Vec<RecvWr> = (base..base + n).map(|i| RecvWr::new(i, &sges)).collect();
    qp.post_recv(&wrs).unwrap();
    qp.modify(&QpAttr::to_error()).unwrap();
}

/// Rule CRT-CQ-1, CRT-CQ-2, CRT-CQ-3, CQ-QUERY-1
#[test]
fn create_cq_sizes() {
    let f = fixture();
    let max = f.ctx.query_device().unwrap().max_cqe;
    // Linux's size (rxe, mlx5): the next power of two above the request, less one.
    for (want, size) in [(1, 1), (2, 3), (3, 3), (4, 7), (100, 127), (256, 511), (1000, 1023), (max, max)] {
        assert_eq!(f.ctx.create_cq(want).unwrap().query().unwrap(), size, "{want}");
    }
    assert_eq!(f.ctx.create_cq(max + 1).unwrap_err(), VerbsError::CqSizeTooLarge);
    assert!(matches!(f.ctx.create_cq(0), Err(VerbsError::InvalidCqSize(_))));
    let a = f.ctx.create_cq(4).unwrap();
    let b = f.ctx.create_cq(4).unwrap();
    assert_ne!(a.handle(), b.handle());
}

/// Rule CRT-CQ-4
#[test]
fn create_cq_results_on_closed_device_and_exhaustion() {
    let mut cfg = DeviceConfig::default().seed(2);
    cfg.attr.max_cq = 2;
    let f = fixture_with(cfg); // holds one CQ already
    let second = f.ctx.create_cq(1).unwrap();
    assert_eq!(f.ctx.create_cq(1).unwrap_err(), VerbsError::InsufficientResources);
    second.destroy().unwrap();
    f.ctx.create_cq(1).unwrap();
    f.ctx.close();
    assert_eq!(f.ctx.create_cq(1).unwrap_err(), VerbsError::InvalidHcaHandle);
}

/// Rule CQ-POLL-1, CQ-POLL-2, CQ-POLL-3, CQ-POLL-4, CQ-ASSOC-1
#[test]
fn poll_returns_oldest_first_once_across_shared_queues() {
    let f = fixture();
    assert_eq!(f.cq.poll(&mut [Wc::default(); 4]).unwrap(), 0, "empty is not an error");
    let a = f.qp_in(QpType::Rc, QpState::Init);
    let b = f.qp_in(QpType::Ud, QpState::Init);
    flush_recvs(&a, 100, 3);
    flush_recvs(&b, 200, 2);
    let sges = [];
    a.post_send(&[SendWr::send(300, &sges)]).unwrap(); // a is in Error: flushed on the SCQ
    let got: Vec<(u32, u64)> = poll_all(&f.cq).iter().map(|w| (w.qp_num, w.wr_id)).collect();
    let (qa, qb) = (a.qp_num(), b.qp_num());
    assert_eq!(got, vec![(qa, 100), (qa, 101), (qa, 102), (qb, 200), (qb, 201), (qa, 300)]);
    assert_eq!(f.cq.poll_one().unwrap(), None);
}

/// Rule CQ-RESIZE-1, CQ-RESIZE-3, CQ-RESIZE-4, CQ-RESIZE-5
#[test]
fn resize_keeps_cqes_in_order_and_refuses_too_small() {
    let f = fixture();
    let cq = f.ctx.create_cq(16).unwrap();
    let qp = f.pd.create_qp(&QpInitAttr::rc(&cq, &cq)).unwrap();
    drive(&qp, QpState::Init);
    flush_recvs(&qp, 0, 10);
    assert!(matches!(cq.resize(9), Err(VerbsError::InvalidCqSize(_))));
    assert_eq!(cq.query().unwrap(), 31);
    let max = f.ctx.query_device().unwrap().max_cqe;
    assert_eq!(cq.resize(max + 1), Err(VerbsError::CqSizeTooLarge));
    assert_eq!(cq.query().unwrap(), 31);
    assert_eq!(cq.resize(10).unwrap(), 15);
    assert_eq!(cq.resize(1000).unwrap(), 1023);
    let ids: Vec<u64> = poll_all(&cq).iter().map(|w| w.wr_id).collect();
    assert_eq!(ids, (0..10).collect::<Vec<_>>());
}

/// Rule CQ-RESIZE-2
#[test]
fn resize_not_supported_leaves_cq_unchanged() {
    let mut cfg = DeviceConfig::default().seed(3);
    cfg.attr.resize_cq = false;
    let f = fixture_with(cfg);
    let before = f.cq.query().unwrap();
    assert!(matches!(f.cq.resize(before * 2), Err(VerbsError::NotSupported(_))));
    assert_eq!(f.cq.query().unwrap(), before);
}

/// Rule CQ-DESTROY-1, CQ-DESTROY-2, CQ-DESTROY-3, CQ-QUERY-2
#[test]
fn destroy_refused_while_in_use_then_handle_is_dead() {
    let f = fixture();
    let scq = f.ctx.create_cq(8).unwrap();
    let rcq = f.ctx.create_cq(8).unwrap();
    let qp = f.pd.create_qp(&QpInitAttr::rc(&scq, &rcq)).unwrap();
    assert_eq!(scq.destroy(), Err(VerbsError::CqInUse));
    assert_eq!(rcq.destroy(), Err(VerbsError::CqInUse));
    assert_eq!(scq.query().unwrap(), 15, "intact");
    qp.destroy().unwrap();
    scq.destroy().unwrap();
    rcq.destroy().unwrap();
    assert_eq!(scq.query(), Err(VerbsError::InvalidCqHandle));
    assert_eq!(scq.poll(&mut [Wc::default()]), Err(VerbsError::InvalidCqHandle));
    assert_eq!(scq.resize(4), Err(VerbsError::InvalidCqHandle));
    assert_eq!(scq.req_notify(NotifyKind::NextCompletion), Err(VerbsError::InvalidCqHandle));
    assert_eq!(scq.destroy(), Err(VerbsError::InvalidCqHandle));
    let r = f.pd.create_qp(&QpInitAttr::rc(&scq, &f.cq));
    assert_eq!(r.unwrap_err(), VerbsError::InvalidCqHandle);
}

fn counting_handler(ctx: &Context) -> Arc<Mutex<Vec<u32>>> {
    let calls = Arc::new(Mutex::new(Vec::new()));
    let c = calls.clone();
    ctx.set_completion_handler(move |cq| c.lock().unwrap().push(cq.handle())).unwrap();
    calls
}

/// Rule CQ-HANDLER-1, CQ-HANDLER-2, CQ-NOTIFY-1, CQ-NOTIFY-2, EVT-CN-1, EVT-CN-3, EVT-CN-4, EVT-CN-5
#[test]
fn next_completion_notification_fires_once_per_request() {
    let f = fixture();
    let calls = counting_handler(&f.ctx);
    let qp = f.qp_in(QpType::Rc, QpState::Init);
    flush_recvs(&qp, 0, 2);
    assert!(calls.lock().unwrap().is_empty(), "no request outstanding: no call");
    f.cq.req_notify(NotifyKind::NextCompletion).unwrap();
    assert!(calls.lock().unwrap().is_empty(), "CQEs already present do not trigger");
    let sges = [];
    qp.post_send(&[SendWr::send(7, &sges), SendWr::send(8, &sges)]).unwrap();
    assert_eq!(*calls.lock().unwrap(), vec![f.cq.handle()], "one call, consumed by the first CQE");
    qp.post_send(&[SendWr::send(9, &sges)]).unwrap();
    assert_eq!(calls.lock().unwrap().len(), 1);
    f.cq.req_notify(NotifyKind::NextCompletion).unwrap();
    qp.post_send(&[SendWr::send(10, &sges)]).unwrap();
    assert_eq!(calls.lock().unwrap().len(), 2);
}

/// Flush CQEs are errors, hence solicited events: a solicited-only request fires on them.
/// Rule EVT-CN-2, EVT-CN-6, EVT-SOL-2, EVT-SOL-5
#[test]
fn solicited_notification_and_both_requests() {
    let f = fixture();
    let calls = counting_handler(&f.ctx);
    let qp = f.qp_in(QpType::Rc, QpState::Error);
    f.cq.req_notify(NotifyKind::Solicited).unwrap();
    f.cq.req_notify(NotifyKind::NextCompletion).unwrap();
    let sges = [];
    qp.post_send(&[SendWr::send(1, &sges), SendWr::send(2, &sges)]).unwrap();
    assert_eq!(calls.lock().unwrap().len(), 1, "both requests consumed by one call");
    f.cq.req_notify(NotifyKind::Solicited).unwrap();
    qp.post_recv(&[RecvWr::new(3, &sges)]).unwrap();
    assert_eq!(calls.lock().unwrap().len(), 2, "a flushed (unsuccessful) CQE is solicited");
}

/// A completion channel receives the notifications of the CQs created with it.
/// Rule CQ-NOTIFY-2, EVT-CN-1
#[test]
fn completion_channel_delivers_events() {
    let f = fixture();
    let ch = f.ctx.create_comp_channel().unwrap();
    let cq = f.ctx.create_cq_with_channel(8, Some(&ch)).unwrap();
    let qp = f.pd.create_qp(&QpInitAttr::ud(&cq, &cq)).unwrap();
    drive(&qp, QpState::Error);
    assert!(ch.try_get_cq_event().is_none());
    cq.req_notify(NotifyKind::NextCompletion).unwrap();
    qp.post_recv(&[RecvWr::new(1, &[])]).unwrap();
    let ev = ch.get_cq_event(Duration::from_secs(1)).expect("event");
    assert_eq!(ev, cq);
    assert!(ch.try_get_cq_event().is_none());
}

/// Overflow: the CQE is not written, the CQ reports a CQ Error, and the CQEs already there stay.
/// Rule CQ-OVF-1, CQ-OVF-2, EVT-ASYNC-1, EVT-AE-1
#[test]
fn overflow_is_detected_and_reported() {
    let f = fixture();
    let events = Arc::new(AtomicUsize::new(0));
    let e = events.clone();
    f.ctx
        .set_async_event_handler(move |ev| {
            if ev.event_type == AsyncEventType::CqErr {
                e.fetch_add(1, Ordering::SeqCst);
            }
        })
        .unwrap();
    let cq = f.ctx.create_cq(2).unwrap();
    assert_eq!(cq.query().unwrap(), 3);
    let qp = f.pd.create_qp(&QpInitAttr::rc(&cq, &cq)).unwrap();
    drive(&qp, QpState::Init);
    flush_recvs(&qp, 0, 4);
    assert!(cq.overflowed().unwrap());
    assert_eq!(events.load(Ordering::SeqCst), 1);
    let ev = f.ctx.get_async_event().unwrap();
    assert_eq!(ev, AsyncEvent { event_type: AsyncEventType::CqErr, element: EventElement::Cq(cq.handle()) });
    let ids: Vec<u64> = poll_all(&cq).iter().map(|w| w.wr_id).collect();
    assert_eq!(ids, vec![0, 1, 2]);
}

/// Rule CRT-QP-1, CQ-ASSOC-1
#[test]
fn a_qp_may_use_one_cq_or_two() {
    let f = fixture();
    let other = f.ctx.create_cq(8).unwrap();
    let same = f.pd.create_qp(&QpInitAttr::rc(&f.cq, &f.cq)).unwrap();
    let split = f.pd.create_qp(&QpInitAttr::rc(&f.cq, &other)).unwrap();
    assert_eq!(same.send_cq(), same.recv_cq());
    assert_eq!(split.recv_cq(), &other);
    drive(&split, QpState::Init);
    flush_recvs(&split, 5, 1);
    split.post_send(&[SendWr::send(6, &[])]).unwrap();
    assert_eq!(poll_all(&other).iter().map(|w| w.wr_id).collect::<Vec<_>>(), vec![5]);
    assert_eq!(poll_all(&f.cq).iter().map(|w| w.wr_id).collect::<Vec<_>>(), vec![6]);
}

fn readable(fd: std::os::fd::RawFd) -> bool {
    let mut p = libc::pollfd { fd, events: libc::POLLIN, revents: 0 };
    // SAFETY: one valid pollfd, zero timeout.
    let n = unsafe { libc::poll(&mut p, 1, 0) };
    n == 1 && p.revents & libc::POLLIN != 0
}

/// The completion channel's and the device's descriptors are readable exactly while events
/// wait, so poll/epoll can wake a blocked consumer.
/// Rule CQ-NOTIFY-2, EVT-ASYNC-1
#[test]
fn channel_and_async_fds_work_with_poll() {
    let f = fixture();
    let ch = f.ctx.create_comp_channel().unwrap();
    let cq = f.ctx.create_cq_with_channel(8, Some(&ch)).unwrap();
    let qp = f.pd.create_qp(&QpInitAttr::ud(&cq, &cq)).unwrap();
    drive(&qp, QpState::Error);
    assert!(!readable(ch.fd()));
    cq.req_notify(NotifyKind::NextCompletion).unwrap();
    qp.post_recv(&[RecvWr::new(1, &[])]).unwrap();
    cq.req_notify(NotifyKind::NextCompletion).unwrap();
    qp.post_recv(&[RecvWr::new(2, &[])]).unwrap();
    assert!(readable(ch.fd()));
    assert!(ch.try_get_cq_event().is_some());
    assert!(readable(ch.fd()), "one more event waits");
    assert!(ch.try_get_cq_event().is_some());
    assert!(!readable(ch.fd()));

    let fd = f.ctx.async_fd().expect("an eventfd");
    assert!(!readable(fd));
    let small = f.ctx.create_cq(1).unwrap();
    let qp = f.pd.create_qp(&QpInitAttr::rc(&small, &small)).unwrap();
    drive(&qp, QpState::Error);
    qp.post_recv(&[RecvWr::new(1, &[]), RecvWr::new(2, &[])]).unwrap(); // overflows
    assert!(readable(fd));
    assert_eq!(f.ctx.get_async_event().map(|e| e.event_type), Some(AsyncEventType::CqErr));
    assert!(!readable(fd));
}

/// A driver's progress hook runs at the start of every poll, so the polling thread can drive
/// the engine.
#[test]
fn progress_hook_runs_on_poll() {
    let f = fixture();
    let n = Arc::new(AtomicUsize::new(0));
    let c = n.clone();
    f.ctx.set_progress(Some(Arc::new(move || {
        c.fetch_add(1, Ordering::SeqCst);
    })));
    f.cq.poll(&mut [Wc::default(); 4]).unwrap();
    f.cq.poll_one().unwrap();
    assert_eq!(n.load(Ordering::SeqCst), 2);
    f.ctx.set_progress(None);
    f.cq.poll_one().unwrap();
    assert_eq!(n.load(Ordering::SeqCst), 2);
}

/// Handlers run after softhca has let go of its locks, so a completion handler may post to the
/// very QP whose CQE woke it, and an asynchronous event handler may query the QP.
/// Rule CQ-HANDLER-2, EVT-ASYNC-1
#[test]
fn handlers_may_call_verbs_on_the_same_qp() {
    let f = fixture();
    let qp = f.qp_in(QpType::Rc, QpState::Error);
    let seen = Arc::new(Mutex::new(Vec::new()));
    let (q, s) = (qp.clone(), seen.clone());
    f.ctx
        .set_completion_handler(move |cq| {
            // Posting flushes at once (the QP is in Error): a CQE on this same CQ.
            q.post_recv(&[RecvWr::new(99, &[])]).unwrap();
            s.lock().unwrap().push(cq.len().unwrap());
        })
        .unwrap();
    let (q, s) = (qp.clone(), seen.clone());
    f.ctx
        .set_async_event_handler(move |_| {
            s.lock().unwrap().push(100 + q.outstanding().unwrap().0);
        })
        .unwrap();
    f.cq.req_notify(NotifyKind::NextCompletion).unwrap();
    qp.post_send(&[SendWr::send(1, &[])]).unwrap();
    assert_eq!(*seen.lock().unwrap(), vec![2], "the handler ran after the post, and its own post flushed");
    assert_eq!(poll_all(&f.cq).iter().map(|w| w.wr_id).collect::<Vec<_>>(), vec![1, 99]);
    // An overflow raises CQ Error: the async handler runs outside the locks too.
    let small = f.ctx.create_cq(1).unwrap();
    let qp2 = f.pd.create_qp(&QpInitAttr::rc(&small, &small)).unwrap();
    drive(&qp2, QpState::Error);
    qp2.post_recv(&[RecvWr::new(1, &[]), RecvWr::new(2, &[])]).unwrap();
    assert_eq!(seen.lock().unwrap().last(), Some(&100));
}
