//! In-process transport speed on the sim link with no faults: RC RDMA Write bandwidth with
//! 64 KiB messages, and the 8-byte Send message rate, alone and beside 1000 idle connected QPs
//! per device (what an idle QP costs the busy one). Wall-clock time, two devices, one process.
//! And the same Writes through the shared-memory link's rings (two devices in one process,
//! busy-poll: the polling thread runs both engines).

use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use softhca::link::sim::{SimConfig, SimFabric};
use softhca::*;

struct Setup {
    fab: SimFabric,
    qa: Qp,
    qb: Qp,
    cqa: Cq,
    cqb: Cq,
    src: Mr,
    dst: Mr,
    /// QPs in RTS that never post: they only have to be there.
    _idle: Vec<Qp>,
}

fn setup(mtu: Mtu, idle: usize) -> Setup {
    let mut fab = SimFabric::new(SimConfig::default().seed(1).latency_ns(1_000));
    let a = fab.add_device("bench-a").unwrap();
    let b = fab.add_device("bench-b").unwrap();
    let (pa, pb) = (a.alloc_pd().unwrap(), b.alloc_pd().unwrap());
    let (cqa, cqb) = (a.create_cq(8192).unwrap(), b.create_cq(8192).unwrap());
    let init = |cq: &Cq| QpInitAttr::rc(cq, cq).max_send_wr(1024).max_recv_wr(4096).max_inline_data(64);
    let qa = pa.create_qp(&init(&cqa)).unwrap();
    let qb = pb.create_qp(&init(&cqb)).unwrap();
    let all = Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ;
    for (qp, peer, gid) in [(&qa, &qb, b.query_gid(1, 0).unwrap()), (&qb, &qa, a.query_gid(1, 0).unwrap())] {
        let av = AddressVector::new(AhAttr::roce(gid, 0), mtu);
        qp.modify(&QpAttr::to_init().port(1).pkey_index(0).access(all)).unwrap();
        qp.modify(&QpAttr::to_rtr(av, peer.qp_num()).rq_psn(0).max_dest_rd_atomic(16)).unwrap();
        qp.modify(&QpAttr::to_rts().sq_psn(0).timeout(14).retry_cnt(7).rnr_retry(7).max_rd_atomic(16)).unwrap();
    }
    let src = pa.alloc_mr(1 << 20, Access::LOCAL_WRITE).unwrap();
    let dst = pb.alloc_mr(1 << 20, all).unwrap();
    let mut _idle = Vec::new();
    for (pd, cq, peer) in [(&pa, &cqa, b.query_gid(1, 0).unwrap()), (&pb, &cqb, a.query_gid(1, 0).unwrap())] {
        for _ in 0..idle {
            let qp = pd.create_qp(&QpInitAttr::rc(cq, cq).max_send_wr(1).max_recv_wr(1)).unwrap();
            let av = AddressVector::new(AhAttr::roce(peer, 0), mtu);
            qp.modify(&QpAttr::to_init().port(1).pkey_index(0).access(all)).unwrap();
            qp.modify(&QpAttr::to_rtr(av, 0xABCD).rq_psn(0).max_dest_rd_atomic(1)).unwrap();
            qp.modify(&QpAttr::to_rts().sq_psn(0).timeout(14).retry_cnt(7).rnr_retry(7).max_rd_atomic(1)).unwrap();
            _idle.push(qp);
        }
    }
    Setup { fab, qa, qb, cqa, cqb, src, dst, _idle }
}

/// Posts `n` signaled 64 KiB writes, keeping up to 64 in flight, and waits for them all.
fn writes(s: &mut Setup, n: u64) {
    let mut wcs = [Wc::default(); 64];
    let (mut posted, mut done) = (0u64, 0u64);
    let sge = [s.src.sge(0..65536)];
    while done < n {
        while posted < n && posted - done < 64 {
            let off = (posted % 16) * 65536;
            s.qa.post_send(&[SendWr::rdma_write(posted, &sge, s.dst.addr() + off, s.dst.rkey()).signaled()]).unwrap();
            posted += 1;
        }
        let cqa = s.cqa.clone();
        s.fab.run_until(|_| cqa.len().unwrap() > 0);
        done += s.cqa.poll(&mut wcs).unwrap() as u64;
    }
}

/// Sends `n` 8-byte inline messages, every 64th signaled, keeping the receiver's RQ stocked.
fn sends(s: &mut Setup, n: u64) {
    let mut wcs = [Wc::default(); 256];
    let (mut posted, mut done, mut recvd, mut stocked) = (0u64, 0u64, 0u64, 0u64);
    let rsge = [s.dst.sge(0..64)];
    let payload = [7u8; 8];
    let recvs: Vec<RecvWr> = (0..256).map(|i| RecvWr::new(i, &rsge)).collect();
    let mut batch: Vec<SendWr> = Vec::with_capacity(512);
    while done < n || recvd < n {
        while stocked - recvd + 256 <= 2048 && stocked < n {
            let k = (n - stocked).min(256) as usize;
            s.qb.post_recv(&recvs[..k]).unwrap();
            stocked += k as u64;
        }
        batch.clear();
        while posted < n && posted - done < 512 {
            let wr = SendWr::send_inline(posted, &payload);
            batch.push(if posted % 64 == 63 || posted + 1 == n { wr.signaled() } else { wr });
            posted += 1;
        }
        if !batch.is_empty() {
            s.qa.post_send(&batch).unwrap();
        }
        let (cqa, cqb) = (s.cqa.clone(), s.cqb.clone());
        s.fab.run_until(|_| cqa.len().unwrap() > 0 || cqb.len().unwrap() > 0);
        while let Ok(k @ 1..) = s.cqa.poll(&mut wcs) {
            done = wcs[k - 1].wr_id + 1;
        }
        while let Ok(k @ 1..) = s.cqb.poll(&mut wcs) {
            recvd += k as u64;
        }
    }
}

