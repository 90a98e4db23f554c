//! The randomized RC soak: many random operations across several QP pairs on a lossy,
//! duplicating, reordering, corrupting simulated fabric, with a fixed seed. It checks that every
//! WQE completes exactly once, in order, with Success; that every destination byte equals its
//! source; and that atomic results agree with a sequential shadow model.
//!
//! Rule ORD-SQ-1, ORD-SQ-3, ORD-RQ-1, ORD-RQ-3, WR-COM-5, WR-COM-6, WR-READ-2, WR-ATOM-4,
//! WR-ATOM-5, WR-ATOM-6, WR-ATOM-7, PKT-NAK-1, PKT-RTY-1, PKT-DUP-1, PKT-DUP-2, PKT-DUP-4

use std::collections::VecDeque;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use softhca::link::sim::{SimConfig, SimFabric};
use softhca::*;

const REGION: usize = 4 << 20; // per QP pair, on each side
const ATOMIC_WORDS: usize = 8;
const DEPTH: usize = 64;

struct Flow {
    qa: Qp,
    qb: Qp,
    cqa: Cq,
    cqb: Cq,
    /// Requester memory: source data, read landing zone, atomic results.
    src: Mr,
    land: Mr,
    results: Mr,
    /// Responder memory: RDMA target, receive buffers, atomic words.
    target: Mr,
    recv: Mr,
    words: Mr,
    /// The target as it must look once every posted write has executed.
    shadow: Vec<u8>,
    atomic_shadow: [u64; ATOMIC_WORDS],
    /// Posted and not yet completed, in post order.
    pending: VecDeque<Expect>,
    recv_pending: VecDeque<(u64, Vec<u8>)>,
    rd_atomic_out: usize,
    next_id: u64,
    next_recv: u64,
}

enum Expect {
    Plain { id: u64 },
    Read { id: u64, land_off: usize, data: Vec<u8> },
    Atomic { id: u64, slot: usize, orig: u64 },
}

impl Expect {
    fn id(&self) -> u64 {
        match self {
            Expect::Plain { id } | Expect::Read { id, .. } | Expect::Atomic { id, .. } => *id,
        }
    }
}

fn size(rng: &mut StdRng, large_every: u32) -> usize {
    if large_every > 0 && rng.random_ratio(1, large_every) {
        rng.random_range(64 << 10..=1 << 20)
    } else if rng.random_ratio(1, 4) {
        rng.random_range(0..=64)
    } else {
        rng.random_range(0..=8192)
    }
}

fn connect(qp: &Qp, remote: &Qp, gid: Gid, mtu: Mtu) {
    let all = Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ | Access::REMOTE_ATOMIC;
    let av = AddressVector::new(AhAttr::roce(gid, 0), mtu);
    qp.modify(&QpAttr::to_init().port(1).pkey_index(0).access(all)).unwrap();
    qp.modify(&QpAttr::to_rtr(av, remote.qp_num()).rq_psn(0xFF_FF00).max_dest_rd_atomic(16).min_rnr_timer(1)).unwrap();
    // PSNs start just below the 24-bit wrap, so every run crosses it.
    qp.modify(&QpAttr::to_rts().sq_psn(0xFF_FF00).timeout(8).retry_cnt(7).rnr_retry(7).max_rd_atomic(16)).unwrap();
}

pub struct SoakResult {
    pub ops: u64,
    pub bytes: u64,
    pub retransmits: u64,
    pub virtual_ns: u64,
    pub sim: softhca::link::sim::SimCounters,
}

