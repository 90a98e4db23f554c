//! Posting, polling and the engine on different threads, as with the UDP link: application
//! threads post and poll their own QPs while one engine thread moves packets and runs timers.
//! Nothing deadlocks, every WQE completes in order, every byte arrives.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use softhca::transport::MAX_DATAGRAM;
use softhca::*;

const PAIRS: usize = 4;
const OPS: u64 = 2_000;

fn device(n: u8) -> (Context, Gid) {
    let gid = Gid::from_ipv4([127, 1, 9, n].into());
    (Context::create(DeviceConfig::default().name(format!("thr{n}")).gid0(gid).seed(n as u64)).unwrap(), gid)
}

/// The engine on a thread of its own: a virtual clock that advances a little every turn, one
/// packet each way at a time, so that the application threads interleave with it.
struct Engine {
    stop: Arc<AtomicBool>,
    thread: std::thread::JoinHandle<()>,
}

impl Engine {
    fn start(a: &Context, b: &Context) -> Engine {
        let stop = Arc::new(AtomicBool::new(false));
        let (a, b, flag) = (a.clone(), b.clone(), stop.clone());
        let thread = std::thread::spawn(move || {
            let mut buf = vec![0u8; MAX_DATAGRAM];
            let mut now = 0u64;
            while !flag.load(Ordering::Acquire) {
                now += 500;
                for (src, dst) in [(&a, &b), (&b, &a)] {
                    if let Some(n) = src.transmit(now, &mut buf) {
                        dst.receive(now, &buf[..n]);
                    }
                    src.handle_timeout(now);
                }
                std::thread::yield_now();
            }
        });
        Engine { stop, thread }
    }

    fn stop(self) {
        self.stop.store(true, Ordering::Release);
        self.thread.join().unwrap();
    }
}

#[test]
fn app_threads_and_an_engine_thread() {
    let (a, ga) = device(1);
    let (b, gb) = device(2);
    let all = Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ;
    let mut pairs = Vec::new();
    for _ in 0..PAIRS {
        let (pa, pb) = (a.alloc_pd().unwrap(), b.alloc_pd().unwrap());
        let (ca, cb) = (a.create_cq(256).unwrap(), b.create_cq(256).unwrap());
        let qa = pa.create_qp(&QpInitAttr::rc(&ca, &ca).max_send_wr(64)).unwrap();
        let qb = pb.create_qp(&QpInitAttr::rc(&cb, &cb).max_recv_wr(256)).unwrap();
        for (qp, peer, gid) in [(&qa, &qb, gb), (&qb, &qa, ga)] {
            let av = AddressVector::new(AhAttr::roce(gid, 0), Mtu::Mtu1024);
            qp.modify(&QpAttr::to_init().port(1).pkey_index(0).access(all)).unwrap();
            qp.modify(&QpAttr::to_rtr(av, peer.qp_num()).rq_psn(0).max_dest_rd_atomic(4).min_rnr_timer(1)).unwrap();
            qp.modify(&QpAttr::to_rts().sq_psn(0).timeout(10).retry_cnt(7).rnr_retry(7).max_rd_atomic(4)).unwrap();
        }
        pairs.push((pa, pb, ca, cb, qa, qb));
    }

    let engine = Engine::start(&a, &b);

    let (done_tx, done_rx) = mpsc::channel();
    let mut apps = Vec::new();
    for (i, (pa, pb, ca, cb, qa, qb)) in pairs.into_iter().enumerate() {
        let done = done_tx.clone();
        apps.push(std::thread::spawn(move || {
            let src =
                pa.reg_mr((0..4096u32).map(|k| (k as usize * (i + 3)) as u8).collect(), Access::LOCAL_WRITE).unwrap();
            let dst = pb.alloc_mr(4096, all).unwrap();
            let rbuf = pb.alloc_mr(4096, Access::LOCAL_WRITE).unwrap();
            let mut wcs = [Wc::default(); 32];
            let (mut posted, mut completed, mut received) = (0u64, 0u64, 0u64);
            while completed < OPS || received < OPS / 2 {
                while posted < OPS && posted - completed < 32 {
                    let len = 1 + (posted as usize * 37) % 3000;
                    let sge = [src.sge(0..len)];
                    let wr = if posted % 2 == 0 {
                        qb.post_recv(&[RecvWr::new(posted, &[rbuf.sge(0..4096)])]).unwrap();
                        SendWr::send(posted, &sge)
                    } else {
                        SendWr::rdma_write(posted, &sge, dst.addr(), dst.rkey())
                    };
                    qa.post_send(&[wr.signaled()]).unwrap();
                    posted += 1;
                }
                let n = ca.poll(&mut wcs).unwrap();
                for wc in &wcs[..n] {
                    assert_eq!((wc.wr_id, wc.status), (completed, WcStatus::Success));
                    completed += 1;
                }
                let n = cb.poll(&mut wcs).unwrap();
                for wc in &wcs[..n] {
                    assert_eq!(wc.status, WcStatus::Success);
                    assert_eq!(wc.byte_len as u64, 1 + (wc.wr_id * 37) % 3000);
                    received += 1;
                }
                std::thread::yield_now();
            }
            assert_eq!(dst.to_vec().unwrap()[..1000], src.to_vec().unwrap()[..1000]);
            done.send(i).unwrap();
        }));
    }
    drop(done_tx);
    for _ in 0..PAIRS {
        // A bound on a hang, not a speed check: a deadlock fails here instead of stalling CI.
        done_rx.recv_timeout(Duration::from_secs(300)).expect("an application thread finished");
    }
    for t in apps {
        t.join().unwrap();
    }
    engine.stop();
}

