//! Posting, polling and the engine on different threads, as with the UDP link: application
//! threads post and poll their own QPs while one engine thread moves packets and runs timers.
//! Nothing deadlocks, every WQE completes in order, every byte arrives.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::time::Duration;

use softhca::transport::MAX_DATAGRAM;
use softhca::*;

const PAIRS: usize = 4;
const OPS: u64 = 2_000;

fn device(n: u8) -> (Context, Gid) {
    let gid = Gid::from_ipv4([127, 1, 9, n].into());
    (Context::create(DeviceConfig::default().name(format!("thr{n}")).gid0(gid).seed(n as u64)).unwrap(), gid)
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

    // The engine: a virtual clock that advances a little every turn, one packet each way at a
    // time, so the application threads interleave with it.
    let stop = Arc::new(AtomicBool::new(false));
    let engine = {
        let (a, b, stop) = (a.clone(), b.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut buf = vec![0u8; MAX_DATAGRAM];
            let mut now = 0u64;
            while !stop.load(Ordering::Acquire) {
                now += 500;
                for (src, dst) in [(&a, &b), (&b, &a)] {
                    if let Some(n) = src.transmit(now, &mut buf) {
                        dst.receive(now, &buf[..n]);
                    }
                    src.handle_timeout(now);
                }
                std::thread::yield_now();
            }
        })
    };

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
    stop.store(true, Ordering::Release);
    engine.join().unwrap();
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