pub fn soak(seed: u64, total_ops: u64, flows_n: usize, faults: bool, large_every: u32) -> SoakResult {
    let mut cfg = SimConfig::default().seed(seed).latency_ns(2_000).bandwidth_bps(100_000_000_000);
    if faults {
        cfg = cfg.loss(0.05).dup(0.02).reorder(0.02).corrupt(0.01).jitter_ns(500);
    }
    let mut fab = SimFabric::new(cfg);
    let a = fab.add_device("soak-a").unwrap();
    let b = fab.add_device("soak-b").unwrap();
    let (ga, gb) = (a.query_gid(1, 0).unwrap(), b.query_gid(1, 0).unwrap());
    let (pda, pdb) = (a.alloc_pd().unwrap(), b.alloc_pd().unwrap());
    let mut rng = StdRng::seed_from_u64(seed ^ 0x5eed);
    let remote = Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ | Access::REMOTE_ATOMIC;
    let mut flows: Vec<Flow> = (0..flows_n)
        .map(|i| {
            let cqa = a.create_cq(1024).unwrap();
            let cqb = b.create_cq(1024).unwrap();
            let init = |cq: &Cq| {
                QpInitAttr::rc(cq, cq)
                    .max_send_wr(DEPTH as u32)
                    .max_recv_wr(DEPTH as u32)
                    .max_send_sge(4)
                    .max_recv_sge(4)
            };
            let qa = pda.create_qp(&init(&cqa)).unwrap();
            let qb = pdb.create_qp(&init(&cqb)).unwrap();
            let mtu = [Mtu::Mtu1024, Mtu::Mtu4096, Mtu::Mtu256, Mtu::Mtu2048][i % 4];
            connect(&qa, &qb, gb, mtu);
            connect(&qb, &qa, ga, mtu);
            let data: Vec<u8> = (0..REGION).map(|_| rng.random()).collect();
            let target_init: Vec<u8> = (0..REGION).map(|_| rng.random()).collect();
            let words_init: [u64; ATOMIC_WORDS] = std::array::from_fn(|_| rng.random());
            let words = pdb.alloc_mr(ATOMIC_WORDS * 8, remote).unwrap();
            for (k, w) in words_init.iter().enumerate() {
                words.write(k * 8, &w.to_ne_bytes()).unwrap();
            }
            Flow {
                qa,
                qb,
                cqa,
                cqb,
                src: pda.reg_mr(data, Access::LOCAL_WRITE).unwrap(),
                land: pda.alloc_mr(DEPTH << 20, Access::LOCAL_WRITE).unwrap(),
                results: pda.alloc_mr(DEPTH * 8, Access::LOCAL_WRITE).unwrap(),
                target: pdb.reg_mr(target_init.clone(), remote).unwrap(),
                recv: pdb.alloc_mr(DEPTH * (1 << 20), Access::LOCAL_WRITE).unwrap(),
                words,
                shadow: target_init,
                atomic_shadow: words_init,
                pending: VecDeque::new(),
                recv_pending: VecDeque::new(),
                rd_atomic_out: 0,
                next_id: 0,
                next_recv: 0,
            }
        })
        .collect();

    let mut posted = 0u64;
    let mut bytes = 0u64;
    let mut wcs = [Wc::default(); 64];
    while posted < total_ops || flows.iter().any(|f| !f.pending.is_empty() || !f.recv_pending.is_empty()) {
        for f in flows.iter_mut() {
            while posted < total_ops && f.pending.len() < DEPTH / 2 {
                bytes += post_one(f, &mut rng, large_every) as u64;
                posted += 1;
            }
        }
        let done = fab.run_until_within(10_000_000_000, |_| {
            flows.iter().any(|f| f.cqa.len().unwrap() > 0 || f.cqb.len().unwrap() > 0)
        });
        if !done {
            for f in &flows {
                eprintln!("A {}\nB {}", f.qa.debug_transport(), f.qb.debug_transport());
            }
        }
        assert!(
            done,
            "stalled with {} pending at {} ns: {:?}",
            flows.iter().map(|f| f.pending.len()).sum::<usize>(),
            fab.now(),
            a.counters()
        );
        for f in flows.iter_mut() {
            let n = f.cqa.poll(&mut wcs).unwrap();
            for wc in &wcs[..n] {
                check_send_completion(f, wc);
            }
            let n = f.cqb.poll(&mut wcs).unwrap();
            for wc in &wcs[..n] {
                let (id, want) = f.recv_pending.pop_front().expect("a receive completion for a posted receive");
                assert_eq!((wc.wr_id, wc.status), (id, WcStatus::Success), "receive in order, successful");
                assert_eq!(wc.byte_len as usize, want.len());
                let slot = (id as usize % DEPTH) << 20;
                let mut got = vec![0; want.len()];
                f.recv.read(slot, &mut got).unwrap();
                assert!(got == want, "received bytes differ");
            }
        }
    }
    for f in &flows {
        assert!(f.target.to_vec().unwrap() == f.shadow, "RDMA target differs from its shadow");
        for k in 0..ATOMIC_WORDS {
            let mut w = [0; 8];
            f.words.read(k * 8, &mut w).unwrap();
            assert_eq!(u64::from_ne_bytes(w), f.atomic_shadow[k]);
        }
        assert_eq!(f.qa.state().unwrap(), QpState::Rts);
        assert_eq!(f.qb.state().unwrap(), QpState::Rts);
    }
    SoakResult {
        ops: posted,
        bytes,
        retransmits: a.counters().retransmits + b.counters().retransmits,
        virtual_ns: fab.now(),
        sim: fab.counters(),
    }
}

