//! How transport tests drive the sim fabric: two devices, an RC QP pair, Sends over a link
//! with every fault on, completions awaited on the virtual clock. Ignored until the RC
//! transport fills in the engine (today's stub emits nothing, so nothing would complete).

use softhca::link::pcap::SharedBuf;
use softhca::link::{SimConfig, SimFabric};
use softhca::*;

const MSGS: u64 = 50;
const LEN: usize = 1_000;

/// Connects a fresh RC QP on each device to the other and returns both, with their CQs and
/// MRs.
struct Side {
    cq: Cq,
    mr: Mr,
    qp: Qp,
}

fn side(ctx: &Context) -> Side {
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(256).unwrap();
    let mr = pd.alloc_mr(LEN * MSGS as usize, Access::LOCAL_WRITE | Access::REMOTE_WRITE).unwrap();
    let qp = pd.create_qp(&QpInitAttr::rc(&cq, &cq).max_send_wr(128).max_recv_wr(128)).unwrap();
    // The PD must outlive the run; leaking it is fine in a test.
    std::mem::forget(pd);
    Side { cq, mr, qp }
}

fn connect(qp: &Qp, remote_gid: Gid, remote_qpn: u32) {
    let av = AddressVector::new(AhAttr::roce(remote_gid, 0), Mtu::Mtu1024);
    qp.modify(&QpAttr::to_init().port(1).pkey_index(0).access(Access::REMOTE_WRITE)).unwrap();
    qp.modify(&QpAttr::to_rtr(av, remote_qpn).rq_psn(0).max_dest_rd_atomic(16)).unwrap();
    // timeout 10 = 4.2 ms of virtual time: retransmissions cost nothing real.
    qp.modify(&QpAttr::to_rts().sq_psn(0).timeout(10).retry_cnt(7).rnr_retry(7).max_rd_atomic(16)).unwrap();
}

/// Runs the exchange and returns the trace, so determinism can be checked too.
fn exchange(config: SimConfig) -> Vec<u8> {
    let mut fabric = SimFabric::new(config);
    let tap = SharedBuf::new();
    fabric.set_pcap(tap.clone()).unwrap();
    let a = fabric.add_device("rc-smoke-a").unwrap();
    let b = fabric.add_device("rc-smoke-b").unwrap();
    let (ga, gb) = (a.query_gid(1, 0).unwrap(), b.query_gid(1, 0).unwrap());
    let (sa, sb) = (side(&a), side(&b));
    connect(&sa.qp, gb, sb.qp.qp_num());
    connect(&sb.qp, ga, sa.qp.qp_num());

    for i in 0..MSGS {
        let off = i as usize * LEN;
        sb.qp.post_recv(&[RecvWr::new(i, &[sb.mr.sge(off..off + LEN)])]).unwrap();
        sa.mr.write(off, &vec![i as u8; LEN]).unwrap();
        sa.qp.post_send(&[SendWr::send(i, &[sa.mr.sge(off..off + LEN)]).signaled()]).unwrap();
    }

    // Completions are polled inside the condition: the fabric is borrowed, the CQs are not.
    let mut done = (0u64, 0u64);
    let mut wcs = [Wc::default(); 16];
    let ok = fabric.run_until_within(10_000_000_000, |_| {
        for (cq, n) in [(&sa.cq, &mut done.0), (&sb.cq, &mut done.1)] {
            let k = cq.poll(&mut wcs).unwrap();
            for wc in &wcs[..k] {
                assert!(wc.ok().is_ok(), "{wc:?}");
                assert_eq!(wc.wr_id, *n, "in order");
                *n += 1;
            }
        }
        done == (MSGS, MSGS)
    });
    assert!(ok, "completions {done:?} by {} ns, fabric {:?}", fabric.now(), fabric.counters());
    let mut got = vec![0u8; LEN * MSGS as usize];
    sb.mr.read(0, &mut got).unwrap();
    for (i, chunk) in got.chunks(LEN).enumerate() {
        assert!(chunk.iter().all(|&x| x == i as u8), "message {i}");
    }
    // Faults happened, and the receivers dropped every corrupted copy they were handed.
    let c = fabric.counters();
    assert!(c.lost + c.corrupted + c.duplicated + c.reordered > 0, "{c:?}");
    let dropped = a.counters().rx_dropped + b.counters().rx_dropped;
    assert!(dropped >= c.corrupted, "{dropped} dropped vs {c:?}");
    assert!(fabric.run_until_idle(), "quiesces");
    tap.contents()
}

fn faulty(seed: u64) -> SimConfig {
    SimConfig::default().seed(seed).loss(0.05).dup(0.02).reorder(0.05).corrupt(0.05).jitter_ns(500)
}

#[test]
fn rc_sends_survive_a_faulty_fabric_deterministically() {
    let one = exchange(faulty(42));
    assert_eq!(one, exchange(faulty(42)), "same seed, same packets");
    assert_ne!(one, exchange(faulty(43)), "another seed, other faults");
}

/// Heavy faults over many seeds: each seed is a different interleaving of losses,
/// duplicates, reorders and corruptions hitting requests and ACKs.
#[test]
fn rc_sends_survive_heavy_faults_over_many_seeds() {
    for seed in 0..20 {
        exchange(SimConfig::default().seed(seed).loss(0.15).dup(0.1).reorder(0.15).corrupt(0.1).jitter_ns(2_000));
    }
}