fn bench(c: &mut Criterion) {
    let mut g = c.benchmark_group("rc_sim");
    g.measurement_time(Duration::from_secs(5)).sample_size(10);
    g.throughput(Throughput::Bytes(65536 * 256));
    g.bench_function("rdma_write_64KiB_x256_mtu4096", |bch| {
        let mut s = setup(Mtu::Mtu4096, 0);
        bch.iter_custom(|iters| {
            let t = Instant::now();
            for _ in 0..iters {
                writes(&mut s, 256);
            }
            t.elapsed()
        })
    });
    g.throughput(Throughput::Elements(20_000));
    g.bench_function("send_8B_x20000", |bch| {
        let mut s = setup(Mtu::Mtu4096, 0);
        bch.iter_custom(|iters| {
            let t = Instant::now();
            for _ in 0..iters {
                sends(&mut s, 20_000);
            }
            t.elapsed()
        })
    });
    g.bench_function("send_8B_x20000_beside_1000_idle_qps", |bch| {
        let mut s = setup(Mtu::Mtu4096, 1000);
        bch.iter_custom(|iters| {
            let t = Instant::now();
            for _ in 0..iters {
                sends(&mut s, 20_000);
            }
            t.elapsed()
        })
    });
    g.finish();
}

/// Two busy-poll devices on the shared-memory link with a connected RC QP pair.
fn shm_pair() -> (softhca::link::shm::ShmDevice, softhca::link::shm::ShmDevice, Qp, Cq, Mr, Mr) {
    use softhca::link::shm::{ShmConfig, ShmDevice};
    let da = ShmDevice::open(ShmConfig::default().busy_poll(true)).unwrap();
    let db = ShmDevice::open(ShmConfig::default().busy_poll(true)).unwrap();
    let (a, b) = (da.context().clone(), db.context().clone());
    let (pa, pb) = (a.alloc_pd().unwrap(), b.alloc_pd().unwrap());
    let (cqa, cqb) = (a.create_cq(8192).unwrap(), b.create_cq(8192).unwrap());
    let qa = pa.create_qp(&QpInitAttr::rc(&cqa, &cqa).max_send_wr(1024)).unwrap();
    let qb = pb.create_qp(&QpInitAttr::rc(&cqb, &cqb).max_send_wr(1024)).unwrap();
    let all = Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ;
    for (qp, peer, gid) in [(&qa, &qb, db.gid()), (&qb, &qa, da.gid())] {
        let av = AddressVector::new(AhAttr::roce(gid, 0), Mtu::Mtu4096);
        qp.modify(&QpAttr::to_init().port(1).pkey_index(0).access(all)).unwrap();
        qp.modify(&QpAttr::to_rtr(av, peer.qp_num()).rq_psn(0).max_dest_rd_atomic(16)).unwrap();
        qp.modify(&QpAttr::to_rts().sq_psn(0).timeout(14).retry_cnt(7).rnr_retry(7).max_rd_atomic(16)).unwrap();
    }
    let src = pa.alloc_mr(1 << 20, Access::LOCAL_WRITE).unwrap();
    let dst = pb.alloc_mr(1 << 20, all).unwrap();
    // The responder's CQ is polled by no one: its device's turns run on the engine thread
    // and on the requester's polls' doorbells; keep qb alive with the devices.
    std::mem::forget((qb, cqb, pb));
    (da, db, qa, cqa, src, dst)
}

fn bench_shm(c: &mut Criterion) {
    let mut g = c.benchmark_group("rc_shm");
    g.measurement_time(Duration::from_secs(5)).sample_size(10);
    g.throughput(Throughput::Bytes(65536 * 256));
    g.bench_function("rdma_write_64KiB_x256_mtu4096_busy_poll", |bch| {
        let (_da, _db, qa, cqa, src, dst) = shm_pair();
        let sge = [src.sge(0..65536)];
        let mut wcs = [Wc::default(); 64];
        bch.iter_custom(|iters| {
            let t = Instant::now();
            for _ in 0..iters {
                let (mut posted, mut done) = (0u64, 0u64);
                while done < 256 {
                    while posted < 256 && posted - done < 64 {
                        let off = (posted % 16) * 65536;
                        qa.post_send(&[SendWr::rdma_write(posted, &sge, dst.addr() + off, dst.rkey()).signaled()])
                            .unwrap();
                        posted += 1;
                    }
                    done += cqa.poll(&mut wcs).unwrap() as u64;
                }
            }
            t.elapsed()
        })
    });
    g.finish();
}

criterion_group!(benches, bench, bench_shm);
criterion_main!(benches);
