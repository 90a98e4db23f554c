//! The SQ/RQ/SRQ rings against the engine: a WR posted right after its QP's error CQE is held
//! in SQE rather than swept up by the flush, and a queue resized by Modify QP or Modify SRQ
//! still posts without allocating.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use softhca::transport::MAX_DATAGRAM;
use softhca::*;

// ---- a counting allocator that counts only on threads that ask it to ----

struct Counting;

static ALLOCS: AtomicU64 = AtomicU64::new(0);

thread_local! {
    static COUNT_HERE: Cell<bool> = const { Cell::new(false) };
}

fn counting() -> bool {
    COUNT_HERE.try_with(|c| c.get()).unwrap_or(false)
}

// SAFETY: every call is forwarded unchanged to the system allocator; the bookkeeping is a
// const-initialised thread-local Cell and a relaxed atomic, neither of which allocates.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if counting() {
            ALLOCS.fetch_add(1, Ordering::Relaxed);
        }
        // SAFETY: the caller's layout contract is passed on as is.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: ptr came from System.alloc with this layout.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if counting() {
            ALLOCS.fetch_add(1, Ordering::Relaxed);
        }
        // SAFETY: as for alloc and dealloc.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// Allocations `f` makes on this thread.
fn allocs_in(f: impl FnOnce()) -> u64 {
    let before = ALLOCS.load(Ordering::SeqCst);
    COUNT_HERE.with(|c| c.set(true));
    f();
    COUNT_HERE.with(|c| c.set(false));
    ALLOCS.load(Ordering::SeqCst) - before
}

fn device(n: u8) -> (Context, Gid) {
    let gid = Gid::from_ipv4([127, 1, 77, n].into());
    (Context::create(DeviceConfig::default().name(format!("ringrev{n}")).gid0(gid).seed(n as u64)).unwrap(), gid)
}

/// An RC QP connected to itself, driven to RTS; `cap` (if any) is supplied at Init→RTR.
fn rc_rts(ctx: &Context, gid: Gid, pd: &Pd, cq: &Cq, sq: u32, cap: Option<WqSizes>) -> Qp {
    let qp = pd.create_qp(&QpInitAttr::rc(cq, cq).max_send_wr(sq).max_recv_wr(sq).max_send_sge(1)).unwrap();
    let av = AddressVector::new(AhAttr::roce(gid, 0), Mtu::Mtu1024);
    let _ = ctx;
    qp.modify(&QpAttr::to_init().port(1).pkey_index(0).access(Access::REMOTE_WRITE)).unwrap();
    let mut rtr = QpAttr::to_rtr(av, qp.qp_num()).rq_psn(0).max_dest_rd_atomic(1).min_rnr_timer(1);
    if let Some(c) = cap {
        rtr = rtr.cap(c);
    }
    qp.modify(&rtr).unwrap();
    qp.modify(&QpAttr::to_rts().sq_psn(0).timeout(10).retry_cnt(7).rnr_retry(7).max_rd_atomic(1)).unwrap();
    qp
}