/// A CQ filled on one thread and polled on another at the same time: every CQE arrives once,
/// in order, and a full CQ refuses rather than overwrites (the ring's producer and consumer
/// sides never share a lock).
/// Rule CQ-POLL-1, CQ-POLL-2, CQ-OVF-1
#[test]
fn cq_filled_and_polled_concurrently() {
    let (ctx, _) = device(3);
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(64).unwrap();
    let qp = pd.create_qp(&QpInitAttr::ud(&cq, &cq).max_recv_wr(64)).unwrap();
    qp.modify(&QpAttr::to_error()).unwrap();
    const N: u64 = 200_000;
    let producer = {
        let qp = qp.clone();
        let cq = cq.clone();
        std::thread::spawn(move || {
            let mut i = 0;
            while i < N {
                // Keep room: a flush into a full CQ would be an overflow, not a test of order.
                if cq.len().unwrap() < 60 {
                    qp.post_recv(&[RecvWr::new(i, &[])]).unwrap();
                    i += 1;
                } else {
                    std::thread::yield_now();
                }
            }
        })
    };
    let mut next = 0u64;
    let mut wcs = [Wc::default(); 16];
    while next < N {
        let n = cq.poll(&mut wcs).unwrap();
        for wc in &wcs[..n] {
            assert_eq!(wc.wr_id, next);
            next += 1;
        }
    }
    producer.join().unwrap();
    assert!(!cq.overflowed().unwrap());
    assert_eq!(cq.poll(&mut wcs).unwrap(), 0);
}

/// One round of the racing-post tests: `qa` on device a sends RDMA Writes to `qb` on device b.
/// `qa`'s SQ is small enough that its posters meet a full queue and the ring wraps; its RQ is
/// large, so that receive posters keep publishing for a while.
struct Rc {
    qa: Qp,
    qb: Qp,
    /// `qa`'s send and receive CQs, large enough for every CQE of a round.
    scq: Cq,
    rcq: Cq,
    src: Mr,
    dst: Mr,
    /// The gather list of `qb`'s WRs.
    bsrc: Mr,
}

const SQ: u32 = 64;
const RQ: u32 = 8192;
/// Each WR's SGEs, and WRs per post, in the Error race: a post checks and fills them all
/// between its load of the QP state and its publish, which widens the window that the
/// handshake in `verbs::qp` must close.
const SGES: usize = 8;
const BATCH: u64 = 16;