fn post_one(f: &mut Flow, rng: &mut StdRng, large_every: u32) -> usize {
    let id = f.next_id;
    f.next_id += 1;
    // Anything after an outstanding Read or Atomic that could disturb it waits (Fence).
    let fence = f.rd_atomic_out > 0;
    let kind = rng.random_range(0..100);
    if kind < 35 {
        // RDMA Write from up to three gather pieces.
        let len = size(rng, large_every);
        let src_off = rng.random_range(0..=REGION - len);
        let dst_off = rng.random_range(0..=REGION - len);
        let cut1 = rng.random_range(0..=len);
        let cut2 = rng.random_range(cut1..=len);
        let sges = [
            f.src.sge(src_off..src_off + cut1),
            f.src.sge(src_off + cut1..src_off + cut2),
            f.src.sge(src_off + cut2..src_off + len),
        ];
        let mut wr = SendWr::rdma_write(id, &sges, f.target.addr() + dst_off as u64, f.target.rkey()).signaled();
        if fence {
            wr = wr.fence();
        }
        f.qa.post_send(&[wr]).unwrap();
        let mut piece = vec![0; len];
        f.src.read(src_off, &mut piece).unwrap();
        f.shadow[dst_off..dst_off + len].copy_from_slice(&piece);
        f.pending.push_back(Expect::Plain { id });
        len
    } else if kind < 65 {
        // Send into the next posted receive.
        let len = size(rng, large_every).min(1 << 20);
        let src_off = rng.random_range(0..=REGION - len);
        let rid = f.next_recv;
        f.next_recv += 1;
        let slot = (rid as usize % DEPTH) << 20;
        f.qb.post_recv(&[RecvWr::new(
            rid,
            &[f.recv.sge(slot..slot + (1 << 19)), f.recv.sge(slot + (1 << 19)..slot + (1 << 20))],
        )])
        .unwrap();
        let sges = [f.src.sge(src_off..src_off + len)];
        let mut wr = SendWr::send(id, &sges).signaled();
        if fence {
            wr = wr.fence();
        }
        f.qa.post_send(&[wr]).unwrap();
        let mut piece = vec![0; len];
        f.src.read(src_off, &mut piece).unwrap();
        f.recv_pending.push_back((rid, piece));
        f.pending.push_back(Expect::Plain { id });
        len
    } else if kind < 90 {
        // RDMA Read of the target as the shadow says it is now.
        let len = size(rng, large_every);
        let from = rng.random_range(0..=REGION - len);
        let land_off = (id as usize % DEPTH) << 20; // its own landing slot while outstanding
        let sges = [f.land.sge(land_off..land_off + len)];
        f.qa.post_send(&[SendWr::rdma_read(id, &sges, f.target.addr() + from as u64, f.target.rkey()).signaled()])
            .unwrap();
        f.rd_atomic_out += 1;
        f.pending.push_back(Expect::Read { id, land_off, data: f.shadow[from..from + len].to_vec() });
        len
    } else {
        let slot = id as usize % DEPTH;
        let k = rng.random_range(0..ATOMIC_WORDS);
        let va = f.words.addr() + (k * 8) as u64;
        let res = [f.results.sge(slot * 8..slot * 8 + 8)];
        let orig = f.atomic_shadow[k];
        let wr = if rng.random_bool(0.5) {
            let add = rng.random();
            f.atomic_shadow[k] = orig.wrapping_add(add);
            SendWr::atomic_fetch_add(id, &res, va, f.words.rkey(), add)
        } else {
            let compare = if rng.random_bool(0.5) { orig } else { rng.random() };
            let swap = rng.random();
            if compare == orig {
                f.atomic_shadow[k] = swap;
            }
            SendWr::atomic_cmp_swp(id, &res, va, f.words.rkey(), compare, swap)
        };
        let wr = if fence { wr.fence() } else { wr };
        f.qa.post_send(&[wr.signaled()]).unwrap();
        f.rd_atomic_out += 1;
        f.pending.push_back(Expect::Atomic { id, slot, orig });
        8
    }
}