/// A UD WQE fails (Local Length Error) with thousands queued behind it. An application that
/// polls the error CQE knows the QP is in SQE (ERR-SQ-1) and posts WR X while the engine is
/// still flushing the WQEs queued before: X must wait for SQE→RTS and then succeed, not be
/// flushed with them (the engine flushes exactly the WQEs published before it entered SQE).
/// Rule QPS-SQE-6, ERR-SQ-1
#[test]
fn wr_posted_after_polling_the_sqe_error_is_held_not_flushed() {
    const BEHIND: u64 = 8_000; // WQEs behind the failing one: a flush long enough to race
    const X: u64 = 1 << 40;
    let (ctx, gid) = device(1);
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(1 << 15).unwrap();
    let rcq = ctx.create_cq(16).unwrap();
    let qp = pd.create_qp(&QpInitAttr::ud(&cq, &rcq).max_send_wr(BEHIND as u32 + 16).max_send_sge(1)).unwrap();
    qp.modify(&QpAttr::to_init().port(1).pkey_index(0).qkey(0x1111)).unwrap();
    qp.modify(&QpAttr::new(QpState::Rtr)).unwrap();
    qp.modify(&QpAttr::to_rts().sq_psn(0)).unwrap();
    let ah = pd.create_ah(&AhAttr::roce(gid, 0)).unwrap();
    let mr = pd.alloc_mr(8192, Access::LOCAL_WRITE).unwrap();
    let (big, small) = ([mr.sge(0..8192)], [mr.sge(0..8)]);
    let dq = qp.qp_num();

    let mut flushed_x = 0;
    let rounds = 20;
    for round in 0..rounds {
        // WR 0 is longer than any MTU: it fails its interface checks when the engine starts it.
        qp.post_send(&[SendWr::send(0, &big).ud(&ah, dq, 0x1111).signaled()]).unwrap();
        let behind: Vec<SendWr<'_>> = (1..=BEHIND).map(|i| SendWr::send(i, &small).ud(&ah, dq, 0x1111)).collect();
        for chunk in behind.chunks(500) {
            qp.post_send(chunk).unwrap();
        }
        let x_status = std::thread::scope(|s| {
            let engine = s.spawn(|| {
                let mut buf = vec![0u8; MAX_DATAGRAM];
                // One turn starts WR 0, fails it, retires it and moves the QP to SQE.
                let _ = ctx.transmit(1_000, &mut buf);
            });
            // The application: poll the error, then post X at once.
            let deadline = Instant::now() + Duration::from_secs(20);
            let mut seen = 0u64;
            let mut x = None;
            loop {
                assert!(Instant::now() < deadline, "round {round}: CQEs missing ({seen} seen)");
                let Some(wc) = cq.poll_one().unwrap() else {
                    std::hint::spin_loop();
                    continue;
                };
                seen += 1;
                if wc.wr_id == 0 {
                    assert_eq!(wc.status, WcStatus::LocLenErr);
                    // ERR-SQ-1: the QP is in SQE now, as far as the application can tell.
                    qp.post_send(&[SendWr::send(X, &small).ud(&ah, dq, 0x1111).signaled()]).unwrap();
                } else if wc.wr_id == X {
                    x = Some(wc.status);
                } else {
                    assert_eq!(wc.status, WcStatus::WrFlushErr);
                }
                // WR 0 and the BEHIND flushed ones; X too when it was (wrongly) flushed.
                if seen > BEHIND {
                    engine.join().unwrap();
                    while let Some(wc) = cq.poll_one().unwrap() {
                        assert_eq!(wc.wr_id, X);
                        x = Some(wc.status);
                    }
                    break x;
                }
            }
        });
        assert_eq!(qp.state().unwrap(), QpState::Sqe);
        qp.modify(&QpAttr::to_rts()).unwrap();
        let mut buf = vec![0u8; MAX_DATAGRAM];
        while ctx.transmit(2_000, &mut buf).is_some() {}
        let x_status = match x_status {
            Some(s) => s,
            None => cq.poll_one().unwrap().expect("X completes after SQE→RTS").status,
        };
        if x_status == WcStatus::WrFlushErr {
            flushed_x += 1;
        } else {
            assert_eq!(x_status, WcStatus::Success);
        }
        assert_eq!(cq.poll_one().unwrap(), None);
    }
    assert_eq!(flushed_x, 0, "{flushed_x} of {rounds} WRs posted in SQE (after its error CQE was polled) were flushed");
}

/// The slots a Modify QP resize makes are readied like those of Create QP, so posting into
/// them does not allocate, as posting into a fresh QP's does not.
/// Rule MOD-GEN-8
#[test]
fn post_send_after_a_resize_does_not_allocate() {
    let (ctx, gid) = device(2);
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(1024).unwrap();
    let mr = pd.alloc_mr(64, Access::LOCAL_WRITE).unwrap();
    let sge = [mr.sge(0..8)];
    let wrs: Vec<SendWr<'_>> = (0..32).map(|i| SendWr::send(i, &sge)).collect();

    let fresh = rc_rts(&ctx, gid, &pd, &cq, 64, None);
    let baseline = allocs_in(|| {
        for wr in &wrs {
            fresh.post_send(std::slice::from_ref(wr)).unwrap();
        }
    });
    assert_eq!(baseline, 0, "a fresh QP's posts allocate (test premise)");

    let resized = rc_rts(&ctx, gid, &pd, &cq, 4, Some(WqSizes { max_send_wr: 64, max_recv_wr: 64 }));
    let after_resize = allocs_in(|| {
        for wr in &wrs {
            resized.post_send(std::slice::from_ref(wr)).unwrap();
        }
    });
    assert_eq!(after_resize, 0, "posts into slots made by a resize allocate");
}

/// The same for the slots a Modify SRQ resize makes.
#[test]
fn srq_post_after_a_resize_does_not_allocate() {
    let (ctx, _gid) = device(3);
    let pd = ctx.alloc_pd().unwrap();
    let mr = pd.alloc_mr(64, Access::LOCAL_WRITE).unwrap();
    let sge = [mr.sge(0..8)];
    let wrs: Vec<RecvWr<'_>> = (0..32).map(|i| RecvWr::new(i, &sge)).collect();

    let fresh = pd.create_srq(&SrqInitAttr { max_wr: 64, max_sge: 1, srq_limit: 0 }).unwrap();
    let baseline = allocs_in(|| {
        for wr in &wrs {
            fresh.post_recv(std::slice::from_ref(wr)).unwrap();
        }
    });
    assert_eq!(baseline, 0, "a fresh SRQ's posts allocate (test premise)");

    let resized = pd.create_srq(&SrqInitAttr { max_wr: 4, max_sge: 1, srq_limit: 0 }).unwrap();
    resized.modify(Some(64), None).unwrap();
    let after_resize = allocs_in(|| {
        for wr in &wrs {
            resized.post_recv(std::slice::from_ref(wr)).unwrap();
        }
    });
    assert_eq!(after_resize, 0, "posts into slots made by Modify SRQ allocate");
}