fn rc(a: &Context, ga: Gid, b: &Context, gb: Gid) -> Rc {
    let all = Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ;
    let (pa, pb) = (a.alloc_pd().unwrap(), b.alloc_pd().unwrap());
    let (scq, rcq, cb) = (a.create_cq(1 << 16).unwrap(), a.create_cq(1 << 16).unwrap(), b.create_cq(64).unwrap());
    let init = QpInitAttr::rc(&scq, &rcq).max_send_wr(SQ).max_recv_wr(RQ).sq_sig_all(true);
    let qa = pa.create_qp(&init.max_send_sge(SGES as u32).max_recv_sge(SGES as u32)).unwrap();
    let qb = pb.create_qp(&QpInitAttr::rc(&cb, &cb)).unwrap();
    for (qp, peer, gid) in [(&qa, &qb, gb), (&qb, &qa, ga)] {
        let av = AddressVector::new(AhAttr::roce(gid, 0), Mtu::Mtu1024);
        qp.modify(&QpAttr::to_init().port(1).pkey_index(0).access(all)).unwrap();
        qp.modify(&QpAttr::to_rtr(av, peer.qp_num()).rq_psn(0).max_dest_rd_atomic(4).min_rnr_timer(1)).unwrap();
        qp.modify(&QpAttr::to_rts().sq_psn(0).timeout(10).retry_cnt(7).rnr_retry(7).max_rd_atomic(4)).unwrap();
    }
    let src = pa.reg_mr(vec![7u8; 64], Access::LOCAL_WRITE).unwrap();
    let dst = pb.alloc_mr(64, all).unwrap();
    let bsrc = pb.alloc_mr(8, Access::LOCAL_WRITE).unwrap();
    Rc { qa, qb, scq, rcq, src, dst, bsrc }
}