fn check_send_completion(f: &mut Flow, wc: &Wc) {
    let want = f.pending.pop_front().expect("a completion for a posted WR");
    if wc.status != WcStatus::Success {
        eprintln!("A {}\nB {}", f.qa.debug_transport(), f.qb.debug_transport());
    }
    assert_eq!((wc.wr_id, wc.status), (want.id(), WcStatus::Success), "in order and successful: {wc:?}");
    match want {
        Expect::Plain { .. } => {}
        Expect::Read { land_off, data, .. } => {
            f.rd_atomic_out -= 1;
            let mut got = vec![0; data.len()];
            f.land.read(land_off, &mut got).unwrap();
            assert!(got == data, "RDMA Read returned other bytes");
        }
        Expect::Atomic { slot, orig, .. } => {
            f.rd_atomic_out -= 1;
            let mut got = [0; 8];
            f.results.read(slot * 8, &mut got).unwrap();
            assert_eq!(u64::from_ne_bytes(got), orig, "atomic original value");
        }
    }
}

#[test]
fn soak_small_lossless() {
    let r = soak(1, 2_000, 2, false, 200);
    assert_eq!(r.retransmits, 0);
}

#[test]
fn soak_small_faulty() {
    let r = soak(2, 3_000, 3, true, 100);
    assert!(r.retransmits > 0);
}

/// The CI soak: 100,000 operations, about 1 GB of payload, 5% loss, 2% duplication, 2%
/// reordering, 1% corruption.
#[test]
fn soak_100k_ops_under_faults() {
    let r = soak(7, 100_000, 4, true, 50);
    eprintln!(
        "soak: {} ops, {} MB, {} retransmits, {:.3} s virtual, {:?}",
        r.ops,
        r.bytes >> 20,
        r.retransmits,
        r.virtual_ns as f64 / 1e9,
        r.sim
    );
    assert!(r.bytes > 900 << 20);
    assert!(r.sim.lost > 0 && r.sim.duplicated > 0 && r.sim.reordered > 0 && r.sim.corrupted > 0);
}

/// The long run: 10^6 operations (about 12 GB). `cargo test --release --test rc_soak -- --ignored`.
#[test]
#[ignore = "about 12 minutes; run by hand, result in the README"]
fn soak_1m_ops_under_faults() {
    let t = std::time::Instant::now();
    let r = soak(11, 1_000_000, 4, true, 50);
    eprintln!(
        "soak: {} ops, {} MB, {} retransmits, {:.3} s virtual, {:.1} s wall, {:?}",
        r.ops,
        r.bytes >> 20,
        r.retransmits,
        r.virtual_ns as f64 / 1e9,
        t.elapsed().as_secs_f64(),
        r.sim
    );
}