/// Posts `wrs` until the queue has room for all of them; any other error is returned.
fn post_until_room(qp: &Qp, wrs: &[SendWr<'_>]) -> std::result::Result<(), PostError> {
    loop {
        match qp.post_send(wrs) {
            Err(e) if e.error == VerbsError::QueueFull => std::thread::yield_now(),
            r => return r,
        }
    }
}

/// Thread `t`'s WR number `k`.
fn wr_id(t: u64, k: u64) -> u64 {
    (t << 32) | k
}

/// Polls `cq` until it has given `n` CQEs. The deadline bounds a hang (a lost WR), it does not
/// measure speed.
fn poll_n(cq: &Cq, n: usize) -> Vec<Wc> {
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut got = Vec::with_capacity(n);
    let mut wcs = [Wc::default(); 64];
    while got.len() < n {
        let k = cq.poll(&mut wcs).unwrap();
        got.extend_from_slice(&wcs[..k]);
        if k == 0 {
            assert!(Instant::now() < deadline, "{} of {n} CQEs: a WR never completed", got.len());
            std::thread::yield_now();
        }
    }
    assert_eq!(cq.poll(&mut wcs).unwrap(), 0, "more CQEs than WRs");
    got
}

/// Every WR of `wcs` completed exactly once, each thread's in its post order, and `expected`
/// says which WR IDs there are.
fn once_each_in_order(wcs: &[Wc], expected: impl Iterator<Item = u64>) {
    let mut seen: HashMap<u64, usize> = HashMap::new();
    let mut last: HashMap<u64, u64> = HashMap::new();
    for wc in wcs {
        *seen.entry(wc.wr_id).or_default() += 1;
        let (t, k) = (wc.wr_id >> 32, wc.wr_id & 0xFFFF_FFFF);
        if let Some(prev) = last.insert(t, k) {
            assert!(k > prev, "thread {t}: WR {k} completed after WR {prev}");
        }
    }
    let mut n = 0;
    for id in expected {
        assert_eq!(seen.get(&id), Some(&1), "WR {id:#x} completed {:?} times", seen.get(&id));
        n += 1;
    }
    assert_eq!(seen.len(), n, "CQEs of WRs never posted");
}

/// Waits until the other threads have posted `threshold` WRs, then runs `f`.
fn when_posted(posted: &AtomicU64, threshold: u64, f: impl FnOnce()) {
    while posted.load(Ordering::Acquire) < threshold {
        std::thread::yield_now();
    }
    f();
}

const POSTERS: u64 = 3;
const PER_POSTER: u64 = 240;
const RECV_POSTERS: u64 = 2;
/// Posts a poster of the Error race still makes after it saw the first flush.
const POSTS_AFTER: u64 = 4;
/// WRs a send poster of the Error race posts before it waits for the flush.
const SENDS_BEFORE: u64 = 32;
const ROUNDS: u64 = 40;
/// The WR ID of the WR that makes the engine move the QP to Error.
const BAD: u64 = u64::MAX;

/// How a round of `posts_racing_the_error_state_complete_once` moves the QP to Error.
#[derive(Debug, Clone, Copy)]
enum ToError {
    /// Modify QP, from another thread.
    Modify,
    /// The engine, on a WR of the QP's own whose L_Key is bad (its requester).
    BadLocalKey,
    /// The engine, on an inbound RDMA Write with a bad R_Key (its responder).
    BadInbound,
}

/// Several threads post to the SQ and others to the RQ of one RC QP while the engine runs and
/// the QP goes to Error: moved there by Modify QP from yet another thread, or by the engine
/// itself on a bad WR or a bad inbound request. Every WR posted completes exactly once,
/// successfully or flushed, each thread's in post order, and no success follows the first
/// error: a WR published as the engine flushed is flushed, never lost. The posters post until
/// the flush reaches them, so that they are publishing when the error strikes.
/// Rule QPS-ERR-3, QPS-ERR-4, ERR-FLUSH-1, ERR-FLUSH-3, ORD-SQ-3
#[test]
fn posts_racing_the_error_state_complete_once() {
    let (a, ga) = device(4);
    let (b, gb) = device(5);
    let engine = Engine::start(&a, &b);
    for round in 0..ROUNDS * 3 {
        let how = [ToError::Modify, ToError::BadLocalKey, ToError::BadInbound][(round % 3) as usize];
        let r = rc(&a, ga, &b, gb);
        let posted = AtomicU64::new(0);
        // Where the error strikes moves from round to round, early in the SQ's posts.
        let threshold = (round * 7) % 64;
        // WRs posted by each thread: SQ posters first, then RQ posters.
        let counts: Vec<AtomicU64> = (0..POSTERS + RECV_POSTERS).map(|_| AtomicU64::new(0)).collect();
        std::thread::scope(|s| {
            for (t, count) in (0..).zip(&counts) {
                let (r, posted) = (&r, &posted);
                s.spawn(move || {
                    let sges: Vec<Sge> = (0..SGES).map(|i| r.src.sge(i..i + 1)).collect();
                    let (mut k, mut after) = (0, 0);
                    // Only the flush puts a CQE on the receive CQ: nothing is sent to `qa`.
                    while after < POSTS_AFTER {
                        let flushed = r.rcq.len().unwrap() > 0;
                        if t < POSTERS && k >= SENDS_BEFORE && !flushed {
                            // Enough Writes: while `qa` sends, `qb` answers with ACKs, which go
                            // before its own requests, so its bad Write would never leave.
                            std::thread::yield_now();
                            continue;
                        }
                        let ids = k..k + BATCH;
                        let done = if t < POSTERS {
                            let wrs: Vec<SendWr<'_>> = ids
                                .map(|i| SendWr::rdma_write(wr_id(t, i), &sges, r.dst.addr(), r.dst.rkey()))
                                .collect();
                            r.qa.post_send(&wrs)
                        } else {
                            let wrs: Vec<RecvWr<'_>> = ids.map(|i| RecvWr::new(wr_id(t, i), &sges)).collect();
                            r.qa.post_recv(&wrs)
                        };
                        match done {
                            Ok(()) => {
                                k += BATCH;
                                posted.fetch_add(BATCH, Ordering::AcqRel);
                            }
                            Err(e) if e.error == VerbsError::QueueFull => std::thread::yield_now(),
                            Err(e) => panic!("{e:?}"),
                        }
                        if flushed {
                            after += 1;
                        }
                    }
                    count.store(k, Ordering::Release);
                });
            }
            s.spawn(|| {
                when_posted(&posted, threshold, || match how {
                    ToError::Modify => r.qa.modify(&QpAttr::to_error()).unwrap(),
                    ToError::BadLocalKey => {
                        let bad = [Sge { addr: r.src.addr(), length: 8, lkey: r.src.lkey() ^ 0x5A5A }];
                        let wr = SendWr::rdma_write(BAD, &bad, r.dst.addr(), r.dst.rkey());
                        post_until_room(&r.qa, &[wr]).unwrap();
                    }
                    ToError::BadInbound => {
                        let sge = [r.bsrc.sge(0..8)];
                        let wr = SendWr::rdma_write(1, &sge, r.src.addr(), r.src.rkey() ^ 0x5A5A);
                        r.qb.post_send(&[wr]).unwrap();
                    }
                })
            });
        });

        let counts: Vec<u64> = counts.iter().map(|c| c.load(Ordering::Acquire)).collect();
        let ids = |range: std::ops::Range<u64>| {
            let counts = &counts;
            range.flat_map(move |t| (0..counts[t as usize]).map(move |k| wr_id(t, k)))
        };
        let bad = matches!(how, ToError::BadLocalKey);
        let sends = poll_n(&r.scq, ids(0..POSTERS).count() + bad as usize);
        once_each_in_order(&sends, ids(0..POSTERS).chain(bad.then_some(BAD)));
        let first_error = sends.iter().position(|wc| wc.status != WcStatus::Success).unwrap_or(sends.len());
        for (i, wc) in sends.iter().enumerate() {
            let want = match (wc.wr_id, i < first_error) {
                (_, true) => WcStatus::Success,
                (BAD, false) => WcStatus::LocProtErr,
                (_, false) => WcStatus::WrFlushErr,
            };
            assert_eq!(wc.status, want, "round {round} ({how:?}), CQE {i}: {wc:?}");
        }
        let recvs = poll_n(&r.rcq, ids(POSTERS..POSTERS + RECV_POSTERS).count());
        once_each_in_order(&recvs, ids(POSTERS..POSTERS + RECV_POSTERS));
        assert!(recvs.iter().all(|wc| wc.status == WcStatus::WrFlushErr), "round {round} ({how:?})");
        assert_eq!(r.qa.state().unwrap(), QpState::Error);
        assert_eq!(r.qa.outstanding().unwrap(), (0, 0));
        r.qa.destroy().unwrap();
        r.qb.destroy().unwrap();
    }
    engine.stop();
}

/// Threads post while another moves the QP RTS → SQD → RTS over and over: a WR posted in SQD
/// waits and then goes, so every WR completes successfully, once, in the QP's post order.
/// Rule QPS-SQD-1, QPS-SQD-9, ORD-SQ-3
#[test]
fn posts_across_sqd_and_back_all_complete() {
    let (a, ga) = device(6);
    let (b, gb) = device(7);
    let engine = Engine::start(&a, &b);
    for round in 0..ROUNDS / 4 {
        let r = rc(&a, ga, &b, gb);
        let posted = AtomicU64::new(0);
        std::thread::scope(|s| {
            for t in 0..POSTERS {
                let (r, posted) = (&r, &posted);
                s.spawn(move || {
                    let sge = [r.src.sge(0..8)];
                    for k in 0..PER_POSTER {
                        let wr = SendWr::rdma_write(wr_id(t, k), &sge, r.dst.addr(), r.dst.rkey());
                        post_until_room(&r.qa, &[wr]).unwrap();
                        posted.fetch_add(1, Ordering::AcqRel);
                    }
                });
            }
            s.spawn(|| {
                for step in 1..8 {
                    when_posted(&posted, (step * (round + 1) * 11) % (POSTERS * PER_POSTER), || {
                        r.qa.modify(&QpAttr::to_sqd()).unwrap();
                        r.qa.modify(&QpAttr::to_rts()).unwrap();
                    });
                }
            });
        });
        let sends = poll_n(&r.scq, (POSTERS * PER_POSTER) as usize);
        once_each_in_order(&sends, (0..POSTERS).flat_map(|t| (0..PER_POSTER).map(move |k| wr_id(t, k))));
        assert!(sends.iter().all(|wc| wc.status == WcStatus::Success), "round {round}");
        r.qa.destroy().unwrap();
        r.qb.destroy().unwrap();
    }
    engine.stop();
}

/// Threads post while another resets the QP and then destroys it: each post succeeds or is
/// refused as a whole, a refusal is final, and no CQE of the QP is left once Reset took them
/// off the CQ (nothing published after the Reset).
/// Rule QPS-RESET-2, QPS-RESET-5, QPS-RESET-6, QPT-SW-12
#[test]
fn posts_racing_reset_and_destroy() {
    let (a, ga) = device(8);
    let (b, gb) = device(9);
    let engine = Engine::start(&a, &b);
    for round in 0..ROUNDS {
        let r = rc(&a, ga, &b, gb);
        let posted = AtomicU64::new(0);
        std::thread::scope(|s| {
            for t in 0..POSTERS {
                let (r, posted) = (&r, &posted);
                s.spawn(move || {
                    let sge = [r.src.sge(0..8)];
                    for k in 0.. {
                        let wr = SendWr::rdma_write(wr_id(t, k), &sge, r.dst.addr(), r.dst.rkey());
                        match post_until_room(&r.qa, &[wr]) {
                            Ok(()) => posted.fetch_add(1, Ordering::AcqRel),
                            Err(e) => {
                                assert_eq!(e.index, 0);
                                assert!(matches!(e.error, VerbsError::InvalidQpState | VerbsError::InvalidQpHandle));
                                break;
                            }
                        };
                    }
                    // Refused once, refused from then on.
                    let wr = SendWr::rdma_write(wr_id(t, u32::MAX as u64), &sge, r.dst.addr(), r.dst.rkey());
                    assert!(r.qa.post_send(&[wr]).is_err());
                });
            }
            s.spawn(|| {
                when_posted(&posted, (round * 53) % (POSTERS * PER_POSTER), || {
                    r.qa.modify(&QpAttr::to_reset()).unwrap();
                    assert_eq!(r.qa.outstanding().unwrap(), (0, 0));
                    r.qa.destroy().unwrap();
                })
            });
        });
        assert_eq!(r.scq.len().unwrap(), 0, "round {round}: a CQE of the reset QP");
        r.qb.destroy().unwrap();
    }
    engine.stop();
}

/// One thread posts receives to an SRQ, two more post Sends to the two QPs that draw from it,
/// while the engine takes SRQ WQEs on its own thread: every Send succeeds and every receive
/// completes exactly once, successfully, in SRQ post order (the engine takes and completes a
/// one-packet Send in one step).
/// Rule ORD-RQ-1
#[test]
fn srq_posted_while_the_engine_takes_from_it() {
    const SENDS: u64 = 2_000;
    let (a, ga) = device(10);
    let (b, gb) = device(11);
    let engine = Engine::start(&a, &b);
    let all = Access::LOCAL_WRITE | Access::REMOTE_WRITE;
    let (pa, pb) = (a.alloc_pd().unwrap(), b.alloc_pd().unwrap());
    let (ca, cb) = (a.create_cq(8192).unwrap(), b.create_cq(8192).unwrap());
    let srq = pb.create_srq(&SrqInitAttr { max_wr: 16, max_sge: 1, srq_limit: 0 }).unwrap();
    let mut senders = Vec::new();
    for _ in 0..2 {
        let qa = pa.create_qp(&QpInitAttr::rc(&ca, &ca).max_send_wr(16).sq_sig_all(true)).unwrap();
        let qb = pb.create_qp(&QpInitAttr::rc(&cb, &cb).max_recv_wr(0).srq(&srq)).unwrap();
        for (qp, peer, gid) in [(&qa, &qb, gb), (&qb, &qa, ga)] {
            let av = AddressVector::new(AhAttr::roce(gid, 0), Mtu::Mtu1024);
            qp.modify(&QpAttr::to_init().port(1).pkey_index(0).access(all)).unwrap();
            qp.modify(&QpAttr::to_rtr(av, peer.qp_num()).rq_psn(0).max_dest_rd_atomic(1).min_rnr_timer(1)).unwrap();
            // An RNR Retry Count of 7 waits for the SRQ poster however long it takes.
            qp.modify(&QpAttr::to_rts().sq_psn(0).timeout(10).retry_cnt(7).rnr_retry(7).max_rd_atomic(1)).unwrap();
        }
        senders.push((qa, qb));
    }
    let src = pa.reg_mr(vec![1u8; 64], Access::LOCAL_WRITE).unwrap();
    let dst = pb.alloc_mr(64, all).unwrap();
    std::thread::scope(|s| {
        s.spawn(|| {
            for k in 0..2 * SENDS {
                loop {
                    match srq.post_recv(&[RecvWr::new(k, &[dst.sge(0..64)])]) {
                        Err(e) if e.error == VerbsError::QueueFull => std::thread::yield_now(),
                        r => break r.unwrap(),
                    }
                }
            }
        });
        for (t, (qa, _)) in (0..).zip(&senders) {
            let src = &src;
            s.spawn(move || {
                for k in 0..SENDS {
                    post_until_room(qa, &[SendWr::send(wr_id(t, k), &[src.sge(0..(k % 64) as usize)])]).unwrap();
                }
            });
        }
    });
    let sends = poll_n(&ca, 2 * SENDS as usize);
    once_each_in_order(&sends, (0..2).flat_map(|t| (0..SENDS).map(move |k| wr_id(t, k))));
    assert!(sends.iter().all(|wc| wc.status == WcStatus::Success));
    let recvs = poll_n(&cb, 2 * SENDS as usize);
    assert!(recvs.iter().all(|wc| wc.status == WcStatus::Success));
    assert_eq!(recvs.iter().map(|wc| wc.wr_id).collect::<Vec<_>>(), (0..2 * SENDS).collect::<Vec<_>>());
    assert!(srq.is_empty().unwrap());
    for (qa, qb) in senders {
        qa.destroy().unwrap();
        qb.destroy().unwrap();
    }
    srq.destroy().unwrap();
    engine.stop();
}

/// Raw QPs created and destroyed on one thread while another feeds the device raw frames and
/// IPv6 datagrams: Create QP registers a Raw QP under the QP table's lock and the receive
/// path looks the Raw QPs up under it too, in the same order, so neither waits for the other
/// for ever. Every frame that found a QP in RTR with a receive posted was received.
#[test]
fn raw_qps_come_and_go_while_raw_packets_arrive() {
    // A hang guard, not a timing check: a lock-order deadlock fails the test instead of
    // stalling the suite (with the two locks taken the other way round it hangs most runs).
    let (done, finished) = mpsc::channel();
    std::thread::spawn(move || {
        raw_qps_and_raw_packets();
        let _ = done.send(());
    });
    assert!(finished.recv_timeout(Duration::from_secs(120)).is_ok(), "deadlocked (or panicked)");
}

fn raw_qps_and_raw_packets() {
    let mut cfg = DeviceConfig::default().name("thr-raw").gid0(Gid::from_ipv4([127, 1, 9, 50].into()));
    cfg.attr.max_raw_ethy_qp = 4;
    cfg.attr.max_raw_ipv6_qp = 4;
    let ctx = Context::create(cfg).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let fed = Arc::new(AtomicU64::new(0));
    let feeder = {
        let (ctx, stop, fed) = (ctx.clone(), stop.clone(), fed.clone());
        std::thread::spawn(move || {
            let frame = [[0xffu8; 6].as_slice(), &[2, 0, 0, 0, 0, 9], &[0x88, 0xB5], &[1u8; 50]].concat();
            let mut v6 = vec![0x60, 0, 0, 0, 0, 0, 253, 64];
            v6.extend_from_slice(&[0u8; 32]);
            while !stop.load(Ordering::Acquire) {
                ctx.receive_frame(&frame);
                ctx.receive(0, &v6);
                fed.fetch_add(1, Ordering::Release);
            }
        })
    };
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(4096).unwrap();
    let mr = pd.alloc_mr(4096, Access::LOCAL_WRITE).unwrap();
    // At least 300 rounds, and as many more as it takes for the feeder to have fed 1000 pairs
    // meanwhile (however the threads are scheduled).
    let mut i = 0u64;
    while i < 300 || fed.load(Ordering::Acquire) < 1000 {
        i += 1;
        let t = if i.is_multiple_of(2) { QpType::RawEthertype } else { QpType::RawIpv6 };
        let qp = pd.create_qp(&QpInitAttr::new(t, &cq, &cq)).unwrap();
        qp.modify(&QpAttr::to_init().port(1)).unwrap();
        qp.post_recv(&[RecvWr::new(i, &[mr.sge(0..2048)])]).unwrap();
        qp.modify(&QpAttr::new(QpState::Rtr)).unwrap();
        qp.destroy().unwrap();
        while cq.poll_one().unwrap().is_some() {}
    }
    stop.store(true, Ordering::Release);
    feeder.join().unwrap();
}
